# ruff: noqa: E402 - OPENBLAS_NUM_THREADS must be set before numpy loads
"""Served and host-stepped gymnasium envs: jaxmesh against RLMesh and the limit.

The served-env benchmarks, each a set of ratios measured side by side in one
run (interleaved repeats, medians, every contender warmed up first):

1. ``peer``: N = 64 (and 1) served gymnasium CartPole-v1 lanes, 500-step
   episodes (the 2x64 MLP of ``common.py`` with ``balancing_params``: the same
   weights in numpy for RLMesh's ``predict_batch`` and in jax for jaxmesh), the
   same seeds. RLMesh 0.1.0: ``rlmesh.EnvServer`` over a list of N envs in a
   child process, driven by ``Model.run(address, seeds=...)``. jaxmesh:
   ``jaxmesh.EnvServer`` over a list of N envs in a child process, driven by
   ``jaxmesh.evaluate(policy, "grpc://...")``. Figure: env steps over the wall
   clock of the run call, each side. Goal: jaxmesh >= 5x RLMesh at N = 64
   (>= 3x to land).
2. ``limit``: a bare Python loop stepping the same N gymnasium CartPole envs
   with no policy (action ``t % 2`` at step t for every lane, so episodes run
   ~40 steps; an ended env is reset), against jaxmesh in process (the list of
   envs) and served, both with the MLP. Goals: >= 0.85x in process, >= 0.5x
   served.
3. ``chunks``: served, a chunk policy (8 actions planned by rolling CartPole's
   physics forward under a balancing rule) at H = 8 against H = 1: round trips
   per env step (from ``result.telemetry`` when it has a wire/call count, else
   n/a) and throughput.
4. ``codec``: 16 lanes of 224x224x3 uint8 (one [16, 224, 224, 3] leaf) through
   ``jaxmesh.remote.codec``: a bare ``Tensor`` (``encode_array`` ->
   ``SerializeToString`` -> ``parse_tensor`` -> ``decode_array``) and the
   ``StepReply`` a server sends (``encode_result_batch`` -> ``SerializeToString``
   -> ``parse_step_reply`` -> ``decode_result_batch``), against one plain memory
   copy of the same bytes (``np.copyto``, ``bytes()``) and against
   base64-in-JSON. Per-call microseconds and ratios.
5. ``pipelining``: ``SlowEnv`` (each lane's step costs X / N ms, mostly
   ``time.sleep``, so the server steps the N lanes in ~X ms) served in a child
   process, and a jax policy whose plan over the N lanes costs ~X ms (a per-row
   chain of matmuls, sized by measurement), X = 2: jaxmesh with lane-group
   pipelining on (``evaluate(..., served=Served(lane_groups=G))``) against off.
   Goal >= 1.6x.

A section whose jaxmesh side does not exist yet prints "... not available yet"
and the script goes on.

Run: ``python benchmarks/remote.py [--quick] [--sections peer,limit,...]``
"""

from __future__ import annotations

import os

# Tiny numpy matmuls are fastest on one thread, and idle OpenBLAS threads spin
# on the cores the env loop needs (see peer.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import base64
import contextlib
import dataclasses
import importlib.util
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from common import (
    balancing_params,
    goal,
    header,
    init_mlp,
    interleave,
    machine,
    median,
    table,
)
from peer import numpy_mlp
from remote_common import (
    ServerPool,
    grpc_target,
    make_envs,
    rlmesh_model,
)

import jaxmesh

SECTIONS = ("peer", "limit", "chunks", "codec", "pipelining")
#: The keyword of ``jaxmesh.evaluate`` that turns lane-group pipelining on (the
#: number of lane groups; 1 = off). The one place to change when it is renamed.
PIPELINE_OPTION = "lane_groups"
K = 8  # chunk length of the chunk policy


# Availability of the jaxmesh side ----------------------------------------------
def served_missing() -> str | None:
    """None when ``jaxmesh.EnvServer`` exists, else why not."""
    try:
        jaxmesh.EnvServer  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def pipelining_missing() -> str | None:
    """None when ``jaxmesh.Served`` has ``PIPELINE_OPTION``, else why not."""
    served = getattr(jaxmesh, "Served", None)
    fields = {f.name for f in dataclasses.fields(served)} if served else set()
    if PIPELINE_OPTION not in fields:
        return f"jaxmesh.Served has no {PIPELINE_OPTION} field"
    return None


