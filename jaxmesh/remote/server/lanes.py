"""The served lanes: ``ServerStepper`` (``jaxmesh.envs.gymnasium.lanes`` and what
serving adds), ``_make_lanes`` and ``_Request``, a checked call (``requests.py``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Any

import gymnasium
import numpy as np

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.envs.gymnasium.batch import TRIAL_INDEX, ResultBatch
from jaxmesh.envs.gymnasium.workers import ProcessStepper
from jaxmesh.remote import codec
from jaxmesh.remote import spaces as wire_spaces


@dataclasses.dataclass(slots=True, eq=False)
class _Request:
    """A checked call: its ops (``Reset`` | ``Replay``, ascending lane) and
    what the reply carries; a call of one action per lane keeps them as two
    arrays (``single``), its ops built only when asked for."""

    built: list | None
    want_obs: bool
    info_keys: tuple[str, ...]
    all_observations: bool
    call_id: int
    release: tuple[int, ...] = ()  # lanes whose episode the client abandons
    single: tuple[np.ndarray, np.ndarray] | None = None
    info_every_step: bool = False  # every step's info, the last observation
    obs_keys: tuple[str, ...] | None = None  # leaves asked (None: every one)

    @property
    def ops(self) -> list:
        if self.built is None:
            lanes, actions = self.single
            self.built = [
                shared.Replay(j, actions[i : i + 1])
                for i, j in enumerate(lanes.tolist())
            ]
        return self.built

    def reply_options(self) -> dict[str, Any]:  # for the lanes' run and collect
        return {
            "want_obs": self.want_obs,
            "info_keys": self.info_keys,
            "keep_all_obs": self.all_observations,
            "keep_all_info": self.info_every_step,
        }


def _wire_leaf(space: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """The lanes' observation layout, the wire leaf's (a module function: its
    partial pickles for worker processes)."""
    leaf = wire_spaces.space_leaf(space, where=where)
    return tuple(leaf.shape), np.dtype(leaf.dtype)


class ServerStepper:
    """The shared lanes and what serving adds: the wire's leaves, the lockstep
    check of a VectorEnv, ``workers`` threads stepping contiguous groups."""

    def __init__(self, lanes: shared.GymStepper, workers: int):
        self.lanes = lanes
        self.num_lanes = n = lanes.num_lanes
        self.name = lanes.name
        self.lockstep = isinstance(lanes, shared.VectorEnvStepper)
        self.obs_leaves = wire_spaces.space_leaves(
            lanes.observation_space, where=f"{self.name} observation_space"
        )
        if len(self.obs_leaves) > codec.MAX_KEYS:
            raise TypeError(
                f"{self.name} observation_space has {len(self.obs_leaves)} leaves, "
                f"more than the {codec.MAX_KEYS} a request may ask for; flatten "
                "some of them with a gymnasium ObservationWrapper"
            )
        self.obs_names = tuple(m.key for m in self.obs_leaves)
        # Only the leaves a client reads are converted, checked and sent.
        self.full_layout = lanes.layout
        self._layouts: dict[tuple[str, ...], Any] = {}
        self.act_leaf = wire_spaces.space_leaf(
            lanes.action_space, where=f"{self.name} action_space"
        )
        self.act_spec = codec.leaf_spec_from_proto(self.act_leaf)
        self.discrete = lanes.discrete
        self.reset_options = (TRIAL_INDEX,) if lanes.declares_trial_index else ()
        self.workers = 1 if self.lockstep else max(1, min(workers, n))
        self.pool = None
        if self.workers > 1:
            pool = concurrent.futures.ThreadPoolExecutor
            self.pool = pool(self.workers, thread_name_prefix="jaxmesh-lanes")
        # Lane j belongs to group j * workers // num_lanes (contiguous groups).
        self.group_of = [j * self.workers // n for j in range(n)]

    def end_session(self) -> None:
        self.lanes.forget()
        self.lanes.layout = self.full_layout

    def layout_for(self, keys: tuple[str, ...] | None) -> Any:
        """The layout pruned to ``keys`` when they are whole top-level Dict
        entries, else every leaf's."""
        full = self.full_layout
        if not keys:  # every leaf, or none asked (every leaf is still checked)
            return full
        layout = self._layouts.get(keys)
        if layout is None:
            top = list(dict.fromkeys(full.paths[k][0] for k in keys))
            layout = full.select(top)
            if set(layout.names) != set(keys):
                layout = full
            self._layouts[keys] = layout
        return layout

    def check(self, request: _Request) -> None:
        """Refuses (ProtocolError) a request lockstep lanes cannot serve."""
        if not self.lockstep:
            return
        ops, lanes = request.ops, self.lanes
        replays = {o.lane: len(o.actions) for o in ops if isinstance(o, shared.Replay)}
        if not replays:
            return  # resets only: nothing is stepped
        named = {op.lane for op in ops} | set(request.release)
        live = np.flatnonzero(lanes.started & ~lanes.ended)
        missing = [int(j) for j in live if int(j) not in named]
        if missing:
            raise codec.ProtocolError(
                f"lanes {missing[:16]} are in the middle of an episode but have no "
                "actions and no reset in this call; this server steps a VectorEnv "
                "as a whole (capability 'lockstep'), so every lane mid-episode is "
                "stepped (or reset, to abandon its episode) in every call. Serve a "
                "list of Envs for lanes that move on their own"
            )
        counts = {c for j, c in replays.items() if not lanes.ended[j]}
        if len(counts) > 1:
            raise codec.ProtocolError(
                f"the lanes stepped in this call have counts {sorted(counts)}; this "
                "server steps a VectorEnv as a whole (capability 'lockstep'), so "
                "every lane mid-episode replays the same number of actions"
            )

    def execute(self, request: _Request) -> ResultBatch:
        """Runs a checked request; its reply's batch (LaneError: an env raised)."""
        lanes = self.lanes
        lanes.release(request.release)
        keys = request.obs_keys
        lanes.layout = self.layout_for(keys)
        batch = None
        if request.single is not None and self.pool is None:
            # The per-step case (h = 1), built without per-lane objects when
            # the lanes allow it (live, no wall-clock cap, observation asked).
            stepped, actions = request.single
            want, info = request.want_obs, request.info_keys
            batch = lanes.step_each(stepped, actions, want, info)
        if batch is None:
            batch = lanes.collect(self._run(request), **request.reply_options())
        if keys is None or batch.observation.keys() == set(keys):
            return batch
        return batch._replace(observation={k: batch.observation[k] for k in keys})

    def _run(self, request: _Request) -> list[shared.LaneResult]:
        ops = request.ops
        run = functools.partial(self.lanes.run, **request.reply_options())
        groups: dict[int, list] = {}
        for op in ops if self.pool is not None else ():
            groups.setdefault(self.group_of[op.lane], []).append(op)
        if len(groups) < 2:
            return run(ops)
        futures = [self.pool.submit(run, group) for group in groups.values()]
        concurrent.futures.wait(futures)  # no group still stepping after an error
        # In lane order (the groups are contiguous): the lowest lane's error first.
        return [result for future in futures for result in future.result()]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.lanes.close()


