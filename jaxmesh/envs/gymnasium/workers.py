"""Gymnasium lanes stepped by worker processes (``jaxmesh-worker``), one core each.

A Python simulator's step holds the GIL, so :class:`WorkerPool` splits the lanes
into contiguous blocks, each stepped by a process's ``lanes.EnvListStepper``.
A shared segment holds each lane's action, flags, reward, ends and observation;
the pipes carry commands, info values, env errors and what ``run`` ops return
(resets' observations too). A worker that dies raises :class:`WorkerLost` once a
new one has rebuilt its lanes' envs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing import connection
from typing import Any

import numpy as np

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.envs.gymnasium.leaves import ObsLayout
from jaxmesh.envs.gymnasium.shm import Segment, Slots

#: Seconds a worker may take to build its envs and say so.
START_SECONDS = 300.0
#: Seconds a worker has to exit after ``close`` before it is killed.
EXIT_SECONDS = 5.0


class WorkerLost(RuntimeError):
    """Worker ``worker`` (lanes ``lanes``) died; its envs were rebuilt."""

    def __init__(self, worker, lanes: list[int], exitcode: int | None, pid=0):
        at = f"pid {pid}, " if pid else ""
        super().__init__(
            f"worker process {worker} ({at}lanes {lanes[0]}..{lanes[-1]}) died "
            f"({exit_text(exitcode)})"
        )
        self.worker, self.lanes, self.exitcode, self.pid = worker, lanes, exitcode, pid


def exit_text(code: int | None) -> str:
    """A process's exit status in words (``killed by SIGSEGV``, ``exit code 3``)."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class WorkerCrashed(RuntimeError):
    """A served lane's worker process died in a call (``ProcessStepper``)."""


def is_source(env: Any) -> bool:
    """``"gymnasium:<id>"``, a factory or a non-empty list of factories."""
    if isinstance(env, str):
        return env.startswith(shared.PREFIX + ":")
    if isinstance(env, list):
        return bool(env) and all(shared.is_factory(e) for e in env)
    return shared.is_factory(env)


def check_source(env: Any, num_lanes: int) -> None:
    """Refuses env objects or unpicklable factories (TypeError), or fewer
    factories than lanes (ValueError), before any worker starts."""
    gym = shared.import_gymnasium()
    if isinstance(env, gym.Env | gym.vector.VectorEnv) or (
        isinstance(env, list) and env and not all(shared.is_factory(e) for e in env)
    ):
        raise TypeError(
            f"workers=: env {type(env).__name__} holds env objects built in this "
            "process, which worker processes cannot share; pass "
            "'gymnasium:<id>' or a picklable zero-argument factory (a "
            "module-level function or functools.partial(gymnasium.make, id)) "
            "that each worker calls, or workers=0"
        )
    if isinstance(env, list) and len(env) < num_lanes:
        raise ValueError(
            f"workers=: {len(env)} env factories for {num_lanes} lanes; pass one "
            "factory per lane (or one factory for all), or num_envs="
            f"{len(env)}"
        )
    if isinstance(env, str):
        shared.parse_id(env)
        return
    for f in env if isinstance(env, list) else [env]:
        try:
            pickle.dumps(f)
        except Exception as exc:  # noqa: BLE001 - any pickling failure
            raise TypeError(
                f"workers=: env factory {getattr(f, '__qualname__', f)!r} cannot "
                f"be pickled for a worker process ({type(exc).__name__}: {exc}); "
                "pass a module-level function or functools.partial(gymnasium."
                "make, id, ...) instead of a lambda or a local function, or "
                "workers=0"
            ) from None


#: The lanes' env work per step from which the default uses workers (2 cores:
#: 16 lanes of 1.2 ms ran at 0.4-0.6x in workers, 8 lanes of 3 ms at 1.96x).
WORTH_SECONDS = 5e-3
#: Env steps timed by ``default_workers``.
PROBE_STEPS = 16


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(source: Any, num_lanes: int) -> int:
    """``workers=None``: ``workers_for`` the fastest of ``PROBE_STEPS`` steps."""
    c = cores()
    if c < 2 or num_lanes < 2:
        return 0
    env = build_envs(source, [0])[0]
    try:
        env.reset(seed=0)
        action = shared.idle_action(env.action_space)
        if isinstance(env.action_space, shared.import_gymnasium().spaces.Discrete):
            action = int(action)
        fastest = float("inf")
        for _ in range(PROBE_STEPS):
            t0 = time.perf_counter()
            _, _, term, trunc, _ = env.step(action)
            fastest = min(fastest, time.perf_counter() - t0)
            if term or trunc:
                break
    finally:
        env.close()
    return workers_for(fastest, num_lanes, c)


