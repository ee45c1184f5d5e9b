"""LIBERO episodes per hour: openpi's plain loop against jaxmesh with 1 and 2 workers.

The shipped config's setting (configs/libero_spatial.yaml): task 0 of
libero_spatial, both cameras at 64x64 (OSMesa, software), 10 settle steps, the
suite's cap of 220 steps, and its scripted policy (``jaxmesh.zoo.libero``,
chunks of 5 executed whole), which never succeeds, so every episode runs its
full 220 steps (the slowest case: a good policy ends episodes earlier).

- ``plain``: openpi's LIBERO client loop in one process (one env: seed, reset,
  init state, settle, then a plan every 5 steps), the policy jitted;
- ``jaxmesh, W workers``: ``jaxmesh.evaluate(scripted, "libero:...",
  num_envs=W, workers=W, horizon=5)``, W worker processes each stepping a lane.

Every figure is wall time over the whole run, process start and env
construction included (what a user waits for), as episodes per hour. It first
times LIBERO itself: an env's construction, a reset (seed, reset, init state,
settle) and a step, state only and with 64 and 256 pixel cameras.

Run: ``python benchmarks/libero_speed.py [--quick] [--episodes E]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np
from common import header, table

import jaxmesh
from jaxmesh.envs import libero
from jaxmesh.zoo.libero import KEYS, chunk, scripted

SUITE, TASK, HORIZON = "libero_spatial", 0, 5


def _libero_env(camera_size):
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv, OffScreenRenderEnv

    with contextlib.redirect_stdout(sys.stderr):
        t = benchmark.get_benchmark_dict()[SUITE]().get_task(TASK)
    bddl = os.path.join(get_libero_path("bddl_files"), t.problem_folder, t.bddl_file)
    if camera_size is None:
        return ControlEnv(
            bddl_file_name=bddl, use_camera_obs=False, has_offscreen_renderer=False
        )
    return OffScreenRenderEnv(
        bddl_file_name=bddl, camera_heights=camera_size, camera_widths=camera_size
    )


def _init_states():
    from libero.libero import benchmark

    with contextlib.redirect_stdout(sys.stderr):  # LIBERO prints its task order
        suite = benchmark.get_benchmark_dict()[SUITE]()
    return suite.get_task_init_states(TASK)


def costs(camera_size, resets: int = 2, steps: int = 20) -> tuple[float, float, float]:
    """LIBERO's own: construction (s), a reset with its settle steps (s), a
    step (ms)."""
    libero._gl_backend()
    t0 = time.perf_counter()
    env = _libero_env(camera_size)
    make = time.perf_counter() - t0
    init = _init_states()
    reset, step = [], []
    for k in range(resets):
        t0 = time.perf_counter()
        env.seed(k)
        env.reset()
        env.set_init_state(init[k])
        for _ in range(libero.DEFAULT_SETTLE_STEPS):
            env.step(list(libero.DUMMY_ACTION))
        reset.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step([0.1, 0, 0, 0, 0, 0, -1])
        step.append((time.perf_counter() - t0) / steps)
    env.close()
    return make, float(np.median(reset)), 1e3 * float(np.median(step))


def plain_loop(episodes: int, camera_size: int, cap: int) -> float:
    """openpi's client loop, one env, the scripted policy jitted; wall seconds."""
    import collections

    import jax

    t0 = time.perf_counter()
    plan = jax.jit(chunk)
    env = _libero_env(camera_size)
    init = _init_states()
    for i in range(episodes):
        env.seed(i)
        env.reset()
        obs = env.set_init_state(init[i % len(init)])
        queue: collections.deque = collections.deque()
        t = 0
        while t < cap + libero.DEFAULT_SETTLE_STEPS:
            if t < libero.DEFAULT_SETTLE_STEPS:
                obs, _, done, _ = env.step(list(libero.DUMMY_ACTION))
                t += 1
                continue
            if not queue:
                planned = plan({k: np.float32(obs[k]) for k in KEYS})
                queue.extend(np.asarray(planned)[:HORIZON])
            obs, _, done, _ = env.step(queue.popleft().tolist())
            if done:
                break
            t += 1
    env.close()
    return time.perf_counter() - t0


def with_jaxmesh(episodes: int, camera_size: int, cap: int, workers: int) -> float:
    t0 = time.perf_counter()
    jaxmesh.evaluate(
        scripted,
        f"libero:{SUITE}/{TASK}",
        env_config={"camera_size": camera_size, "max_episode_steps": cap},
        episodes=episodes,
        num_envs=workers,
        workers=workers,
        horizon=HORIZON,
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 episodes, 40 steps")
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--camera-size", type=int, default=64)
    args = ap.parse_args()
    episodes = args.episodes or (2 if args.quick else 6)
    cap = 40 if args.quick else libero.SUITES[SUITE]
    size = args.camera_size
    print(
        header(
            "LIBERO: episodes per hour",
            {
                "task": f"{SUITE}/{TASK}",
                "episodes": episodes,
                "cap": cap,
                "camera_size": size,
                "cores": os.cpu_count(),
            },
        )
    )
    rows = []
    for cams in (None, 64, 256):
        make, reset, step = costs(cams, resets=1 if args.quick else 2)
        rows.append(
            [
                "state only" if cams is None else f"{cams}x{cams} cameras",
                make,
                reset,
                step,
            ]
        )
    print(table(["LIBERO env", "make (s)", "reset + settle (s)", "step (ms)"], rows))
    print()
    runs = [("plain loop (openpi's client)", lambda: plain_loop(episodes, size, cap))]
    for w in (1, 2):
        runs.append(
            (
                f"jaxmesh, {w} worker{'s' if w > 1 else ''}",
                lambda w=w: with_jaxmesh(episodes, size, cap, w),
            )
        )
    rows, base = [], None
    for name, fn in runs:
        wall = fn()
        per_hour = 3600 * episodes / wall
        base = base or per_hour
        rows.append([name, wall, per_hour, per_hour / base])
        print(f"result: {name}: {per_hour:.0f} episodes/hour", flush=True)
    print()
    print(table(["run", "wall (s)", "episodes / hour", "x plain"], rows))


if __name__ == "__main__":
    main()
