"""Action chunks: a heavy chunk policy at horizon H = 8 against H = 1.

The policy is a 3x512 relu MLP with 8x2 logits: one argmax per row gives a chunk
of 8 CartPole actions. At H = 1 the same policy runs every step and only
chunk[0] is executed; at H = 8 it runs once per 8 steps (per episode: an episode
end discards the rest of a chunk, and a new episode plans at its reset).

Ideal speed-up. Let T1 be the time per env step at H = 1 and T_env the time per
env step of the same run with a trivial chunk policy (the env plus the engine's
bookkeeping, measured at H = 8 so that its own planning is amortised too). The
policy costs T_policy = T1 - T_env per step at H = 1; planning once per 8 steps
ideally leaves T_env + T_policy / 8, so::

    ideal = T1 / (T_env + T_policy / 8)      fraction of ideal = speed-up / ideal

Rows per step (``result.rows_per_step``, rows the policy computed per env step,
tile padding included) is compared with 1/h; ``x h`` shows it in units of 1/h
(goal <= 1.5). ``floor x h`` is what exactly fitting tiles would give with the
measured episode lengths: sum(ceil(len / h)) / sum(len) * h (an episode of 10
steps at h = 8 needs 2 plans, i.e. 1.6 / h).

``speed-up from rows`` = T1 / (T_env + T_policy * rows(H=8) / rows(H=1)) is the
speed-up the measured rows allow: the gap between it and ``ideal`` is tile
padding and episode ends, the gap between it and the measured speed-up is the
cost of planning in more, smaller batches.

Two regimes: ``random`` (the MLP with random init: ~10-step episodes, lanes out
of step with each other) and ``balanced`` (the same MLP, whose logits are added
at 1e-3 weight to a chunk planned by rolling CartPole's own ``step_env`` forward
8 steps under the rule ``theta + 0.5 * theta_dot > 0``: 500-step episodes, all
lanes in step). Each row interleaves the runs and takes medians.

Goals: fraction of ideal >= 0.8; rows/step <= 1.5 / h.

Run: ``python benchmarks/chunks.py [--quick]``
"""

from __future__ import annotations

import argparse

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from common import goal, header, init_mlp, interleave, machine, size_budget, table

import jaxmesh

ENV = "gymnax:CartPole-v1"
K = 8


def rule_chunk(obs: jax.Array) -> jax.Array:
    """A chunk of K actions by rolling CartPole forward under a balancing rule.

    CartPole's dynamics are deterministic, so the planned states are the ones
    the env will reach: the open-loop chunk balances like the closed loop.
    """
    env, params = gymnax.make("CartPole-v1")
    state = gymnax.environments.classic_control.cartpole.EnvState(
        x=obs[0], x_dot=obs[1], theta=obs[2], theta_dot=obs[3], time=0
    )
    key = jax.random.PRNGKey(0)  # step_env of CartPole ignores its key

    def body(state, _):
        a = (state.theta + 0.5 * state.theta_dot > 0).astype(jnp.int32)
        _, state, _, _, _ = env.step_env(key, state, a, params)
        return state, a

    _, actions = jax.lax.scan(body, state, None, length=K)
    return actions


def make_policies(regime: str):
    """(heavy chunk policy, trivial chunk policy) for a regime."""
    module, params = init_mlp((512, 512, 512), K * 2)

    def logits(p, obs):
        return module.apply(p, obs).reshape(K, 2)

    if regime == "random":

        def heavy(p, obs):
            return jnp.argmax(logits(p, obs), -1).astype(jnp.int32)

        def trivial(obs):
            return jnp.full((K,), obs[2] > 0, jnp.int32)

    else:

        def heavy(p, obs):
            rule = jax.nn.one_hot(rule_chunk(obs), 2)
            nudge = 1e-3 * jnp.tanh(logits(p, obs))
            return jnp.argmax(rule + nudge, -1).astype(jnp.int32)

        def trivial(obs):
            return rule_chunk(obs)

    return (
        jaxmesh.Model(
            heavy, params=params, native_chunk=K, name=f"mlp3x512_chunk8_{regime}"
        ),
        jaxmesh.Model(trivial, native_chunk=K, name=f"trivial_chunk8_{regime}"),
    )


