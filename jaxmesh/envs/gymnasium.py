"""Gymnasium envs as host-stepped lanes: an ``Env``, a list of them, a ``VectorEnv``.

jaxmesh's host loop (``jaxmesh.run.host``) owns episode accounting; this module
owns every gymnasium call. A run sees one of two ``Lanes`` classes:

- ``EnvLanes``: one gymnasium ``Env`` per lane (a single Env, a list of Envs,
  or ``"gymnasium:<id>"``, whose envs jaxmesh makes and closes). Only lanes
  that run an episode are stepped.
- ``VectorLanes``: a gymnasium ``VectorEnv`` in ``AutoresetMode.DISABLED``
  (gymnasium 1.x). Episodes start with ``reset(seed=[...], options={"reset_mask":
  mask})``; every lane is stepped on every call, so lanes with no episode left
  get a fixed idle action, and are reset with ``seed=None`` when their env ends.

Episode i with seed s starts with ``reset(seed=s)``, plus ``options={"trial_index":
i}`` exactly when the env lists ``"trial_index"`` in ``metadata["reset_options"]``
(CONTRACT 6, with ``trial_index_base = 0``).

``HostEnvSpec`` describes the lanes to the agent builder in jaxmesh's own env
protocol (shapes only: it is never stepped). gymnasium is imported on first
use, so importing this module costs nothing.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.remote.protocol import TRIAL_INDEX

PREFIX = "gymnasium"

_DISABLED_HOW = (
    "build one with gymnasium.make_vec(env_id, num_envs=N, vectorization_mode="
    "'sync', vector_kwargs={'autoreset_mode': "
    "gymnasium.vector.AutoresetMode.DISABLED}) (or pass autoreset_mode="
    "AutoresetMode.DISABLED to SyncVectorEnv / AsyncVectorEnv), or pass a list of "
    "gymnasium Envs"
)


def is_host_stepped(env: Any) -> bool:
    """Whether ``env`` is a gymnasium env jaxmesh steps on the host.

    True for ``"gymnasium:<id>"``, a ``gymnasium.Env`` (wrappers included), a
    ``gymnasium.vector.VectorEnv`` and a list holding a ``gymnasium.Env``. Never
    imports gymnasium: an object can only be a gymnasium env once it is loaded.
    """
    if isinstance(env, str):
        return env.startswith(PREFIX + ":")
    gym = sys.modules.get("gymnasium")
    if gym is None:
        return False
    if isinstance(env, gym.Env | gym.vector.VectorEnv):
        return True
    return isinstance(env, list) and any(isinstance(e, gym.Env) for e in env)


def _gym():
    import gymnasium

    return gymnasium


# Spaces ------------------------------------------------------------------------
def _canonical(dtype: Any) -> np.dtype:
    """The dtype JAX computes in (float64 -> float32 unless x64 is on)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))


