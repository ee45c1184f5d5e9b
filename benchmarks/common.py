"""Shared helpers for the benchmark scripts: timing, policies, machine, tables.

Every benchmark measures its contenders side by side in one process: repeats are
interleaved (A, B, A, B, ...), everything is compiled and warmed up before the
first timed repeat, device work is waited for with ``block_until_ready`` (or a
host read of the result), and the reported figure is the median.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """ReLU MLP: ``hidden`` layers, then ``out`` linear outputs."""

    hidden: Sequence[int]
    out: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.out)(x)


def init_mlp(hidden: Sequence[int], out: int, obs_dim: int = 4, seed: int = 0):
    """A randomly initialised MLP and its params."""
    module = MLP(tuple(hidden), out)
    params = module.init(jax.random.PRNGKey(seed), jnp.zeros((obs_dim,)))
    return module, params


def balancing_params(params: Any) -> Any:
    """Weights for the 2x64 CartPole MLP that pick ``obs[2] + 0.5 * obs[3] > 0``.

    Hidden unit 0 carries ``relu(s)``, unit 1 carries ``relu(-s)`` with
    ``s = obs[2] + 0.5 * obs[3]`` (pole angle and angular velocity); the second
    layer passes them through and the head maps them to the logits of action 1
    (push right) and action 0. Every other weight is zero: the network costs
    exactly what a random one costs, but keeps the pole up for the whole
    500-step episode.
    """
    p = jax.tree.map(jnp.zeros_like, params)
    d0, d1, d2 = (p["params"][f"Dense_{i}"] for i in range(3))
    d0["kernel"] = d0["kernel"].at[:, 0].set(jnp.array([0.0, 0.0, 1.0, 0.5]))
    d0["kernel"] = d0["kernel"].at[:, 1].set(-jnp.array([0.0, 0.0, 1.0, 0.5]))
    d1["kernel"] = d1["kernel"].at[0, 0].set(1.0).at[1, 1].set(1.0)
    d2["kernel"] = d2["kernel"].at[0, 1].set(1.0).at[1, 0].set(1.0)
    return p


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def interleave(
    contenders: dict[str, Callable[[], dict[str, float]]],
    repeats: int,
    warmups: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, dict[str, float]]:
    """Runs each contender ``repeats`` times, interleaved; medians per metric.

    Each contender returns a dict of metrics for one run; the result maps a
    contender's name to the median of each of its metrics. Contenders are run
    once each first as a warm-up (that run is discarded), or ``warmups[name]``
    instead when given (a cheaper call that compiles and connects the same).
    """
    warmups = warmups or {}
    for name, fn in contenders.items():
        warmups.get(name, fn)()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            runs[name].append(fn())
    return {
        name: {k: median([r[k] for r in rs]) for k in rs[0]}
        for name, rs in runs.items()
    }


def size_budget(
    run: Callable[[int], Any], num_envs: int, seconds: float, start: int = 4096
) -> int:
    """An episode budget (a multiple of ``num_envs``) whose run takes ~``seconds``.

    ``run(episodes)`` calls ``jaxmesh.evaluate`` and returns its result; each
    new budget compiles once, so few are tried. Small runs overstate the time
    per step (the host loop's fixed costs): the budget grows until a run takes a
    tenth of the target, then is scaled from that run's ``run_time`` (and kept
    as it is when it already takes half the target or more).
    """
    episodes = num_envs * max(1, math.ceil(start / num_envs))
    while True:
        t = max(run(episodes).run_time, 1e-6)
        if t >= 0.5 * seconds:
            return episodes
        if t >= 0.1 * seconds:
            break
        episodes *= int(min(64, max(4, 0.5 * seconds / t)))
    return num_envs * max(1, math.ceil(episodes * seconds / t / num_envs))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Calls ``fn``, waits for its device arrays, returns (value, seconds)."""
    t0 = time.perf_counter()
    out = fn()
    out = jax.block_until_ready(out)
    return out, time.perf_counter() - t0


