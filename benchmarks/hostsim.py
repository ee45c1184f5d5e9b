"""Host-stepped Python simulators at user defaults: jaxmesh beside hand loops.

Unlike ``realistic.py`` this script sets no thread environment variable
(``OPENBLAS_NUM_THREADS`` and the like stay as the user has them): the figures
are what a user gets out of the box. For that reason it does not import
``realistic.py`` (which sets ``OPENBLAS_NUM_THREADS`` when imported) and keeps
its own copy of the policy and the hand loop. One run, one process (plus the
child processes named below), repeats interleaved, medians; every contender's
first call (compiling, connecting, starting workers) is timed on its own as
``first call s``. The figure is env steps over the wall clock of the call.

Workload A (the main one): 16 gymnasium ``HalfCheetah-v5`` lanes (MuJoCo),
200-step episodes (``max_episode_steps=200``), episode i reset with
``seed=i``, ``--episodes`` (64) episodes per call, a 2x256 tanh MLP with fixed
random weights (17 -> 256 -> 256 -> 6, tanh head; its chunk variant computes
an [8, 6] chunk from the same trunk). Contenders:

1. ``sim alone``: the 16 envs (built before timing) in a plain loop with zero
   actions, no policy.
2. ``hand loop``: reset the 16 envs with seeds 0..15; per step one jitted
   batched policy call over the [16, 17] observations (``np.asarray`` of the
   result), then ``env.step`` per lane; a lane whose episode ends is reset with
   the next seed (the same episodes as jaxmesh). Every ratio is to this row.
3. ``gymnasium AsyncVectorEnv``: 16 subprocesses (``forkserver``, built before
   timing, ``autoreset_mode=DISABLED``, lanes reset through ``reset_mask``
   with the next seeds) in the same hand loop: what a user picks to use cores.
4. ``jaxmesh workers=0``: ``jaxmesh.evaluate(policy,
   "gymnasium:HalfCheetah-v5", num_envs=16, seeds=range(E),
   max_episode_steps=200, workers=0)`` at h = 1, and the chunk policy with
   ``horizon=8``. The id string makes jaxmesh build its 16 envs inside each
   call (the cost of building them is printed beside the table).
5. ``jaxmesh workers=2`` and ``jaxmesh default`` (``workers`` not given): the
   same call with worker processes.
6. ``jaxmesh served``: a ``jaxmesh serve-env gymnasium:HalfCheetah-v5 --lanes
   16`` child process on 127.0.0.1 (started before timing), h = 1 and h = 8,
   and h = 1 with ``transport="grpc"``.
7. ``EnvPool XLA``: when ``import envpool`` works, a hand-written EnvPool XLA
   loop (``handle, recv, send, step = env.xla()``; a fixed-length
   ``lax.fori_loop`` of ``E * 200 / 16`` batched steps with the same MLP,
   ``num_threads`` 1 and 2), in a child process (envpool's XLA calls need
   ``jax_enable_x64``, which this process must not set). An anchor only: it
   seeds lanes, not episodes, so it runs other episodes (its auto-reset steps
   are counted as steps).

Workload B (heavy sim): ``busyenv.BusyEnv`` burns ~3 ms of pure-Python CPU per
step (a busy loop calibrated at start) and returns a Dict observation
{"image": uint8 64x64x3, "state": float32 [8]}; 8 lanes, 30-step episodes;
the policy reads ``obs["state"]`` and returns a 2-dim float action. The hand
loop (one process) against jaxmesh ``workers=0``, ``workers=2``, default and
``workers=4`` (more workers than cores),
each given a picklable factory (``functools.partial(busyenv.BusyEnv,
loops=...)``) as its env. The env lives in a module of its own that imports no
JAX, as a simulator's does: each worker imports its factory's module, and
importing this one (JAX) took ~1 s of each worker's start.

Workload C (image wire): ``ImageEnv`` below returns one 224x224x3 uint8 image
per step (cheap); 16 lanes, 50-step episodes; the policy averages the image.
jaxmesh in process (a list of 16 envs built before timing) against served on
the same host (a ``serve-env gymnasium:hostsim:HostsimImage-v0`` child).

A contender whose call raises ``TypeError`` naming a keyword or feature this
build of jaxmesh lacks (``workers``, ``transport``, Dict observations) is
printed as ``<name>: not available in this build`` and skipped. Every
jaxmesh contender's (and the vector env's) per-episode returns are checked
against the hand loop's (``np.allclose``; h = 8 rows against jaxmesh's first
h = 8 row): a benchmark comparing different work would be worthless.

Run: ``python benchmarks/hostsim.py [--quick] [--episodes 64]``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import multiprocessing as mp
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from busyenv import BusyEnv, calibrate
from common import envpool_xla_loop, goal, header, machine, median, table
from mlp import HIDDEN, K, act, act_chunk, init_params, jaxmesh_run
from remote_common import START_TIMEOUT_S, STOP_TIMEOUT_S, grpc_target, make_envs

import jaxmesh

HERE = os.path.dirname(os.path.abspath(__file__))
HC_ID = "gymnasium:HalfCheetah-v5"
IMAGE_ID = "HostsimImage-v0"
#: Returns agree when np.allclose(a, b, rtol=RTOL, atol=ATOL): jaxmesh sums an
#: episode's rewards in float32, the hand loop in Python floats.
RTOL, ATOL = 1e-4, 1e-3
#: Thread settings printed (never set) so a reader sees the user defaults.
THREAD_VARS = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "XLA_FLAGS",
)

SIM, HAND, VEC = "sim alone (zero actions)", "hand loop, h = 1", "AsyncVectorEnv x16"
W0, W0_8 = "jaxmesh workers=0, h = 1", f"jaxmesh workers=0, h = {K}"
W2, WDEF = "jaxmesh workers=2, h = 1", "jaxmesh default (no workers=), h = 1"
SV1, SV8 = "jaxmesh served, h = 1", f"jaxmesh served, h = {K}"
SVG = 'jaxmesh served transport="grpc", h = 1'
B_HAND, B_W0 = "hand loop (one process)", "jaxmesh workers=0"
B_W2, B_DEF = "jaxmesh workers=2", "jaxmesh default (no workers=)"
B_W4 = "jaxmesh workers=4 (more workers than cores)"
C_IN, C_SV = "jaxmesh in process", "jaxmesh served (same host)"
EP_NOTE = "seeds per lane, not per episode; not the same episodes"


def envpool_row(threads: int) -> str:
    return f"EnvPool XLA, num_threads={threads}"


# Workload A's policy ----------------------------------------------------------
def batched(fn: Callable, params: Any) -> Callable[[Any], np.ndarray]:
    """What a user jits by hand: a batch of observations -> numpy actions."""
    jitted = jax.jit(fn)
    params = jax.device_put(params)
    return lambda obs: np.asarray(jitted(params, obs))


# Workload C: its env defined here (module level: it pickles) ------------------
class ImageEnv(gym.Env):
    """A cheap env with a big observation: one 224x224x3 uint8 image per step.

    The image is drawn at reset (from the seed) and one row changes per step;
    the reward is the action's value, so returns follow the policy.
    """

    metadata = {"render_modes": []}

    def __init__(self, episode_steps: int = 50):
        self.episode_steps = episode_steps
        self.observation_space = gym.spaces.Box(0, 255, (224, 224, 3), np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._image = np.zeros((224, 224, 3), np.uint8)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._image = self.np_random.integers(0, 256, (224, 224, 3), dtype=np.uint8)
        self._t = 0
        return self._image.copy(), {}

    def step(self, action):
        self._t += 1
        self._image[self._t % 224] = self._t % 256
        reward = float(np.asarray(action).reshape(-1)[0])
        return self._image.copy(), reward, False, self._t >= self.episode_steps, {}


# serve-env imports this module (gymnasium:hostsim:HostsimImage-v0) to make it.
if IMAGE_ID not in gym.registry:
    gym.register(IMAGE_ID, entry_point="hostsim:ImageEnv")


def busy_act(p: Any, obs: dict[str, jax.Array]) -> jax.Array:
    """B's policy: reads only ``obs["state"]`` ([8] or [n, 8]) -> [2] / [n, 2]."""
    return jnp.tanh(obs["state"] @ p["w"])