def observation_layout(space: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one lane's observation array for a gymnasium space.

    Raises:
      TypeError: a space jaxmesh does not read yet (Dict, Tuple and the rest).
    """
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(np.int32)
    if isinstance(space, spaces.Box | spaces.MultiBinary | spaces.MultiDiscrete):
        return tuple(int(d) for d in space.shape), _canonical(space.dtype)
    if isinstance(space, spaces.Dict | spaces.Tuple):
        raise TypeError(
            f"{where}: observation_space {space} is a {type(space).__name__}; "
            "jaxmesh does not read Dict or Tuple observations from gymnasium envs "
            "yet. Flatten it (gymnasium.wrappers.FlattenObservation(env)) or pick "
            "one entry with a gymnasium ObservationWrapper"
        )
    raise TypeError(
        f"{where}: observation_space {space} ({type(space).__name__}) is not one "
        "jaxmesh reads; expected Box, Discrete, MultiBinary or MultiDiscrete"
    )


def action_layout(space: Any, where: str) -> tuple[tuple[int, ...], Any, int | None]:
    """(action_shape, action_dtype, num_actions) the agent uses for a space.

    Discrete(n) -> ((), int32, n); Box -> (shape, float32, None).

    Raises:
      TypeError: any other action space (not supported yet).
    """
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return (), jnp.int32, int(space.n)
    if isinstance(space, spaces.Box):
        return tuple(int(d) for d in space.shape), jnp.float32, None
    raise TypeError(
        f"{where}: action_space {space} is a {type(space).__name__}; jaxmesh "
        "drives gymnasium envs with Discrete or Box actions only (MultiDiscrete, "
        "MultiBinary, Dict and Tuple actions are not supported yet). Wrap the env "
        "in a gymnasium ActionWrapper that maps a Box or Discrete action to its own"
    )


def _idle_action(space: Any) -> Any:
    """An action valid in ``space``, sent to vector lanes with no episode."""
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return np.asarray(space.start, np.int64)
    zero = np.zeros(space.shape, space.dtype)
    return np.clip(zero, space.low, space.high).astype(space.dtype)


def env_actions(space: Any, actions: np.ndarray) -> np.ndarray:
    """The agent's actions ([n, *A]) as the env's own action values."""
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return actions.astype(np.int64) + int(space.start)
    return actions.astype(space.dtype)


def _declares_trial_index(metadata: Any) -> bool:
    options = (metadata or {}).get("reset_options", ()) or ()
    return TRIAL_INDEX in options


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    env_id = getattr(spec, "id", None)
    if env_id:
        return f"{PREFIX}:{env_id}"
    inner = getattr(env, "unwrapped", env)
    return f"{PREFIX}:{type(inner).__name__}"


@dataclasses.dataclass(eq=False)
class HostEnvSpec:
    """What the agent builder needs of host-stepped lanes (jaxmesh's env protocol).

    ``reset`` gives a zero observation of the right shape and dtype; it is only
    ever traced for shapes (``jax.eval_shape``). ``step`` is never called: the
    host loop steps the gymnasium envs itself.
    """

    name: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_shape: tuple[int, ...]
    action_dtype: Any
    num_actions: int | None

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        del key
        return jnp.zeros(self.obs_shape, self.obs_dtype), jnp.zeros((), jnp.int32)

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        raise TypeError(
            f"{self.name} is stepped on the host by jaxmesh.evaluate; it has no "
            "jitted step (use it through jaxmesh.evaluate, not make_evaluator)"
        )

    @property
    def signature(self) -> tuple:
        """A hashable summary: what compiled agent code depends on."""
        return (
            self.obs_shape,
            str(self.obs_dtype),
            self.action_shape,
            str(jnp.dtype(self.action_dtype)),
            self.num_actions,
        )


def _spec_for(name: str, obs_space: Any, act_space: Any, where: str) -> HostEnvSpec:
    shape, dtype = observation_layout(obs_space, where)
    a_shape, a_dtype, n = action_layout(act_space, where)
    return HostEnvSpec(name, shape, dtype, a_shape, a_dtype, n)


def _same_space(a: Any, b: Any) -> bool:
    """``a == b`` for two spaces; two Boxes with the same shape, dtype and
    bounds compare without gymnasium's ``allclose`` (the usual case, per lane
    of every run)."""
    if a is b:
        return True
    box = _gym().spaces.Box
    if type(a) is box and type(b) is box:
        if (
            a.shape == b.shape
            and a.dtype == b.dtype
            and np.array_equal(a.low, b.low)
            and np.array_equal(a.high, b.high)
        ):
            return True
    return a == b


# Lanes -------------------------------------------------------------------------
class _Lanes:
    """Common parts: the spec, observation conversion and trial_index options.

    Info keys: the host loop sets ``info_keys`` (the keys its metrics read);
    after each ``step``, ``info[key]`` is ``(values float64 [n], present bool
    [n])`` for the lanes stepped, and ``info_seen`` the keys their infos had.
    """

    spec: HostEnvSpec
    num_lanes: int
    action_space: Any
    info_keys: tuple[str, ...] = ()
    info: dict = {}
    info_seen: set = set()

    def _new_info(self, n: int) -> None:
        self.info = {
            k: (np.zeros(n, np.float64), np.zeros(n, bool)) for k in self.info_keys
        }
        self.info_seen = set()

    def _read_info(self, info: Any, j: int) -> None:
        """Lane ``j``'s values of the info keys (gymnasium's own info dict)."""
        if not info:  # most steps of most envs: nothing to read
            return
        from jaxmesh.run.host import info_value

        self.info_seen.update(info)
        for k in self.info_keys:
            if k in info:
                v = info_value(info, k, f"{self.spec.name} lane {j}")
                vals, present = self.info[k]
                vals[j], present[j] = v, True

    def observation(self, obs: Any, lane: int) -> np.ndarray:
        """One lane's observation as an array of the spec's shape and dtype."""
        arr = np.asarray(obs, self.spec.obs_dtype)
        if arr.shape != self.spec.obs_shape:
            raise ValueError(
                f"{self.spec.name} lane {lane} returned an observation of shape "
                f"{arr.shape}; its observation_space has shape "
                f"{self.spec.obs_shape}. Make the env return observations of its "
                "declared shape"
            )
        return arr

    def observations(self, values: Sequence, lanes: Any) -> np.ndarray:
        """The observations of ``lanes`` (a slice or a list) stacked, checked
        as ``observation`` checks one (one numpy call in the usual case)."""
        try:
            arr = np.asarray(values, self.spec.obs_dtype)
        except ValueError:  # ragged: name the lane below
            arr = None
        if arr is None or arr.shape[1:] != self.spec.obs_shape:
            where = range(len(values)) if isinstance(lanes, slice) else lanes
            for j, v in zip(where, values, strict=True):
                self.observation(v, j)
        return arr

    def close(self) -> None:
        """Closes the envs jaxmesh made (never the caller's own)."""


class EnvLanes(_Lanes):
    """One gymnasium ``Env`` per lane; only lanes with an episode are stepped.

    Args:
      envs: the lanes' envs (all with equal observation and action spaces).
      owned: jaxmesh made them (``"gymnasium:<id>"``) and closes them.
    """

    def __init__(self, envs: list, owned: bool = False):
        gym = _gym()
        for j, e in enumerate(envs):
            if not isinstance(e, gym.Env):
                raise TypeError(
                    f"env list entry {j} is a {type(e).__name__}, not a "
                    "gymnasium.Env; pass a list of gymnasium Envs, one per lane"
                )
        seen: dict[int, int] = {}
        for j, e in enumerate(envs):
            k = seen.setdefault(id(e), j)
            if k != j:
                raise ValueError(
                    f"env list entries {k} and {j} are the same Env object; each "
                    "lane needs its own env (e.g. [gymnasium.make(id) for _ in "
                    "range(n)])"
                )
        first = envs[0]
        for j, e in enumerate(envs[1:], start=1):
            for attr in ("observation_space", "action_space"):
                if not _same_space(getattr(e, attr), getattr(first, attr)):
                    raise TypeError(
                        f"env list entry {j} has {attr} {getattr(e, attr)}, entry "
                        f"0 has {getattr(first, attr)}; every lane must have the "
                        "same spaces"
                    )
        self.envs = list(envs)
        self.owned = owned
        self.num_lanes = len(envs)
        self.action_space = first.action_space
        self.spec = _spec_for(
            _env_name(first), first.observation_space, first.action_space, "env"
        )
        self._trial = [_declares_trial_index(e.metadata) for e in self.envs]

    def reset(self, lanes: list[int], seeds: list[int], trials: list[int]) -> list:
        """Starts an episode on each of ``lanes``; their observations."""
        out = []
        for j, seed, trial in zip(lanes, seeds, trials, strict=True):
            if self._trial[j]:
                obs, _ = self.envs[j].reset(
                    seed=int(seed), options={TRIAL_INDEX: int(trial)}
                )
            else:
                obs, _ = self.envs[j].reset(seed=int(seed))
            out.append(self.observation(obs, j))
        return out

    def step(self, actions: np.ndarray, go: np.ndarray, obs: np.ndarray):
        """Steps the lanes in ``go``; writes their observations into ``obs``.

        Returns:
          (reward float32 [n], terminated [n], truncated [n]); lanes not in
          ``go`` read 0 / False.
        """
        n = go.shape[0]
        reward = np.zeros(n, np.float32)
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        values = env_actions(self.action_space, actions)
        # Python ints for a Discrete space (what its step expects).
        acts = values.tolist() if values.ndim == 1 else values
        envs = self.envs
        if go.all():  # the usual step: every lane, no index lists
            lanes: Any = slice(None)
            out = [e.step(a) for e, a in zip(envs, acts, strict=False)]
        else:
            lanes = np.flatnonzero(go).tolist()
            out = [envs[j].step(acts[j]) for j in lanes]
        if keys := bool(self.info_keys):
            self._new_info(n)
        if not out:
            return reward, term, trunc
        o, r, te, tr, infos = zip(*out, strict=True)
        obs[lanes] = self.observations(o, lanes)
        reward[lanes], term[lanes], trunc[lanes] = r, te, tr
        if keys and any(infos):  # most steps of most envs: every info empty
            where = range(n) if isinstance(lanes, slice) else lanes
            for j, info in zip(where, infos, strict=True):
                self._read_info(info, j)
        return reward, term, trunc

    def close(self) -> None:
        if self.owned:
            for e in self.envs:
                e.close()


class VectorLanes(_Lanes):
    """A gymnasium ``VectorEnv`` in ``AutoresetMode.DISABLED``.

    Raises:
      ValueError: any other autoreset mode (saying how to build a DISABLED one).
    """

    def __init__(self, vec: Any):
        gym = _gym()
        mode = (vec.metadata or {}).get("autoreset_mode")
        try:
            mode = gym.vector.AutoresetMode(mode) if mode is not None else None
        except ValueError:
            pass
        if mode != gym.vector.AutoresetMode.DISABLED:
            raise ValueError(
                f"{type(vec).__name__} has metadata['autoreset_mode']={mode!r}; "
                "jaxmesh starts every episode itself (its own seed, CONTRACT 6), "
                "so it serves a VectorEnv only in AutoresetMode.DISABLED: "
                + _DISABLED_HOW
            )
        where = f"VectorEnv {type(vec).__name__}"
        self.vec = vec
        self.num_lanes = int(vec.num_envs)
        self.action_space = vec.single_action_space
        self.spec = _spec_for(
            _env_name(vec), vec.single_observation_space, self.action_space, where
        )
        self._trial = _declares_trial_index(vec.metadata)
        self._idle = _idle_action(self.action_space)
        # Lanes whose env ended and was not reset since (DISABLED: stepping one
        # fails); None before the first reset.
        self._ended: np.ndarray | None = None

    def _reset(self, lanes: list[int], seeds: list, options: dict) -> Any:
        mask = np.zeros(self.num_lanes, bool)
        mask[lanes] = True
        seed_list: list = [None] * self.num_lanes
        for j, s in zip(lanes, seeds, strict=True):
            seed_list[j] = None if s is None else int(s)
        obs, _ = self.vec.reset(seed=seed_list, options={"reset_mask": mask, **options})
        if self._ended is not None:
            self._ended[mask] = False
        return obs

    def reset(self, lanes: list[int], seeds: list[int], trials: list[int]) -> list:
        """Starts an episode on each of ``lanes`` (``reset_mask``); their obs.

        One reset call for all of them, or one per lane when the env takes a
        ``trial_index`` (gymnasium passes one ``options`` dict to every lane).
        """
        if self._ended is None:
            # gymnasium's vector envs hold no observation for a lane never
            # reset, so the first call resets every lane at once (lanes with no
            # episode with seed=None); with a trial_index, the episodes' own
            # resets follow, one per lane.
            every = list(range(self.num_lanes))
            first: list = [None] * self.num_lanes
            if not self._trial:
                for j, s in zip(lanes, seeds, strict=True):
                    first[j] = s
            obs = self._reset(every, first, {})
            self._ended = np.zeros(self.num_lanes, bool)
            if not self._trial:
                return [self.observation(obs[j], j) for j in lanes]
        if not self._trial:
            obs = self._reset(lanes, seeds, {})
            return [self.observation(obs[j], j) for j in lanes]
        out = []
        for j, seed, trial in zip(lanes, seeds, trials, strict=True):
            obs = self._reset([j], [seed], {TRIAL_INDEX: int(trial)})
            out.append(self.observation(obs[j], j))
        return out

    def step(self, actions: np.ndarray, go: np.ndarray, obs: np.ndarray):
        """Steps every vector lane; lanes not in ``go`` play the idle action.

        Returns:
          (reward float32 [n], terminated [n], truncated [n]) for the first n
          lanes; lanes not in ``go`` read 0 / False.
        """
        n = go.shape[0]
        if self._ended is not None and self._ended.any():
            idle = [int(j) for j in np.flatnonzero(self._ended)]
            self._reset(idle, [None] * len(idle), {})
        batch = np.broadcast_to(self._idle, (self.num_lanes,) + self._idle.shape).copy()
        values = env_actions(self.action_space, actions)
        batch[:n][go] = values[go]
        o, r, te, tr, info = self.vec.step(batch)
        te, tr = np.asarray(te, bool), np.asarray(tr, bool)
        if self.info_keys:
            self._read_vector_info(info, go)
        self._ended = te | tr
        for j in np.flatnonzero(go):
            obs[j] = self.observation(o[j], int(j))
        reward = np.where(go, np.asarray(r, np.float32)[:n], np.float32(0))
        return reward, te[:n] & go, tr[:n] & go

    def _read_vector_info(self, info: dict, go: np.ndarray) -> None:
        """The info keys of the lanes in ``go`` (gymnasium's vector info: an
        array per key, and a ``_key`` mask of the lanes that had it)."""
        from jaxmesh.run.host import info_value

        n = go.shape[0]
        self._new_info(n)
        self.info_seen = {k for k in info if not k.startswith("_")}
        for k in self.info_keys:
            if k not in info:
                continue
            mask = np.asarray(info.get("_" + k, np.ones(self.num_lanes, bool)), bool)
            vals, present = self.info[k]
            for j in np.flatnonzero(go & mask[:n]):
                v = info_value({k: np.asarray(info[k])[j]}, k, f"lane {j}")
                vals[j], present[j] = v, True

    def close(self) -> None:
        """The caller's VectorEnv stays open."""


def make_lanes(env: Any, num_envs: int, episodes: int) -> _Lanes:
    """The lanes for what the user passed as a host-stepped ``env``.

    Args:
      env: ``"gymnasium:<id>"``, a gymnasium ``Env``, a list of them, or a
        ``VectorEnv``.
      num_envs: lanes asked for; an id makes ``min(num_envs, episodes)``
        envs (at least one), a list gives its first ``num_envs`` envs; the run
        uses ``min(num_envs, lanes.num_lanes)`` lanes.
      episodes: the budget (an id makes no more envs than it needs).

    Raises:
      ValueError: an unknown id, an empty list, a VectorEnv not in
        ``AutoresetMode.DISABLED``.
      TypeError: a list entry that is not a gymnasium Env, lanes with different
        spaces, a space jaxmesh does not support yet.
    """
    gym = _gym()
    if isinstance(env, str):
        name = env.partition(":")[2]
        # "module:Id" makes gymnasium import the module that registers Id.
        if ":" not in name and name not in gym.registry:
            from jaxmesh.envs import unknown_id

            raise ValueError(
                unknown_id(
                    "gymnasium env",
                    name,
                    gym.registry,
                    "gymnasium.pprint_registry() lists them; import the package "
                    "that registers yours first",
                )
            )
        count = max(1, min(num_envs, episodes))
        envs = []
        try:
            for _ in range(count):
                envs.append(gym.make(name))
            return EnvLanes(envs, owned=True)
        except BaseException:
            for e in envs:
                e.close()
            raise
    if isinstance(env, gym.vector.VectorEnv):
        return VectorLanes(env)
    if isinstance(env, gym.Env):
        return EnvLanes([env])
    if isinstance(env, list):
        if not env:
            raise ValueError("env=[]: pass at least one gymnasium Env")
        return EnvLanes(env[:num_envs])
    raise TypeError(
        f"env {type(env).__name__} is not a gymnasium env; pass a gymnasium Env, a "
        "list of them, a VectorEnv or 'gymnasium:<id>'"
    )


__all__ = [
    "PREFIX",
    "TRIAL_INDEX",
    "is_host_stepped",
    "make_lanes",
    "EnvLanes",
    "VectorLanes",
    "HostEnvSpec",
    "observation_layout",
    "action_layout",
]
