"""Gymnasium envs as lanes, without JAX: every gymnasium call jaxmesh makes.

Shared by the host loop (``jaxmesh.envs.gymnasium.local``) and the env server
(``jaxmesh.remote.server``); imports numpy, and gymnasium on first use.
:class:`EnvListStepper` (one ``Env`` per lane) and :class:`VectorEnvStepper` (a
``VectorEnv`` in lockstep) answer ``reset``, ``step`` and ``replay`` with a
:class:`ResultBatch`; an env error surfaces as a :class:`LaneError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from jaxmesh.envs.gymnasium.batch import DTYPE_NAMES, TRIAL_INDEX, ResultBatch
from jaxmesh.envs.gymnasium.leaves import ObsLayout
from jaxmesh.envs.names import check_id
from jaxmesh.envs.timing import step_seconds

PREFIX = "gymnasium"

#: dtype names an info value may have to come back in a ``ResultBatch``.
NUMBER_DTYPES = frozenset(DTYPE_NAMES)


def import_gymnasium():
    import gymnasium

    return gymnasium


def is_host_stepped(env: Any) -> bool:
    """Whether ``env`` is a gymnasium id, ``Env``, ``VectorEnv``, factory or a
    list holding an ``Env`` or factory (never imports gymnasium)."""
    if isinstance(env, str):
        return env.startswith(PREFIX + ":")
    gym = sys.modules.get("gymnasium")
    if gym is None:
        return False
    envs = env if isinstance(env, list) else [env]
    return isinstance(env, gym.vector.VectorEnv) or any(
        isinstance(e, gym.Env) or is_factory(e) for e in envs
    )


def is_factory(env: Any) -> bool:
    """A function, a ``functools.partial`` or a ``gymnasium.Env`` subclass."""
    if isinstance(env, types.FunctionType | functools.partial):
        return True
    gym = sys.modules.get("gymnasium")
    return gym is not None and isinstance(env, type) and issubclass(env, gym.Env)


def env_name(env: Any) -> str:
    """``"gymnasium:<id>"`` of an env (its class name when it has no id)."""
    env_id = getattr(getattr(env, "spec", None), "id", None)
    if env_id:
        return f"{PREFIX}:{env_id}"
    return f"{PREFIX}:{type(getattr(env, 'unwrapped', env)).__name__}"


def env_dt(env: Any) -> float | None:
    """``step_seconds`` of an env, or of a VectorEnv's first env (None for an
    ``AsyncVectorEnv``: its workers shut down on a missing attribute)."""
    if isinstance(env, import_gymnasium().vector.VectorEnv):
        envs = getattr(env, "envs", None)
        return env_dt(envs[0]) if envs else None
    return step_seconds(getattr(env, "unwrapped", env))


def declares_trial_index(metadata: Any) -> bool:
    """Whether an env lists ``"trial_index"`` in ``metadata["reset_options"]``."""
    return TRIAL_INDEX in ((metadata or {}).get("reset_options", ()) or ())


def same_space(a: Any, b: Any) -> bool:
    """``a == b`` for two spaces; equal Boxes without gymnasium's ``allclose``."""
    if a is b:
        return True
    box = import_gymnasium().spaces.Box
    if type(a) is box and type(b) is box and (a.shape, a.dtype) == (b.shape, b.dtype):
        if np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high):
            return True
    return a == b


def idle_action(space: Any) -> np.ndarray:
    """An action valid in ``space``, played by vector lanes with no episode."""
    if isinstance(space, import_gymnasium().spaces.Discrete):
        return np.asarray(space.start, np.int64)
    zero = np.zeros(space.shape, space.dtype)
    return np.clip(zero, space.low, space.high).astype(space.dtype)


def env_actions(space: Any, actions: np.ndarray) -> np.ndarray:
    """The agent's actions (Discrete from 0) as the env's own values (Discrete
    from ``space.start``, int64; Box in the space's dtype)."""
    if isinstance(space, import_gymnasium().spaces.Discrete):
        return actions.astype(np.int64) + int(space.start)
    return actions.astype(space.dtype)