def image_act(p: Any, obs: jax.Array) -> jax.Array:
    """C's policy: the image's mean, scaled to [-1, 1] ([1] or [n, 1])."""
    mean = jnp.mean(obs.astype(jnp.float32), axis=(-3, -2, -1))
    return (mean * p["scale"] - 1.0)[..., None]


# Contenders -------------------------------------------------------------------
def obs_buffer(space: gym.Space, n: int) -> Any:
    """Stacked observations of ``n`` lanes: an array, or a dict of arrays."""
    if isinstance(space, gym.spaces.Dict):
        return {k: obs_buffer(s, n) for k, s in space.spaces.items()}
    dtype = np.float32 if np.issubdtype(space.dtype, np.floating) else space.dtype
    return np.zeros((n, *space.shape), dtype)


def put(buf: Any, j: int, obs: Any) -> None:
    if isinstance(buf, dict):
        for k in buf:
            buf[k][j] = obs[k]
    else:
        buf[j] = obs


def host_loop(
    envs: list[gym.Env], seeds: list[int], cap: int, forward: Callable | None
) -> tuple[dict[str, float], np.ndarray]:
    """The hand loop (``forward``: stacked obs -> actions) or the sim alone.

    Lane j starts with seeds[j]; a lane whose episode ends (terminated,
    truncated or ``cap`` steps) takes the next unstarted seed, in ascending
    lane order, and is reset at once; a lane with none left is not stepped.
    Returns env steps/s over the call's wall clock and the returns in episode
    order.
    """
    n, total = len(envs), len(seeds)
    t0 = time.perf_counter()
    obs = obs_buffer(envs[0].observation_space, n)
    zeros = np.zeros((n, *envs[0].action_space.shape), np.float32)
    episode = np.full(n, -1)
    ret, length = np.zeros(n), np.zeros(n, np.int64)
    returns = np.zeros(total)
    started = steps = 0
    for j in range(min(n, total)):
        put(obs, j, envs[j].reset(seed=seeds[started])[0])
        episode[j], started = started, started + 1
    active = [j for j in range(n) if episode[j] >= 0]
    while active:
        actions = forward(obs) if forward is not None else zeros
        for j in active:
            o, r, term, trunc, _ = envs[j].step(actions[j])
            ret[j] += r
            length[j] += 1
            steps += 1
            put(obs, j, o)
            if term or trunc or length[j] >= cap:
                returns[episode[j]] = ret[j]
                ret[j], length[j] = 0.0, 0
                if started < total:
                    put(obs, j, envs[j].reset(seed=seeds[started])[0])
                    episode[j], started = started, started + 1
                else:
                    episode[j] = -1
        active = [j for j in active if episode[j] >= 0]
    wall = time.perf_counter() - t0
    return {"sps": steps / wall, "wall": wall, "steps": float(steps)}, returns