def pipeline_kwargs(on: bool, groups: int) -> dict[str, Any]:
    """The ``evaluate`` keyword that turns pipelining on (``groups``) or off."""
    return {"served": jaxmesh.Served(**{PIPELINE_OPTION: groups if on else 1})}


# Timing ------------------------------------------------------------------------
def timed_eval(**kwargs: Any) -> tuple[Any, float]:
    """``jaxmesh.evaluate(**kwargs)`` and the wall clock of the call."""
    t0 = time.perf_counter()
    result = jaxmesh.evaluate(**kwargs)
    return result, time.perf_counter() - t0


def jm_figures(result: Any, wall: float) -> dict[str, float]:
    """Env steps/s over the call's wall clock and the engine's own figure."""
    return {
        "sps": result.env_steps / wall,
        "engine_sps": float(result.steps_per_second),
        "wall": wall,
        "steps": float(result.env_steps),
    }


def telemetry_count(result: Any, names=("wire", "round_trip", "rpc", "call")):
    """The count of the first telemetry series whose name holds one of ``names``.

    None when the result has no telemetry or no such series.
    """
    tel = getattr(result, "telemetry", None)
    if not isinstance(tel, dict):
        return None
    for want in names:
        for key, series in tel.items():
            if want in str(key) and isinstance(series, dict) and "count" in series:
                return int(series["count"])
    return None


# Policies ----------------------------------------------------------------------
def mlp_policies():
    """The 2x64 MLP that balances CartPole: (jaxmesh policy, numpy forward)."""
    module, params = init_mlp((64, 64), 2)
    params = balancing_params(params)
    policy = jaxmesh.Model(
        lambda p, obs: jnp.argmax(module.apply(p, obs)).astype(jnp.int32),
        params=params,
        name="mlp2x64_balancing",
    )
    return policy, numpy_mlp(params)


def rule_chunk(obs: jax.Array) -> jax.Array:
    """K actions from rolling gymnasium CartPole's physics forward under a rule.

    The rule pushes towards ``theta + 0.5 * theta_dot > 0``; the dynamics are
    CartPole-v1's (Euler, tau = 0.02), so the open-loop chunk balances.
    """
    g, m_cart, m_pole, half_len, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total, pml = m_cart + m_pole, m_pole * half_len

    def body(s, _):
        x, x_dot, th, th_dot = s
        a = (th + 0.5 * th_dot > 0).astype(jnp.int32)
        force = jnp.where(a == 1, force_mag, -force_mag)
        cos, sin = jnp.cos(th), jnp.sin(th)
        temp = (force + pml * th_dot**2 * sin) / total
        th_acc = (g * sin - cos * temp) / (
            half_len * (4.0 / 3.0 - m_pole * cos**2 / total)
        )
        x_acc = temp - pml * th_acc * cos / total
        s = (
            x + tau * x_dot,
            x_dot + tau * x_acc,
            th + tau * th_dot,
            th_dot + tau * th_acc,
        )
        return s, a

    _, actions = jax.lax.scan(body, tuple(obs[i] for i in range(4)), None, length=K)
    return actions