def native_layout(space: Any, where: str = "lanes") -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an observation leaf in its space's own dtype
    (Discrete: int64); TypeError for a space that is not one array."""
    spaces = import_gymnasium().spaces
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, spaces.Box | spaces.MultiBinary | spaces.MultiDiscrete):
        return tuple(int(d) for d in space.shape), np.dtype(space.dtype)
    raise TypeError(
        f"{where}: observation_space {space} ({type(space).__name__}) is not one "
        "jaxmesh reads; expected Box, Discrete, MultiBinary or MultiDiscrete "
        "leaves, alone or in Dict and Tuple spaces: flatten it with "
        "gymnasium.wrappers.FlattenObservation(env)"
    )


def info_value(info: Any, key: str, where: str) -> float | None:
    """One lane's info ``key`` as a float (None: absent); ValueError for a
    value that is not one number (or bool)."""
    if key not in info:
        return None
    arr = np.asarray(info[key])
    if arr.size != 1 or arr.dtype.kind not in "biuf":
        raise ValueError(
            f"{where}: info[{key!r}] is {arr.dtype}{list(arr.shape)}; a metric is "
            "one number (or bool) per step: name a scalar info key"
        )
    return float(arr.reshape(()))


#: jaxmesh's own prefixes, never a module that registers gymnasium envs: in
#: ``"gymnasium:gymnax:CartPole-v1"`` gymnasium would make its own CartPole-v1.
NOT_MODULES = {
    "gymnax": "jaxmesh's prefix for gymnax's JAX envs",
    "brax": "jaxmesh's prefix for brax's JAX envs",
    "gymnasium": "the prefix of the id itself",
    "grpc": "the scheme of a served env's address",
    "grpcs": "the scheme of a served env's address over TLS",
}

ID_FORMS = (
    "expected gymnasium:<id> (e.g. gymnasium:CartPole-v1), or "
    "gymnasium:<module>:<id> for an env that <module> registers when imported"
)


def parse_id(env_id: str) -> str:
    """The id ``gymnasium.make`` takes for ``"gymnasium:<id>"`` (``"<id>"`` or
    ``"<module>:<id>"``); ValueError for another form or a ``<module>`` in
    ``NOT_MODULES``."""
    prefix, sep, name = env_id.partition(":")
    module, inner, rest = name.rpartition(":")
    if prefix != PREFIX or not sep or not rest.strip() or (inner and not module):
        raise ValueError(f"env {env_id!r}: {ID_FORMS}")
    first = module.split(":")[0]
    if inner and first.lower() in NOT_MODULES:
        raise ValueError(
            f"env {env_id!r}: {first!r} is not a module that registers gymnasium "
            f"envs ({first}: is {NOT_MODULES[first.lower()]}); {ID_FORMS}"
        )
    return name


def make_envs(env_id: str, count: int, **kwargs: Any) -> list:
    """``count`` envs of ``"gymnasium:<id>"`` (``gymnasium.make(id, **kwargs)``);
    ValueError for an id gymnasium does not know or ``parse_id`` refuses."""
    name = parse_id(env_id)
    gym = import_gymnasium()
    # "module:Id" makes gymnasium import the module that registers Id.
    if ":" not in name:
        how = (
            "gymnasium.pprint_registry() lists them; import the package that "
            "registers yours first"
        )
        check_id("gymnasium env", name, gym.registry, how)
    return build_all(functools.partial(gym.make, name, **kwargs) for _ in range(count))


def build_all(makers: Iterable[Callable[[], Any]]) -> list:
    """``[make() for make in makers]``; the envs made are closed if one fails."""
    envs: list = []
    with closing_on_error(envs):
        for make in makers:
            envs.append(make())
    return envs


@contextlib.contextmanager
def closing_on_error(things: Iterable) -> Iterator[None]:
    """Closes each of ``things`` (as they are then) if the block raises."""
    try:
        yield
    except BaseException:
        for thing in things:
            thing.close()
        raise


class LaneError(Exception):
    """An env raised ``exc`` (or returned an observation that does not fit)
    while lane ``lane`` was ``phase``, after ``steps`` steps of the call."""

    def __init__(self, lane: int, phase: str, exc: BaseException, steps: int = 0):
        super().__init__(lane, phase, exc)
        self.lane, self.phase, self.exc, self.steps = lane, phase, exc, steps
        self.__cause__ = exc

    @property
    def text(self) -> str:
        """The env error's traceback, as text."""
        return "".join(traceback.format_exception(self.exc))

    def summary(self) -> str:
        return f"{type(self.exc).__name__}: {self.exc}"

    def details(self) -> str:
        return f"env lane {self.lane} raised {self.summary()} (while {self.phase})"

    __str__ = details


