"""jaxmesh.evaluate against a bare ``jax.lax.scan`` over the same env and policy.

Both sides step N vmapped gymnax CartPole-v1 lanes with the same 2x64 flax MLP
(relu, 2 logits, argmax). The bare scan is the loop a user would write by hand:
one batched forward over all N lanes per step, then gymnax's auto-resetting
``env.step`` (which computes a reset every step and selects it where an episode
ended), per-lane keys from ``jax.random.split``; it keeps no per-episode
records. jaxmesh runs the same policy through ``evaluate`` with an exact episode
budget, per-episode results, fixed-size plan tiles and fold-in keys.

Two regimes: a randomly initialised MLP (episodes of ~10 steps, so lanes reset
all the time) and the same network with hand-set weights that balance the pole
(500-step episodes). The bare scan runs as many env steps as the jaxmesh run
took. jaxmesh's figure is ``result.steps_per_second`` of a warm call (compile
excluded); ``wall`` divides the same steps by the whole call's wall clock.

Goal: jaxmesh >= 0.9x the bare scan's env steps/s.

``--metrics`` also runs jaxmesh with episode metrics (``Scoring(metrics={"discount":
"mean"}, success="discount")``: two device accumulators per lane, reduced
every step) on the same budget, interleaved; ``metrics ratio`` is its steps/s
over the plain run's (goal: >= 0.95, at most 5% slower).

``--record`` also runs jaxmesh recording 4 episodes (``record=jaxmesh.Record(
episodes=[0, 1, 2, 3])``: observations, actions, rewards and ends written into
device buffers every step) on the same budget, interleaved; ``record ratio`` is
its steps/s over the plain run's (goal: >= 0.95).

``--on-step`` also runs jaxmesh with a hook whose ``on_step`` does nothing (the
engine then compiles an ordered ``io_callback`` into the step and the host
builds one ``jaxmesh.StepEvent`` per lane and step) on the same budget,
interleaved; ``on_step ratio`` is its steps/s over the plain run's. No goal: it
is the price of a step hook, documented in docs/evaluation.md ("Step hooks").

Run: ``python benchmarks/overhead.py [--quick] [--metrics] [--record] [--on-step]``
"""

from __future__ import annotations

import argparse
import time

import gymnax
import jax
import jax.numpy as jnp
from common import (
    balancing_params,
    goal,
    header,
    init_mlp,
    interleave,
    machine,
    op_profile,
    size_budget,
    table,
    timed,
)

import jaxmesh
from jaxmesh.results.record import Record

ENV_ID = "CartPole-v1"


def make_bare(module, num_envs: int, steps: int):
    """The hand-written loop: jitted ``fn(params, key) -> (reward sum, ends)``."""
    env, env_params = gymnax.make(ENV_ID)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    reset = jax.vmap(env.reset, in_axes=(0, None))

    def run(params, key):
        key, k0 = jax.random.split(key)
        obs, state = reset(jax.random.split(k0, num_envs), env_params)

        def body(carry, _):
            obs, state, key, total, ends = carry
            key, k = jax.random.split(key)
            action = jnp.argmax(module.apply(params, obs), -1).astype(jnp.int32)
            obs, state, reward, term, trunc, _ = step(
                jax.random.split(k, num_envs), state, action, env_params
            )
            total = total + jnp.sum(reward)
            ends = ends + jnp.sum(term | trunc, dtype=jnp.int32)
            return (obs, state, key, total, ends), None

        init = (obs, state, key, jnp.float32(0), jnp.int32(0))
        (_, _, _, total, ends), _ = jax.lax.scan(body, init, None, length=steps)
        return total, ends

    return jax.jit(run)


class NoOpStep:
    """A step hook that does nothing: what remains is the cost of delivering."""

    def on_step(self, event: jaxmesh.StepEvent) -> None:
        del event


def make_policy(module, params, name: str) -> jaxmesh.Model:
    def mlp_argmax(p, obs):
        return jnp.argmax(module.apply(p, obs)).astype(jnp.int32)

    return jaxmesh.Model(mlp_argmax, params=params, name=name)


