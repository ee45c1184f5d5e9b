"""One simulator client of ``serve_policy.py``: steps a gymnasium CartPole with
a 224x224x3 camera image beside its state, asking a policy server for every
action over openpi's websocket protocol (msgpack frames, arrays as openpi's
``msgpack_numpy`` writes them). No JAX: a client is what a simulator process
holds.

Protocol with its parent: prints ``ready`` once connected (the server's
metadata read), waits for a line on stdin, steps for ``seconds``, then prints
one JSON line: the round trip of every request (ms), the batch it ran in and
the server's forward time.

Run: ``python serve_client.py URL SECONDS SEED``
"""

from __future__ import annotations

import json
import sys
import time

import gymnasium
import msgpack
import numpy as np
from websockets.sync.client import connect


def pack(obj):
    if isinstance(obj, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": obj.tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    return obj


def unpack(obj):
    if b"__ndarray__" in obj:
        dtype = np.dtype(obj[b"dtype"])
        return np.ndarray(buffer=obj[b"data"], dtype=dtype, shape=obj[b"shape"])
    return obj


def main(url: str, seconds: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    with connect(url, compression=None, max_size=None) as ws:
        msgpack.unpackb(ws.recv(), object_hook=unpack)
        print("ready", flush=True)
        sys.stdin.readline()
        latency, batch, forward = [], [], []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            frame = msgpack.packb(
                {
                    "observation/image": image,
                    "observation/state": obs.astype(np.float32),
                    "prompt": "keep the pole up",
                },
                default=pack,
            )
            t0 = time.perf_counter()
            ws.send(frame)
            reply = msgpack.unpackb(ws.recv(), object_hook=unpack)
            latency.append((time.perf_counter() - t0) * 1000.0)
            timing = reply["server_timing"]
            batch.append(timing["batch_size"])
            forward.append(timing["forward_ms"])
            action = int(reply["actions"][0, 0] > 0)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
    env.close()
    out = {"latency_ms": latency, "batch": batch, "forward_ms": forward}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
