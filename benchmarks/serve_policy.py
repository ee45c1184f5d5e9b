# ruff: noqa: E402 - OPENBLAS_NUM_THREADS must be set before numpy loads
"""Serving a policy to many simulator clients: batched against one at a time.

Two policies of realistic cost, each reading a 224x224x3 uint8 camera image
(converted to float on the server, as the spec's ``Image`` says) and the
state, and returning a chunk of 8 actions: a wide MLP (the image pooled to
16x16, two layers of 2048: 25 MB of weights) and a small conv net (the image
pooled to 56x56, three strided convolutions, 512 wide). Each is served by
``jaxmesh.PolicyServer`` over openpi's websocket protocol to N = 1, 4 and 16
client processes (``serve_client.py``), each stepping a
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

Then ``jaxmesh.RemotePolicy`` (the native gRPC protocol) against the same
model in process: ``jaxmesh.evaluate`` over B lanes of a gymnasium CartPole
that also gives a 224x224x3 camera image, with the conv net planning at
every step (horizon 1), once in this process and once through a
``jaxmesh serve-policy --protocol grpc`` process on the same machine. Figures
per B: env steps/s of each and their ratio, and the added time per agent step
(the served run's seconds per step minus the in-process run's). Goal: served
>= 0.9x in process at the same batch.

Run: ``python benchmarks/serve_policy.py [--quick] [--seconds S] [--repeats R]
[--parts openpi,remote]``
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
from common import goal, header, serve_policy_process, table

import jaxmesh
from jaxmesh.adapt import Image, State

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 8
#: The camera as openpi clients send it (resized on their side to the model's
#: 224x224): the server converts it to float32 in [0, 1].
IMAGE = Image(key="observation/image", size=(224, 224))
SIZES = (1, 2, 4, 8, 16)


class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, image: jax.Array, state: jax.Array) -> jax.Array:
        x = image.reshape(56, 4, 56, 4, 3).mean(axis=(1, 3))  # 4x4 pooling
        x = nn.relu(nn.Conv(32, (5, 5), strides=2)(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=2)(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=2)(x))
        x = jnp.concatenate([x.reshape(-1), state])
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(CHUNK)(x).reshape(CHUNK, 1)


class WideMLP(nn.Module):
    """The image pooled to a 16x16 thumbnail beside the state, two layers of
    2048: 6.3 M weights (25 MB), read once per forward whatever the batch."""

    @nn.compact
    def __call__(self, image: jax.Array, state: jax.Array) -> jax.Array:
        small = image.reshape(16, 14, 16, 14, 3).mean(axis=(1, 3))
        x = jnp.concatenate([small.reshape(-1), state])
        x = nn.relu(nn.Dense(2048)(x))
        x = nn.relu(nn.Dense(2048)(x))
        return nn.Dense(CHUNK)(x).reshape(CHUNK, 1)


NETS = {"conv": ConvNet(), "mlp": WideMLP()}
#: What each model is, for the report.
DESCRIBED = {
    "conv": "conv net: 224x224x3 pooled to 56x56, 3 strided convolutions, "
    "512 wide, chunk 8",
    "mlp": "wide MLP: 224x224x3 pooled to a 16x16 thumbnail + state, 2x2048 "
    "(25 MB of weights), chunk 8",
}


class CameraPolicy(jaxmesh.Model):
    native_chunk = CHUNK
    spec = {"image": IMAGE, "state": State(key="observation/state")}

    def __init__(self, net: str = "conv"):
        super().__init__(name=f"camera-{net}")
        self.net = NETS[net]

    def load(self):
        self.params = self.net.init(
            jax.random.PRNGKey(0), jnp.zeros((224, 224, 3)), jnp.zeros((4,))
        )

    def predict_chunk(self, obs):
        return self.net.apply(self.params, obs["image"], obs["state"])


def example(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": np.zeros(4, np.float32),
        "prompt": "keep the pole up",
    }


def bare_forward(net: nn.Module, params):
    """A timer of the jitted forward alone (the spec's image conversion + the
    net on a stacked numpy batch, read back): ``timer(repeats)`` gives, per
    batch size, the median of ``repeats`` calls."""

    @jax.jit
    def bare(params, images, states):
        x = jax.vmap(lambda im: IMAGE.frame({"observation/image": im}))(images)
        return jax.vmap(net.apply, in_axes=(None, 0, 0))(params, x, states)

    inputs = {
        b: (
            np.stack([example(i)["observation/image"] for i in range(b)]),
            np.zeros((b, 4), np.float32),
        )
        for b in SIZES
    }
    for images, states in inputs.values():
        np.asarray(bare(params, images, states))

    def timer(repeats: int) -> dict[int, float]:
        out = {}
        for b, (images, states) in inputs.items():
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                np.asarray(bare(params, images, states))
                times.append((time.perf_counter() - t0) * 1000.0)
            out[b] = statistics.median(times)
        return out

    return timer


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


def measure(
    net: str, clients: list[int], seconds: float, repeats: int, quick: bool
) -> None:
    """The table and goal lines of one model."""
    model = CameraPolicy(net)
    servers = {
        "batched": jaxmesh.PolicyServer(
            model, max_batch=16, max_wait_ms=5.0, example=example()
        ),
        "one at a time": jaxmesh.PolicyServer(model, max_batch=1, example=example()),
    }
    print(
        header(
            f"Serving a policy ({net}): batched against one request at a time",
            {
                "model": DESCRIBED[net],
                "clients": clients,
                "seconds": seconds,
                "repeats": repeats,
                "jax backend": jax.default_backend(),
            },
        )
    )
    timer = bare_forward(model.net, model.params)
    bare_runs = [timer(20)]
    figures: dict[tuple[int, str], list[dict]] = {}
    with servers["batched"], servers["one at a time"]:
        for n in clients:  # a warm-up round, discarded
            for server in servers.values():
                run_clients(server, n, min(seconds, 1.0))
        raw: dict[tuple[int, str], list[dict]] = {}
        for _ in range(repeats):
            for n in clients:
                for name, server in servers.items():
                    got = run_clients(server, n, seconds)
                    raw.setdefault((n, name), []).append(got)
            # The bare forward between the rounds, so that it sees their noise.
            bare_runs.append(timer(20))
    bare = {b: statistics.median(r[b] for r in bare_runs) for b in SIZES}
    print(
        "bare jitted forward (ms) by batch size, median of "
        f"{len(bare_runs)} timings between the rounds: "
        + ", ".join(f"{b}: {ms:.2f}" for b, ms in bare.items())
        + "\n"
    )
    for key, runs in raw.items():
        figures[key] = [summarise(got, seconds, bare) for got in runs]

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
    print(
        goal(
            f"{net}: {top} clients, batched over one at a time (obs/s)",
            ratio,
            ratio >= 4,
        )
    )
    if 1 in clients:
        p50 = med(1, "batched", "p50")
        what = f"{net}: added latency p50, 1 client, 224x224x3 (ms)"
        print(goal(what, p50, p50 <= 1.0))


# RemotePolicy against the model in process ----------------------------------------
class CameraCartPole:
    """CartPole whose observation is ``{"image": 224x224x3 uint8, "state":
    [4]}``: the camera a fixed random picture per env (what a simulator's
    render costs to move, not to draw)."""

    def __new__(cls, seed: int = 0):
        import gymnasium

        class Env(gymnasium.ObservationWrapper):
            def __init__(self):
                super().__init__(gymnasium.make("CartPole-v1"))
                rng = np.random.default_rng(seed)
                self.image = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
                self.observation_space = gymnasium.spaces.Dict(
                    {
                        "image": gymnasium.spaces.Box(0, 255, (224, 224, 3), np.uint8),
                        "state": self.env.observation_space,
                    }
                )

            def observation(self, obs):
                return {"image": self.image, "state": obs.astype(np.float32)}

        return Env()


class CameraCartPolePolicy(jaxmesh.Model):
    """The conv net on the camera image and the state: push right when its
    first output is positive (a chunk of 8 actions, planned every step at
    horizon 1)."""

    native_chunk = CHUNK
    spec = {
        "image": Image(key="image", size=(224, 224)),
        "state": State(key="state"),
    }

    def load(self):
        self.net = NETS["conv"]
        self.params = self.net.init(
            jax.random.PRNGKey(0), jnp.zeros((224, 224, 3)), jnp.zeros((4,))
        )

    def predict_chunk(self, obs):
        out = self.net.apply(self.params, obs["image"], obs["state"])
        return (out[:, 0] > 0).astype(jnp.int32)


def _served_process() -> tuple[subprocess.Popen, str]:
    """``jaxmesh serve-policy serve_policy:CameraCartPolePolicy --protocol
    grpc`` in its own process; its address once serving."""
    return serve_policy_process(
        "serve_policy:CameraCartPolePolicy", "--protocol", "grpc", "--max-batch", "16"
    )


def measure_remote(batches: list[int], seconds: float, repeats: int) -> None:
    """RemotePolicy against the model in process, at each batch (lanes)."""
    print(
        header(
            "RemotePolicy (gRPC) against the model in process",
            {
                "model": DESCRIBED["conv"] + ", horizon 1",
                "env": "gymnasium CartPole + a 224x224x3 uint8 camera, "
                "max_episode_steps 100",
                "lanes": batches,
                "seconds": seconds,
                "repeats": repeats,
                "jax backend": jax.default_backend(),
            },
        )
    )
    proc, address = _served_process()
    model = CameraCartPolePolicy()
    remote = jaxmesh.RemotePolicy(address)
    contenders = {"in process": model, "served": remote}

    def once(policy, lanes: int, episodes: int) -> float:
        t0 = time.perf_counter()
        res = jaxmesh.evaluate(
            policy,
            [CameraCartPole(i) for i in range(lanes)],
            episodes=episodes,
            num_envs=lanes,
            max_episode_steps=100,
            workers=0,
        )
        return float(res.lengths.sum()) / (time.perf_counter() - t0)

    try:
        figures: dict[tuple[int, str], list[float]] = {}
        for lanes in batches:
            rate = once(model, lanes, lanes)  # compiles; sizes the budget
            for policy in contenders.values():
                once(policy, lanes, lanes)  # warm (the server compiles too)
            episodes = max(lanes, int(rate * seconds / 100))
            for _ in range(repeats):
                for name, policy in contenders.items():
                    got = once(policy, lanes, episodes)
                    figures.setdefault((lanes, name), []).append(got)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    rows = []
    for lanes in batches:
        here = statistics.median(figures[(lanes, "in process")])
        served = statistics.median(figures[(lanes, "served")])
        added = (1.0 / served - 1.0 / here) * lanes * 1000.0
        # Each repeat ran both back to back: the median of their ratios
        # cancels most of the machine's load, which drifts between repeats.
        served_each = figures[(lanes, "served")]
        pairs = zip(served_each, figures[(lanes, "in process")], strict=True)
        ratio = statistics.median(b / a for b, a in pairs)
        rows.append([lanes, here, served, ratio, added])
    print(
        table(
            [
                "lanes",
                "steps/s in process",
                "steps/s served",
                "served / in process (median of paired ratios)",
                "added ms per agent step",
            ],
            rows,
        )
    )
    print()
    for row in rows:
        print(
            goal(
                f"RemotePolicy over in process, {row[0]} lanes (steps/s)",
                row[3],
                row[3] >= 0.9,
            )
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--seconds", type=float, default=None, help="per measurement")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats")
    ap.add_argument("--clients", default=None, help="e.g. 1,4,16")
    ap.add_argument(
        "--models", default=None, help=f"comma-separated, of {sorted(NETS)}"
    )
    ap.add_argument(
        "--parts",
        default="openpi,remote",
        help="openpi (clients batched against one at a time), remote "
        "(RemotePolicy against in process)",
    )
    ap.add_argument("--lanes", default=None, help="RemotePolicy's batches, e.g. 1,16")
    args = ap.parse_args(argv)
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    repeats = args.repeats or (1 if args.quick else 3)
    default = "1,4" if args.quick else "1,4,16"
    clients = [int(c) for c in (args.clients or default).split(",")]
    models = (args.models or ("mlp" if args.quick else "mlp,conv")).split(",")
    unknown = sorted(set(models) - set(NETS))
    if unknown:
        ap.error(f"--models: unknown {unknown}; choose from {sorted(NETS)}")
    parts = args.parts.split(",")
    if "openpi" in parts:
        for net in models:
            measure(net, clients, seconds, repeats, args.quick)
    if "remote" in parts:
        lanes = [
            int(b)
            for b in (args.lanes or ("1,8" if args.quick else "1,4,16")).split(",")
        ]
        measure_remote(lanes, seconds, repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