def measure(module, params, name, args, tile: int) -> dict:
    """One row: jaxmesh and the bare scan, interleaved, same env steps."""
    n = args.num_envs
    env = f"gymnax:{ENV_ID}"
    policy = make_policy(module, params, name)
    layout = jaxmesh.Layout(plan_tile=tile)
    episodes = size_budget(
        lambda e: jaxmesh.evaluate(policy, env, num_envs=n, episodes=e, layout=layout),
        n,
        args.seconds,
    )

    def run_jaxmesh(**extra):
        t0 = time.perf_counter()
        r = jaxmesh.evaluate(
            policy, env, num_envs=n, episodes=episodes, layout=layout, **extra
        )
        wall = time.perf_counter() - t0
        return {
            "sps": r.steps_per_second,
            "sps_wall": r.env_steps / wall,
            "env_steps": r.env_steps,
            "rows_per_step": r.rows_per_step,
            "mean_len": float(r.lengths.mean()),
            "compile": r.compile_time,
            "run_time": r.run_time,
            "tile": r.plan_tile,
        }

    first = run_jaxmesh()  # compiles
    steps = max(1, int(first["env_steps"]) // n)
    bare = make_bare(module, n, steps)
    key = jax.random.PRNGKey(1)

    def run_bare():
        _, dt = timed(lambda: bare(params, key))
        return {"sps": n * steps / dt, "run_time": dt}

    runs = {"jaxmesh": run_jaxmesh, "bare": run_bare}
    if args.metrics:
        scoring = jaxmesh.Scoring(metrics={"discount": "mean"}, success="discount")
        asked = {"scoring": scoring}
        run_jaxmesh(**asked)  # compiles
        runs["metrics"] = lambda: run_jaxmesh(**asked)
    if args.record:
        recorded = {"record": Record(episodes=[0, 1, 2, 3])}
        run_jaxmesh(**recorded)  # compiles
        runs["record"] = lambda: run_jaxmesh(**recorded)
    if args.on_step:
        stepped = {"hooks": NoOpStep()}
        run_jaxmesh(**stepped)  # compiles
        runs["on_step"] = lambda: run_jaxmesh(**stepped)
    med = interleave(runs, args.repeats)
    if args.profile:
        per = first["env_steps"] / n
        print(f"\n### ops of one jaxmesh call: {name}, plan_tile={tile}\n")
        print(op_profile(run_jaxmesh, per))
        print(f"\n### ops of one bare scan call: {name}\n")
        print(op_profile(lambda: bare(params, key), per))
    jm, bs = med["jaxmesh"], med["bare"]
    return {
        "policy": name,
        "plan_tile": f"auto ({int(first['tile'])})" if tile is None else tile,
        "episodes": episodes,
        "mean_len": jm["mean_len"],
        "env_steps": int(jm["env_steps"]),
        "jaxmesh_run_s": jm["run_time"],
        "jaxmesh_sps": jm["sps"],
        "jaxmesh_sps_wall": jm["sps_wall"],
        "bare_sps": bs["sps"],
        "ratio": jm["sps"] / bs["sps"],
        "ratio_wall": jm["sps_wall"] / bs["sps"],
        "rows_per_step": jm["rows_per_step"],
        "first_compile_s": first["compile"],
        "metrics_ratio": med["metrics"]["sps"] / jm["sps"] if args.metrics else None,
        "record_ratio": med["record"]["sps"] / jm["sps"] if args.record else None,
        "on_step_sps": med["on_step"]["sps"] if args.on_step else None,
        "on_step_ratio": med["on_step"]["sps"] / jm["sps"] if args.on_step else None,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Prints the overhead table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs", type=int, default=1024, help="lanes N")
    ap.add_argument(
        "--seconds", type=float, default=1.5, help="target length of a jaxmesh run"
    )
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats")
    ap.add_argument(
        "--tiles",
        default="auto,32,N",
        help="comma-separated plan_tile values; N means num_envs (one tile), "
        "auto the default (None: 128 // h rows)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also print each row's XLA ops per env step (jax.profiler trace)",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    ap.add_argument(
        "--metrics",
        action="store_true",
        help="also time a run with episode metrics (the metrics ratio)",
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="also time a run recording 4 episodes (the record ratio)",
    )
    ap.add_argument(
        "--on-step",
        action="store_true",
        help="also time a run with a no-op on_step hook (the on_step ratio)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats, args.tiles = 0.3, 2, "auto"

    def tile(t: str) -> int | None:
        t = t.strip()
        return {"N": args.num_envs, "auto": None}[t] if t in ("N", "auto") else int(t)

    tiles = [tile(t) for t in args.tiles.split(",")]

    module, random_params = init_mlp((64, 64), 2)
    regimes = [
        ("mlp 2x64 random init (short episodes)", random_params),
        ("mlp 2x64 balancing (500-step episodes)", balancing_params(random_params)),
    ]
    print(
        header(
            "overhead: jaxmesh.evaluate vs a bare lax.scan (gymnax CartPole-v1)",
            {
                "N": args.num_envs,
                "target run s": args.seconds,
                "repeats": args.repeats,
                "plan_tile": tiles,
                "jax": jax.__version__,
                "cpus": machine()["nproc"],
            },
        )
    )
    rows = []
    for name, params in regimes:
        for tile in tiles:
            rows.append(measure(module, params, name, args, tile))
    print(
        table(
            [
                "policy",
                "plan_tile",
                "episodes",
                "mean len",
                "env steps",
                "jaxmesh run s",
                "jaxmesh steps/s",
                "jaxmesh steps/s (wall)",
                "bare scan steps/s",
                "ratio",
                "ratio (wall)",
                "rows/step",
            ],
            [
                [
                    r["policy"],
                    r["plan_tile"],
                    r["episodes"],
                    r["mean_len"],
                    r["env_steps"],
                    r["jaxmesh_run_s"],
                    r["jaxmesh_sps"],
                    r["jaxmesh_sps_wall"],
                    r["bare_sps"],
                    r["ratio"],
                    r["ratio_wall"],
                    r["rows_per_step"],
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nratio = jaxmesh steps/s (result.steps_per_second, warm call) / bare scan "
        "steps/s; goal >= 0.9. Medians of interleaved repeats.\n"
    )
    for r in rows:
        text = f"overhead ratio >= 0.9 [{r['policy']}, plan_tile={r['plan_tile']}]"
        print(goal(text, r["ratio"], r["ratio"] >= 0.9))
        if r["metrics_ratio"] is not None:
            m = r["metrics_ratio"]
            text = f"metrics ratio >= 0.95 [{r['policy']}, plan_tile={r['plan_tile']}]"
            print(goal(text, m, m >= 0.95))
        if r["record_ratio"] is not None:
            m = r["record_ratio"]
            text = f"record ratio >= 0.95 [{r['policy']}, plan_tile={r['plan_tile']}]"
            print(goal(text, m, m >= 0.95))
        if r["on_step_ratio"] is not None:
            print(
                f"on_step ratio (no goal) [{r['policy']}, plan_tile={r['plan_tile']}]: "
                f"{r['on_step_ratio']:.3f} ({r['on_step_sps']:,.0f} steps/s with "
                f"a no-op on_step, {r['jaxmesh_sps']:,.0f} without)"
            )
    return rows


if __name__ == "__main__":
    main()
