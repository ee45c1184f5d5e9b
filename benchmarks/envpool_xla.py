"""EnvPool's HalfCheetah inside jaxmesh's jitted loop, beside a hand-written
EnvPool XLA loop and jaxmesh on gymnasium's HalfCheetah.

Workload: 16 lanes of ``HalfCheetah-v5`` (1000-step episodes, EnvPool's and
gymnasium's default cap), a 2x256 tanh MLP with fixed random weights (17 ->
256 -> 256 -> 6, tanh head), episode i seeded with i. Contenders, each at
EnvPool ``num_threads`` 1 and 2 where it has threads:

1. ``hand XLA loop``: EnvPool's own XLA interface (``handle, recv, send,
   step = env.xla()``) in a jitted ``lax.fori_loop`` of ``E * 1000 / 16``
   batched steps with the same MLP and no per-episode accounting (the pool
   auto-resets; its seeds are per lane, so it runs other episodes). It runs
   in a child process: EnvPool's own XLA calls need ``jax_enable_x64``.
2. ``jaxmesh envpool``: ``jaxmesh.evaluate(policy, "envpool:HalfCheetah-v5"
   (num_threads=t), num_envs=16, seeds=range(E))``; the figure is env steps
   over the result's ``run_time`` (the segments; the call's wall time, which
   adds building the run's pool and compiling its program, is printed beside).
3. ``jaxmesh gymnasium``: the same call on ``"gymnasium:HalfCheetah-v5"``
   (jaxmesh's default for gymnasium envs).

Every figure is a median of ``--repeats`` interleaved runs (each hand loop
run right after jaxmesh's at the same thread count, its compile untimed).
The ratios printed are jaxmesh envpool over the hand loop at the same thread
count, and jaxmesh envpool over jaxmesh gymnasium.

Run: ``python benchmarks/envpool_xla.py [--quick] [--episodes 32]``
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

LANES, CAP = 16, 1000
TASK = "HalfCheetah-v5"


def weights(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [(17, 256), (256, 256), (256, 6)]
    return [(rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for s in sizes]


def mlp(w, obs):
    import jax.numpy as jnp

    h = jnp.tanh(obs @ w[0])
    h = jnp.tanh(h @ w[1])
    return jnp.tanh(h @ w[2])


def anchor(threads: int, iters: int, repeats: int) -> None:
    """The hand-written EnvPool XLA loop (child process): prints JSON."""
    import jax
    import jax.numpy as jnp
    from common import envpool_xla_loop

    jax.config.update("jax_enable_x64", True)
    w = [jnp.asarray(x) for x in weights()]
    policy = functools.partial(mlp, w)
    _, loop, handle, obs = envpool_xla_loop(TASK, LANES, threads, CAP, iters, policy)
    handle, obs, _ = jax.block_until_ready(loop(handle, obs))  # compile
    sps = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        handle, obs, _ = jax.block_until_ready(loop(handle, obs))
        sps.append(iters * LANES / (time.perf_counter() - t0))
    print(json.dumps(sps))


def run_anchor(threads: int, iters: int, repeats: int) -> list[float]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--anchor",
            str(threads),
            "--iters",
            str(iters),
            "--repeats",
            str(repeats),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--anchor", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--iters", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.anchor:
        anchor(args.anchor, args.iters, args.repeats)
        return 0
    if args.quick:
        args.episodes, args.repeats = 16, 2
    try:
        import envpool  # noqa: F401
    except ImportError:
        print("result: envpool: not measured (pip install 'jaxmesh[envpool]')")
        return 0
    import jax

    import jaxmesh

    w = [jax.numpy.asarray(x) for x in weights()]
    policy = lambda obs: mlp(w, obs)  # noqa: E731
    e = args.episodes
    iters = e * CAP // LANES
    print(
        f"envpool: {LANES} HalfCheetah-v5 lanes, {CAP}-step episodes, {e} episodes "
        f"per call, 2x256 tanh MLP; nproc {os.cpu_count()}, jax {jax.__version__}"
    )
    envs = {t: jaxmesh.make_env(f"envpool:{TASK}", num_threads=t) for t in (1, 2)}
    rows: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    returns = {}
    for _ in range(args.repeats):
        for t, env in envs.items():
            t0 = time.perf_counter()
            r = jaxmesh.evaluate(policy, env, num_envs=LANES, seeds=range(e))
            name = f"jaxmesh envpool, num_threads={t}"
            rows.setdefault(name, []).append(r.steps_per_second)
            walls.setdefault(name, []).append(r.env_steps / (time.perf_counter() - t0))
            returns.setdefault(name, []).append(np.asarray(r.returns))
            name = f"hand EnvPool XLA loop, num_threads={t}"
            rows.setdefault(name, []).extend(run_anchor(t, iters, 1))
        t0 = time.perf_counter()
        r = jaxmesh.evaluate(
            policy,
            "gymnasium:HalfCheetah-v5",
            num_envs=LANES,
            seeds=range(e),
            max_episode_steps=CAP,
        )
        name = "jaxmesh gymnasium (default workers)"
        rows.setdefault(name, []).append(r.steps_per_second)
        walls.setdefault(name, []).append(r.env_steps / (time.perf_counter() - t0))
    same = all(np.array_equal(a, returns[k][0]) for k in returns for a in returns[k])
    print(f"jaxmesh envpool returns equal across repeats and thread counts: {same}")
    print(f"{'contender':45s} {'steps/s (run)':>14s} {'steps/s (call)':>15s}")
    med = {k: statistics.median(v) for k, v in rows.items()}
    for k, v in med.items():
        call = f"{statistics.median(walls[k]):15.0f}" if k in walls else f"{'-':>15s}"
        print(f"{k:45s} {v:14.0f} {call}")
    gym = med["jaxmesh gymnasium (default workers)"]
    for t in (1, 2):
        ours = med[f"jaxmesh envpool, num_threads={t}"]
        hand = med[f"hand EnvPool XLA loop, num_threads={t}"]
        print(
            f"result: envpool: jaxmesh / hand XLA loop at num_threads={t}: "
            f"{ours / hand:.2f}x; jaxmesh envpool / jaxmesh gymnasium: "
            f"{ours / gym:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