def mark_where(exc: BaseException, lane: int, phase: str | None, steps: int = 0):
    """Marks an env's exception with where it was raised (``phase`` None:
    unknown), which the run's ``jaxmesh.errors.EnvError`` names."""
    # An exception may take no attribute.
    with contextlib.suppress(AttributeError, TypeError):
        exc._jaxmesh_where = (int(lane), phase, int(steps))
    return exc


def where_raised(exc: BaseException) -> tuple[int, str | None, int] | None:
    """``mark_where``'s ``(lane, phase, steps)`` of ``exc``, or None."""
    return getattr(exc, "_jaxmesh_where", None)


class Reset(NamedTuple):
    """``env.reset(seed=seed, options=options)`` on ``lane``; a
    ``max_episode_seconds`` > 0 truncates the episode by wall clock."""

    lane: int
    seed: int | None
    options: dict[str, Any] | None = None
    max_episode_seconds: float = 0.0


class Replay(NamedTuple):
    """Step ``lane`` with ``actions`` (``[count, *A]``, the env's own values)
    until they run out or its episode ends."""

    lane: int
    actions: np.ndarray


@dataclasses.dataclass(slots=True, eq=False)
class LaneResult:
    """What one lane did in one call (before :meth:`GymStepper.collect`)."""

    lane: int
    reset: bool = False
    obs: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    terminated: list[bool] = dataclasses.field(default_factory=list)
    truncated: list[bool] = dataclasses.field(default_factory=list)
    infos: list[dict] = dataclasses.field(default_factory=list)


