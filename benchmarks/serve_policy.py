# ruff: noqa: E402 - OPENBLAS_NUM_THREADS must be set before numpy loads
"""Serving a policy to many simulator clients: batched against one at a time.

A small conv net (a 224x224x3 camera image resized to 64x64 on the server,
three strided convolutions, a 512-wide layer with the state, a chunk of 8
actions) served by ``jaxmesh.PolicyServer`` over openpi's websocket protocol
to N = 1, 4 and 16 client processes (``serve_client.py``), each stepping a
gymnasium CartPole and asking for every action. Two servers side by side, the
same model and the same clients, repeats interleaved:

- batched: ``max_batch=16``, ``max_wait_ms=5``: the requests of all clients
  share one queue and run together;
- one at a time: ``max_batch=1``, as openpi's own server runs ``infer``.

Figures per N: observations/s (requests answered over the window), forwards/s,
and the added latency of a request (its round trip seen by the client minus the
bare jitted forward at the batch size it ran at: the same network on an
already stacked numpy batch, transfer included), p50 and p99. Goals: with 16
clients, batched >= 4x one at a time; added latency p50 <= 1 ms for one client
(224x224x3 on loopback).

Run: ``python benchmarks/serve_policy.py [--quick] [--seconds S] [--repeats R]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import statistics
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from common import goal, header, table

import jaxmesh
from jaxmesh.adapt import Image, State

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 8
IMAGE = Image(key="observation/image", size=(64, 64))
SIZES = (1, 2, 4, 8, 16)


class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, image: jax.Array, state: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(32, (5, 5), strides=2)(image))
        x = nn.relu(nn.Conv(64, (3, 3), strides=2)(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=2)(x))
        x = jnp.concatenate([x.reshape(-1), state])
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(CHUNK)(x).reshape(CHUNK, 1)


NET = ConvNet()


class CameraPolicy(jaxmesh.Model):
    native_chunk = CHUNK
    spec = {"image": IMAGE, "state": State(key="observation/state")}

    def load(self):
        self.params = NET.init(
            jax.random.PRNGKey(0), jnp.zeros((64, 64, 3)), jnp.zeros((4,))
        )

    def predict_chunk(self, obs):
        return NET.apply(self.params, obs["image"], obs["state"])


def example(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": np.zeros(4, np.float32),
        "prompt": "keep the pole up",
    }


def bare_forward_ms(params, repeats: int) -> dict[int, float]:
    """The jitted forward alone (resize + net on a stacked numpy batch, read
    back), per batch size: the median of ``repeats`` calls."""

    @jax.jit
    def bare(params, images, states):
        x = jax.vmap(lambda im: IMAGE.frame({"observation/image": im}))(images)
        return jax.vmap(NET.apply, in_axes=(None, 0, 0))(params, x, states)

    out = {}
    for b in SIZES:
        images = np.stack([example(i)["observation/image"] for i in range(b)])
        states = np.zeros((b, 4), np.float32)
        np.asarray(bare(params, images, states))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.asarray(bare(params, images, states))
            times.append((time.perf_counter() - t0) * 1000.0)
        out[b] = statistics.median(times)
    return out


def run_clients(server: jaxmesh.PolicyServer, n: int, seconds: float) -> dict:
    """N client processes stepping for ``seconds`` at once; their requests."""
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "serve_client.py"), server.url]
            + [str(seconds), str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a client did not connect: {line!r}")
        before = (server.stats.forwards, server.stats.requests)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs]
        after = (server.stats.forwards, server.stats.requests)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
    return {
        "latency_ms": [x for r in results for x in r["latency_ms"]],
        "batch": [x for r in results for x in r["batch"]],
        "forwards": after[0] - before[0],
        "requests": after[1] - before[1],
    }


def padded(b: int) -> int:
    return next(s for s in SIZES if s >= b)


def summarise(got: dict, seconds: float, bare: dict[int, float]) -> dict:
    added = [
        lat - bare[padded(b)]
        for lat, b in zip(got["latency_ms"], got["batch"], strict=True)
    ]
    return {
        "obs_s": got["requests"] / seconds,
        "forwards_s": got["forwards"] / seconds,
        "mean_batch": got["requests"] / max(got["forwards"], 1),
        "p50": float(np.percentile(added, 50)) if added else float("nan"),
        "p99": float(np.percentile(added, 99)) if added else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--seconds", type=float, default=None, help="per measurement")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats")
    ap.add_argument("--clients", default=None, help="e.g. 1,4,16")
    args = ap.parse_args(argv)
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    repeats = args.repeats or (1 if args.quick else 3)
    clients = [
        int(c) for c in (args.clients or ("1,4" if args.quick else "1,4,16")).split(",")
    ]

    model = CameraPolicy()
    servers = {
        "batched": jaxmesh.PolicyServer(
            model, max_batch=16, max_wait_ms=5.0, example=example()
        ),
        "one at a time": jaxmesh.PolicyServer(model, max_batch=1, example=example()),
    }
    print(
        header(
            "Serving a policy: batched against one request at a time",
            {
                "model": "conv net, 224x224x3 -> 64x64, chunk 8",
                "clients": clients,
                "seconds": seconds,
                "repeats": repeats,
                "jax backend": jax.default_backend(),
            },
        )
    )
    bare = bare_forward_ms(model.params, repeats=20 if args.quick else 50)
    print(
        "bare jitted forward (ms) by batch size: "
        + ", ".join(f"{b}: {ms:.2f}" for b, ms in bare.items())
        + "\n"
    )
    figures: dict[tuple[int, str], list[dict]] = {}
    with servers["batched"], servers["one at a time"]:
        for n in clients:  # a warm-up round, discarded
            for server in servers.values():
                run_clients(server, n, min(seconds, 1.0))
        for _ in range(repeats):
            for n in clients:
                for name, server in servers.items():
                    got = run_clients(server, n, seconds)
                    figures.setdefault((n, name), []).append(
                        summarise(got, seconds, bare)
                    )

    def med(n: int, name: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[(n, name)])

    rows = []
    for n in clients:
        b, s = "batched", "one at a time"
        rows.append(
            [
                n,
                med(n, b, "obs_s"),
                med(n, s, "obs_s"),
                med(n, b, "obs_s") / med(n, s, "obs_s"),
                med(n, b, "forwards_s"),
                med(n, s, "forwards_s"),
                med(n, b, "mean_batch"),
                med(n, b, "p50"),
                med(n, b, "p99"),
                med(n, s, "p50"),
                med(n, s, "p99"),
            ]
        )
    print(
        table(
            [
                "clients",
                "obs/s batched",
                "obs/s one at a time",
                "ratio",
                "forwards/s batched",
                "forwards/s one at a time",
                "mean batch",
                "added p50 ms batched",
                "added p99 ms batched",
                "added p50 ms one at a time",
                "added p99 ms one at a time",
            ],
            rows,
        )
    )
    print()
    top = max(clients)
    ratio = med(top, "batched", "obs_s") / med(top, "one at a time", "obs_s")
    print(goal(f"{top} clients, batched over one at a time (obs/s)", ratio, ratio >= 4))
    if 1 in clients:
        p50 = med(1, "batched", "p50")
        print(goal("added latency p50, 1 client, 224x224x3 (ms)", p50, p50 <= 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