def _make_lanes(env: Any, lanes: int | None, workers: int) -> ServerStepper:
    """The lanes of ``env``, or of what a factory ``env`` returns (closed with them)."""
    made = callable(env) and not isinstance(
        env, str | list | gymnasium.Env | gymnasium.vector.VectorEnv
    )
    if made:
        env = env()
    if lanes is not None and not isinstance(env, str):
        raise ValueError(
            f"lanes={lanes} is only for an env id ('gymnasium:<id>'); a "
            f"{type(env).__name__} brings its own lanes (pass a list of Envs or a "
            "VectorEnv with the lanes you want)"
        )
    if isinstance(env, str) and not env.startswith(shared.PREFIX + ":"):
        raise ValueError(
            f"env {env!r}: expected 'gymnasium:<id>' (e.g. "
            "'gymnasium:CartPole-v1'), a gymnasium Env, a list of them, a "
            "VectorEnv in AutoresetMode.DISABLED, or a factory of one"
        )
    if isinstance(env, gymnasium.Env):
        env = [env]
    if not isinstance(env, str | list | gymnasium.vector.VectorEnv):
        what = "the env factory returned" if made else "env is"
        raise TypeError(
            f"{what} a {type(env).__name__}, not a gymnasium env; pass a gymnasium "
            "Env, a list of them, a VectorEnv in AutoresetMode.DISABLED, "
            "'gymnasium:<id>', or a zero-argument factory returning one"
        )
    count = 1 if lanes is None else lanes
    if isinstance(env, str) and workers > 1 and count > 1:
        # A Python sim's step holds the GIL: the lanes step in processes.
        layout = functools.partial(_wire_leaf, where=f"{env} observation_space")
        stepper = ProcessStepper(env, count, workers, layout=layout)
        workers = 1
    else:
        # EnvListStepper refuses an empty list, repeated objects, unequal spaces;
        # VectorEnvStepper a mode other than AutoresetMode.DISABLED.
        owned = isinstance(env, str)
        envs = shared.make_envs(env, count) if owned else env
        vector = isinstance(envs, gymnasium.vector.VectorEnv)
        first = envs[0] if not vector and envs else envs
        where = f"{shared.env_name(first)} observation_space"
        layout = functools.partial(_wire_leaf, where=where)
        kind = shared.VectorEnvStepper if vector else shared.EnvListStepper
        with shared.closing_on_error(envs if owned else ()):
            stepper = kind(envs, owned=owned, layout=layout)
    stepper.owned = stepper.owned or made
    with shared.closing_on_error([stepper]):
        return ServerStepper(stepper, workers)
