"""The host loop's lanes (``jaxmesh.run.host``): adapters over ``lanes``' steppers.

``EnvLanes`` holds one ``Env`` per lane, ``VectorEnvLanes`` a ``VectorEnv``,
``WorkerEnvLanes`` lanes in worker processes. An env's exception reaches the
caller as the env raised it, marked with its lane (``lanes.mark_where``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.envs.gymnasium.batch import TRIAL_INDEX
from jaxmesh.envs.gymnasium.lanes import env_actions, import_gymnasium, info_value
from jaxmesh.envs.gymnasium.spec import observation_layout, spec_for
from jaxmesh.envs.gymnasium.workers import (
    WorkerLost,
    WorkerPool,
    build_envs,
    is_source,
    read_infos,
)

__all__ = ["LocalAdapter", "EnvLanes", "VectorEnvLanes", "WorkerEnvLanes", "make_lanes"]


class _InfoKeys:
    """The keys a step's infos had, gathered only when an error reads them."""

    def __init__(self, infos: Sequence):
        self.infos = infos

    def __iter__(self):
        return iter({k for info in self.infos if info for k in info})


def _env_errors(method):
    """The env's own exception instead of the ``LaneError`` wrapping it."""

    @functools.wraps(method)
    def unwrapped(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except shared.LaneError as err:
            exc = shared.mark_where(err.exc, err.lane, err.phase, err.steps)
        # Outside the except block: no LaneError in the env error's context.
        raise exc

    return unwrapped


class _LaneView:
    """What every adapter keeps for the host loop, which sets ``info_keys``.

    After a ``step``, ``info[key]`` is ``(values float64 [n], present bool
    [n])`` and ``info_seen`` the keys the infos had; after a ``reset``,
    ``reset_info`` holds such pairs and ``reset_text[key]`` the ``text_keys``
    values (None where absent), rows in the order given.
    """

    def _view(self, src: Any, where: str) -> None:
        space = src.action_space
        self.spec = spec_for(src.name, src.observation_space, space, where, src.dt)
        self.num_lanes, self.action_space = src.num_lanes, space
        self.declares_trial_index = src.declares_trial_index
        self.info_keys: tuple[str, ...] = ()
        self.info: dict = {}
        #: No info had an ``info_keys`` key at the last ``step`` (where known).
        self.info_empty = False
        self.info_seen: set = set()
        self._absent: tuple = ((), 0, {})  # (keys, n, info): ``_new_info``'s
        self.reset_info: dict = {}
        self.reset_text: dict = {}

    def _new_info(self, n: int, pairs: dict, seen: Any) -> None:
        """``info`` of n lanes from ``{key: [(lane, value)]}`` (``read_infos``);
        with no value, read-only zeros kept while the keys stay."""
        self.info_seen, self.info_empty = seen, not any(pairs.values())
        if self.info_empty:
            if self._absent[:2] != (self.info_keys, n):
                pair = (np.zeros(n, np.float64), np.zeros(n, bool))
                for x in pair:
                    x.flags.writeable = False
                self._absent = (self.info_keys, n, dict.fromkeys(self.info_keys, pair))
            self.info = self._absent[2]
            return
        self.info = {k: (np.zeros(n), np.zeros(n, bool)) for k in self.info_keys}
        for key, got in pairs.items():
            vals, present = self.info[key]
            for j, v in got:
                vals[j], present[j] = v, True

    def reset(self, lanes, seeds, trials, max_episode_seconds=None, text_keys=()):
        """Starts an episode on each of ``lanes`` (any order, with a seed and a
        trial index each): observations as named leaves ``[m, ...]``, rows in
        the order given. ``max_episode_seconds`` caps episodes in ``replay``."""
        # The lanes reset by ascending lane; ``back`` orders their rows as given.
        lanes = [int(j) for j in lanes]
        order = np.argsort(lanes, kind="stable").tolist()
        back = np.argsort(order)
        seconds, ops = float(max_episode_seconds or 0.0), []
        for i in order:  # the trial index only for an env that takes it (CONTRACT 6)
            options = (
                {TRIAL_INDEX: int(trials[i])} if self.declares_trial_index else None
            )
            ops.append(shared.Reset(lanes[i], int(seeds[i]), options, seconds))
        asked = tuple(dict.fromkeys(self.info_keys + tuple(text_keys)))
        results = self._resets(ops, asked)
        rows = [results[b].infos[0] if results[b].infos else {} for b in back]
        self.reset_text = {k: [row.get(k) for row in rows] for k in text_keys}
        info, present = shared.info_leaves(rows, self.info_keys)
        self.reset_info, where = {}, f"{self.spec.name} reset"
        for key, values in info.items():
            got = [info_value({key: v}, key, where) for v in values]
            has = present.get(key, np.ones(len(values), bool))
            self.reset_info[key] = (np.asarray(got, np.float64), has)
        obs, dtypes = {}, self.spec.layout.dtypes
        for n in self.carried:
            obs[n] = np.asarray([r.obs[0][n] for r in results], dtypes[n])[back]
        return obs


class LocalAdapter(_LaneView):
    """The in-process adapters' common part over a shared stepper (``kind``
    of ``env``, its observations in JAX's dtypes)."""

    def __init__(self, kind: type, env: Any, where: str, **kw: Any):
        layout = functools.partial(observation_layout, where=where)
        self.lanes: shared.GymStepper = kind(env, layout=layout, **kw)
        self._view(self.lanes, where)
        self.carried = self.spec.layout.names

    @_env_errors
    def _resets(self, ops: list, keys: tuple) -> list:
        return self.lanes.run(ops, want_obs=True, info_keys=keys, keep_all_obs=False)

    @_env_errors
    def replay(self, *args: Any, **kwargs: Any) -> shared.ResultBatch:
        """``GymStepper.replay`` of the shared lanes, an env's error as raised."""
        return self.lanes.replay(*args, **kwargs)

    @_env_errors
    def step(self, actions: np.ndarray, go: np.ndarray, obs: dict):
        """Steps the lanes in ``go`` (a VectorEnv's others play the idle
        action), their observations into ``obs`` (named leaves ``[n, ...]``):
        (reward float32, terminated, truncated) ``[n]``, 0 / False for lanes
        not in ``go``."""
        n = go.shape[0]
        values = env_actions(self.action_space, actions)
        stepper, infos = self.lanes, ()
        if n and np.count_nonzero(go) == n:  # the usual step: no index lists
            lanes: Any = range(n)
            into = {k: obs[k][:n] for k in stepper.layout.names}  # stacked in place
            _, r, term, trunc, infos = stepper.step_lanes(lanes, values, into)
            reward = r.astype(np.float32)
        else:
            reward = np.zeros(n, np.float32)
            term, trunc = np.zeros(n, bool), np.zeros(n, bool)
            lanes = np.flatnonzero(go).tolist()
            if lanes:
                rows, r, te, tr, infos = stepper.step_lanes(lanes, values[lanes])
                for name, leaf in rows.items():
                    obs[name][lanes] = leaf
                reward[lanes], term[lanes], trunc[lanes] = r, te, tr
        if self.info_keys:
            seen: Any = _InfoKeys(infos)
            if isinstance(infos, dict):  # a VectorEnv's, ``_key`` masks and all
                seen = {k for k in infos if not k.startswith("_")}
                infos = [stepper.lane_info(infos, j, self.info_keys) for j in lanes]
            pairs = read_infos(infos, self.info_keys, lanes, self.spec.name)
            self._new_info(n, pairs, seen)
        return reward, term, trunc

    def close(self) -> None:
        self.lanes.close()


class EnvLanes(LocalAdapter):
    """One gymnasium ``Env`` per lane (``owned``: jaxmesh made and closes them)."""

    def __init__(self, envs: list, owned: bool = False):
        super().__init__(shared.EnvListStepper, envs, "env", owned=owned)
        self.envs = self.lanes.envs


class VectorEnvLanes(LocalAdapter):
    """A gymnasium ``VectorEnv`` in ``AutoresetMode.DISABLED`` (ValueError
    for another mode, saying how to build one)."""

    def __init__(self, vec: Any):
        where = f"VectorEnv {type(vec).__name__}"
        super().__init__(shared.VectorEnvStepper, vec, where)
        self.vec = vec


class _Sent(list):
    """The workers a ``send`` asked, and the lanes it held back (their worker
    died in a reset: ``lost``, ``culprits``) for its ``take`` to report."""

    lost: list[int]
    culprits: list[int]


class WorkerEnvLanes(_LaneView):
    """Lanes in worker processes (``workers.WorkerPool``), as :class:`EnvLanes`.

    After a ``step``, ``lost`` lists the lanes of a worker that died in it
    (rebuilt, not stepped: the host loop runs their episodes again) and
    ``culprits`` those whose env step was under way.
    """

    def __init__(self, source: Any, num_lanes: int, workers: int):
        self.pool = pool = WorkerPool(source, num_lanes, workers)
        with shared.closing_on_error([pool]):
            self._view(pool, "env")
        self.lost: list[int] = []
        self.culprits: list[int] = []
        #: The lanes of a worker that died in a ``reset`` (and those it was
        #: resetting): the next ``take`` reports them ``lost``.
        self.lost_in_reset: set[int] = set()
        self.culprits_in_reset: list[int] = []
        self.carried: tuple[str, ...] | None = None
        self.kept = False  # kept between runs (``run.kept``): ``close`` leaves it

    @property
    def workers(self) -> int:
        return self.pool.workers

    def carry(self, names: Sequence[str] | None = None) -> None:
        """Makes the shared segment with the observation leaves ``names`` only
        (None: every leaf; the others read as zeros here)."""
        layout = self.spec.layout
        keep = layout.names if names is None else set(names)
        carried = tuple(n for n in layout.names if n in keep)
        if self.carried is not None and (names is None or carried == self.carried):
            return
        if self.carried is not None:  # kept lanes, another run's leaves
            self.pool.detach()
        self.carried = carried
        self.pool.attach(layout, carried)

    def _resets(self, ops: list, keys: tuple) -> list:
        """A worker that dies while resetting is replaced and the reset tried
        once more (its lanes reported ``lost`` by the next ``take``); a second
        death raises ``workers.WorkerLost``, marked with the lane."""
        self.carry()  # every leaf, unless the run named the ones it reads
        pool = self.pool
        kw = dict(want_obs=True, info_keys=keys, keep_all_obs=False)
        for again in (False, True):
            results, lost, _ = pool.run(ops, kw)
            if not lost:
                return results
            dead = pool.deaths[0]
            if again:  # the run names the episode reset
                exc = WorkerLost(dead.worker, lost, dead.exitcode, dead.pid)
                raise shared.mark_where(exc, (pool.culprits or lost)[0], "resetting")
            self.lost_in_reset.update(lost)
            self.culprits_in_reset += pool.culprits

    def step(self, actions: np.ndarray, go: np.ndarray, obs: dict):
        """:meth:`EnvLanes.step` in the workers (``lost`` lanes: not stepped)."""
        return self.take(self.send(actions, go), go, obs)

    @property
    def groups(self) -> list[np.ndarray]:
        """Each worker's lanes, ascending: the lane groups a run may pace."""
        return [np.asarray(b, np.int64) for b in self.pool.blocks]

    def send(self, actions: np.ndarray, go: np.ndarray) -> list[int]:
        """Starts the step of the lanes in ``go``; ``take`` its results."""
        act = self.pool.slots["action"]
        n = go.shape[0]
        act[:n][go] = env_actions(self.action_space, actions[go])
        if not self.lost_in_reset:
            return self.pool.send(go, self.info_keys)
        go = go.copy()
        go[[j for j in self.lost_in_reset if j < n]] = False
        sent = _Sent(self.pool.send(go, self.info_keys))
        sent.lost, sent.culprits = sorted(self.lost_in_reset), self.culprits_in_reset
        self.lost_in_reset, self.culprits_in_reset = set(), []
        return sent

    def take(self, sent: list[int], go: np.ndarray, obs: dict):
        """The results of ``send(actions, go)`` (``sent``), as :meth:`EnvLanes.step`."""
        n = go.shape[0]
        pool = self.pool
        info, seen, lost = pool.take(sent)
        self.lost, self.culprits = lost, pool.culprits
        if isinstance(sent, _Sent):  # lanes of a worker that died in a reset
            self.lost = sorted(set(sent.lost).union(lost))
            self.culprits = sent.culprits + self.culprits
        if self.lost:
            go = go.copy()
            go[[j for j in self.lost if j < n]] = False
        slots = pool.slots
        js = np.flatnonzero(go)
        for name in self.carried:
            obs[name][js] = slots["obs:" + name][js]
        reward = np.where(go, slots["reward"][:n], np.float32(0))
        term = slots["terminated"][:n] & go
        trunc = slots["truncated"][:n] & go
        if self.info_keys:
            self._new_info(n, info, seen)
        return reward, term, trunc

    def close(self) -> None:
        if not self.kept:
            self.pool.close()


def make_lanes(env: Any, num_envs: int, episodes: int) -> LocalAdapter:
    """The lanes of a host-stepped ``env``: ``"gymnasium:<id>"`` or factories
    (``min(num_envs, episodes)`` envs, at least one, owned), an ``Env``, a list
    of them (its first ``num_envs``) or a ``VectorEnv``.

    Raises:
      ValueError: an unknown id, an empty list, a VectorEnv not in
        ``AutoresetMode.DISABLED``.
      TypeError: a list entry that is not a gymnasium Env, lanes with different
        spaces, a space jaxmesh does not support yet.
    """
    gym = import_gymnasium()
    if isinstance(env, str) or is_source(env):
        envs = build_envs(env, range(max(1, min(num_envs, episodes))))
        with shared.closing_on_error(envs):
            return EnvLanes(envs, owned=True)
    if isinstance(env, gym.vector.VectorEnv):
        return VectorEnvLanes(env)
    if isinstance(env, gym.Env):
        return EnvLanes([env])
    if isinstance(env, list):  # EnvListStepper refuses an empty one
        return EnvLanes(env[:num_envs])
    raise TypeError(
        f"env {type(env).__name__} is not a gymnasium env; pass a gymnasium Env, a "
        "list of them, a VectorEnv or 'gymnasium:<id>'"
    )