def workers_for(step_seconds: float, num_lanes: int, cores: int) -> int:
    """One worker per core (at most one per lane) when the lanes' env steps
    together cost at least ``WORTH_SECONDS``, else 0 (in process)."""
    if cores < 2 or num_lanes < 2 or step_seconds * num_lanes < WORTH_SECONDS:
        return 0
    return min(cores, num_lanes)


def build_envs(source: Any, lanes: Sequence[int]) -> list:
    """The envs of ``lanes`` from a source (:func:`is_source`)."""
    if isinstance(source, str):
        return shared.make_envs(source, len(lanes))
    gym = shared.import_gymnasium()

    def made(make: Any) -> Any:
        env = make()
        if not isinstance(env, gym.Env):
            raise TypeError(
                f"env factory {getattr(make, '__qualname__', make)!r} returned "
                f"a {type(env).__name__}; it must return a gymnasium.Env"
            )
        return env

    makers = [source[j] if isinstance(source, list) else source for j in lanes]
    return shared.build_all(functools.partial(made, m) for m in makers)


def _worker_main(conn: Any, source: Any, block: list[int], layout: Any) -> None:
    """A worker: builds its lanes' envs, then answers commands until ``close``."""
    envs = None
    slots = None
    try:
        envs = build_envs(source, block)
        lanes = shared.EnvListStepper(envs, owned=True, layout=layout)
        spaces = lanes.observation_space, lanes.action_space
        about = lanes.name, lanes.declares_trial_index, lanes.dt
        conn.send(("ready", *spaces, os.getpid(), *about))
        while True:
            msg = conn.recv()
            op = msg[0]
            if op == "close":
                break
            if op == "attach":
                name, n, fields = msg[1:]
                slots = Slots(Segment(name), n, fields)
                _attached[:] = [slots.shm]
                obs_names = [f[4:] for f in fields if f.startswith("obs:")]
                conn.send(("ok",))
                continue
            try:
                if op == "step":
                    conn.send(_step(lanes, slots, block, obs_names, msg[1]))
                elif op == "run":
                    conn.send(("ran", _run(lanes, slots, block, msg[1], msg[2])))
                else:
                    conn.send(("error", None, ValueError(f"unknown op {op!r}"), ""))
            except shared.LaneError as err:
                error = _picklable(err.exc)
                conn.send(("error", block[err.lane], error, err.text, err.phase))
    except (EOFError, ConnectionError, KeyboardInterrupt):
        # The evaluating process died without closing us: its segment would
        # be left behind, so the workers unlink it.
        if slots is not None:
            slots.shm.unlink()
        elif envs is None:
            raise  # building the envs failed: the traceback goes to stderr
    except BaseException as exc:  # noqa: BLE001 - building the envs failed
        with contextlib.suppress(Exception):  # the pipe may be gone
            text = "".join(traceback.format_exception(exc))
            conn.send(("error", None, _picklable(exc), text))
    finally:
        if slots is not None:
            slots.release()
        for e in envs or ():
            with contextlib.suppress(Exception):  # closing is best effort
                e.close()


PARENT_POLL_SECONDS = 0.2
#: The segment this worker process has attached (``_watch_parent`` unlinks it).
_attached: list = []


def _watch_parent(parent: int) -> None:
    """Ends this worker (unlinking its segment) once its parent is gone: one
    whose env hangs never reads the pipe, and it ignores SIGTERM."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        for segment in _attached:
            segment.unlink()
        os._exit(1)

    threading.Thread(target=watch, name="jaxmesh-parent-watch", daemon=True).start()


def _reap(proc: subprocess.Popen, seconds: float) -> int:
    """``proc``'s exit code, killed if it has not exited within ``seconds``."""
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - send a stand-in that pickles
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def read_infos(infos: Sequence, keys: tuple, lanes, where: str) -> dict:
    """Info values per key as (lane, float) pairs."""
    values: dict = {k: [] for k in keys}
    wanted = frozenset(keys)
    for j, info in zip(lanes, infos, strict=True):
        # Most steps of most envs: none of the keys.
        if not info or wanted.isdisjoint(info):
            continue
        for k in keys:
            if k in info:
                values[k].append((j, shared.info_value(info, k, f"{where} lane {j}")))
    return values