def vector_loop(
    venv: gym.vector.VectorEnv, seeds: list[int], cap: int, forward: Callable
) -> tuple[dict[str, float], np.ndarray]:
    """The hand loop over a ``VectorEnv`` built with ``autoreset_mode=DISABLED``.

    The same episode-to-lane order as :func:`host_loop`: ended lanes take the
    next seeds in ascending lane order and are reset together through
    ``reset_mask``. A lane with no episode left keeps stepping in lockstep
    (reset without a seed when it ends); its steps are not counted.
    """
    n, total = venv.num_envs, len(seeds)
    t0 = time.perf_counter()
    first = [seeds[j] if j < total else None for j in range(n)]
    obs = venv.reset(seed=first)[0].astype(np.float32)
    episode = np.array([j if j < total else -1 for j in range(n)])
    started = min(n, total)
    ret, length = np.zeros(n), np.zeros(n, np.int64)
    returns = np.zeros(total)
    steps = 0
    while (episode >= 0).any():
        o, r, term, trunc, _ = venv.step(forward(obs))
        live = episode >= 0
        steps += int(live.sum())
        ret += np.where(live, r, 0.0)
        length += 1
        done = term | trunc | (length >= cap)
        if done.any():
            again: list[int | None] = [None] * n
            for j in np.flatnonzero(done):
                if episode[j] >= 0:
                    returns[episode[j]] = ret[j]
                    if started < total:
                        episode[j], again[j] = started, seeds[started]
                        started += 1
                    else:
                        episode[j] = -1
                ret[j], length[j] = 0.0, 0
            o = venv.reset(seed=again, options={"reset_mask": done})[0]
        obs = o.astype(np.float32)
    wall = time.perf_counter() - t0
    return {"sps": steps / wall, "wall": wall, "steps": float(steps)}, returns