def op_profile(fn: Callable[[], Any], per: float, top: int = 15) -> str:
    """Traces one call of ``fn`` with ``jax.profiler``; a table of its XLA ops.

    Each op's total time is divided by ``per`` (e.g. the number of env steps
    of N lanes). On CPU every thunk is traced, which inflates tiny ops: read
    the shares, not the absolute times.
    """
    import collections
    import glob
    import gzip
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            jax.block_until_ready(fn())
        path = sorted(glob.glob(f"{tmp}/**/*perfetto_trace.json.gz", recursive=True))
        with gzip.open(path[-1]) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("$", "end:")):
            continue
        total[name] += e.get("dur", 0)
        count[name] += 1
    rows = [[name[:60], count[name], us / per] for name, us in total.most_common(top)]
    return table(["op (inclusive for while/cond)", "calls", "us per step"], rows)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> str:
    try:
        return subprocess.run(
            ["nproc"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(os.cpu_count())


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": nproc(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax backend": jax.default_backend(),
        "load average (1, 5, 15 min)": " ".join(f"{x:.2f}" for x in load),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats are printed with 3 significant digits."""

    def cell(x: Any) -> str:
        if isinstance(x, float):
            if x != 0 and abs(x) < 1e-3:
                return f"{x:.3g}"
            return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
        if isinstance(x, int):
            return f"{x:,}"
        return str(x)

    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def goal(text: str, figure: float, met: bool) -> str:
    """One goal line; ``run_all.py`` gathers these lines into its summary."""
    return f"goal: {text}: {figure:.3g} -> {'met' if met else 'MISSED'}"


def header(title: str, settings: dict[str, Any]) -> str:
    """A one-line title and the run's settings, for the top of a report."""
    parts = ", ".join(f"{k}={v}" for k, v in settings.items())
    return f"## {title}\n\nsettings: {parts}\n"


def envpool_xla_loop(
    task: str,
    lanes: int,
    threads: int,
    cap: int,
    iters: int,
    policy: Callable,
    *,
    raw: bool = False,
    **make_kwargs: Any,
) -> tuple:
    """The hand-written anchor: a pool of ``lanes`` EnvPool envs (seed 0)
    stepped through EnvPool's XLA interface in a jitted ``fori_loop`` of
    ``iters`` steps, each lane acting ``policy(obs)``; no per-episode
    accounting. The policy gets float32 observations and returns actions
    made float64 (MuJoCo), or with ``raw`` takes the batch as EnvPool gives it
    and returns EnvPool's action dtype (Atari: uint8 frames in, int32 actions
    out). ``make_kwargs`` go to ``envpool.make``. EnvPool's ``xla()`` needs
    ``jax_enable_x64`` on. Returns ``(env, loop, handle, obs)``, where
    ``loop(handle, obs) -> (handle, obs, total reward)``."""
    import envpool

    env = envpool.make(
        task,
        env_type="gymnasium",
        num_envs=lanes,
        batch_size=lanes,
        num_threads=threads,
        seed=0,
        max_episode_steps=cap,
        **make_kwargs,
    )
    handle, recv, _send, step = env.xla()
    env.async_reset()
    handle, (obs, *_) = recv(handle)
    ids = jnp.arange(lanes, dtype=jnp.int32)
    act = policy if raw else lambda o: policy(o.astype(jnp.float32)).astype(jnp.float64)

    def body(_, carry):
        h, o, total = carry
        h, (o, r, *_) = step(h, act(o), ids)
        return h, o, total + r.sum(dtype=jnp.float64)

    loop = jax.jit(
        lambda h, o: jax.lax.fori_loop(0, iters, body, (h, o, jnp.float64(0.0)))
    )
    return env, loop, handle, obs


def serve_policy_process(*args: str) -> tuple[subprocess.Popen, str]:
    """``jaxmesh serve-policy *args`` in its own process, as a user starts it
    (``benchmarks/`` on its path); the process and the address it printed once
    serving (``--ready-fd``).

    Raises:
      RuntimeError: the server did not start (the process is reaped).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    read, write = os.pipe()
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmesh.cli", "serve-policy", *args]
        + ["--ready-fd", str(write)],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )
    os.close(write)
    with os.fdopen(read, "rb") as ready:
        line = ready.readline().decode().strip()
    if not line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"jaxmesh serve-policy {' '.join(args)} did not start")
    return proc, line


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds (Linux's /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
