"""Many hosts: ``Layout(devices="all")`` under ``jax.distributed``.

The test starts two processes (``WORKER``) on 127.0.0.1, each with two forced
CPU devices and JAX's CPU collectives (gloo), so that the mesh holds four
devices of two processes. Both run the same calls; each must return the whole
result, in episode order. The test process compares what each returns with the
unsharded one-device run of the same budget, which it makes itself, and the
per-step policy's episodes with a plain Python loop over the env's own functions
(``reference_loop``). Readiness needs no sleep: ``jax.distributed.initialize``
blocks until both processes have joined.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import gymnax
import jax
import numpy as np
import pytest
import reference_loop as ref

import jaxmesh

TESTS = Path(__file__).resolve().parents[2]

#: Seconds the two processes may take together, compiles included.
DEADLINE_S = 240

#: Shared by the workers and the test process: the policies, the params, the
#: budget. (Each process builds them itself, from the same keys.)
POLICIES = r"""
import jax
import jax.numpy as jnp
import numpy as np

import jaxmesh
from jaxmesh.adapt import Previous, State


def mlp(key, n_in, n_out, width=32):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (n_in, width)) * 0.5,
        "w2": jax.random.normal(k2, (width, n_out)) * 0.5,
    }


def per_step(p, obs):
    return jnp.argmax(jnp.tanh(obs @ p["w1"]) @ p["w2"]).astype(jnp.int32)


def chunk(p, x):
    # A chunk of 4 from a window of 2 frames and the previous action.
    feats = jnp.concatenate([x["obs"].reshape(-1), x["prev"][None] * 1.0])
    logits = (jnp.tanh(feats @ p["w1"]) @ p["w2"]).reshape(4, 2)
    return jnp.argmax(logits, -1).astype(jnp.int32)


CHUNKED = jaxmesh.Model(
    chunk, spec={"obs": State(stack=2), "prev": Previous()}, native_chunk=4
)
KEY = jax.random.PRNGKey(3)
SEEDS = [int(s) for s in np.random.default_rng(1).integers(0, 2**31 - 1, 23)]
SETTINGS = {"num_envs": 8, "layout": jaxmesh.Layout(segment_steps=64)}
#: The same settings with the lanes split over every process's devices.
ON_ALL = {"num_envs": 8, "layout": jaxmesh.Layout(segment_steps=64, devices="all")}
CASES = {
    "per-step": (per_step, mlp(KEY, 4, 2), {}),
    "chunked, window, lead": (
        CHUNKED,
        mlp(KEY, 9, 8),
        {"horizon": 4, "chunking": jaxmesh.Chunking(prefetch_lead=2)},
    ),
}
FIELDS = ("returns", "lengths", "terminated", "truncated", "predict_calls", "seeds")
"""

WORKER = (
    r"""
import json
import sys

import jax

port, me = sys.argv[1], int(sys.argv[2])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=me,
    initialization_timeout=120,
)
assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (
    2, 4, 2
), jax.devices()
"""
    + POLICIES
    + r"""
class Order:
    def __init__(self):
        self.seen = []

    def on_episode_end(self, ep):
        self.seen.append(ep.index)


def record(run, hook):
    out = {f: np.asarray(getattr(run, f)).tolist() for f in FIELDS}
    out.update(
        indices=run.indices.tolist(),
        lanes=run.lanes.tolist(),
        env_steps=int(run.env_steps),
        plan_tile=run.plan_tile,
        num_envs=run.num_envs,
        compile_time=run.compile_time,
        heard=None if hook is None else hook.seen,
    )
    return out


report = {"process": me}
ev = jaxmesh.Evaluator(
    per_step,
    "gymnax:CartPole-v1",
    takes_params=True,
    layout=jaxmesh.Layout(devices="all"),
)
mesh = ev.placement.mesh
report["mesh_processes"] = [d.process_index for d in mesh.devices.flat]
for name, (policy, params, kw) in CASES.items():
    # With a hook the host reads every segment; without, only at the end.
    hook = Order() if name == "per-step" else None
    run = jaxmesh.evaluate(
        policy,
        "gymnax:CartPole-v1",
        params=params,
        seeds=SEEDS,
        hooks=hook,
        **ON_ALL,
        **kw,
    )
    report[name] = record(run, hook)

# The cached program runs other params on a budget smaller than the mesh (one
# device has no episode) without compiling.
policy, _, kw = CASES["per-step"]
hook = Order()
run = jaxmesh.evaluate(
    policy,
    "gymnax:CartPole-v1",
    params=mlp(jax.random.PRNGKey(9), 4, 2),
    seeds=SEEDS[:3],
    hooks=hook,
    **ON_ALL,
    **kw,
)
report["other params, 3 episodes"] = record(run, hook)

# Process 1 passes other seeds, then other params: every process refuses the
# run (the cached program, no compile) after one small all-gather.
report["mismatch"] = []
for seeds, params in ((SEEDS[::-1], KEY), (SEEDS, jax.random.PRNGKey(9))):
    try:
        jaxmesh.evaluate(
            per_step,
            "gymnax:CartPole-v1",
            params=mlp(params if me == 1 else KEY, 4, 2),
            seeds=seeds if me == 1 else SEEDS,
            **ON_ALL,
        )
        report["mismatch"].append(None)
    except ValueError as exc:
        report["mismatch"].append(str(exc))