def chain_policy(iters: int, width: int = 128) -> Callable[[jax.Array], jax.Array]:
    """A single-lane policy costing ``iters`` (width x width) matvecs per row.

    Its action is the balancing rule on the observation; the chain's result is
    folded in at 1e-30 weight so that XLA cannot drop it.
    """
    w = jax.random.normal(jax.random.PRNGKey(1), (width, width)) / np.sqrt(width)

    def act(obs):
        h = jnp.tile(obs.astype(jnp.float32), width // 4)
        h = jax.lax.fori_loop(0, iters, lambda i, h: jnp.tanh(w @ h), h)
        return (obs[2] + 0.5 * obs[3] + 1e-30 * h.sum() > 0).astype(jnp.int32)

    return act


def batch_ms(fn: Callable, rows: int, repeats: int = 20) -> float:
    """Median milliseconds of one jitted call of ``vmap(fn)`` over ``rows`` rows."""
    f = jax.jit(jax.vmap(fn))
    x = jnp.zeros((rows, 4), jnp.float32) + 0.01
    f(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 1e3 * median(times)


def calibrate_chain(target_ms: float, rows: int) -> tuple[int, float]:
    """Chain length whose call over ``rows`` rows costs ~``target_ms``; (iters, ms)."""
    iters, ms = 64, 0.0
    for _ in range(6):
        ms = batch_ms(chain_policy(iters), rows)
        if abs(ms - target_ms) < 0.1 * target_ms:
            break
        iters = max(1, round(iters * target_ms / max(ms, 1e-3)))
    return iters, ms


# Sections ----------------------------------------------------------------------
def _peer_measure(args, n, seeds, policy, model, served_jm):
    """Interleaved runs of RLMesh and jaxmesh on n served lanes; (medians, returns)."""
    contenders, warm, keep = {}, {}, {}
    with _servers(args, model is not None, served_jm, n) as (rl_addr, jm_addr):
        if model is not None:

            def rl():
                t0 = time.perf_counter()
                r = model.run(rl_addr, seeds=seeds, max_episode_steps=args.cap)
                dt = time.perf_counter() - t0
                keep["rl"] = [e.reward for e in r.episodes]
                return {
                    "sps": r.total_steps / dt,
                    "wall": dt,
                    "steps": float(r.total_steps),
                }

            contenders["rlmesh"] = rl
            warm["rlmesh"] = lambda: model.run(
                rl_addr, seeds=list(range(n)), max_episode_steps=20
            )
        if served_jm:
            target = grpc_target(jm_addr)

            def jm():
                r, dt = timed_eval(
                    policy=policy,
                    env=target,
                    num_envs=n,
                    seeds=seeds,
                    max_episode_steps=args.cap,
                )
                keep["jm"] = list(np.asarray(r.returns))
                keep["jm_result"] = r
                return jm_figures(r, dt)

            contenders["jaxmesh"] = jm
        return interleave(contenders, args.repeats, warm), keep


def section_peer(args: argparse.Namespace) -> list[str]:
    print("### 1. peer: served CartPole-v1, jaxmesh vs RLMesh\n")
    policy, forward = mlp_policies()
    model, note = rlmesh_model(
        forward, "MLP2x64", one=int, many=lambda a: a.astype("int64")
    )
    missing = served_missing()
    if missing:
        print(f"jaxmesh served: not available yet ({missing})\n")
    if model is None:
        print(f"rlmesh not measured: {note}\n")
    if missing and model is None:
        return []
    out, rows, telemetry = [], [], {}
    for n, per_lane in ((args.lanes, 1), (1, 2)):
        seeds = list(range(n * per_lane))
        med, keep = _peer_measure(args, n, seeds, policy, model, not missing)
        if "jm_result" in keep:
            telemetry[n] = keep["jm_result"].format_telemetry()
        same = "n/a"
        if "rl" in keep and "jm" in keep:
            agree = sum(a == b for a, b in zip(keep["rl"], keep["jm"], strict=True))
            same = f"{agree}/{len(seeds)}"
        rl_sps = med.get("rlmesh", {}).get("sps")
        jm_sps = med.get("jaxmesh", {}).get("sps")
        ratio = jm_sps / rl_sps if rl_sps and jm_sps else None
        for name, m in med.items():
            rows.append(
                [
                    n,
                    name,
                    len(seeds),
                    m["steps"],
                    m["wall"],
                    m["sps"],
                    m.get("engine_sps", "-"),
                    same,
                ]
            )
        if ratio is not None:
            rows.append([n, "jaxmesh / RLMesh", "", "", "", ratio, "", ""])
            if n == args.lanes:
                out.append(
                    goal(
                        f"peer: jaxmesh over RLMesh, {n} served lanes "
                        "(>= 5x; >= 3x to land)",
                        ratio,
                        ratio >= 5,
                    )
                )
            else:
                out.append(f"result: peer: jaxmesh over RLMesh, 1 lane: {ratio:.3g}x")
    print(
        table(
            [
                "N",
                "runner",
                "episodes",
                "env steps",
                "wall s",
                "env steps/s",
                "engine steps/s",
                "same returns",
            ],
            rows,
        )
    )
    print(
        "\nenv steps/s: env steps over the wall clock of the run call (RLMesh "
        "Model.run, jaxmesh.evaluate), connection and handshake included; engine "
        "steps/s: jaxmesh's result.steps_per_second. same returns: episodes whose "
        "return is equal in both runs.\n"
    )
    for n, text in telemetry.items():
        print(f"jaxmesh telemetry, N = {n} (last timed run; ms per call):\n")
        print(f"```\n{text}\n```\n")
    return out


@contextlib.contextmanager
def _servers(args, rl: bool, jm: bool, n: int, env_kind="cartpole", **kw):
    """(rlmesh address or None, jaxmesh address or None) from ``args.pool``."""
    pool = args.pool
    yield (
        pool.address("rlmesh", env_kind, n, **kw) if rl else None,
        pool.address("jaxmesh", env_kind, n, **kw) if jm else None,
    )


def bare_loop(envs: list[gym.Env], vector_steps: int, first_seed: int) -> dict:
    """Steps every env ``vector_steps`` times, action ``t % 2``; resets ended envs."""
    seed = first_seed
    for e in envs:
        e.reset(seed=seed)
        seed += 1
    steps = ends = 0
    t0 = time.perf_counter()
    for t in range(vector_steps):
        a = t % 2
        for e in envs:
            _, _, term, trunc, _ = e.step(a)
            steps += 1
            if term or trunc:
                e.reset(seed=seed)
                seed += 1
                ends += 1
    dt = time.perf_counter() - t0
    return {
        "sps": steps / dt,
        "wall": dt,
        "steps": float(steps),
        "steps_per_episode": steps / max(ends, 1),
    }


def section_limit(args: argparse.Namespace) -> list[str]:
    print("### 2. limit: a bare loop over the same CartPole envs\n")
    n = args.lanes
    policy, _ = mlp_policies()
    envs = make_envs("cartpole", n)
    seeds = list(range(n))
    vector_steps = args.cap or 500
    missing = served_missing()
    if missing:
        print(f"jaxmesh served: not available yet ({missing})\n")
    contenders: dict[str, Callable[[], dict[str, float]]] = {
        "bare loop (no policy)": lambda: bare_loop(envs, vector_steps, 10_000),
    }

    def inproc():
        r, dt = timed_eval(
            policy=policy, env=envs, num_envs=n, seeds=seeds, max_episode_steps=args.cap
        )
        return jm_figures(r, dt)

    contenders["jaxmesh in process"] = inproc
    with _servers(args, False, not missing, n) as (_, addr):
        if addr is not None:
            target = grpc_target(addr)

            def remote(model, **kw):
                def run():
                    r, dt = timed_eval(
                        policy=model,
                        env=target,
                        num_envs=n,
                        seeds=seeds,
                        max_episode_steps=args.cap,
                        **kw,
                    )
                    return jm_figures(r, dt)

                return run

            chunk_policy = jaxmesh.Model(rule_chunk, native_chunk=K, name="rule_chunk8")
            contenders["jaxmesh served"] = remote(policy)
            contenders[f"jaxmesh served, h = {K} (chunk policy)"] = remote(
                chunk_policy, horizon=K
            )
        med = interleave(contenders, args.repeats)
    for e in envs:
        e.close()
    bare = med["bare loop (no policy)"]["sps"]
    rows = [
        [
            name,
            m["steps"],
            m["wall"],
            m["sps"],
            m.get("engine_sps", "-"),
            m["sps"] / bare,
        ]
        for name, m in med.items()
    ]
    print(
        table(
            [
                "runner",
                "env steps",
                "wall s",
                "env steps/s",
                "engine steps/s",
                "x bare loop",
            ],
            rows,
        )
    )
    spe = med["bare loop (no policy)"]["steps_per_episode"]
    print(
        f"\nN = {n}. The bare loop's episodes last {spe:.0f} steps (action t % 2), "
        "jaxmesh's the MLP's 500 (one reset per episode either way); jaxmesh's "
        f"figures include its policy. The h = {K} row (reported, not the goal's "
        f"figure) runs the chunk policy of section 3: one round trip per {K} "
        "steps.\n"
    )
    out = []
    r = med["jaxmesh in process"]["sps"] / bare
    out.append(
        goal(
            f"limit: jaxmesh in process over a bare loop, N={n} (>= 0.85x)",
            r,
            r >= 0.85,
        )
    )
    if "jaxmesh served" in med:
        r = med["jaxmesh served"]["sps"] / bare
        out.append(
            goal(
                f"limit: jaxmesh served over a bare loop, N={n} (>= 0.5x)", r, r >= 0.5
            )
        )
    return out


def section_chunks(args: argparse.Namespace) -> list[str]:
    print("### 3. chunks on the wire: served CartPole, H = 8 vs H = 1\n")
    missing = served_missing()
    if missing:
        print(f"jaxmesh served: not available yet ({missing})\n")
        return [f"result: chunks: jaxmesh served not available yet ({missing})"]
    n = args.lanes
    seeds = list(range(n))
    policy = jaxmesh.Model(rule_chunk, native_chunk=K, name="rule_chunk8")
    calls: dict[int, int | None] = {}
    with _servers(args, False, True, n) as (_, addr):
        target = grpc_target(addr)

        def run(h):
            r, dt = timed_eval(
                policy=policy,
                env=target,
                num_envs=n,
                seeds=seeds,
                horizon=h,
                max_episode_steps=args.cap,
            )
            calls[h] = telemetry_count(r)
            return jm_figures(r, dt) | {"mean_return": float(np.mean(r.returns))}

        med = interleave({1: lambda: run(1), K: lambda: run(K)}, args.repeats)
    rows = []
    for h, m in med.items():
        c = calls[h]
        per_step = c / m["steps"] if c is not None else "n/a"
        per_vec = c * n / m["steps"] if c is not None else "n/a"
        rows.append([h, m["steps"], m["mean_return"], m["sps"], per_step, per_vec])
    print(
        table(
            [
                "H",
                "env steps",
                "mean return",
                "env steps/s",
                "round trips / env step",
                "round trips / (env step of N lanes)",
            ],
            rows,
        )
    )
    speed = med[K]["sps"] / med[1]["sps"]
    print(
        f"\nN = {n}; round trips from result.telemetry (the last timed run; n/a "
        "when it has no wire or call count). H = 1 would cross once per env step "
        f"of the N lanes, H = {K} once per {K} at best.\n"
    )
    return [f"result: chunks: served H={K} over H=1 throughput: {speed:.3g}x"]


def section_codec(args: argparse.Namespace) -> list[str]:
    print("### 4. codec: 16 lanes of 224x224x3 uint8\n")
    from jaxmesh.remote import codec
    from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb

    lanes = 16
    frames = np.random.default_rng(0).integers(0, 256, (lanes, 224, 224, 3), np.uint8)
    dst = np.empty_like(frames)
    spec = {"image": codec.LeafSpec("image", "uint8", (224, 224, 3))}
    ones, zeros = np.ones(lanes, np.uint32), np.zeros(lanes)

    def tensor_roundtrip():
        data = codec.encode_array(frames, "image").SerializeToString()
        return codec.decode_array(codec.parse_tensor(data), key="image")

    def reply_roundtrip():
        batch = codec.encode_result_batch(
            np.arange(lanes),
            ones,
            ones,
            zeros,
            zeros.astype(bool),
            zeros.astype(bool),
            {"image": frames},
        )
        data = pb.StepReply(batch=batch, call_id=1).SerializeToString()
        back = codec.parse_step_reply(data)
        return codec.decode_result_batch(back.batch, spec, num_lanes=lanes)

    def json_roundtrip():
        msg = json.dumps(
            {
                "dtype": "uint8",
                "shape": list(frames.shape),
                "data": base64.b64encode(frames.tobytes()).decode("ascii"),
            }
        )
        back = json.loads(msg)
        x = np.frombuffer(base64.b64decode(back["data"]), np.dtype(back["dtype"]))
        return x.reshape(back["shape"])

    def copyto():
        np.copyto(dst, frames)

    def to_bytes():
        return bytes(memoryview(frames))

    for fn in (tensor_roundtrip, json_roundtrip):
        assert np.array_equal(fn(), frames), fn.__name__
    assert np.array_equal(reply_roundtrip().observation["image"], frames)

    def per_call(fn, calls):
        def run():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return {"us": 1e6 * (time.perf_counter() - t0) / calls}

        return run

    calls = 3 if args.quick else 20
    names = {
        "np.copyto (one copy)": copyto,
        "bytes() (one copy)": to_bytes,
        "codec: Tensor": tensor_roundtrip,
        "codec: StepReply": reply_roundtrip,
    }
    contenders = {name: per_call(fn, calls) for name, fn in names.items()}
    contenders["base64 in JSON"] = per_call(json_roundtrip, max(1, calls // 4))
    med = interleave(contenders, args.repeats + 2)
    copy_us = med["np.copyto (one copy)"]["us"]
    codec_us = med["codec: StepReply"]["us"]
    mib = frames.nbytes / 2**20
    rows = [
        [name, m["us"], m["us"] / copy_us, m["us"] / codec_us, mib / (m["us"] / 1e6)]
        for name, m in med.items()
    ]
    print(
        table(
            ["encode + decode", "us per call", "x copyto", "x StepReply", "MiB/s"],
            rows,
        )
    )
    print(
        f"\n{frames.nbytes:,} bytes ({mib:.2f} MiB) per call, one [16, 224, 224, 3] "
        "uint8 leaf. Tensor: encode_array, SerializeToString, parse_tensor, "
        "decode_array. StepReply: what a server sends for 16 lanes "
        "(encode_result_batch into a StepReply, SerializeToString, "
        "parse_step_reply, decode_result_batch against the leaf's spec; decoded "
        "arrays view the parsed bytes). base64 in JSON: b64encode + json.dumps, "
        "json.loads + b64decode + np.frombuffer.\n"
    )
    json_us = med["base64 in JSON"]["us"]
    return [
        f"result: codec: StepReply round trip {codec_us / copy_us:.3g}x a memory "
        f"copy; base64-in-JSON {json_us / codec_us:.3g}x the StepReply round trip"
    ]


def slow_kwargs(args: argparse.Namespace) -> dict:
    """The ``SlowEnv`` settings of the pipelining section."""
    per_lane = args.x_ms / args.pipe_lanes
    return {"step_ms": per_lane, "episode_steps": 20 if args.quick else 50}


def _series_total_ms(result: Any, name: str) -> float | None:
    """count * mean of a telemetry series, in ms (None when it is absent)."""
    tel = getattr(result, "telemetry", None) or {}
    series = tel.get(name)
    if not isinstance(series, dict):
        return None
    return 1e3 * series["count"] * series["mean"]


def section_pipelining(args: argparse.Namespace) -> list[str]:
    print("### 5. pipelining: lane groups on vs off\n")
    missing = served_missing() or pipelining_missing()
    if missing:
        print(f"jaxmesh pipelining: not available yet ({missing})\n")
        return [f"result: pipelining: not available yet ({missing})"]
    n, groups, x = args.pipe_lanes, args.groups, args.x_ms
    iters, full_ms = calibrate_chain(x, n)
    group_ms = batch_ms(chain_policy(iters), max(1, n // groups))
    policy = jaxmesh.Model(chain_policy(iters), name=f"chain{iters}")
    kw = slow_kwargs(args)
    seeds = list(range(n * (1 if args.quick else 2)))
    last: dict[bool, Any] = {}
    with _servers(args, False, True, n, env_kind="slow", **kw) as (_, addr):
        target = grpc_target(addr)

        def run(on):
            r, dt = timed_eval(
                policy=policy,
                env=target,
                num_envs=n,
                seeds=seeds,
                **pipeline_kwargs(on, groups),
            )
            last[on] = r
            return jm_figures(r, dt)

        med = interleave(
            {"off": lambda: run(False), "on": lambda: run(True)}, args.repeats
        )
    rows = []
    for on in (False, True):
        m, r = med["on" if on else "off"], last[on]
        vec_steps = m["steps"] / n
        per = [_series_total_ms(r, k) for k in ("predict", "env_step")]
        per = [t / vec_steps if t is not None else "n/a" for t in per]
        rows.append(
            [
                "on" if on else "off",
                m["steps"],
                m["wall"],
                m["sps"],
                1e3 * m["wall"] / vec_steps,
                *per,
            ]
        )
    print(
        table(
            [
                "pipelining",
                "env steps",
                "wall s",
                "env steps/s",
                "ms per env step of N lanes",
                "predict ms (same)",
                "server env ms (same)",
            ],
            rows,
        )
    )
    ideal = (x + full_ms) / max(x, full_ms)
    print(
        f"\nN = {n} lanes, {groups} lane groups when on ({PIPELINE_OPTION}="
        f"{groups}; off: {PIPELINE_OPTION}=1). env: each lane's step costs "
        f"{kw['step_ms']:.3g} ms = X / N (time.sleep, which releases the GIL and "
        "uses no CPU, less its measured overshoot), so the server "
        "(ServeOptions() default: lanes stepped in turn) steps"
        f" all N lanes in ~X = {x} ms and a group in "
        f"X / {groups}. policy: {iters} 128x128 matvecs per row: {full_ms:.2f} ms "
        f"per call of {n} rows, {group_ms:.2f} ms of {max(1, n // groups)} rows "
        "(measured here, jitted, outside the engine). "
        f"{kw['episode_steps']}-step episodes, {len(seeds)} episodes. predict / "
        "server env ms: the run's telemetry (predict, env_step) summed, per env "
        "step of the N lanes. Ideal speed-up when env and policy overlap fully: "
        f"{ideal:.2f}x.\n"
    )
    p_off, e_off = (_series_total_ms(last[False], k) for k in ("predict", "env_step"))
    if p_off and e_off:
        print(
            "Ideal from the off run's own telemetry (predict and server env time "
            f"overlapping fully): {(p_off + e_off) / max(p_off, e_off):.2f}x.\n"
        )
    speed = med["on"]["sps"] / med["off"]["sps"]
    return [goal(f"pipelining: on over off, X={x} ms (>= 1.6x)", speed, speed >= 1.6)]


# Main --------------------------------------------------------------------------
def servers_needed(args: argparse.Namespace, names: list[str]) -> list[tuple]:
    """The server children the chosen sections will ask ``args.pool`` for."""
    jm = served_missing() is None
    need = []
    if "peer" in names:
        for n in (args.lanes, 1):
            if importlib.util.find_spec("rlmesh") is not None:
                need.append(("rlmesh", "cartpole", n))
            need += [("jaxmesh", "cartpole", n)] if jm else []
    if jm and ("limit" in names or "chunks" in names):
        need.append(("jaxmesh", "cartpole", args.lanes))
    if "pipelining" in names and jm and pipelining_missing() is None:
        need.append(("jaxmesh", "slow", args.pipe_lanes, slow_kwargs(args)))
    return need


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen sections; returns 0, or 1 when a section failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    ap.add_argument("--lanes", type=int, default=64, help="CartPole lanes (N)")
    ap.add_argument(
        "--cap", type=int, default=None, help="max_episode_steps (default: 500)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    ap.add_argument("--x-ms", type=float, default=2.0, help="pipelining: X in ms")
    ap.add_argument("--pipe-lanes", type=int, default=16, help="pipelining lanes")
    ap.add_argument("--groups", type=int, default=2, help="pipelining lane groups")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 40 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.lanes, args.cap, args.repeats, args.pipe_lanes = 16, 100, 1, 8
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: unknown {unknown}; choose from {list(SECTIONS)}")

    m = machine()
    print(
        header(
            "remote: served and host-stepped gymnasium envs",
            {
                "nproc": m["nproc"],
                "cpu": m["cpu"],
                "python": m["python"],
                "jax": f"{m['jax']} ({m['jax backend']})",
                "gymnasium": gym.__version__,
                "load": m["load average (1, 5, 15 min)"],
                "N": args.lanes,
                "episode cap": args.cap or "env's own (500)",
                "repeats": args.repeats,
                "OPENBLAS_NUM_THREADS": os.environ["OPENBLAS_NUM_THREADS"],
            },
        )
    )
    lines, failed = [], False
    with ServerPool() as args.pool:
        # Spawn every server the sections need at once (each child imports its
        # library, builds its envs and binds while the others do and while this
        # process compiles).
        args.pool.start(*servers_needed(args, names))
        for name in names:
            t0 = time.perf_counter()
            try:
                lines += globals()[f"section_{name}"](args)
            except Exception:
                failed = True
                print(f"section {name} failed:\n```\n{traceback.format_exc()}```\n")
            print(f"({name}: {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print("### Summary\n")
    print("\n".join(lines) if lines else "(no figures)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