def _step(lanes: shared.EnvListStepper, slots: Slots, block: list[int], names, keys):
    lo = block[0]
    local = np.flatnonzero(slots["go"][lo : lo + len(block)]).tolist()
    if not local:
        return ("stepped", {}, set())
    rows = [lo + j for j in local]
    # ``busy`` names the lane whose env step kills the process, if one does.
    busy = slots["busy"][lo : lo + len(block)]
    leaves, *out, infos = lanes.step_lanes(local, slots["action"][rows], busy=busy)
    for name in names:
        slots["obs:" + name][rows] = leaves[name]
    for field, values in zip(("reward", "terminated", "truncated"), out, strict=True):
        slots[field][rows] = values
    if not keys:
        return ("stepped", {}, set())
    seen = set().union(*(info for info in infos if info))  # the keys the infos had
    return ("stepped", read_infos(infos, keys, rows, lanes.name), seen)


def _run(lanes: shared.EnvListStepper, slots: Slots, block, ops, kw) -> list:
    """``lanes.run`` of ``ops`` (local lanes), one at a time marked ``busy``."""
    busy, lo, out = slots["busy"], block[0], []
    for op in ops:
        busy[lo + op.lane] = True
        out += lanes.run([op], **kw)
        busy[lo + op.lane] = False
    keys = kw["info_keys"]
    for r in out:  # the keys asked for alone cross the pipe
        r.infos = [{k: info[k] for k in keys if k in info} for info in r.infos]
    return out


def _main_path(source: Any, layout: Any) -> str | None:
    """The main script's path when the source (or layout) is defined in it (a
    worker runs it to unpickle them, as ``multiprocessing`` does)."""
    items = source if isinstance(source, list) else [source]
    for obj in [*items, layout]:
        obj = getattr(obj, "func", obj)  # a functools.partial's function
        if getattr(obj, "__module__", None) == "__main__":
            main = sys.modules["__main__"]
            return getattr(main, "__file__", None)
    return None


#: A worker's first lines. jaxmesh's packages are stubs whose ``__init__`` (and
#: JAX) load only if a name they define is asked for; the exit skips the
#: interpreter's teardown (unloading JAX or MuJoCo took 0.05-0.2 s).
_BOOT = r"""
import os, signal, sys, types
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
try:  # the name ps -e, top and pgrep show (the command line names it too)
    __import__("ctypes").CDLL(None).prctl(15, b"jaxmesh-worker", 0, 0, 0)
except Exception:  # not Linux: the command line alone names it
    pass
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[-1]))
parent = int(sys.argv[-2].partition("=")[2])
sys.path[:], main = conn.recv()


def _stub(name):
    spec = __import__("importlib.util").util.find_spec(name)
    where = list(spec.submodule_search_locations)
    mod = types.ModuleType(name)
    mod.__path__, mod.__file__ = where, spec.origin

    def __getattr__(attr):
        if any(
            os.path.exists(os.path.join(d, attr + ".py"))
            or os.path.isdir(os.path.join(d, attr))
            for d in where
        ):
            raise AttributeError(attr)  # a submodule: the import system loads it
        del mod.__getattr__
        with open(spec.origin) as f:
            exec(compile(f.read(), spec.origin, "exec"), mod.__dict__)
        return getattr(mod, attr)

    mod.__getattr__ = __getattr__
    sys.modules[name] = mod
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, mod)


for name in ("jaxmesh", "jaxmesh.envs", "jaxmesh.envs.gymnasium"):
    _stub(name)
if main:
    from multiprocessing import spawn

    spawn._fixup_main_from_path(main)
from jaxmesh.envs.gymnasium.workers import _watch_parent, _worker_main

_watch_parent(parent)
code = 0
try:
    _worker_main(conn, *conn.recv())
except BaseException:
    __import__("traceback").print_exc()
    code = 1
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
"""