def info_leaves(
    rows: Sequence[dict], keys: Sequence[str]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(info, info_present)`` of a :class:`ResultBatch` for these info rows.
    A key no row has, or whose values are not numbers of one shape, is left
    out; a row without the key holds zeros."""
    info, present = {}, {}
    for key in keys:
        values = [row.get(key) for row in rows]
        have = np.asarray([v is not None for v in values])
        arrays = [np.asarray(v) for v in values if v is not None]
        if not arrays or any(
            a.dtype.name not in NUMBER_DTYPES or a.shape != arrays[0].shape
            for a in arrays
        ):
            continue
        dtype = np.result_type(*arrays)
        if dtype.name in NUMBER_DTYPES:
            info[key] = np.zeros((len(rows),) + arrays[0].shape, dtype)
            info[key][have] = arrays
            if not have.all():
                present[key] = have
    return info, present


class GymStepper:
    """What every stepper shares: layout (``leaves.ObsLayout``), lane state and
    the operations over a subclass's ``run`` (checked ``Reset`` | ``Replay``
    ops, ascending lanes, one each -> their ``LaneResult``) and ``close`` (of
    ``owned`` envs). ``started[j]``: lane j was reset since made or
    :meth:`forget`; ``ended[j]``: its episode ended (or was released) since,
    so replaying it executes nothing.
    """

    num_lanes: int
    name: str
    observation_space: Any
    action_space: Any
    metadata: dict
    dt: float | None
    owned: bool

    def _setup(self, layout: Callable[[Any], tuple] | None) -> None:
        self.layout = ObsLayout(
            self.observation_space, layout or native_layout, self.name
        )
        self.discrete = isinstance(
            self.action_space, import_gymnasium().spaces.Discrete
        )
        self.declares_trial_index = declares_trial_index(self.metadata)
        self.started, self.ended = np.zeros((2, self.num_lanes), bool)
        self.forget()
        #: Buffers ``{leaf: [>= m, ...]}`` ``step_each`` stacks into where they
        #: fit (a same-host server's ring slot).
        self.obs_into: dict[str, np.ndarray] | None = None

    def abandon(self, respawn: bool = True) -> None:
        """The call under way is given up (only ``ProcessStepper`` can stop it)."""
        del respawn

    def forget(self) -> None:
        """Every lane "not reset" again; the envs' own state is kept."""
        self.started[:] = False
        self.ended[:] = False
        # perf_counter() past which an episode is truncated; None: no cap.
        self.deadline: list[float | None] = [None] * self.num_lanes

    def release(self, lanes: Sequence[int]) -> None:
        """Treat ``lanes``' episodes as ended (abandoned without another)."""
        if len(lanes):
            self.ended[list(lanes)] = True

    def _past_deadline(self, lane: int) -> bool:
        deadline = self.deadline[lane]
        return deadline is not None and time.perf_counter() > deadline

    def _start_clock(self, op: Reset) -> None:
        seconds = op.max_episode_seconds
        self.deadline[op.lane] = time.perf_counter() + seconds if seconds > 0 else None

    def _started(self, lane: int) -> None:
        self.ended[lane] = False
        self.started[lane] = True

    def _reset_result(self, j, arr, info, want_obs, keys) -> LaneResult:
        self._started(j)
        obs, infos = [arr] if want_obs else [], [info] if keys else []
        return LaneResult(j, reset=True, obs=obs, infos=infos)

    def reset(
        self,
        lanes: npt.ArrayLike,
        seeds: Sequence[int | None],
        options: Sequence[dict | None] | None = None,
        max_episode_seconds: Sequence[float] | None = None,
        *,
        want_obs: bool = True,
        info_keys: Sequence[str] = (),
    ) -> ResultBatch:
        """Starts an episode on each of ``lanes`` (ascending), with per lane a
        seed, ``options`` and wall-clock cap (0: none). LaneError: an env
        raised, or returned an observation that does not fit."""
        js = self._lanes(lanes, "reset")
        m = len(js)
        options = [None] * m if options is None else list(options)
        seconds = [0.0] * m if max_episode_seconds is None else max_episode_seconds
        if not len(seeds) == len(options) == len(seconds) == m:
            raise ValueError(
                f"reset: {m} lanes, {len(seeds)} seeds, {len(options)} options and "
                f"{len(seconds)} max_episode_seconds; expected one of each per lane"
            )
        ops = [
            Reset(j, None if s is None else int(s), o or None, float(c))
            for j, s, o, c in zip(js, seeds, options, seconds, strict=True)
        ]
        kw = dict(want_obs=want_obs, info_keys=tuple(info_keys), keep_all_obs=False)
        return self.collect(self.run(ops, **kw), **kw)

    def step(
        self,
        lanes: npt.ArrayLike,
        actions: np.ndarray,
        *,
        want_obs: bool = True,
        info_keys: Sequence[str] = (),
    ) -> ResultBatch:
        """One action (``[m, *A]``, the env's own values) on each of ``lanes``:
        ``replay`` with counts of 1 and ``keep_all_obs``, by ``step_each``
        where it serves."""
        js = self._lanes(lanes, "step")
        keys, actions = tuple(info_keys), np.asarray(actions)
        if actions.shape[:1] != (len(js),):
            raise ValueError(
                f"step: {len(js)} lanes but actions of shape {actions.shape}; "
                "expected one action per lane, [m, *action_shape]"
            )
        out = self.step_each(np.asarray(js, np.int64), actions, want_obs, keys)
        if out is None:
            kw = dict(keep_all_obs=True, want_obs=want_obs, info_keys=keys)
            out = self.replay(js, np.ones(len(js), np.int64), actions, **kw)
        return out

    def step_each(self, lanes, actions, want_obs, info_keys) -> ResultBatch | None:
        """:meth:`step` of checked input when the fast path serves it, else None."""
        return None

    def replay(
        self,
        lanes: npt.ArrayLike,
        counts: npt.ArrayLike,
        actions: np.ndarray,
        *,
        keep_all_obs: bool = False,
        want_obs: bool = True,
        info_keys: Sequence[str] = (),
    ) -> ResultBatch:
        """Lane ``lanes[i]`` (ascending, reset before) executes its ``counts[i]``
        (>= 1) actions of ``actions`` (``[sum(counts), *A]``, the env's own
        values, lane after lane) until its episode ends (terminated, truncated,
        or past its wall-clock cap); a lane whose episode had ended executes
        nothing. ``keep_all_obs``: every step's observation and info row, else
        each lane's last.

        Raises:
          ValueError: lanes not ascending or never reset, counts below 1, or
            actions that do not match the counts.
          LaneError: an env raised, or returned an observation that does not fit.
        """
        js = self._lanes(lanes, "replay")
        counts = np.asarray(counts).reshape(-1)
        actions = np.asarray(actions)
        if counts.shape != (len(js),) or (counts.size and counts.min() < 1):
            raise ValueError(
                f"replay: counts {counts[:16].tolist()} for {len(js)} lanes; "
                "expected one count >= 1 per lane"
            )
        total = int(counts.sum())
        if actions.shape[:1] != (total,):
            raise ValueError(
                f"replay: actions of shape {actions.shape} for counts summing to "
                f"{total}; expected [sum(counts), *action_shape]"
            )
        starts = (np.cumsum(counts) - counts).tolist()
        ops = [
            Replay(j, actions[s : s + int(c)])
            for j, s, c in zip(js, starts, counts.tolist(), strict=True)
        ]
        keys = tuple(info_keys)
        kw = dict(want_obs=want_obs, info_keys=keys, keep_all_obs=keep_all_obs)
        return self.collect(self.run(ops, **kw), **kw)

    def _lanes(self, lanes: npt.ArrayLike, what: str) -> list[int]:
        """``lanes`` as ascending distinct lane numbers, each reset before
        unless ``what`` is "reset"; else ValueError."""
        arr, num_lanes = np.asarray(lanes).reshape(-1), self.num_lanes
        if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0):
            raise ValueError(
                f"{what}: lanes {arr[:16].tolist()} are not lane numbers; expected "
                f"ints in 0..{num_lanes - 1}"
            )
        out = arr.astype(np.int64).tolist()
        if out and out[-1] >= num_lanes:
            raise ValueError(
                f"{what}: lane {max(out)} given, but there are {num_lanes} lanes "
                f"(0..{num_lanes - 1})"
            )
        if any(b <= a for a, b in zip(out, out[1:], strict=False)):
            raise ValueError(
                f"{what}: lanes {out[:16]} are not strictly ascending; name each lane "
                "once, in ascending order"
            )
        if what != "reset" and out and not self.started[out].all():
            lane = next(j for j in out if not self.started[j])
            raise ValueError(
                f"{what}: lane {lane} was never reset; reset it (reset([{lane}], "
                "seeds=[...])) before stepping it"
            )
        return out

    def collect(
        self, results, *, want_obs, info_keys, keep_all_obs, keep_all_info=False
    ) -> ResultBatch:
        """The results of one :meth:`run` (ascending lanes, its flags) as one
        :class:`ResultBatch`."""
        steps = [len(r.rewards) for r in results]
        # The wire's rule: 1 for a reset; a replay's steps when every
        # observation is kept, else min(steps, 1) (the info rows follow it too).
        per = zip(results, steps, strict=True)
        rows = [1 if r.reset else k if keep_all_obs else min(k, 1) for r, k in per]
        observation = {}
        if want_obs:
            rows = [len(r.obs) for r in results]
            frames = [o for r in results for o in r.obs]
            observation = self.layout.empty((0,))
            if frames:
                observation = {
                    n: np.stack([f[n] for f in frames]) for n in self.layout.names
                }
        # Every step's info with only the last observation: a reset's row and
        # one per executed step.
        info_rows = None
        if keep_all_info and not keep_all_obs:
            per_step = [
                1 if r.reset else k for r, k in zip(results, steps, strict=True)
            ]
            info_rows = None if per_step == rows else per_step
        info: dict = {}
        present: dict = {}
        if info_keys:
            infos = [row for r in results for row in r.infos]
            if infos and len(infos) == sum(rows if info_rows is None else info_rows):
                info, present = info_leaves(infos, info_keys)
        if not info:  # no info leaf: nothing to count rows of
            info_rows = None
        return ResultBatch(
            np.asarray([r.lane for r in results], np.int64),
            np.asarray(steps, np.int64),
            np.asarray(rows, np.int64),
            np.asarray([x for r in results for x in r.rewards], np.float64),
            np.asarray([x for r in results for x in r.terminated], bool),
            np.asarray([x for r in results for x in r.truncated], bool),
            observation,
            info,
            present,
            None if info_rows is None else np.asarray(info_rows, np.int64),
        )