# devices=2 is the first two devices of the whole system: process 0's. Process 1
# owns none of them and says so before compiling.
if me == 1:
    try:
        jaxmesh.Evaluator(
            per_step,
            "gymnax:CartPole-v1",
            takes_params=True,
            layout=jaxmesh.Layout(devices=2),
        )
        report["refused"] = None
    except ValueError as exc:
        report["refused"] = str(exc)
print("REPORT " + json.dumps(report), flush=True)
"""
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(tmp_path: Path) -> list[tuple[subprocess.Popen, Path, Path]]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(
            [str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
        ),
    )
    port = free_port()
    workers = []
    for i in range(2):
        out, err = tmp_path / f"out{i}.txt", tmp_path / f"err{i}.txt"
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.Popen(
                [sys.executable, "-c", WORKER, str(port), str(i)],
                env=env,
                stdout=o,
                stderr=e,
                cwd=tmp_path,
            )
        workers.append((proc, out, err))
    return workers


def finish(workers: list, deadline: float) -> list[dict]:
    """Waits for both workers (killing both on a timeout or a failure); returns
    their reports."""
    codes = []
    try:
        for proc, _, _ in workers:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        codes.append("timed out")
    finally:
        for proc, _, _ in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = "\n".join(
        f"--- process {i}: exit {proc.returncode}\n{out.read_text()[-3000:]}\n"
        f"{err.read_text()[-6000:]}"
        for i, (proc, out, err) in enumerate(workers)
    )
    assert codes == [0, 0], f"workers: {codes}\n{logs}"
    reports = []
    for _, out, _ in workers:
        lines = [x for x in out.read_text().splitlines() if x.startswith("REPORT ")]
        assert len(lines) == 1, logs
        reports.append(json.loads(lines[0][len("REPORT ") :]))
    return reports


def assert_same(got: dict, want: Any, name: str) -> None:
    for f in ("returns", "lengths", "terminated", "truncated", "predict_calls"):
        np.testing.assert_array_equal(
            np.asarray(got[f], np.asarray(getattr(want, f)).dtype),
            getattr(want, f),
            err_msg=f"{name}: {f}",
        )
    np.testing.assert_array_equal(got["seeds"], want.seeds, err_msg=name)
    e = len(want.seeds)
    assert got["indices"] == list(range(e)), name
    assert got["heard"] in (None, list(range(e))), name
    assert got["env_steps"] == want.env_steps == int(want.lengths.sum()), name
    assert got["plan_tile"] == want.plan_tile and got["num_envs"] == 8, name
    # Device d of 4 (process d // 2) runs episodes d, d + 4, ... on lanes 2d, 2d+1.
    assert [lane // 2 for lane in got["lanes"]] == [i % 4 for i in range(e)], name


@pytest.mark.slow  # make test: the device split (test_sharded.py)
def test_two_processes_equal_one_device(tmp_path: Path):
    deadline = time.monotonic() + DEADLINE_S
    workers = start_workers(tmp_path)
    try:
        # The references, made while the workers start and compile.
        shared: dict = {}
        exec(POLICIES, shared)
        cases, seeds, settings = shared["CASES"], shared["SEEDS"], shared["SETTINGS"]
        want = {
            name: jaxmesh.evaluate(
                policy,
                "gymnax:CartPole-v1",
                params=params,
                seeds=seeds,
                **settings,
                **kw,
            )
            for name, (policy, params, kw) in cases.items()
        }
        per_step, _, _ = cases["per-step"]
        other = shared["mlp"](jax.random.PRNGKey(9), 4, 2)
        want["other params, 3 episodes"] = jaxmesh.evaluate(
            per_step,
            "gymnax:CartPole-v1",
            params=other,
            seeds=seeds[:3],
            **settings,
        )
        # The per-step policy against a plain loop (independent of the engine).
        reset, step = ref.gymnax_fns(*gymnax.make("CartPole-v1"))
        params = cases["per-step"][1]
        policy = ref.single(lambda obs, key: per_step(params, obs))
        plain = [ref.run_episode(reset, step, policy, s) for s in seeds[:8]]
    except BaseException:
        for proc, _, _ in workers:
            proc.kill()
            proc.wait()
        raise
    reports = finish(workers, deadline)

    assert want["per-step"].lengths.min() < want["per-step"].lengths.max()
    for report in reports:
        me = report["process"]
        # "all" is every device of both processes, process 0's first.
        assert report["mesh_processes"] == [0, 0, 1, 1], report["mesh_processes"]
        for name, run in want.items():
            assert_same(report[name], run, f"process {me}, {name}")
        assert report["other params, 3 episodes"]["compile_time"] == 0.0
        got = report["per-step"]
        first = {f: np.asarray(got[f][:8]) for f in shared["FIELDS"]}
        ref.assert_matches(types.SimpleNamespace(**first), plain)
        assert [m and m.split(";")[0] for m in report["mismatch"]] == [
            "under jax.distributed, process(es) [1] were given other seeds than "
            "process 0",
            "under jax.distributed, process(es) [1] were given other params than "
            "process 0",
        ], report["mismatch"]
    refused = reports[1]["refused"]
    assert refused is not None and "none to this process (1 of 2)" in refused
