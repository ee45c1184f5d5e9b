"""LIBERO with a served policy: openpi's example loop against jaxmesh with 2 workers.

One ``jaxmesh serve-policy`` process (openpi's websocket protocol, its
defaults: batches of up to 16, 5 ms wait) on 127.0.0.1 serves ``POLICY``, a
cheap stand-in for pi05_libero that takes openpi's LIBERO request (two uint8
224x224x3 images, an 8-float state, the prompt) and answers a chunk of
``CHUNK`` = 10 actions [10, 7] (pi05_libero's action_horizon): a
proportional step of the end effector towards a fixed point, gripper open
(closed if both images were black). What is measured is the plumbing around a
model (the env, the request, the wire, the batcher), not a model. Against it,
on task 0 of libero_spatial, both cameras at 256x256 (openpi's size, OSMesa),
the same episodes (seeds and initial states 0..E-1) and the same step cap:

- ``openpi example loop``: what openpi's ``examples/libero/main.py`` does,
  with one env in this process: per episode seed, reset, the initial state,
  10 settle steps of the dummy action, then at every step both cameras turned
  upright and resized with padding to 224 (PIL's bilinear, as
  ``openpi_client.image_tools.resize_with_pad``; openpi keeps them for its
  replay video) and, every 5 steps (replan_steps), one ``infer`` with them,
  the state (eef position, axis-angle, gripper) and the task's language, the
  first 5 actions replayed. The client is ``ws_policy.OpenpiClient``
  (``WebsocketClientPolicy`` line for line; openpi-client pins numpy<2, so
  it cannot be installed here). Left out, in the baseline's favour: writing
  the replay video (an mp4 per episode) and openpi's logging.
- ``jaxmesh, 2 workers``: ``jaxmesh.evaluate(jaxmesh.RemotePolicy("ws://...",
  inputs=libero_inputs, instructions="language", native_chunk=10),
  "libero:libero_spatial/0", env_config={"camera_size": 256,
  "max_episode_steps": cap}, episodes=E, num_envs=2, workers=2, horizon=5)``:
  configs/libero_openpi.yaml's setting (there num_envs=8 for 50 episodes a
  task; here one lane per worker: with horizon 5 the run is lockstep, so a
  worker's second lane would step after its first, adding no parallelism, and
  each extra lane is one more LIBERO env to build in a run of a few episodes).

Each figure is the wall time of the whole call (the env's construction, the
connection and, for jaxmesh, its worker processes and compile included),
as episodes per hour; the server is started (and its forward compiled) before
either clock starts. The stand-in never succeeds, so every episode runs to the
cap (220 steps, libero_spatial's, as openpi sets it; fewer with ``--cap``):
the slowest case, and both contenders run the same number of env steps.

Both contenders send the same requests: the stand-in reads only the end
effector's position (cast to float32 on the server, the same on either side)
and whether the images are black, and MuJoCo is deterministic, so every
action, and so each episode's return, success and length, must agree; the
script checks it. (The axis-angle is computed from LIBERO's float64
quaternion by the openpi loop, and may reach ``libero_inputs`` through
jaxmesh's host loop in float32: its last bits can differ, which is why the
stand-in does not read it.)

``--pil-inputs`` adds a third run, a diagnostic: the jaxmesh run with
``inputs=openpi_inputs``, ``libero_inputs`` with the cameras resized by PIL as
openpi's client does (the same pixels), to show what ``libero_inputs``'
numpy resize costs (it runs in the evaluating process, for each lane that
plans, while the workers wait).

Goal: jaxmesh with 2 workers >= 1.8x the openpi example loop's episodes per
hour. LIBERO's own cost (construction, a reset with its settle steps, a step)
at the camera size is printed first, and the cores one env's steps keep busy
(its process CPU time over the wall clock): OSMesa's software renderer
(llvmpipe) draws on threads, so at 256x256 one env already uses more than one
core, and 2 workers can give at most ``cores / that`` the openpi loop's rate
(the bound printed).

Run: ``cd benchmarks && ../.venv/bin/python libero_served.py [--quick]
[--episodes E] [--cap STEPS] [--camera-size PX] [--pil-inputs]`` (the full
run, 6 episodes at the cap of 220: about 10 minutes on 2 quiet cores, 13 with
``--pil-inputs``)
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
from common import cpu_seconds, goal, header, machine, serve_policy_process, table

import jaxmesh
from jaxmesh.adapt import State, Text
from jaxmesh.envs import libero
from jaxmesh.serve.libero_inputs import SIZE, libero_inputs, quat_to_axis_angle

SUITE, TASK = "libero_spatial", 0
#: Actions per reply (pi05_libero's action_horizon), and those replayed
#: before the next plan (openpi's replan_steps).
CHUNK, REPLAN = 10, 5
WORKERS = 2
OPENPI = "openpi example loop"
JAXMESH = f"jaxmesh, {WORKERS} workers"
PIL_ROW = f"{JAXMESH}, PIL resize"
IMAGE, WRIST, STATE = (
    "observation/image",
    "observation/wrist_image",
    "observation/state",
)
#: Where the stand-in moves the end effector (LIBERO's world frame, metres),
#: and its gain and step bound.
TARGET = np.array([-0.05, 0.05, 1.05], np.float32)
GAIN, STEP = 5.0, 0.5
PROMPT_BYTES = 128


def _encode(instruction: str) -> np.ndarray:
    """The prompt as ``PROMPT_BYTES`` UTF-8 bytes, zero-padded."""
    data = instruction.encode()[:PROMPT_BYTES]
    return np.frombuffer(data.ljust(PROMPT_BYTES, b"\0"), np.uint8)


def plan(inputs: dict) -> jnp.ndarray:
    """The stand-in: ``[CHUNK, 7]``, each row a bounded proportional step of
    the end effector towards ``TARGET``, no rotation, the gripper open (-1),
    or closed (+1) when both images are black."""
    eef = inputs["state"][:3]
    move = jnp.clip(GAIN * (TARGET - eef), -STEP, STEP)
    lit = (
        jnp.sum(inputs["image"], dtype=jnp.int32)
        + jnp.sum(inputs["wrist_image"], dtype=jnp.int32)
    ) > 0
    grip = jnp.where(lit, -1.0, 1.0)[None]
    action = jnp.concatenate([move, jnp.zeros(3), grip]).astype(jnp.float32)
    return jnp.broadcast_to(action, (CHUNK, 7))


#: What ``jaxmesh serve-policy libero_served:POLICY`` serves.
POLICY = jaxmesh.Model(
    plan,
    spec={
        "image": State(key=IMAGE),
        "wrist_image": State(key=WRIST),
        "state": State(key=STATE),
        "prompt": Text(_encode),
    },
    native_chunk=CHUNK,
    name="libero-stand-in",
)


def serve() -> tuple[subprocess.Popen, str]:
    """``jaxmesh serve-policy libero_served:POLICY`` in its own process, its
    inputs declared (so it compiles before serving); the process and its
    ``ws://`` address."""
    image = f"uint8[{SIZE},{SIZE},3]"
    proc, line = serve_policy_process(
        "libero_served:POLICY",
        *("--input", f"{IMAGE}={image}"),
        *("--input", f"{WRIST}={image}"),
        *("--input", f"{STATE}=float32[8]"),
    )
    return proc, "ws://" + line.removeprefix("ws://")