class EnvListStepper(GymStepper):
    """One gymnasium ``Env`` per lane; only the lanes named are stepped.

    ``owned``: jaxmesh made the envs (and closes them); ``layout``: ``space ->
    (shape, dtype)`` of the observations (default :func:`native_layout`).
    ValueError: no envs, or one Env object in two lanes; TypeError: an entry
    that is not a ``gymnasium.Env``, unequal spaces, a layout that refuses one.
    """

    def __init__(self, envs: Sequence, *, owned: bool = False, layout=None):
        envs = list(envs)
        if not envs:
            raise ValueError("env=[]: pass at least one gymnasium Env")
        gym = import_gymnasium()
        seen: dict[int, int] = {}
        first = envs[0]
        for j, e in enumerate(envs):
            if not isinstance(e, gym.Env):
                raise TypeError(
                    f"env list entry {j} is a {type(e).__name__}, not a "
                    "gymnasium.Env; pass a list of gymnasium Envs, one per lane"
                )
            k = seen.setdefault(id(e), j)
            if k != j:
                raise ValueError(
                    f"env list entries {k} and {j} are the same Env object; each "
                    "lane needs its own env (e.g. [gymnasium.make(id) for _ in "
                    "range(n)])"
                )
            for attr in ("observation_space", "action_space"):
                if not same_space(getattr(e, attr), getattr(first, attr)):
                    raise TypeError(
                        f"env list entry {j} has {attr} {getattr(e, attr)}, entry "
                        f"0 has {getattr(first, attr)}; every lane must have the "
                        "same spaces"
                    )
        self.envs, self.owned, self.num_lanes = envs, owned, len(envs)
        self.name, self.dt = env_name(first), env_dt(first)
        self.metadata = first.metadata
        self.observation_space = first.observation_space
        self.action_space = first.action_space
        self._setup(layout)

    def step_lanes(self, lanes, actions, into=None, busy=None) -> tuple:
        """One step of each of ``lanes`` (``actions``: the env's own values, one
        per lane; ``busy[j]`` set while lane j steps), the ended ones marked:
        (observations stacked, into ``into`` where it fits, rewards, terminated,
        truncated, infos); LaneError."""
        acts = actions.tolist() if self.discrete else actions
        envs, steps = self.envs, []
        flags = {} if busy is None else busy  # a dict takes the flags unread
        try:
            for j, a in zip(lanes, acts, strict=True):
                flags[j] = True
                steps.append(envs[j].step(a))
                flags[j] = False
        except Exception as exc:
            lane = lanes[len(steps)]
            flags[lane] = False
            raise LaneError(lane, "stepping", exc) from exc
        o, r, te, tr, infos = zip(*steps, strict=True)
        try:
            obs = self.layout.stack(o, lanes, into)
        except Exception as exc:  # a bad observation: its lane's LaneError
            bad = lanes[0]
            for j, v in zip(lanes, o, strict=True):
                try:
                    self.layout.leaves(v, j)
                except Exception:  # noqa: BLE001 - any failure names this lane
                    bad = j
                    break
            raise LaneError(bad, "stepping", exc) from exc
        term, trunc = np.asarray(te, bool), np.asarray(tr, bool)
        done = term | trunc
        if done.any():
            self.ended[lanes] |= done
        return obs, np.asarray(r, np.float64), term, trunc, infos

    def step_each(self, lanes, actions, want_obs, info_keys) -> ResultBatch | None:
        # Live lanes with no deadline, the observation asked for: the batch in a
        # few numpy calls.
        if not want_obs or not lanes.size:
            return None
        lane_list = lanes.tolist()
        deadline = self.deadline
        if self.ended[lanes].any() or any(deadline[j] is not None for j in lane_list):
            return None
        m, layout = len(lane_list), self.layout
        into = {  # the first m rows of the ``obs_into`` buffers that fit
            name: buf[:m]
            for name, buf in (self.obs_into or {}).items()
            if name in layout.dtypes
            and (buf.dtype, buf.shape[1:]) == (layout.dtypes[name], layout.shapes[name])
            and buf.shape[0] >= m
        }
        obs, r, term, trunc, infos = self.step_lanes(lane_list, actions, into)
        info, present = info_leaves(infos, info_keys) if info_keys else ({}, {})
        js, ones = lanes.astype(np.int64, copy=False), np.ones(m, np.int64)
        return ResultBatch(js, ones, ones, r, term, trunc, obs, info, present)

    def _reset(self, op, want_obs, info_keys) -> LaneResult:
        self._start_clock(op)
        options = {"options": op.options} if op.options else {}
        try:
            obs, info = self.envs[op.lane].reset(seed=op.seed, **options)
            arr = self.layout.leaves(obs, op.lane)
        except Exception as exc:
            raise LaneError(op.lane, "resetting", exc) from exc
        return self._reset_result(op.lane, arr, info, want_obs, info_keys)

    def _replay(self, op, want_obs, info_keys, keep_all, all_info) -> LaneResult:
        j, out = op.lane, LaneResult(op.lane)
        if self.ended[j]:
            return out
        step, every_info = self.envs[j].step, info_keys and (keep_all or all_info)
        last = 0  # 1 once the last step's observation is converted
        try:
            for action in op.actions.tolist() if self.discrete else op.actions:
                obs, reward, term, trunc, info = step(action)
                if want_obs and keep_all:
                    out.obs.append(self.layout.leaves(obs, j))
                out.rewards.append(float(reward))
                term, trunc = bool(term), bool(trunc) or self._past_deadline(j)
                out.terminated.append(term)
                out.truncated.append(trunc)
                if every_info:
                    out.infos.append(info)
                if term or trunc:
                    self.ended[j] = True
                    break
            if out.rewards and not keep_all:
                # Only the last step's observation is converted and checked.
                last = 1
                if want_obs:
                    out.obs.append(self.layout.leaves(obs, j))
                if info_keys and not every_info:
                    out.infos.append(info)
        except Exception as exc:  # steps taken before the one that raised
            raise LaneError(j, "stepping", exc, len(out.rewards) - last) from exc
        return out

    def run(self, ops, *, want_obs, info_keys, keep_all_obs, keep_all_info=False):
        return [
            self._reset(op, want_obs, info_keys)
            if isinstance(op, Reset)
            else self._replay(op, want_obs, info_keys, keep_all_obs, keep_all_info)
            for op in ops
        ]

    def close(self) -> None:
        if self.owned:
            for env in self.envs:
                env.close()


