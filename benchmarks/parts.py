"""Costs of the parts of one env step over N CartPole lanes (evidence for overhead).

Times, per call and inside one jitted ``fori_loop`` (so dispatch is excluded):

- gymnax CartPole ``reset_env`` vmapped over all N lanes (what an engine pays on
  a step where any lane starts an episode, when it resets every lane and
  selects), and over ``N / mean_len`` lanes (about how many lanes start per step
  with ~11-step episodes: what resetting only the starting lanes would cost),
- ``step_env`` vmapped over N lanes,
- per-lane keys: two ``fold_in`` per lane (jaxmesh's env-step keys) against one
  ``jax.random.split(key, N)`` (the bare scan's).

Each part's loop body also derives N keys with one ``fold_in`` (so its input
changes every iteration); that baseline is timed alone and subtracted.
Interleaved repeats, medians.

Run: ``python benchmarks/parts.py [--quick]``
"""

from __future__ import annotations

import argparse
import time

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from common import header, machine, table


def looped(fn, n: int, iters: int):
    """jit(fori_loop) calling ``fn(keys [n, 2], i) -> scalar`` ``iters`` times."""
    keys0 = jax.vmap(jax.random.PRNGKey)(jnp.arange(n))

    def run(x):
        def body(i, acc):
            keys = jax.vmap(jax.random.fold_in, (0, None))(keys0, i)
            # Keeps every lane's key live whatever fn reads (x * 0.0 is not
            # folded for floats), so the baseline is the same in every loop.
            live = jnp.sum(keys).astype(jnp.float32) * 0.0
            return acc + fn(keys, i) + live

        return jax.lax.fori_loop(0, iters, body, x)

    return jax.jit(run)


def main(argv: list[str] | None = None) -> list[list]:
    """Prints the parts table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs", type=int, default=1024, help="lanes N")
    ap.add_argument("--mean-len", type=float, default=11.1, help="mean episode length")
    ap.add_argument("--iters", type=int, default=200, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.iters, args.repeats = 50, 3
    n = args.num_envs
    few = max(1, round(n / args.mean_len))
    env, params = gymnax.make("CartPole-v1")
    _, state = jax.vmap(env.reset_env, (0, None))(
        jax.random.split(jax.random.PRNGKey(0), n), params
    )

    def reset(keys, i):
        obs, _ = jax.vmap(env.reset_env, (0, None))(keys, params)
        return jnp.sum(obs)

    def step(keys, i):
        action = (keys[:, 0] % 2).astype(jnp.int32)
        obs, *_ = jax.vmap(env.step_env, (0, 0, 0, None))(keys, state, action, params)
        return jnp.sum(obs)

    def fold2(keys, i):
        t = jnp.full((n,), i)
        k = jax.vmap(lambda k, s: jax.random.fold_in(jax.random.fold_in(k, 0), s))(
            keys, t
        )
        return jnp.sum(k).astype(jnp.float32)

    def split(keys, i):
        return jnp.sum(jax.random.split(keys[0], n)).astype(jnp.float32)

    def nothing(keys, i):
        return jnp.float32(0)

    parts = {
        f"reset_env over all N={n} lanes": (reset, n),
        f"reset_env over N/mean_len={few} lanes": (reset, few),
        f"step_env over N={n} lanes": (step, n),
        "keys: 2x fold_in per lane (jaxmesh)": (fold2, n),
        "keys: split(key, N) (bare scan)": (split, n),
    }
    baselines = {m: looped(nothing, m, args.iters) for m in {n, few}}
    loops = {name: looped(fn, m, args.iters) for name, (fn, m) in parts.items()}
    every = {**{("base", m): f for m, f in baselines.items()}, **loops}
    for f in every.values():
        f(jnp.float32(0)).block_until_ready()
    times: dict = {k: [] for k in every}
    for _ in range(args.repeats):
        for k, f in every.items():
            t0 = time.perf_counter()
            f(jnp.float32(0)).block_until_ready()
            times[k].append((time.perf_counter() - t0) / args.iters * 1e6)
    med = {k: float(np.median(v)) for k, v in times.items()}
    rows = [[name, m, med[name] - med[("base", m)]] for name, (_, m) in parts.items()]
    print(
        header(
            "parts: costs inside one step of N gymnax CartPole lanes",
            {
                "N": n,
                "iters": args.iters,
                "repeats": args.repeats,
                "jax": jax.__version__,
                "cpus": machine()["nproc"],
            },
        )
    )
    print(table(["part", "lanes", "us per call"], rows))
    print(
        "\nus per call, minus a baseline loop that only derives the keys. Medians "
        "of interleaved repeats."
    )
    return rows


if __name__ == "__main__":
    main()
