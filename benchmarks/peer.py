# ruff: noqa: E402 - OPENBLAS_NUM_THREADS must be set before numpy loads
"""jaxmesh against a Python loop over gymnasium's vectorized CartPole.

The peer is the loop most people write: ``gymnasium.make_vec("CartPole-v1",
num_envs=N, vectorization_mode="sync")`` with same-step autoreset (every
``step`` is a real env step for every lane; the obs of a lane whose episode
ended is already its reset obs), and the same 2x64 MLP (random init, the same
weights as jaxmesh's) applied to the batch of N observations, either as a
jitted jax function (``peer (jax policy)``) or as numpy matmuls
(``peer (numpy policy)``). It counts N env steps per loop iteration and keeps
only a reward sum (no exact budget, no per-episode records): that favours it.

jaxmesh runs ``evaluate`` on gymnax CartPole-v1 with the same N and weights;
its figure is ``result.steps_per_second`` of a warm call. Runs are interleaved
and each figure is a median.

Run: ``python benchmarks/peer.py [--quick]``
"""

from __future__ import annotations

import os

# Tiny numpy matmuls are fastest on one thread, and idle OpenBLAS threads spin
# on the cores the env loop needs (2.4 ms vs 58 us per 256-row forward here).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from common import header, init_mlp, interleave, machine, size_budget, table

import jaxmesh


def numpy_mlp(params):
    """The flax 2x64 MLP's forward in numpy (same weights): obs [N, 4] -> [N]."""
    layers = [
        (np.asarray(params["params"][f"Dense_{i}"]["kernel"]),)
        + (np.asarray(params["params"][f"Dense_{i}"]["bias"]),)
        for i in range(3)
    ]

    def act(obs):
        x = obs
        for w, b in layers[:-1]:
            x = np.maximum(x @ w + b, 0.0)
        w, b = layers[-1]
        return np.argmax(x @ w + b, axis=-1)

    return act


def jax_mlp(module, params):
    fn = jax.jit(lambda p, obs: jnp.argmax(module.apply(p, obs), -1))

    def act(obs):
        return np.asarray(fn(params, obs))

    return act


def peer_loop(num_envs: int, steps: int, act) -> dict:
    """One timed run of the gymnasium loop; returns its steps/s."""
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    try:
        obs, _ = envs.reset(seed=0)
        total = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            obs, reward, term, trunc, _ = envs.step(act(obs))
            total += float(reward.sum())
        dt = time.perf_counter() - t0
    finally:
        envs.close()
    return {"sps": num_envs * steps / dt, "run_time": dt}


def measure(num_envs: int, args, module, params) -> list[list]:
    n = num_envs
    policy = jaxmesh.Model(
        lambda p, obs: jnp.argmax(module.apply(p, obs)).astype(jnp.int32),
        params=params,
        name="mlp2x64",
    )
    env = "gymnax:CartPole-v1"
    acts = {"jax": jax_mlp(module, params), "numpy": numpy_mlp(params)}
    episodes = size_budget(
        lambda e: jaxmesh.evaluate(policy, env, num_envs=n, episodes=e),
        n,
        args.seconds,
    )
    peer_steps = {}
    for name, act in acts.items():
        act(np.zeros((n, 4), np.float32))  # compile
        steps = 20
        for _ in range(2):
            rate = peer_loop(n, steps, act)["sps"]
            steps = max(20, int(args.seconds * rate / n))
        peer_steps[name] = steps

    def run_jaxmesh():
        r = jaxmesh.evaluate(policy, env, num_envs=n, episodes=episodes)
        return {"sps": r.steps_per_second, "run_time": r.run_time}

    contenders = {"jaxmesh": run_jaxmesh}
    for name, act in acts.items():
        contenders[f"peer_{name}"] = lambda act=act, s=peer_steps[name]: peer_loop(
            n, s, act
        )
    med = interleave(contenders, args.repeats)
    jm = med["jaxmesh"]["sps"]
    rows = [[n, "jaxmesh.evaluate (gymnax)", med["jaxmesh"]["run_time"], jm, 1.0]]
    for name in acts:
        m = med[f"peer_{name}"]
        label = f"gymnasium sync loop ({name} policy)"
        rows.append([n, label, m["run_time"], m["sps"], jm / m["sps"]])
    return rows


def main(argv: list[str] | None = None) -> list[list]:
    """Prints the peer table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs-list", default="16,256", help="comma-separated N")
    ap.add_argument("--seconds", type=float, default=1.5, help="target run length")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats = 0.3, 1
    module, params = init_mlp((64, 64), 2)
    ns = [int(x) for x in args.num_envs_list.split(",")]
    print(
        header(
            "peer: jaxmesh vs a Python loop over gymnasium's vector CartPole-v1",
            {
                "N": ns,
                "policy": "mlp 2x64 (random init)",
                "run target s": args.seconds,
                "repeats": args.repeats,
                "gymnasium": gym.__version__,
                "jax": jax.__version__,
                "cpus": machine()["nproc"],
            },
        )
    )
    rows = []
    for n in ns:
        rows += measure(n, args, module, params)
    print(
        table(
            ["N", "runner", "run s", "env steps/s", "jaxmesh speed-up"],
            rows,
        )
    )
    print(
        "\njaxmesh speed-up = jaxmesh steps/s / that runner's steps/s. Medians of "
        "interleaved repeats.\n"
    )
    for n in ns:
        mine = [r for r in rows if r[0] == n]
        best = min(r[4] for r in mine[1:])
        print(f"result: jaxmesh over the best gymnasium loop at N={n}: {best:.3g}x")
    return rows


if __name__ == "__main__":
    main()