class WorkerPool:
    """``num_lanes`` lanes' envs in ``workers`` processes (contiguous blocks),
    and the messages to them: ``send`` / ``take`` of a step over the shared
    segment (``local.WorkerEnvLanes``), ``run`` of any op over the pipes.

    Args:
      source: ``"gymnasium:<id>"``, a picklable zero-argument factory, or a list
        of them (one per lane).
      layout: the workers' ``EnvListStepper`` layout (picklable; None: the space's
        own dtypes).

    Raises what a worker met building its envs (with its traceback).
    """

    def __init__(self, source: Any, num_lanes: int, workers: int, layout: Any = None):
        self.source = source
        self.layout = layout
        self.num_lanes = num_lanes
        w = max(1, min(workers, num_lanes))
        bounds = np.linspace(0, num_lanes, w + 1).round().astype(int)
        self.blocks = [list(range(bounds[k], bounds[k + 1])) for k in range(w)]
        self.procs: list = [None] * w
        self.conns: list = [None] * w
        self.pids: list[int] = [0] * w
        self.shm: Segment | None = None
        self.slots: Slots | None = None
        self.fields: dict | None = None
        self.owner = np.repeat(np.arange(w), [len(b) for b in self.blocks])
        #: Of the last call: the lanes whose env call was under way when a
        #: worker died, and the workers that died.
        self.culprits: list[int] = []
        self.deaths: list[WorkerLost] = []
        #: Workers whose reply this process awaits, and those ``abandon`` killed.
        self.waiting: set[int] = set()
        self.killed: set[int] = set()
        self.closing = False  # dead workers are not replaced
        with shared.closing_on_error([self]):
            for k in range(w):
                self._spawn(k)
            first = [self._ready(k) for k in range(w)][0]
            (self.observation_space, self.action_space, _, self.name) = first[1:5]
            self.declares_trial_index, self.dt = first[5], first[6]

    @property
    def workers(self) -> int:
        return len(self.blocks)

    def _spawn(self, k: int) -> None:
        ours, theirs = socket.socketpair()
        try:
            # The boot code comes in the environment: ps shows the process's
            # name, not the code.
            block = self.blocks[k]
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    'import os; exec(os.environ.pop("JAXMESH_WORKER_BOOT"))',
                    "jaxmesh-worker",
                    str(k),
                    f"lanes={block[0]}..{block[-1]}",
                    f"parent={os.getpid()}",
                    str(theirs.fileno()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=dict(os.environ, JAXMESH_WORKER_BOOT=_BOOT),
            )
        finally:
            theirs.close()
        conn = connection.Connection(ours.detach())
        self.procs[k], self.conns[k] = proc, conn
        conn.send((sys.path, _main_path(self.source, self.layout)))
        conn.send((self.source, self.blocks[k], self.layout))

    def _ready(self, k: int) -> tuple:
        reply = self._recv(k, START_SECONDS, "building its envs", starting=True)
        if reply[0] != "ready":
            self._raise(reply, k)
        self.pids[k] = reply[3]
        if self.slots is not None:
            self.conns[k].send(("attach", self.shm.name, self.num_lanes, self.fields))
            self._recv(k, START_SECONDS, "attaching", starting=True)
        return reply

    def attach(self, layout: ObsLayout, names: Sequence[str]) -> None:
        """Makes the shared segment (the env's own action values, observation
        leaves ``names``) and hands it to the workers."""
        idle = shared.idle_action(self.action_space)  # an action's shape and dtype
        fields: dict = {"action": (idle.shape, idle.dtype), "reward": ((), np.float32)}
        for flag in ("go", "busy", "terminated", "truncated"):
            fields[flag] = ((), bool)
        for name in names:
            fields["obs:" + name] = (layout.shapes[name], layout.dtypes[name])
        self._share(fields)

    def detach(self) -> None:
        """Unlinks the shared segment (``attach`` makes another)."""
        if self.slots is not None:
            self.slots.release()
        if self.shm is not None:
            self.shm.unlink()
        self.slots = self.shm = None

    def _share(self, fields: dict) -> None:
        """Makes the shared segment of ``fields`` and hands it to the workers."""
        self.fields = fields
        size = Slots.size(self.num_lanes, fields)
        self.shm = Segment(f"jaxmesh_{os.getpid()}_{secrets.token_hex(4)}", size)
        self.slots = Slots(self.shm, self.num_lanes, fields)
        for k in range(self.workers):
            self.conns[k].send(("attach", self.shm.name, self.num_lanes, fields))
        for k in range(self.workers):
            self._recv(k, START_SECONDS, "attaching")

    def _recv(self, k, timeout, doing, starting=False) -> tuple:
        """Worker k's next message; one that died while starting is an error,
        later a ``WorkerLost`` once a new one has taken its lanes."""
        conn = self.conns[k]
        # A worker that dies closes its end: the connection reads EOF.
        self.waiting.add(k)
        try:
            ready = connection.wait([conn], timeout)
        finally:
            self.waiting.discard(k)
        if ready:
            with contextlib.suppress(EOFError, OSError):
                return conn.recv()
        else:
            raise TimeoutError(
                f"worker process {k} took over {timeout:.0f} s {doing}; is its env "
                "hanging?"
            )
        if starting:
            code = self.procs[k].wait()
            raise RuntimeError(
                f"worker process {k} exited (code {code}) while {doing}; its error "
                "is printed above. Check that the env can be built in a fresh "
                "Python process (its module importable, its factory picklable)"
            )
        self._lost(k)

    def _lost(self, k: int) -> None:
        """Worker k died: start a new one for its lanes, then say so."""
        code = _reap(self.procs[k], EXIT_SECONDS)  # alive but mute: killed
        self.conns[k].close()
        pid = self.pids[k]
        if self.closing:  # nothing will use its lanes again
            self.procs[k] = self.conns[k] = None
        else:
            self._spawn(k)
            self._ready(k)
        raise WorkerLost(k, self.blocks[k], code, pid)

    def abandon(self, respawn: bool = True) -> None:
        """Kills the workers another thread awaits (a client gave up on a hung
        env): that call ends with ``WorkerLost``; new workers take their lanes
        unless ``respawn`` is False."""
        self.closing = self.closing or not respawn
        for k in list(self.waiting):
            proc = self.procs[k]
            if proc is not None and proc.poll() is None:
                self.killed.add(k)
                proc.kill()

    def _raise(self, reply: tuple, k: int) -> None:
        _, lane, exc, text, *phase = reply
        where = f"worker process {k}" + ("" if lane is None else f", lane {lane}")
        exc.add_note(f"(raised in {where}; its traceback:)\n{text}")
        if lane is not None:
            shared.mark_where(exc, lane, phase[0] if phase else None)
        raise exc

    def _gather(self, ks: list[int]) -> tuple[dict, list[int]]:
        """Each worker's reply, and the lanes of those that died (replaced by
        now); the first env error is raised once every reply is in."""
        replies: dict[int, tuple] = {}
        lost: list[int] = []
        self.culprits, self.deaths = [], []
        for k in ks:
            try:
                replies[k] = self._recv(k, None, "replying")
            except WorkerLost as dead:
                lost += self.blocks[k]
                self.deaths.append(dead)
                if self.slots is not None:  # its busy flags name the culprits
                    busy = self.slots["busy"]
                    self.culprits += [j for j in self.blocks[k] if busy[j]]
                    busy[self.blocks[k]] = False
        for k, reply in replies.items():
            if reply[0] == "error":
                self._raise(reply, k)
        return replies, lost

    def run(self, ops: list, kw: dict) -> tuple[list, list[int], dict]:
        """``EnvListStepper.run`` of ``ops`` (ascending lanes) in the workers
        owning their lanes: the results, the lanes of workers that died (as
        ``_gather``), and each worker's ops (their lanes local)."""
        sent: dict[int, list] = {}
        for op in ops:
            k = int(self.owner[op.lane])
            sent.setdefault(k, []).append(op._replace(lane=op.lane - self.blocks[k][0]))
        for k, mine in sent.items():
            self.conns[k].send(("run", mine, kw))
        replies, lost = self._gather(list(sent))
        out = []
        for k in sorted(replies):
            for r in replies[k][1]:
                r.lane += self.blocks[k][0]
                out.append(r)
        return out, lost, sent

    def send(self, go: np.ndarray, info_keys: tuple) -> list[int]:
        """Starts the step of the lanes in ``go`` (actions in the segment); the
        workers asked (``take`` their replies). Only their lanes' ``go`` flags
        are written: other workers may be stepping meanwhile."""
        n = go.shape[0]
        flags = self.slots["go"]
        ks = sorted({int(k) for k in self.owner[:n][go]})
        cmd = ("step", tuple(info_keys))
        for k in ks:
            block = self.blocks[k]
            lo, hi = block[0], block[-1] + 1
            flags[lo:hi] = go[lo:hi] if hi <= n else np.r_[go[lo:n], [False] * (hi - n)]
            self.conns[k].send(cmd)
        return ks

    def take(self, ks: list[int]) -> tuple[dict, set, list]:
        """The replies of workers ``ks`` to ``send``: info values ``{key:
        [(lane, value)]}``, the keys the infos had, and the lanes of workers
        that died in the step (rebuilt, to be reset; no results)."""
        replies, lost = self._gather(ks)
        info: dict = {}
        seen: set = set()
        for _, inf, s in replies.values():
            seen |= s
            for key, pairs in inf.items():
                info.setdefault(key, []).extend(pairs)
        return info, seen, lost

    def close(self) -> None:
        """Stops every worker (killed after ``EXIT_SECONDS``), unlinks the segment."""
        for conn in filter(None, self.conns):
            with contextlib.suppress(OSError, ValueError):
                conn.send(("close",))
        deadline = time.monotonic() + EXIT_SECONDS  # for all: hung ones die
        for k, proc in enumerate(self.procs):
            if proc is None:
                continue
            _reap(proc, max(0.0, deadline - time.monotonic()))
            if self.conns[k] is not None:
                self.conns[k].close()
            self.procs[k] = self.conns[k] = None
        self.detach()