class VectorEnvStepper(GymStepper):
    """A gymnasium ``VectorEnv`` in ``AutoresetMode.DISABLED``, in lockstep: lanes
    not named play :func:`idle_action`; a lane whose env ended is reset with
    ``seed=None`` before the next step. ValueError for another autoreset mode.
    """

    def __init__(self, vec: Any, *, owned: bool = False, layout=None):
        gym = import_gymnasium()
        mode = (vec.metadata or {}).get("autoreset_mode")
        with contextlib.suppress(ValueError):
            mode = gym.vector.AutoresetMode(mode) if mode is not None else None
        if mode != gym.vector.AutoresetMode.DISABLED:
            raise ValueError(
                f"{type(vec).__name__} has metadata['autoreset_mode']={mode!r}; "
                "jaxmesh starts every episode itself (its own seed, CONTRACT 6), "
                "so it serves a VectorEnv only in AutoresetMode.DISABLED: build "
                "one with gymnasium.make_vec(env_id, num_envs=N, "
                "vectorization_mode='sync', vector_kwargs={'autoreset_mode': "
                "gymnasium.vector.AutoresetMode.DISABLED}) (or pass autoreset_mode="
                "AutoresetMode.DISABLED to SyncVectorEnv / AsyncVectorEnv), or "
                "pass a list of gymnasium Envs"
            )
        self.vec, self.owned, self.num_lanes = vec, owned, int(vec.num_envs)
        self.name, self.metadata, self.dt = env_name(vec), vec.metadata, env_dt(vec)
        self.observation_space = vec.single_observation_space
        self.action_space = vec.single_action_space
        self._setup(layout)
        self.idle = idle_action(self.action_space)
        # The env's own state (kept by forget()).
        self.ready = False
        self.env_ended = np.zeros(self.num_lanes, bool)

    def reset_vector(self, seeds: dict, options: dict | None = None):
        """``vec.reset`` of the lanes ``seeds`` maps to their seeds: (obs, info)."""
        mask = np.zeros(self.num_lanes, bool)
        mask[list(seeds)] = True
        seed_list = [seeds.get(j) for j in range(self.num_lanes)]
        obs, info = self.vec.reset(
            seed=seed_list, options={"reset_mask": mask, **(options or {})}
        )
        self.env_ended[mask] = False
        return obs, info

    def step_lanes(self, lanes, actions, into=None, want_obs=True) -> tuple:
        """One ``vec.step``: ``lanes`` play ``actions``, the others
        :func:`idle_action`; lanes whose env ended are reset first. As
        :meth:`EnvListStepper.step_lanes`, but with the vector's info dict."""
        lanes = np.asarray(lanes, np.int64)  # one index array for every lookup
        batch = np.broadcast_to(self.idle, (self.num_lanes,) + self.idle.shape).copy()
        batch[lanes] = actions
        if self.env_ended.any():
            self.reset_vector(dict.fromkeys(np.flatnonzero(self.env_ended).tolist()))
        o, r, te, tr, info = self.vec.step(batch)
        te, tr = np.asarray(te, bool), np.asarray(tr, bool)
        self.env_ended = te | tr
        self.ended[lanes] |= self.env_ended[lanes]
        obs = self.layout.take(o, lanes, into) if want_obs else {}
        return obs, np.asarray(r, np.float64)[lanes], te[lanes], tr[lanes], info

    @staticmethod
    def lane_info(info: dict, j: int, keys: tuple[str, ...]) -> dict:
        """Lane ``j``'s row of a vector info (arrays, ``_key`` masks)."""
        out = {}
        for key in keys:
            present = info.get("_" + key)
            if key in info and (present is None or bool(np.asarray(present)[j])):
                with contextlib.suppress(IndexError, TypeError):
                    out[key] = np.asarray(info[key])[j]
        return out

    def _resets(self, resets, want_obs, info_keys) -> list[LaneResult]:
        # One reset call per distinct options (one dict for every lane).
        groups: dict[tuple, list[Reset]] = {}
        for op in resets:
            groups.setdefault(tuple(sorted((op.options or {}).items())), []).append(op)
        results: dict[int, LaneResult] = {}
        calls: list = []
        if not self.ready:
            # The first reset covers every lane (seed None where unnamed).
            calls = [(None, groups.pop((), []) if len(groups) == 1 else [])]
        try:
            for key, ops in calls + list(groups.items()):
                seeds = {op.lane: op.seed for op in ops}
                if key is None:  # every lane
                    seeds = {j: seeds.get(j) for j in range(self.num_lanes)}
                for op in ops:
                    self._start_clock(op)
                obs, info = self.reset_vector(seeds, dict(key or ()))
                self.ready = True
                lanes = [op.lane for op in ops]
                rows = self.layout.take(obs, lanes) if lanes else {}
                for i, j in enumerate(lanes):
                    arr = {n: x[i] for n, x in rows.items()}
                    got = self.lane_info(info, j, info_keys)
                    results[j] = self._reset_result(j, arr, got, want_obs, info_keys)
        except Exception as exc:
            raise LaneError(resets[0].lane, "resetting", exc) from exc
        return [results[op.lane] for op in resets]

    def _replays(self, replays, want_obs, info_keys, keep_all, every) -> list:
        results = {op.lane: LaneResult(op.lane) for op in replays}
        live, k = replays, 0
        while live := [
            op for op in live if k < len(op.actions) and not self.ended[op.lane]
        ]:
            lanes = [op.lane for op in live]
            try:
                obs, reward, term, trunc, info = self.step_lanes(
                    lanes, [op.actions[k] for op in live], want_obs=want_obs
                )
                for i, j in enumerate(lanes):
                    res, tr = results[j], bool(trunc[i]) or self._past_deadline(j)
                    res.rewards.append(float(reward[i]))
                    res.terminated.append(bool(term[i]))
                    res.truncated.append(tr)
                    # Every step's row, or the last one only.
                    if want_obs:
                        row = {n: x[i] for n, x in obs.items()}
                        res.obs[len(res.obs) if keep_all else 0 :] = [row]
                    if info_keys:
                        row = self.lane_info(info, j, info_keys)
                        res.infos[len(res.infos) if every else 0 :] = [row]
                    self.ended[j] |= tr
            except Exception as exc:
                done = len(results[lanes[0]].rewards)
                raise LaneError(lanes[0], "stepping", exc, done) from exc
            k += 1
        return [results[op.lane] for op in replays]

    def run(self, ops, *, want_obs, info_keys, keep_all_obs, keep_all_info=False):
        # Steps first, then resets: a lane reset in this call is not stepped.
        resets = [op for op in ops if isinstance(op, Reset)]
        replays = [op for op in ops if isinstance(op, Replay)]
        every_info = keep_all_obs or keep_all_info
        out = self._replays(replays, want_obs, info_keys, keep_all_obs, every_info)
        if resets:
            out += self._resets(resets, want_obs, info_keys)
        return sorted(out, key=lambda r: r.lane)

    def close(self) -> None:
        if self.owned:
            self.vec.close()