def missing_feature(e: BaseException, words: tuple[str, ...]) -> bool:
    """True when ``e`` is a TypeError naming one of ``words`` (a keyword or
    feature this build of jaxmesh lacks)."""
    return isinstance(e, TypeError) and any(w in str(e) for w in words)


def measure(
    contenders: dict[str, tuple[Callable[[], tuple[dict, np.ndarray]], tuple]],
    repeats: int,
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray], list[str]]:
    """First call of each contender, then ``repeats`` interleaved timed calls.

    ``contenders`` maps a name to (the call, the words whose TypeError means
    "not in this build"). Returns medians per contender (``first``: the first
    call's wall clock; ``runs``: each repeat's env steps/s), each contender's
    returns (last call) and the lines naming contenders not measured.
    """
    first, runs, returns, skipped = {}, {}, {}, []
    live = {}
    for name, (fn, words) in contenders.items():
        try:
            figures, returns[name] = fn()
        except Exception as e:
            if missing_feature(e, words):
                line = f"{name}: not available in this build ({str(e)[:160]})"
            else:
                print(f"{name} failed:\n```\n{traceback.format_exc()}```\n")
                line = f"{name}: failed: {traceback.format_exc().splitlines()[-1]}"
            print(line, flush=True)
            skipped.append(line)
            continue
        first[name], runs[name], live[name] = figures["wall"], [], fn
    for _ in range(repeats):
        for name, fn in live.items():
            figures, returns[name] = fn()
            runs[name].append(figures)
    med = {
        name: {k: median([r[k] for r in rs]) for k in rs[0]}
        | {"first": first[name], "runs": [r["sps"] for r in rs]}
        for name, rs in runs.items()
    }
    return med, returns, skipped


def paired(med: dict, a: str, b: str) -> float | None:
    """The median over repeats of a's env steps/s over b's in the same repeat."""
    if a in med and b in med:
        pairs = zip(med[a]["runs"], med[b]["runs"], strict=True)
        return median([x / y for x, y in pairs])
    return None


def agreement(a: np.ndarray | None, b: np.ndarray | None) -> tuple[str, bool]:
    """("k/n", all agree) for episodes whose returns agree (allclose)."""
    if a is None or b is None:
        return "n/a", True
    if a.shape != b.shape:
        return f"budget differs ({a.size} vs {b.size})", False
    same = np.isclose(a, b, rtol=RTOL, atol=ATOL)
    return f"{int(same.sum())}/{same.size}", bool(same.all())


def report_table(
    med: dict, returns: dict, ref_of: dict[str, str | None], base: str, notes: dict
) -> list[str]:
    """Prints one workload's table; returns the lines for differing returns."""
    rows, differ = [], []
    for name, f in med.items():
        ref = ref_of.get(name, base)
        if name in notes:
            same = notes[name]
        elif ref is None or name == ref:
            same = "(reference)"
        else:
            same, ok = agreement(returns.get(name), returns.get(ref))
            if not ok:
                differ.append(f"returns differ: {name} vs {ref}: {same} agree")
        r = paired(med, name, base)
        rows.append(
            [
                name,
                f["steps"],
                f["first"],
                f["wall"],
                f["sps"],
                float("nan") if r is None else r,
                same,
            ]
        )
    headers = ["contender", "env steps", "first call s", "wall s", "env steps/s"]
    print(table([*headers, f"x {base}", "same returns"], rows))
    for line in differ:
        print(line)
    return differ


def add_goal(out: list[str], text: str, r: float | None, floor: float) -> None:
    if r is None:
        out.append(f"result: hostsim: {text}: not measured")
    else:
        out.append(goal(f"hostsim: {text} (>= {floor}x)", r, r >= floor))