def _resize_with_pad(image: np.ndarray) -> np.ndarray:
    """``openpi_client.image_tools.resize_with_pad(image, 224, 224)`` (PIL's
    bilinear filter, zero padding), then ``convert_to_uint8`` (a no-op on
    uint8)."""
    from PIL import Image

    h, w = image.shape[:2]
    if (h, w) == (SIZE, SIZE):
        return image
    ratio = max(w / SIZE, h / SIZE)
    rh, rw = int(h / ratio), int(w / ratio)
    resized = Image.fromarray(image).resize((rw, rh), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (SIZE, SIZE), 0)
    canvas.paste(resized, (max(0, int((SIZE - rw) / 2)), max(0, int((SIZE - rh) / 2))))
    return np.asarray(canvas)


def _upright(image: np.ndarray) -> np.ndarray:
    """A camera turned upright and resized as openpi's client does."""
    return _resize_with_pad(np.ascontiguousarray(np.asarray(image)[::-1, ::-1]))


def openpi_inputs(obs: dict, instruction: str | None) -> dict:
    """``libero_inputs`` with the cameras resized by PIL, as openpi's client
    resizes them (the same pixels, ~1 ms an image instead of ~50): for
    ``--pil-inputs``."""
    request = {
        IMAGE: _upright(obs["agentview_image"]),
        WRIST: _upright(obs["robot0_eye_in_hand_image"]),
        STATE: np.concatenate(
            (
                obs["robot0_eef_pos"],
                quat_to_axis_angle(obs["robot0_eef_quat"]),
                obs["robot0_gripper_qpos"],
            )
        ),
    }
    if instruction is not None:
        request["prompt"] = instruction
    return request


