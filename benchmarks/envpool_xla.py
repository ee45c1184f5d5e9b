"""EnvPool tasks inside jaxmesh's jitted loop, beside a hand-written EnvPool XLA
loop with the same network (and jaxmesh on gymnasium's HalfCheetah).

Workloads, each at EnvPool ``num_threads`` 1 and 2:

- ``HalfCheetah-v5``: 16 lanes, 1000-step episodes (EnvPool's and gymnasium's
  default cap), a 2x256 tanh MLP with fixed random weights (17 -> 256 -> 256
  -> 6, tanh head), episode i seeded with i.
- ``Pong-v5``: 8 lanes, episodes cut at 500 agent steps (2,000 frames), the
  small DQN conv net of ``jaxmesh.zoo.atari`` (fixed random weights; uint8
  ``[4, 84, 84]`` frames in, a greedy action out), episode i seeded with i.

Contenders:

1. ``hand XLA loop``: EnvPool's own XLA interface (``handle, recv, send,
   step = env.xla()``) in a jitted ``lax.fori_loop`` of about as many batched
   steps as jaxmesh's call, the same network, no per-episode accounting (the
   pool auto-resets; its seeds are per lane, so it runs other episodes). It
   runs in one child process kept for the whole benchmark (EnvPool's own XLA
   calls need ``jax_enable_x64``), its loops compiled before any timing.
2. ``jaxmesh envpool``: ``jaxmesh.evaluate(policy, "envpool:<id>"
   (num_threads=t), num_envs=N, seeds=range(E))``; the figure is env steps
   over the result's ``run_time`` (the segments; the call's wall time, which
   adds building the run's pool and compiling its program, is printed beside).
3. ``jaxmesh gymnasium`` (HalfCheetah only): the same call on
   ``"gymnasium:HalfCheetah-v5"`` (jaxmesh's default for gymnasium envs).

Repeats are interleaved: each jaxmesh call is followed at once by the hand loop
at the same thread count, and the ratio printed is the median over repeats of
each such pair's ratio (on shared cores, a pair sees the same load), beside
the ratio of the medians.

Run: ``python benchmarks/envpool_xla.py [--quick] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

THREADS = (1, 2)


def weights(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [(17, 256), (256, 256), (256, 6)]
    return [(rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for s in sizes]


def mlp(w, obs):
    import jax.numpy as jnp

    h = jnp.tanh(obs @ w[0])
    h = jnp.tanh(h @ w[1])
    return jnp.tanh(h @ w[2])


#: name -> (task, lanes, episode cap, episodes per call (quick: half))
WORKLOADS = {
    "HalfCheetah": ("HalfCheetah-v5", 16, 1000, 32),
    "Pong": ("Pong-v5", 8, 500, 16),
}
#: What jaxmesh passes to Atari tasks by default; the hand loop gets the same.
ATARI = {"episodic_life": False, "reward_clip": False}


def policies(name: str) -> tuple:
    """(jaxmesh's one-lane policy, the hand loop's batched policy, raw):
    the same network."""
    import jax

    if name == "Pong":
        from jaxmesh.zoo import atari

        return atari.pong, jax.vmap(atari.pong), True
    w = [jax.numpy.asarray(x) for x in weights()]
    one = functools.partial(mlp, w)
    return one, one, False


def _child(conn, iters: dict) -> None:
    """The hand loops (x64 on), one per (workload, threads), compiled first;
    answers (workload, threads) with the env steps/s of one timed run."""
    import jax

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import envpool_xla_loop

    loops = {}
    for name, (task, lanes, cap, _) in WORKLOADS.items():
        _, batch, raw = policies(name)
        extra = ATARI if name == "Pong" else {}
        for t in THREADS:
            env, loop, h, o = envpool_xla_loop(
                task, lanes, t, cap, iters[name], batch, raw=raw, **extra
            )
            h, o, _ = jax.block_until_ready(loop(h, o))  # compile
            loops[name, t] = [env, loop, h, o]
    conn.send("ready")
    while True:
        try:
            key = conn.recv()
        except EOFError:
            return
        if key is None:
            return
        env, loop, h, o = loops[key]
        t0 = time.perf_counter()
        h, o, _ = jax.block_until_ready(loop(h, o))
        wall = time.perf_counter() - t0
        loops[key][2:] = [h, o]
        conn.send(iters[key[0]] * WORKLOADS[key[0]][1] / wall)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 2
    try:
        import envpool  # noqa: F401
    except ImportError:
        print("result: envpool: not measured (pip install 'jaxmesh[envpool]')")
        return 0
    import jax

    import jaxmesh

    episodes = {k: v[3] // (2 if args.quick else 1) for k, v in WORKLOADS.items()}
    iters = {k: episodes[k] * v[2] // v[1] for k, v in WORKLOADS.items()}
    ctx = mp.get_context("spawn")
    conn, child_end = ctx.Pipe()
    child = ctx.Process(target=_child, args=(child_end, iters), daemon=True)
    child.start()
    child_end.close()
    print(
        f"envpool: nproc {os.cpu_count()}, jax {jax.__version__}, envpool "
        f"{envpool.__version__}; load average {os.getloadavg()[0]:.1f} at the start"
    )
    envs = {
        (name, t): jaxmesh.make_env(
            f"envpool:{task}", num_threads=t, max_episode_steps=cap
        )
        for name, (task, _, cap, _) in WORKLOADS.items()
        for t in THREADS
    }
    ours = {name: policies(name)[0] for name in WORKLOADS}
    assert conn.recv() == "ready"
    rows: dict[str, list[float]] = {}
    calls: dict[str, list[float]] = {}
    pairs: dict[tuple, list[float]] = {}
    returns: dict[str, list[np.ndarray]] = {}
    gym = "jaxmesh gymnasium HalfCheetah (default workers)"
    for _ in range(args.repeats):
        for (name, t), env in envs.items():
            task, lanes, cap, _ = WORKLOADS[name]
            t0 = time.perf_counter()
            r = jaxmesh.evaluate(
                ours[name], env, num_envs=lanes, seeds=range(episodes[name])
            )
            call = time.perf_counter() - t0
            conn.send((name, t))
            hand = conn.recv()
            row = f"jaxmesh {name}, num_threads={t}"
            rows.setdefault(row, []).append(r.steps_per_second)
            calls.setdefault(row, []).append(r.env_steps / call)
            rows.setdefault(f"hand XLA loop {name}, num_threads={t}", []).append(hand)
            pairs.setdefault((name, t), []).append(r.steps_per_second / hand)
            returns.setdefault(name, []).append(np.asarray(r.returns))
        t0 = time.perf_counter()
        r = jaxmesh.evaluate(
            ours["HalfCheetah"],
            "gymnasium:HalfCheetah-v5",
            num_envs=16,
            seeds=range(episodes["HalfCheetah"]),
            max_episode_steps=1000,
        )
        rows.setdefault(gym, []).append(r.steps_per_second)
        calls.setdefault(gym, []).append(r.env_steps / (time.perf_counter() - t0))
    conn.send(None)
    child.join(timeout=30)
    for name, rs in returns.items():
        same = all(np.array_equal(a, rs[0]) for a in rs)
        print(f"jaxmesh {name} returns equal across repeats and thread counts: {same}")
    print(f"{'contender':48s} {'steps/s (run)':>14s} {'steps/s (call)':>15s}")
    med = {k: statistics.median(v) for k, v in rows.items()}
    for k, v in med.items():
        call = f"{statistics.median(calls[k]):15.0f}" if k in calls else f"{'-':>15s}"
        print(f"{k:48s} {v:14.0f} {call}")
    for (name, t), ratios in pairs.items():
        ours_med = med[f"jaxmesh {name}, num_threads={t}"]
        hand_med = med[f"hand XLA loop {name}, num_threads={t}"]
        print(
            f"result: envpool: jaxmesh / hand XLA loop, {name}, num_threads={t}: "
            f"{statistics.median(ratios):.2f}x (pairs: "
            f"{', '.join(f'{x:.2f}' for x in ratios)}; medians "
            f"{ours_med / hand_med:.2f}x)"
        )
    for t in THREADS:
        cheetah = med[f"jaxmesh HalfCheetah, num_threads={t}"]
        print(
            f"result: envpool: jaxmesh envpool / jaxmesh gymnasium HalfCheetah at "
            f"num_threads={t}: {cheetah / med[gym]:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