# Child processes ----------------------------------------------------------------
class ServeEnv:
    """A ``jaxmesh serve-env ENV --lanes N`` child process on 127.0.0.1.

    Started at once; :meth:`address` waits for the address it prints on stdout.
    """

    def __init__(self, env_id: str, lanes: int):
        self.what = f"jaxmesh serve-env {env_id} --lanes {lanes}"
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [HERE, *filter(None, [env.get("PYTHONPATH")])]
        )
        cmd = [sys.executable, "-m", "jaxmesh.cli", "serve-env", env_id]
        self.proc = subprocess.Popen(
            [*cmd, "--lanes", str(lanes)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self._address: str | None = None

    def address(self) -> str:
        """The bound address as ``grpc://host:port``.

        Raises:
          RuntimeError: the child exited or printed nothing within
            ``START_TIMEOUT_S`` (its stderr is in the message).
        """
        if self._address is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
            line = self.proc.stdout.readline().strip() if ready else ""
            if not line:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{self.what} printed no address:\n{err}")
            self._address = grpc_target(line)
        return self._address

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _envpool_child(conn, lanes: int, iters: int, cap: int, threads, seed: int):
    """EnvPool's XLA loops in a child (x64 on, as envpool's XLA calls need).

    Answers ``threads`` with (status, figures of one timed run of that pool).
    """
    try:
        jax.config.update("jax_enable_x64", True)
        import envpool

        params = jax.device_put(init_params(seed))
        policy = functools.partial(act, params)
        pools = {
            t: list(envpool_xla_loop("HalfCheetah-v5", lanes, t, cap, iters, policy))
            for t in threads
        }
        conn.send(("ok", envpool.__version__))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            t = conn.recv()
        except EOFError:
            return
        if t == "stop":
            return
        env, loop, h, o = pools[t]
        t0 = time.perf_counter()
        h, o, _ = jax.block_until_ready(loop(h, o))
        wall = time.perf_counter() - t0
        pools[t][2:] = [h, o]
        steps = float(iters * lanes)
        conn.send(("ok", {"sps": steps / wall, "wall": wall, "steps": steps}))


class EnvPoolChild:
    """The EnvPool anchor's child process (spawned), or why there is none."""

    def __init__(self, lanes: int, iters: int, cap: int, threads, seed: int):
        self.why, self.proc = None, None
        self.version: str | None = None
        try:
            import envpool  # noqa: F401
        except ImportError:
            self.why = "envpool: not installed"
            return
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_envpool_child,
            args=(child, lanes, iters, cap, tuple(threads), seed),
            daemon=True,
        )
        self.proc.start()
        child.close()

    def ready(self) -> bool:
        if self.proc is None:
            return False
        if self.version is None and self.why is None:
            if not self.conn.poll(START_TIMEOUT_S):
                self.why = "envpool: its child reported nothing"
            else:
                status, payload = self.conn.recv()
                if status == "ok":
                    self.version = payload
                else:
                    self.why = f"envpool: failed:\n{payload}"
        return self.why is None

    def run(self, threads: int) -> tuple[dict, np.ndarray]:
        self.conn.send(threads)
        status, figures = self.conn.recv()
        return figures, np.zeros(0)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        self.proc.join(STOP_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(STOP_TIMEOUT_S)


# Workloads ----------------------------------------------------------------------
def workload_a(args, served: ServeEnv, pool: EnvPoolChild) -> list[str]:
    n, cap = args.lanes, args.cap
    seeds = list(range(args.episodes))
    params = init_params(args.seed)
    forward = batched(act, params)
    policy = jaxmesh.Model(act, params=params, name="mlp2x256_tanh")
    chunk = jaxmesh.Model(
        act_chunk, params=params, native_chunk=K, name=f"mlp2x256_tanh_chunk{K}"
    )
    envs = make_envs("halfcheetah", n)
    t0 = time.perf_counter()
    for e in make_envs("halfcheetah", n):
        e.close()
    build_s = time.perf_counter() - t0
    make_one = functools.partial(gym.make, "HalfCheetah-v5", max_episode_steps=cap)
    venv = gym.vector.AsyncVectorEnv(
        [make_one] * n,
        context="forkserver",
        autoreset_mode=gym.vector.AutoresetMode.DISABLED,
    )
    hc = HC_ID
    workers, transport = ("workers",), ("transport",)
    contenders: dict[str, tuple[Callable, tuple]] = {
        SIM: (lambda: host_loop(envs, seeds, cap, None), ()),
        HAND: (lambda: host_loop(envs, seeds, cap, forward), ()),
        VEC: (lambda: vector_loop(venv, seeds, cap, forward), ()),
        W0: (lambda: jaxmesh_run(policy, hc, n, seeds, cap, workers=0), workers),
        W0_8: (
            lambda: jaxmesh_run(chunk, hc, n, seeds, cap, horizon=K, workers=0),
            workers,
        ),
        W2: (lambda: jaxmesh_run(policy, hc, n, seeds, cap, workers=2), workers),
        WDEF: (lambda: jaxmesh_run(policy, hc, n, seeds, cap), ()),
    }
    notes = []
    try:
        target = served.address()
    except RuntimeError as e:
        notes.append(f"jaxmesh served not measured: {e}")
        target = None
    if target is not None:
        contenders[SV1] = (lambda: jaxmesh_run(policy, target, n, seeds, cap), ())
        contenders[SV8] = (
            lambda: jaxmesh_run(chunk, target, n, seeds, cap, horizon=K),
            (),
        )
        contenders[SVG] = (
            lambda: jaxmesh_run(
                policy, target, n, seeds, cap, served=jaxmesh.Served(transport="grpc")
            ),
            transport,
        )
    ep_rows = []
    if pool.ready():
        for t in args.envpool_threads:
            ep_rows.append(envpool_row(t))
            contenders[ep_rows[-1]] = (lambda t=t: pool.run(t), ())
    else:
        notes.append(pool.why or "envpool: not installed")
    print(
        f"### A: {n} HalfCheetah-v5 lanes, a 2x{HIDDEN} tanh MLP, {args.episodes} "
        f"episodes of {cap} steps\n",
        flush=True,
    )
    try:
        med, returns, skipped = measure(contenders, args.repeats)
    finally:
        venv.close()
        for e in envs:
            e.close()
    h8 = W0_8 if W0_8 in med else (SV8 if SV8 in med else None)
    ref_of = {SV8: h8, W0_8: h8}
    table_notes = {SIM: "- (no policy)", **{r: EP_NOTE for r in ep_rows}}
    if h8 is not None:
        table_notes[h8] = f"(reference at h = {K})"
    print()
    differ = report_table(med, returns, ref_of, HAND, table_notes)
    print(
        f"\nenv steps/s: env steps over the wall clock of the call (median of "
        f"{args.repeats}; first call s: the first call, compiling, connecting and "
        "starting workers included). x hand loop: the median over repeats of the "
        "ratio of the two runs of one repeat. same returns: np.allclose "
        f"(rtol={RTOL}, atol={ATOL}) per episode against the hand loop (h = {K} "
        f"rows against the first h = {K} row). jaxmesh's rows pass the id "
        f"{HC_ID!r}: each call builds its {n} envs, which takes {build_s:.2f} s "
        f"here. EnvPool rows: {EP_NOTE}; "
        f"{args.episodes * cap // n} batched steps of {n} lanes in one fori_loop"
        + (f" (envpool {pool.version})" if pool.version else "")
        + ".\n"
    )
    for line in notes:
        print(line)
    out: list[str] = []
    add_goal(
        out,
        "A: jaxmesh workers=2 over the hand loop, h = 1",
        paired(med, W2, HAND),
        1.6,
    )
    add_goal(
        out,
        "A: jaxmesh default over the hand loop, h = 1",
        paired(med, WDEF, HAND),
        1.6,
    )
    add_goal(
        out,
        "A: jaxmesh served (same host) over the hand loop, h = 1",
        paired(med, SV1, HAND),
        1.4,
    )
    add_goal(
        out,
        'A: jaxmesh served transport="grpc" over the hand loop, h = 1',
        paired(med, SVG, HAND),
        0.8,
    )
    add_goal(
        out,
        "A: jaxmesh workers=0 over the hand loop, h = 1",
        paired(med, W0, HAND),
        0.95,
    )
    for name in (VEC, *ep_rows, W0_8, SV8):
        r = paired(med, name, HAND)
        if r is not None:
            out.append(f"result: hostsim: A: {name} over the hand loop: {r:.3g}x")
    return out + [f"result: hostsim: A: {s}" for s in skipped + differ]


def workload_b(args, loops: int) -> list[str]:
    n, cap, steps_ms = 8, 30, args.busy_ms
    seeds = list(range(args.b_episodes))
    rng = np.random.default_rng(args.seed)
    params = {"w": rng.normal(0.0, 0.5, (8, 2)).astype(np.float32)}
    forward = batched(busy_act, params)
    policy = jaxmesh.Model(busy_act, params=params, name="busy_state_policy")
    # The factory pickles by module name (busyenv.BusyEnv), not __main__.
    factory = functools.partial(BusyEnv, loops=loops, episode_steps=cap)
    envs = [factory() for _ in range(n)]
    # A TypeError naming workers=, Dict observations, or a factory as env (this
    # build refusing the functools.partial as an env): not available.
    feats = ("workers", "Dict", "not an environment", "not a gymnasium env")
    contenders: dict[str, tuple[Callable, tuple]] = {
        B_HAND: (lambda: host_loop(envs, seeds, cap, forward), ()),
        B_W0: (lambda: jaxmesh_run(policy, factory, n, seeds, cap, workers=0), feats),
        B_W2: (lambda: jaxmesh_run(policy, factory, n, seeds, cap, workers=2), feats),
        B_DEF: (lambda: jaxmesh_run(policy, factory, n, seeds, cap), feats),
        B_W4: (lambda: jaxmesh_run(policy, factory, n, seeds, cap, workers=4), feats),
    }
    print(
        f"\n### B: {n} lanes of a {steps_ms:g} ms pure-Python sim ({loops:,} loops), "
        f"Dict observations, {args.b_episodes} episodes of {cap} steps\n",
        flush=True,
    )
    try:
        med, returns, skipped = measure(contenders, args.repeats)
    finally:
        for e in envs:
            e.close()
    print()
    differ = report_table(med, returns, {}, B_HAND, {})
    print(
        f"\nThe hand loop runs in this one process; jaxmesh's rows are given the "
        f"picklable factory functools.partial(busyenv.BusyEnv, loops={loops}). The "
        f"ideal with 2 processes on {os.cpu_count()} cores is 2x.\n"
    )
    out: list[str] = []
    add_goal(
        out,
        "B: jaxmesh workers=2 over one process (hand loop)",
        paired(med, B_W2, B_HAND),
        1.9,
    )
    for name in (B_W0, B_DEF, B_W4):
        r = paired(med, name, B_HAND)
        if r is not None:
            out.append(f"result: hostsim: B: {name} over the hand loop: {r:.3g}x")
    return out + [f"result: hostsim: B: {s}" for s in skipped + differ]


def workload_c(args, served: ServeEnv) -> list[str]:
    n, cap = 16, 50
    seeds = list(range(args.c_episodes))
    params = {"scale": np.float32(1.0 / 127.5)}
    forward = batched(image_act, params)
    policy = jaxmesh.Model(image_act, params=params, name="image_mean")
    envs = [ImageEnv(episode_steps=cap) for _ in range(n)]
    takes = inspect.signature(jaxmesh.evaluate).parameters
    in_kw = {"workers": 0} if "workers" in takes else {}
    contenders: dict[str, tuple[Callable, tuple]] = {
        HAND: (lambda: host_loop(envs, seeds, cap, forward), ()),
        C_IN: (lambda: jaxmesh_run(policy, envs, n, seeds, cap, **in_kw), ()),
    }
    notes = []
    try:
        target = served.address()
        contenders[C_SV] = (lambda: jaxmesh_run(policy, target, n, seeds, cap), ())
    except RuntimeError as e:
        notes.append(f"jaxmesh served not measured: {e}")
    print(
        f"\n### C: {n} lanes of 224x224x3 uint8 images, {args.c_episodes} episodes "
        f"of {cap} steps\n",
        flush=True,
    )
    try:
        med, returns, skipped = measure(contenders, args.repeats)
    finally:
        for e in envs:
            e.close()
    print()
    differ = report_table(med, returns, {}, HAND, {})
    mb = 224 * 224 * 3 * n / 1e6
    print(
        f"\njaxmesh in process: a list of {n} ImageEnv built before timing"
        + (" (workers=0)" if in_kw else " (default options)")
        + f"; served: a serve-env child over gymnasium:hostsim:{IMAGE_ID} on "
        f"127.0.0.1 ({mb:.1f} MB of images per batched step on the wire).\n"
    )
    for line in notes:
        print(line)
    out: list[str] = []
    add_goal(
        out,
        "C: jaxmesh served (same host) over in process, 224x224x3 images",
        paired(med, C_SV, C_IN),
        0.8,
    )
    r = paired(med, C_IN, HAND)
    if r is not None:
        out.append(
            f"result: hostsim: C: jaxmesh in process over the hand loop: {r:.3g}x"
        )
    return out + [f"result: hostsim: C: {s}" for s in skipped + differ]


# Main -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Runs workloads A, B and C; prints their tables and goal lines.

    Returns 1 when a contender failed (other than not being in this build).
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=16, help="A: HalfCheetah lanes")
    ap.add_argument("--episodes", type=int, default=64, help="A: episodes per run")
    ap.add_argument("--cap", type=int, default=200, help="A: max_episode_steps")
    ap.add_argument("--b-episodes", type=int, default=128, help="B: episodes per run")
    ap.add_argument("--busy-ms", type=float, default=3.0, help="B: CPU ms per step")
    ap.add_argument("--c-episodes", type=int, default=64, help="C: episodes per run")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats")
    ap.add_argument("--seed", type=int, default=0, help="the policy weights' seed")
    ap.add_argument(
        "--envpool-threads", default="1,2", help="EnvPool num_threads to measure"
    )
    ap.add_argument("--only", default="A,B,C", help="workloads to run, e.g. A,B")
    ap.add_argument("--quick", action="store_true", help="small sizes (~1-3 min)")
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.b_episodes, args.c_episodes = args.lanes, 8, 16
        args.repeats = 1
    args.envpool_threads = [int(t) for t in args.envpool_threads.split(",") if t]
    only = {w.strip().upper() for w in args.only.split(",")}
    # jaxmesh's worker processes and serve-env import hostsim by module name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    # Calibrated first, before any child process competes for the cores.
    loops = calibrate(args.busy_ms)

    m = machine()
    print(
        header(
            "hostsim: host-stepped Python simulators at user defaults",
            {
                "nproc": m["nproc"],
                "cpu": m["cpu"],
                "python": m["python"],
                "jax": f"{m['jax']} ({m['jax backend']})",
                "gymnasium": gym.__version__,
                "load": m["load average (1, 5, 15 min)"],
                "repeats": args.repeats,
                **{v: os.environ.get(v, "unset") for v in THREAD_VARS},
            },
        ),
        flush=True,
    )
    out: list[str] = []
    a_served = ServeEnv(HC_ID, args.lanes) if "A" in only else None
    c_served = ServeEnv(f"gymnasium:hostsim:{IMAGE_ID}", 16) if "C" in only else None
    pool = None
    try:
        if "A" in only:
            iters = args.episodes * args.cap // args.lanes
            pool = EnvPoolChild(
                args.lanes, iters, args.cap, args.envpool_threads, args.seed
            )
            out += workload_a(args, a_served, pool)
            pool.stop()
            a_served.stop()
            pool = a_served = None
        if "B" in only:
            out += workload_b(args, loops)
        if "C" in only:
            out += workload_c(args, c_served)
    finally:
        for child in (pool, a_served, c_served):
            if child is not None:
                child.stop()
    print("\n" + "\n".join(out))
    # Not available in this build is expected; any other failure is an error.
    return 1 if any(": failed:" in line for line in out) else 0


if __name__ == "__main__":
    sys.exit(main())