def floor_rows(lengths: np.ndarray, h: int) -> float:
    """Plans per env step with exactly fitting tiles, in units of 1/h."""
    lengths = np.asarray(lengths, np.int64)
    return float(np.sum(-(-lengths // h)) / np.sum(lengths) * h)


def measure(regime: str, tile: int, args) -> dict:
    n = args.num_envs
    heavy, trivial = make_policies(regime)
    layout = jaxmesh.Layout(plan_tile=tile)
    episodes = size_budget(
        lambda e: jaxmesh.evaluate(heavy, ENV, num_envs=n, episodes=e, layout=layout),
        n,
        args.seconds,
        start=n,  # one episode per lane first: episodes may last 500 steps
    )

    def runner(policy, horizon):
        def run():
            r = jaxmesh.evaluate(
                policy,
                ENV,
                horizon=horizon,
                num_envs=n,
                episodes=episodes,
                layout=layout,
            )
            return {
                "sps": r.steps_per_second,
                "rows": r.rows_per_step,
                "mean_len": float(r.lengths.mean()),
                "floor": floor_rows(r.lengths, r.effective_horizon),
                "run_time": r.run_time,
                "tile": r.plan_tile,
            }

        return run

    med = interleave(
        {
            "h1": runner(heavy, 1),
            "h8": runner(heavy, K),
            "env": runner(trivial, K),
        },
        args.repeats,
    )
    h1, h8, env = med["h1"], med["h8"], med["env"]
    t1, t8, t_env = 1 / h1["sps"], 1 / h8["sps"], 1 / env["sps"]
    t_policy = max(t1 - t_env, 0.0)
    ideal = t1 / (t_env + t_policy / K)
    speedup = t1 / t8
    # What the speed-up would be if the policy's cost followed its rows exactly.
    by_rows = t1 / (t_env + t_policy * h8["rows"] / h1["rows"])
    return {
        "regime": regime,
        "plan_tile": (
            f"{int(h1['tile'])}/{int(h8['tile'])} (H1/H8)" if tile is None else tile
        ),
        "episodes": episodes,
        "len_h1": h1["mean_len"],
        "len_h8": h8["mean_len"],
        "sps_h1": h1["sps"],
        "sps_h8": h8["sps"],
        "run_s_h1": h1["run_time"],
        "run_s_h8": h8["run_time"],
        "t_env_us": t_env * 1e6,
        "t_policy_us": t_policy * 1e6,
        "speedup": speedup,
        "ideal": ideal,
        "fraction": speedup / ideal,
        "by_rows": by_rows,
        "rows_h8": h8["rows"],
        "rows_h8_x_h": h8["rows"] * K,
        "floor_x_h": h8["floor"],
        "rows_h1": h1["rows"],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Prints the chunk table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs", type=int, default=256, help="lanes N")
    ap.add_argument(
        "--seconds", type=float, default=2.0, help="target length of the H=1 run"
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    ap.add_argument(
        "--tiles",
        default="auto,8,16,32",
        help="plan_tile values (random); auto: the default, 128 // h rows",
    )
    ap.add_argument(
        "--balanced-tiles", default="auto", help="plan_tile values (balanced regime)"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats = 0.3, 1
        args.tiles, args.balanced_tiles = "auto", ""

    def tile(t: str) -> int | None:
        return None if t.strip() == "auto" else int(t)

    cases = [("random", tile(t)) for t in args.tiles.split(",") if t.strip()]
    cases += [("balanced", tile(t)) for t in args.balanced_tiles.split(",") if t]

    print(
        header(
            "chunks: 3x512 MLP emitting 8 actions, horizon 8 vs 1 (CartPole-v1)",
            {
                "N": args.num_envs,
                "H=1 run target s": args.seconds,
                "repeats": args.repeats,
                "jax": jax.__version__,
                "cpus": machine()["nproc"],
            },
        )
    )
    rows = [measure(regime, tile, args) for regime, tile in cases]
    print(
        table(
            [
                "regime",
                "plan_tile",
                "episodes",
                "mean len H1/H8",
                "steps/s H=1",
                "steps/s H=8",
                "speed-up",
                "T_env us",
                "T_policy us",
                "ideal",
                "fraction of ideal",
                "speed-up from rows",
                "rows/step H=8",
                "x h",
                "floor x h",
            ],
            [
                [
                    r["regime"],
                    r["plan_tile"],
                    r["episodes"],
                    f"{r['len_h1']:.1f}/{r['len_h8']:.1f}",
                    r["sps_h1"],
                    r["sps_h8"],
                    r["speedup"],
                    r["t_env_us"],
                    r["t_policy_us"],
                    r["ideal"],
                    r["fraction"],
                    r["by_rows"],
                    r["rows_h8"],
                    r["rows_h8_x_h"],
                    r["floor_x_h"],
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nT_* are per env step. ideal = T1 / (T_env + T_policy / 8); fraction = "
        "speed-up / ideal (goal >= 0.8). x h = rows/step * 8 (goal <= 1.5); "
        "floor x h = the same with exactly fitting tiles. speed-up from rows = "
        "T1 / (T_env + T_policy * rows8 / rows1): the speed-up if the policy's cost "
        "followed the rows it computes. Medians of interleaved repeats.\n"
    )
    for r in rows:
        tag = f"[{r['regime']}, plan_tile={r['plan_tile']}]"
        f = r["fraction"]
        print(goal(f"chunks fraction of ideal >= 0.8 {tag}", f, f >= 0.8))
        x = r["rows_h8_x_h"]
        print(goal(f"chunks rows/step <= 1.5/h, in units of 1/h {tag}", x, x <= 1.5))
    return rows


if __name__ == "__main__":
    main()