def openpi_loop(address: str, episodes: int, camera_size: int, cap: int) -> dict:
    """openpi's ``examples/libero/main.py`` with one env; wall seconds, and
    each episode's return, success and length."""
    from libero_speed import _init_states, _libero_env
    from websockets.sync.client import connect
    from ws_policy import OpenpiClient

    t0 = time.perf_counter()
    libero._gl_backend()
    env = _libero_env(camera_size)
    init = _init_states()
    language = libero.suite_tasks(SUITE)[TASK][1]
    settle = libero.DEFAULT_SETTLE_STEPS
    returns, success, lengths, requests = [], [], [], 0
    with connect(address, compression=None, max_size=None) as ws:
        client = OpenpiClient(ws)
        for i in range(episodes):
            env.seed(i)
            env.reset()
            obs = env.set_init_state(init[i % len(init)])
            plan_: collections.deque = collections.deque()
            t, total, done = 0, 0.0, False
            while t < cap + settle:
                if t < settle:
                    obs, _, done, _ = env.step(list(libero.DUMMY_ACTION))
                    t += 1
                    continue
                img = _upright(obs["agentview_image"])
                wrist = _upright(obs["robot0_eye_in_hand_image"])
                if not plan_:
                    element = {
                        IMAGE: img,
                        WRIST: wrist,
                        STATE: np.concatenate(
                            (
                                obs["robot0_eef_pos"],
                                quat_to_axis_angle(obs["robot0_eef_quat"]),
                                obs["robot0_gripper_qpos"],
                            )
                        ),
                        "prompt": str(language),
                    }
                    chunk = np.asarray(client.infer(element)["actions"])
                    requests += 1
                    plan_.extend(chunk[:REPLAN])
                obs, reward, done, _ = env.step(plan_.popleft().tolist())
                total += reward
                t += 1
                if done:
                    break
            returns.append(total)
            success.append(bool(done))
            lengths.append(t - settle)
    env.close()
    wall = time.perf_counter() - t0
    return {
        "wall": wall,
        "returns": returns,
        "success": success,
        "lengths": lengths,
        "requests": requests,
    }


def with_jaxmesh(
    address: str, episodes: int, camera_size: int, cap: int, inputs=libero_inputs
) -> dict:
    """``evaluate`` with a ``RemotePolicy`` as configs/libero_openpi.yaml
    builds it, 2 lanes in 2 worker processes; the same figures."""
    t0 = time.perf_counter()
    with jaxmesh.RemotePolicy(
        address, inputs=inputs, instructions="language", native_chunk=CHUNK
    ) as remote:
        r = jaxmesh.evaluate(
            remote,
            f"libero:{SUITE}/{TASK}",
            env_config={"camera_size": camera_size, "max_episode_steps": cap},
            episodes=episodes,
            num_envs=WORKERS,
            workers=WORKERS,
            horizon=REPLAN,
        )
        requests = remote.client.requests
    wall = time.perf_counter() - t0
    success = r.success if r.success is not None else r.terminated
    return {
        "wall": wall,
        "run_time": r.run_time,
        "returns": [float(x) for x in np.asarray(r.returns)],
        "success": [bool(x) for x in np.asarray(success)],
        "lengths": [int(x) for x in np.asarray(r.lengths)],
        "requests": requests,
    }


