"""Lanes stepped by Ray actors (``workers=jaxmesh.Ray(...)``), side by side with
worker processes and this process, on a local Ray cluster.

One run, one process (plus Ray's processes and the actors), repeats
interleaved, medians and ranges. No thread environment variable is set.

Part 1, the data path: what one step of 4 lanes costs through a Ray actor,
per round trip, for two ways of moving it: Ray's object store (an actor
method ``step(actions)`` called with ``actor.step.remote`` and ``ray.get``,
the envs resetting themselves) and jaxmesh's env server in the actor
(``jaxmesh.remote.server.actor.EnvActor``: gRPC, or shared memory on the
same node), driven by ``jaxmesh.RemoteVectorEnv``; beside them the same 4
envs stepped in this process (the simulator alone). CartPole-v1 and
Pendulum-v1.

Part 2, start-up: ``jaxmesh.evaluate`` with ``workers=jaxmesh.Ray(N)`` for
N = 1, 2, 4 (on a connection made before the call, so Ray's own start is
not counted; printed apart), 8 CartPole lanes, one step per episode: the
actors' start (placed, envs built, serving; the call's wall clock less its
compile and run) and the first step's latency (the run: a reset and one
step of every lane).

Part 3, the heavy Python simulator (``busyenv.BusyEnv``: ~4 ms of
pure-Python CPU a step, a Dict observation with a 64x64x3 image; 8 lanes,
30-step episodes): a hand loop in this process, ``workers=0``,
``workers=2`` (local processes) and ``workers=jaxmesh.Ray(num_workers=2)``;
env steps per second over the run (the loop, without start-up) and over the
call's wall clock, each repeat's per-episode returns checked equal to the
hand loop's.

Run: ``python benchmarks/ray_workers.py [--quick]`` (needs ``jaxmesh[ray]``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import ray
from busyenv import BusyEnv, calibrate
from common import goal, machine, median, table
from hostsim import batched, busy_act, host_loop

import jaxmesh
from jaxmesh.remote.server.actor import EnvActor

LANES = 4
RTOL, ATOL = 1e-4, 1e-3


class StoreStepper:
    """The object-store data path: envs in an actor, one method call a step."""

    def __init__(self, env_id: str, lanes: int):
        self.envs = [gym.make(env_id) for _ in range(lanes)]
        self.seed = 0

    def reset(self) -> np.ndarray:
        obs = []
        for e in self.envs:
            obs.append(e.reset(seed=self.seed)[0])
            self.seed += 1
        return np.stack(obs)

    def step(self, actions: np.ndarray) -> tuple:
        obs, rew, term, trunc = [], [], [], []
        for e, a in zip(self.envs, actions, strict=True):
            o, r, t, u, _ = e.step(a)
            if t or u:
                o = e.reset(seed=self.seed)[0]
                self.seed += 1
            obs.append(o)
            rew.append(r)
            term.append(t)
            trunc.append(u)
        return np.stack(obs), np.asarray(rew), np.asarray(term), np.asarray(trunc)


def actions_for(space: gym.Space, n: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return np.zeros(n, np.int64)
    return np.zeros((n, *space.shape), space.dtype)


def store_loop(actor, actions: np.ndarray, steps: int) -> float:
    ray.get(actor.reset.remote())
    t0 = time.perf_counter()
    for _ in range(steps):
        ray.get(actor.step.remote(actions))
    return (time.perf_counter() - t0) / steps


def served_loop(venv, actions: np.ndarray, steps: int) -> float:
    venv.reset(seed=list(range(venv.num_envs)))
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = venv.step(actions)
        done = term | trunc
        if done.any():
            venv.reset(options={"reset_mask": done})
    return (time.perf_counter() - t0) / steps


def local_loop(envs, actions: np.ndarray, steps: int) -> float:
    for i, e in enumerate(envs):
        e.reset(seed=i)
    t0 = time.perf_counter()
    for _ in range(steps):
        for e, a in zip(envs, actions, strict=True):
            _, _, t, u, _ = e.step(a)
            if t or u:
                e.reset()
    return (time.perf_counter() - t0) / steps


def part_data_path(args) -> list[str]:
    out = []
    rows = []
    store_cls = ray.remote(num_cpus=1)(StoreStepper)
    served_cls = ray.remote(num_cpus=1)(EnvActor)
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        envs = [gym.make(env_id) for _ in range(LANES)]
        actions = actions_for(envs[0].action_space, LANES)
        store = store_cls.remote(env_id, LANES)
        ray.get(store.reset.remote())
        venvs = {}
        actors = []
        for name, opts in (("shm", {}), ("grpc", {"shared_memory": False})):
            a = served_cls.remote(f"gymnasium:{env_id}", range(LANES), "t" * 16, opts)
            actors.append(a)
            address = ray.get(a.serve.remote())
            venvs[name] = jaxmesh.RemoteVectorEnv(address, token="t" * 16)
        runs: dict[str, list[float]] = {
            k: [] for k in ("local", "store", "grpc", "shm")
        }
        store_loop(store, actions, 50)  # warm-up
        served_loop(venvs["shm"], actions, 50)
        served_loop(venvs["grpc"], actions, 50)
        for _ in range(args.repeats):
            runs["local"].append(local_loop(envs, actions, args.steps))
            runs["store"].append(store_loop(store, actions, args.steps))
            runs["grpc"].append(served_loop(venvs["grpc"], actions, args.steps))
            runs["shm"].append(served_loop(venvs["shm"], actions, args.steps))
        for v in venvs.values():
            v.close()
        for a in [store, *actors]:
            ray.kill(a)
        for e in envs:
            e.close()
        names = {
            "local": "the 4 envs in this process (no wire)",
            "store": "Ray object store (actor.step.remote + ray.get)",
            "grpc": "jaxmesh env server in the actor, gRPC",
            "shm": "jaxmesh env server in the actor, shared memory",
        }
        for k, label in names.items():
            us = [x * 1e6 for x in runs[k]]
            rows.append([env_id, label, median(us), f"{min(us):.0f}-{max(us):.0f}"])
        ratio = median([s / m for s, m in zip(runs["store"], runs["shm"], strict=True)])
        ratio_g = median(
            [s / m for s, m in zip(runs["store"], runs["grpc"], strict=True)]
        )
        out.append(
            f"result: ray_workers: {env_id}: object store / env server per step: "
            f"{ratio:.2f}x (shared memory), {ratio_g:.2f}x (gRPC)"
        )
    print(f"\n### 1: one step of {LANES} lanes through one actor (us per step)\n")
    print(table(["env", "data path", "median us", "range"], rows))
    return out


def part_startup(args) -> list[str]:
    out, rows = [], []

    def policy(obs):
        return (obs[..., 2] > 0).astype(jnp.int32)

    for n in (1, 2, 4):
        starts, firsts = [], []
        for _ in range(args.repeats):
            r = jaxmesh.evaluate(
                policy,
                "gymnasium:CartPole-v1",
                num_envs=8,
                episodes=8,
                max_episode_steps=1,
                workers=jaxmesh.Ray(num_workers=n, num_cpus_per_worker=0.5),
            )
            starts.append(r.wall_time - r.run_time - r.compile_time)
            firsts.append(r.run_time)
        rows.append(
            [
                n,
                median(starts),
                f"{min(starts):.2f}-{max(starts):.2f}",
                median(firsts) * 1e3,
                f"{min(firsts) * 1e3:.0f}-{max(firsts) * 1e3:.0f}",
            ]
        )
        out.append(
            f"result: ray_workers: start-up N={n}: {median(starts):.2f} s, first "
            f"step {median(firsts) * 1e3:.0f} ms"
        )
    print("\n### 2: actor start-up and first step, 8 CartPole lanes\n")
    print(
        table(
            ["actors", "start-up s", "range", "first step ms", "range"],
            rows,
        )
    )
    return out


def run_jaxmesh(policy, factory, seeds, cap, workers) -> tuple[dict, np.ndarray]:
    t0 = time.perf_counter()
    r = jaxmesh.evaluate(
        policy, factory, num_envs=8, seeds=seeds, max_episode_steps=cap, workers=workers
    )
    wall = time.perf_counter() - t0
    figures = {
        "run_sps": r.env_steps / r.run_time,
        "wall_sps": r.env_steps / wall,
    }
    return figures, np.asarray(r.returns, np.float64)


def part_heavy(args) -> list[str]:
    n, cap = 8, 30
    loops = calibrate(args.busy_ms)
    seeds = list(range(args.episodes))
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(0.0, 0.5, (8, 2)).astype(np.float32)}
    forward = batched(busy_act, params)
    policy = jaxmesh.Model(busy_act, params=params, name="busy_state_policy")
    factory = functools.partial(BusyEnv, loops=loops, episode_steps=cap)
    envs = [factory() for _ in range(n)]

    def hand():
        t0 = time.perf_counter()
        figures, returns = host_loop(envs, seeds, cap, forward)
        wall = time.perf_counter() - t0
        return {"run_sps": figures["sps"], "wall_sps": figures["steps"] / wall}, returns

    contenders = {
        "hand loop (this process)": hand,
        "jaxmesh workers=0": lambda: run_jaxmesh(policy, factory, seeds, cap, 0),
        "jaxmesh workers=2 (processes)": lambda: run_jaxmesh(
            policy, factory, seeds, cap, 2
        ),
        "jaxmesh workers=Ray(num_workers=2)": lambda: run_jaxmesh(
            policy, factory, seeds, cap, jaxmesh.Ray(num_workers=2)
        ),
    }
    ref = None
    runs: dict[str, list[dict]] = {k: [] for k in contenders}
    agree: dict[str, bool] = dict.fromkeys(contenders, True)
    for fn in contenders.values():  # warm-up: compiles, imports
        fn()
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            figures, returns = fn()
            if ref is None:
                ref = returns
            agree[name] &= bool(np.allclose(returns, ref, rtol=RTOL, atol=ATOL))
            runs[name].append(figures)
    for e in envs:
        e.close()
    rows = []
    for name, rs in runs.items():
        run_sps = [r["run_sps"] for r in rs]
        wall_sps = [r["wall_sps"] for r in rs]
        rows.append(
            [
                name,
                median(run_sps),
                f"{min(run_sps):.0f}-{max(run_sps):.0f}",
                median(wall_sps),
                f"{min(wall_sps):.0f}-{max(wall_sps):.0f}",
                "yes" if agree[name] else "NO",
            ]
        )
    print(
        f"\n### 3: {n} lanes of a {args.busy_ms:g} ms pure-Python sim, "
        f"{args.episodes} episodes of {cap} steps (env steps/s)\n"
    )
    print(
        table(
            ["contender", "run", "range", "wall", "range", "returns equal"],
            rows,
        )
    )

    def ratio(a: str, b: str, key: str) -> tuple[float, float, float]:
        xs = [x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True)]
        return median(xs), min(xs), max(xs)

    ray_name = "jaxmesh workers=Ray(num_workers=2)"
    # The per-step cost (start-up is part 2's): env steps/s over the run.
    m, _, _ = ratio(ray_name, "jaxmesh workers=2 (processes)", "run_sps")
    out = [goal("Ray(2) over workers=2 processes, over the run, >= 0.8x", m, m >= 0.8)]
    for other in ("jaxmesh workers=2 (processes)", "hand loop (this process)"):
        for key in ("run_sps", "wall_sps"):
            m, lo, hi = ratio(ray_name, other, key)
            out.append(
                f"result: ray_workers: Ray(2) over {other}, {key}: {m:.2f}x "
                f"({lo:.2f}-{hi:.2f})"
            )
    if not all(agree.values()):
        out.append("result: ray_workers: RETURNS DIFFER")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--episodes", type=int, default=48)
    p.add_argument("--busy-ms", type=float, default=4.0)
    p.add_argument("--parts", default="1,2,3")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.episodes = 2, 200, 16
    print(f"machine: {machine()}; ray {ray.__version__}; jaxmesh {jaxmesh.__version__}")
    t0 = time.perf_counter()
    # 4 logical CPUs: N = 4 actors of 0.5 CPU and 2 of 1 fit; the machine has
    # os.cpu_count() cores whatever Ray is told.
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
    print(f"ray.init (a local cluster): {time.perf_counter() - t0:.2f} s")
    out = []
    try:
        parts = args.parts.split(",")
        if "1" in parts:
            out += part_data_path(args)
        if "2" in parts:
            out += part_startup(args)
        if "3" in parts:
            out += part_heavy(args)
    finally:
        ray.shutdown()
    print()
    print("\n".join(out))
    print(f"cores: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
