"""A HostPolicy against the same MLP written in jnp, on gymnax CartPole.

Contenders, interleaved, same budget and seeds (returns checked equal):

(a) ``jax``: a 2x256 tanh MLP in ``jnp`` as a plain JAX policy, planned inside
    the jitted scan;
(b) ``host``: the same MLP in numpy as ``jaxmesh.HostPolicy``: each plan call
    (one tile of the lanes that plan) leaves the compiled loop through
    ``jax.pure_callback``, runs the numpy forward and comes back.

Prints env steps/s of each, the ratio host/jax, and the cost of one plan call:
(b)'s run time less (a)'s, over the number of callback calls (the forward's
own numpy time, and the rest, the callback's, are reported apart).

    .venv/bin/python benchmarks/host_policy.py [--lanes 16 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import gymnax
import jax.numpy as jnp
import numpy as np
from common import header, interleave, machine, table

import jaxmesh

HIDDEN = 256


def weights(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(4, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 2)]
    return [(rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--episodes-per-lane", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    w1, w2, w3 = weights()
    env = gymnax.make("CartPole-v1")
    calls = {"n": 0, "s": 0.0}

    def numpy_mlp(obs):
        t0 = time.perf_counter()
        x = np.tanh(np.tanh(obs @ w1) @ w2) @ w3
        out = np.argmax(x, -1).astype(np.int32)
        calls["n"] += 1
        calls["s"] += time.perf_counter() - t0
        return out

    def jnp_mlp(obs):
        x = jnp.tanh(jnp.tanh(obs @ w1) @ w2) @ w3
        return jnp.argmax(x, -1).astype(jnp.int32)

    host = jaxmesh.HostPolicy(numpy_mlp)
    print(header("HostPolicy vs a JAX policy", {"hidden": f"2x{HIDDEN}", **machine()}))
    rows = []
    for n in args.lanes:
        seeds = list(range(n * args.episodes_per_lane))
        results = {}

        def run(policy, name, n=n, seeds=seeds, results=results):
            calls["n"], calls["s"] = 0, 0.0
            r = jaxmesh.evaluate(policy, env, num_envs=n, seeds=seeds)
            results[name] = r
            return {
                "t": r.run_time,
                "steps": r.env_steps,
                "calls": calls["n"],
                "fwd": calls["s"],
            }

        med = interleave(
            {"jax": lambda: run(jnp_mlp, "jax"), "host": lambda: run(host, "host")},
            args.repeats,
        )
        np.testing.assert_array_equal(results["jax"].returns, results["host"].returns)
        jx, hp = med["jax"], med["host"]
        per_call = (hp["t"] - jx["t"]) / max(hp["calls"], 1)
        rows.append(
            [
                n,
                f"{jx['steps'] / jx['t']:,.0f}",
                f"{hp['steps'] / hp['t']:,.0f}",
                f"{jx['t'] / hp['t']:.2f}x",
                int(hp["calls"]),
                f"{1e6 * per_call:.0f}",
                f"{1e6 * hp['fwd'] / max(hp['calls'], 1):.0f}",
                f"{1e6 * (per_call - hp['fwd'] / max(hp['calls'], 1)):.0f}",
            ]
        )
    print(
        table(
            [
                "lanes",
                "jax steps/s",
                "host steps/s",
                "host / jax",
                "plan calls",
                "us added per call",
                "us numpy forward per call",
                "us callback per call",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