def env_cores(camera_size: int, steps: int = 20) -> float:
    """The cores one LIBERO env's steps keep busy: this process's CPU time
    over the wall clock while it steps (above 1: the renderer's threads)."""
    from libero_speed import _init_states, _libero_env

    libero._gl_backend()
    env = _libero_env(camera_size)
    env.seed(0)
    env.reset()
    env.set_init_state(_init_states()[0])
    env.step([0.1, 0, 0, 0, 0, 0, -1])  # warm
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        env.step([0.1, 0, 0, 0, 0, 0, -1])
    busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
    env.close()
    return busy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 episodes, 30 steps")
    ap.add_argument("--episodes", type=int, default=None, help="seeds 0..E-1")
    ap.add_argument(
        "--cap", type=int, default=None, help="policy steps per episode (default 220)"
    )
    ap.add_argument("--camera-size", type=int, default=libero.DEFAULT_CAMERA_SIZE)
    ap.add_argument(
        "--pil-inputs",
        action="store_true",
        help=f"also run {PIL_ROW!r}: RemotePolicy(inputs=) resizing with PIL "
        "(a diagnostic of libero_inputs' cost; about a third more time)",
    )
    args = ap.parse_args(argv)
    episodes = args.episodes or (2 if args.quick else 6)
    cap = args.cap or (30 if args.quick else libero.SUITES[SUITE])
    size = args.camera_size
    print(
        header(
            "LIBERO with a served policy: openpi's example loop against jaxmesh",
            {
                "task": f"{SUITE}/{TASK}",
                "episodes": episodes,
                "cap": cap,
                "camera_size": size,
                "policy": f"stand-in, chunks of {CHUNK}, {REPLAN} replayed",
                "server": "jaxmesh serve-policy (openpi protocol, defaults)",
                **machine(),
            },
        )
    )
    from libero_speed import costs

    make, reset, step = costs(size, resets=1 if args.quick else 2)
    busy = env_cores(size)
    print(
        table(
            ["LIBERO env", "make (s)", "reset + settle (s)", "step (ms)", "cores"],
            [[f"{size}x{size} cameras", make, reset, step, busy]],
        )
    )
    cores = os.cpu_count() or 1
    print(
        f"\none env's steps keep {busy:.2f} cores busy: {WORKERS} workers on "
        f"{cores} cores can give at most {min(WORKERS, cores / busy):.2f}x the "
        "openpi loop's rate\n"
    )
    proc, address = serve()
    runs: dict[str, dict] = {}
    try:
        contenders = [
            (OPENPI, lambda: openpi_loop(address, episodes, size, cap)),
            (JAXMESH, lambda: with_jaxmesh(address, episodes, size, cap)),
        ]
        if args.pil_inputs:
            contenders.append(
                (
                    PIL_ROW,
                    lambda: with_jaxmesh(address, episodes, size, cap, openpi_inputs),
                )
            )
        for name, fn in contenders:
            server = cpu_seconds(proc.pid)
            runs[name] = fn()
            runs[name]["server_cpu"] = cpu_seconds(proc.pid) - server
            per_hour = 3600 * episodes / runs[name]["wall"]
            runs[name]["per_hour"] = per_hour
            print(f"result: {name}: {per_hour:.0f} episodes/hour", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print()
    a, b = runs[OPENPI], runs[JAXMESH]
    for name, m in runs.items():
        for key in ("returns", "success", "lengths"):
            if m[key] != a[key]:
                raise AssertionError(
                    f"per-episode {key} differ: {OPENPI} {a[key]}, {name} {m[key]}"
                )
    print(
        f"per-episode returns, successes and lengths agree for seeds 0..{episodes - 1}"
        f": {sum(a['success'])} of {episodes} succeeded, lengths {a['lengths']} "
        f"(the cap is {cap}); requests: {a['requests']} ({OPENPI}), "
        f"{b['requests']} ({JAXMESH}, with one of zeros when the run traces)\n"
    )
    base = a["per_hour"]
    rows = [
        [
            name,
            m["wall"],
            m["per_hour"],
            f"{m['per_hour'] / base:.2f}x",
            m["server_cpu"],
        ]
        for name, m in runs.items()
    ]
    print(
        table(
            ["contender", "wall (s)", "episodes / hour", "x openpi", "server CPU (s)"],
            rows,
        )
    )
    print()
    for name, m in runs.items():
        if "run_time" in m:
            print(
                f"({name}: evaluate's run_time {m['run_time']:.1f} s of its "
                f"{m['wall']:.1f} s wall)"
            )
    print()
    ratio = b["per_hour"] / base
    what = f"LIBERO episodes/hour, served policy, {JAXMESH} >= 1.8x {OPENPI}"
    print(goal(what, ratio, ratio >= 1.8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
