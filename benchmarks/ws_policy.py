"""RemotePolicy("ws://") on 16 lanes against openpi's own client loop.

One ``jaxmesh serve-policy`` process (openpi's websocket protocol, batching
on: its default ``--max-batch 16``) on 127.0.0.1 serves ``POLICY``, a 2x64
ReLU MLP on gymnasium CartPole's 4 observations (argmax of 2 logits, fixed
random weights). Against it, side by side, repeats interleaved, the same
seeds 0..E-1:

- ``openpi client loop``: openpi's way, one gymnasium CartPole env and a
  client doing what ``openpi_client.WebsocketClientPolicy`` does
  (``OpenpiClient``), one ``infer`` per step (horizon 1), episodes one after
  another;
- ``RemotePolicy, 16 lanes``: ``jaxmesh.evaluate(jaxmesh.RemotePolicy(
  "ws://..."), "gymnasium:CartPole-v1", num_envs=16, seeds=range(E))``, its
  defaults otherwise: the lanes that plan at a step send their requests at
  once and the server answers them in one forward;
- ``RemotePolicy, 1 lane``: the same at ``num_envs=1``, for context.

Figures: observations/s (env steps over the wall clock of the loop or of the
``evaluate`` call, and for jaxmesh also over its ``run_time``), the CPU
time this process and the server spent per observation, and the per-episode
returns of both RemotePolicy runs checked equal to the openpi client loop's.
Goal: RemotePolicy on 16 lanes >= 3x the openpi client loop's observations/s.

Run: ``cd benchmarks && ../.venv/bin/python ws_policy.py [--quick]
[--episodes E] [--repeats R]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import gymnasium
import jax.numpy as jnp
import msgpack
import numpy as np
from common import (
    cpu_seconds,
    goal,
    header,
    interleave,
    machine,
    serve_policy_process,
    table,
)
from serve_client import pack, unpack
from websockets.sync.client import connect

import jaxmesh
from jaxmesh.adapt import State

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "observation/state"
HIDDEN = 64
OPENPI = "openpi client loop"


def weights(seed: int = 0, noise: float = 0.1) -> list[np.ndarray]:
    """The MLP's (kernel, bias) pairs: hidden units 0 and 1 carry
    ``relu(+-(obs[2] + 0.5 * obs[3]))`` to the logits of pushing right and
    left (a pole-balancing rule, as ``common.balancing_params``), every other
    weight random from ``seed``, the head's scaled by ``noise``: episodes of
    many lengths, none a tie between the logits."""
    rng = np.random.default_rng(seed)
    shapes = [(4, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 2)]
    w = [(rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    b = [(0.1 * rng.normal(size=s[1])).astype(np.float32) for s in shapes]
    rule = np.array([0.0, 0.0, 1.0, 0.5], np.float32)
    w[0][:, 0], w[0][:, 1], b[0][:2] = rule, -rule, 0.0
    w[1][:2], w[1][:, :2], b[1][:2] = 0.0, 0.0, 0.0
    w[1][0, 0] = w[1][1, 1] = 1.0
    w[2] *= noise
    w[2][:2] = [[0.0, 1.0], [1.0, 0.0]]
    return [w[0], b[0], w[1], b[1], w[2], b[2]]


def act(inputs: dict) -> jnp.ndarray:
    """The 2x64 ReLU MLP on one CartPole observation: its discrete action."""
    w1, b1, w2, b2, w3, b3 = weights()
    x = jnp.maximum(inputs["state"] @ w1 + b1, 0.0)
    x = jnp.maximum(x @ w2 + b2, 0.0)
    return jnp.argmax(x @ w3 + b3).astype(jnp.int32)


#: What ``jaxmesh serve-policy ws_policy:POLICY`` serves.
POLICY = jaxmesh.Model(act, spec={"state": State(key=KEY)}, name="cartpole-mlp")


def serve() -> tuple[subprocess.Popen, str]:
    """``jaxmesh serve-policy ws_policy:POLICY`` in its own process, as a
    user starts it; the process and its address once serving."""
    proc, line = serve_policy_process(
        "ws_policy:POLICY", "--input", f"{KEY}=float32[4]"
    )
    return proc, line.removeprefix("ws://")


def with_cpu(run, server: int) -> dict:
    """``run()``'s figures, and the CPU microseconds per observation that this
    process and the server spent during it."""
    mine, theirs = time.process_time(), cpu_seconds(server)
    figures = run()
    mine, theirs = time.process_time() - mine, cpu_seconds(server) - theirs
    steps = figures["steps"]
    return {
        **figures,
        "cpu_here": 1e6 * mine / steps,
        "cpu_server": 1e6 * theirs / steps,
    }


class OpenpiClient:
    """What ``openpi_client.WebsocketClientPolicy`` does, line for line, on
    a websockets sync connection (no compression): the server's metadata read
    on connect, and per ``infer`` one msgpack frame out (arrays as openpi's
    ``msgpack_numpy`` writes them, ``serve_client.pack``) and one in.
    (openpi-client pins numpy<2, so the benchmarks' extras cannot install it.)
    """

    def __init__(self, ws):
        self.ws = ws
        self.metadata = msgpack.unpackb(ws.recv(), object_hook=unpack)
        self.packer = msgpack.Packer(default=pack)

    def infer(self, obs: dict) -> dict:
        self.ws.send(self.packer.pack(obs))
        reply = self.ws.recv()
        if isinstance(reply, str):
            raise RuntimeError(f"Error in inference server:\n{reply}")
        return msgpack.unpackb(reply, object_hook=unpack)


def openpi_loop(address: str, seeds: range) -> tuple[dict, list]:
    """openpi's client loop: one env, one ``infer`` per step; its connection
    opens before the clock starts and closes after."""
    env = gymnasium.make("CartPole-v1")
    returns, steps = [], 0
    with connect(f"ws://{address}", compression=None, max_size=None) as ws:
        client = OpenpiClient(ws)
        t0 = time.perf_counter()
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            total, done = 0.0, False
            while not done:
                reply = client.infer({KEY: obs})
                action = int(np.asarray(reply["actions"]).reshape(-1)[0])
                obs, reward, terminated, truncated, _ = env.step(action)
                total, done = total + reward, terminated or truncated
                steps += 1
            returns.append(total)
        wall = time.perf_counter() - t0
    env.close()
    return {"obs_wall": steps / wall, "obs_run": steps / wall, "steps": steps}, returns


def remote_run(address: str, lanes: int, seeds: range) -> tuple[dict, list, int]:
    """``evaluate`` with a ``RemotePolicy`` built (and connected) before the
    clock starts and closed after: its figures, returns and requests."""
    with jaxmesh.RemotePolicy(f"ws://{address}") as remote:
        t0 = time.perf_counter()
        r = jaxmesh.evaluate(
            remote, "gymnasium:CartPole-v1", num_envs=lanes, seeds=seeds
        )
        wall = time.perf_counter() - t0
        requests = remote.client.requests
    figures = {
        "obs_wall": r.env_steps / wall,
        "obs_run": r.env_steps / r.run_time,
        "steps": r.env_steps,
    }
    return figures, list(np.asarray(r.returns)), requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--episodes", type=int, default=None, help="seeds 0..E-1")
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats")
    args = ap.parse_args(argv)
    episodes = args.episodes or (32 if args.quick else 128)
    repeats = args.repeats or (1 if args.quick else 3)
    seeds = range(episodes)
    print(
        header(
            "RemotePolicy('ws://') against openpi's client loop, one serve-policy",
            {
                "policy": f"2x{HIDDEN} ReLU MLP, argmax, horizon 1",
                "env": "gymnasium CartPole-v1",
                "episodes": episodes,
                "repeats": repeats,
                **machine(),
            },
        )
    )
    proc, address = serve()
    returns: dict[str, list] = {}
    requests: dict[str, int] = {}
    try:

        def loop() -> dict:
            figures, returns[OPENPI] = openpi_loop(address, seeds)
            return figures

        def lanes(name: str, n: int) -> dict:
            figures, returns[name], requests[name] = remote_run(address, n, seeds)
            return figures

        many, one = f"RemotePolicy, {args.lanes} lanes", "RemotePolicy, 1 lane"
        contenders = {
            OPENPI: lambda: with_cpu(loop, proc.pid),
            many: lambda: with_cpu(lambda: lanes(many, args.lanes), proc.pid),
            one: lambda: with_cpu(lambda: lanes(one, 1), proc.pid),
        }
        med = interleave(contenders, repeats)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    want = np.asarray(returns[OPENPI])
    for name in (many, one):
        np.testing.assert_array_equal(returns[name], want, err_msg=name)
    print(
        f"per-episode returns of both RemotePolicy runs equal the openpi client loop's "
        f"for seeds 0..{episodes - 1} (mean {want.mean():.1f}); requests sent "
        f"per run: {requests[many]:,} at {args.lanes} lanes, {requests[one]:,} "
        "at 1 (one per env step, and one of zeros when the run traces)\n"
    )
    base = med[OPENPI]["obs_wall"]
    rows = [
        [
            name,
            int(m["steps"]),
            m["obs_wall"],
            m["obs_run"] if name != OPENPI else "",
            f"{m['obs_wall'] / base:.2f}x",
            m["cpu_here"],
            m["cpu_server"],
        ]
        for name, m in med.items()
    ]
    print(
        table(
            [
                "contender",
                "env steps",
                "obs/s (wall)",
                "obs/s (run_time)",
                "ratio (wall)",
                "client CPU us/obs",
                "server CPU us/obs",
            ],
            rows,
        )
    )
    print()
    ratio = med[many]["obs_wall"] / base
    what = f"RemotePolicy {args.lanes} lanes >= 3x openpi's client loop (obs/s)"
    print(goal(what, ratio, ratio >= 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