class ProcessStepper(shared.GymStepper):
    """A ``lanes.GymStepper`` over a :class:`WorkerPool` (``jaxmesh serve-env
    --workers``): ops go to the workers owning their lanes, results come back
    over the pipes. A worker that dies ends the call with a ``LaneError`` (a
    ``WorkerCrashed``) of the lane whose op it ran, and is replaced."""

    def __init__(self, source: Any, num_lanes: int, workers: int, layout: Any = None):
        self.pool = pool = WorkerPool(source, num_lanes, workers, layout)
        self.owned, self.num_lanes = True, num_lanes
        for attr in ("name", "dt", "observation_space", "action_space"):
            setattr(self, attr, getattr(pool, attr))
        options = (shared.TRIAL_INDEX,) if pool.declares_trial_index else ()
        self.metadata = {"reset_options": options}
        with shared.closing_on_error([pool]):
            # ``busy`` flags alone: the data come back over the pipes.
            pool._share({"busy": ((), bool)})
            self._setup(layout)

    def abandon(self, respawn: bool = True) -> None:
        """``WorkerPool.abandon``: the call under way ends with a ``LaneError``."""
        self.pool.abandon(respawn)

    def run(self, ops, **kw):
        # A replay of an ended (or released) lane executes nothing: not sent.
        skip = [isinstance(op, shared.Replay) and self.ended[op.lane] for op in ops]
        out = [shared.LaneResult(op.lane) for op, s in zip(ops, skip, strict=True) if s]
        ops = [op for op, s in zip(ops, skip, strict=True) if not s]
        results, lost, sent = self.pool.run(ops, kw)
        if lost:
            self._crashed(sent)
        for r in results:
            if r.reset:
                self._started(r.lane)
            if r.terminated and (r.terminated[-1] or r.truncated[-1]):
                self.ended[r.lane] = True
        out += results
        return sorted(out, key=lambda r: r.lane)

    def _crashed(self, sent: dict[int, list]) -> None:
        """The ``LaneError`` (a ``WorkerCrashed``) of a worker that died, at the
        lane whose env call was under way (else its ops' lowest lane, else its
        first)."""
        pool = self.pool
        dead = pool.deaths[0]
        killed = dead.worker in pool.killed
        pool.killed.clear()
        mine = {dead.lanes[0] + op.lane: op for op in sent[dead.worker]}
        culprits = [j for j in pool.culprits if j in dead.lanes]
        lane = (culprits or sorted(mine) or dead.lanes)[0]
        phase = "resetting" if isinstance(mine.get(lane), shared.Reset) else "stepping"
        where = f" in lane {lane}'s env call" if culprits else ""
        if killed:
            exc = WorkerCrashed(
                f"worker process {dead.worker} (pid {dead.pid}, lanes "
                f"{dead.lanes[0]}..{dead.lanes[-1]}) was killed{where} while "
                f"{phase}: the call's client gave up on it (the env may "
                "hang). A new worker took its lanes"
            )
        else:
            exc = WorkerCrashed(
                f"{dead}{where} while {phase}. A new worker took its lanes: "
                "their episodes are lost (reset them to go on); run the env "
                "in one process (serve-env without --workers) to see its error"
            )
        raise shared.LaneError(lane, phase, exc)

    def close(self) -> None:
        self.pool.close()
