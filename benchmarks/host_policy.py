"""A HostPolicy against the same MLP in jnp, and against a hand loop.

A. gymnax CartPole; contenders, interleaved, same budget and seeds (returns
checked equal):

(a) ``jax``: a 2x256 tanh MLP in ``jnp`` as a plain JAX policy, planned inside
    the jitted scan;
(b) ``host``: the same MLP in numpy as ``jaxmesh.HostPolicy``: each plan call
    (one tile of the lanes that plan) leaves the compiled loop through
    ``jax.pure_callback``, runs the numpy forward and comes back.

Prints env steps/s of each, the ratio host/jax, what (b) adds per plan call
((b)'s run time less (a)'s, over its calls) and (b)'s numpy forward per call.

B. 16 gymnasium ``HalfCheetah-v5`` lanes, 200-step episodes, the 2x256 tanh MLP
of ``mlp.py`` in numpy: ``evaluate`` with it as a HostPolicy against
``hostsim.host_loop`` calling the same numpy function on the [16, 17]
observations (returns checked close: jaxmesh sums rewards in float32), and
``evaluate`` with the same MLP in jnp (``mlp.act``) as a JAX policy (its
jitted agent step). A HostPolicy that reads the whole observation and replays
its chunks plainly runs its numpy agent step here (``run.host.direct``): no
callback, ``fn`` called from the host loop.

Thread settings stay as the user has them (nothing sets
``OPENBLAS_NUM_THREADS``): the figures are what a user gets.

    cd benchmarks && ../.venv/bin/python host_policy.py [--lanes 16 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from common import goal, header, interleave, machine, table
from hostsim import host_loop
from mlp import act, init_params
from remote_common import make_envs

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
    ap.add_argument("--cheetah-episodes", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="small sizes")
    args = ap.parse_args()
    if args.quick:
        args.lanes, args.episodes_per_lane, args.repeats = [16], 4, 1
        args.cheetah_episodes = 16  # one per lane: the hand loop's least
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
    print(
        header(
            "A: HostPolicy vs a JAX policy, gymnax CartPole",
            {"hidden": f"2x{HIDDEN}", **machine()},
        )
    )
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
            ],
            rows,
        )
    )
    cheetah(args.repeats, args.cheetah_episodes)


def numpy_cheetah(p: dict) -> callable:
    """``mlp.act`` in numpy: obs [B, 17] -> actions [B, 6]."""

    def forward(obs: np.ndarray) -> np.ndarray:
        h = np.tanh(np.tanh(obs @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])
        return np.tanh(h @ p["w3"] + p["b3"])

    return forward


def cheetah(repeats: int, episodes: int, lanes: int = 16, cap: int = 200) -> None:
    params = init_params(0)
    forward = numpy_cheetah(params)
    envs = make_envs("halfcheetah", lanes)
    seeds = list(range(episodes))
    as_jax = jaxmesh.Model(act, params=jax.device_put(params), name="jnp MLP")
    host = jaxmesh.HostPolicy(forward)  # one object: its program compiles once
    returns = {}

    def hand():
        figures, returns["hand"] = host_loop(envs, seeds, cap, forward)
        return figures

    def run(policy, name):
        t0 = time.perf_counter()
        r = jaxmesh.evaluate(
            policy, envs, num_envs=lanes, seeds=seeds, max_episode_steps=cap
        )
        wall = time.perf_counter() - t0
        returns[name] = np.asarray(r.returns, np.float64)
        return {"sps": r.env_steps / wall, "wall": wall, "steps": float(r.env_steps)}

    contenders = {
        "hand loop, numpy MLP": hand,
        "evaluate, HostPolicy (numpy MLP)": lambda: run(host, "host"),
        "evaluate, the MLP in jnp": lambda: run(as_jax, "jax"),
    }
    med = interleave(contenders, repeats)
    np.testing.assert_allclose(returns["host"], returns["hand"], rtol=1e-4, atol=1e-3)
    base = med["hand loop, numpy MLP"]["sps"]
    print(f"\n### B: {lanes} HalfCheetah-v5 lanes, {episodes} x {cap}-step episodes\n")
    rows = [
        [
            name,
            f"{m['sps']:,.0f}",
            f"{m['sps'] / base:.2f}x",
            f"{1e6 * lanes / m['sps']:.0f}",
        ]
        for name, m in med.items()
    ]
    print(table(["contender", "env steps/s", "ratio", "us per agent step"], rows))
    ratio = med["evaluate, HostPolicy (numpy MLP)"]["sps"] / base
    print(goal("HostPolicy >= 0.9x the hand loop (HalfCheetah)", ratio, ratio >= 0.9))


if __name__ == "__main__":
    main()
