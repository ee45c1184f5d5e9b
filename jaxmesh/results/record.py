"""Recording episodes: ``evaluate(..., record=jaxmesh.Record(...))``, kept in
buffers of ``[len(episodes), max_steps (+ 1), ...]``
(``jaxmesh.core.tally.Recording``), returned as ``RunResult.trajectories``.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxmesh.core.tally import info_leaves

#: The default cap on the steps kept per recorded episode.
DEFAULT_RECORD_STEPS = 1000


@dataclasses.dataclass(frozen=True)
class Record:
    """Which episodes a run keeps step by step.

    Args:
      episodes: the episode indices (of the budget) to record, kept sorted.
      keys: the observation leaves to keep (names of a dict observation's
        leaves, nested ones joined with ``/``), or None for all of it.
      max_steps: the most steps kept per episode (default 1000); a longer
        episode keeps its first ones and its ``Trajectory.cut`` is True.
      frames: capture ``env.render()`` frames (host-stepped gymnasium envs in
        process with ``render_mode="rgb_array"``). None: when the env renders
        ``rgb_array``; True: required; False: never.
      states: keep the physics state the env's renderer draws (JAX envs whose
        adapter declares ``render_state``: Playground, brax). None: when
        declared; True: required; False: never (videos replay the actions).

    Raises:
      TypeError, ValueError: a bad field, naming it.
    """

    episodes: Sequence[int] = (0,)
    keys: Sequence[str] | str | None = None
    max_steps: int = DEFAULT_RECORD_STEPS
    frames: bool | None = None
    states: bool | None = None

    def __post_init__(self) -> None:
        eps = self.episodes
        if isinstance(eps, numbers.Integral) and not isinstance(eps, bool):
            eps = [eps]
        try:
            eps = list(eps)
        except TypeError:
            raise TypeError(
                f"Record(episodes={self.episodes!r}): expected a list of episode "
                "indices, e.g. Record(episodes=[0, 1, 2])"
            ) from None
        for i in eps:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0:
                raise ValueError(
                    f"Record(episodes={self.episodes!r}): {i!r} is not an episode "
                    "index (an int >= 0)"
                )
        if not eps:
            raise ValueError(
                "Record(episodes=[]): name at least one episode to record, or "
                "pass record=None"
            )
        if len(set(eps)) != len(eps):
            raise ValueError(
                f"Record(episodes={self.episodes!r}): an episode is named twice; "
                "name each once"
            )
        object.__setattr__(self, "episodes", tuple(sorted(int(i) for i in eps)))
        keys = self.keys
        if keys is not None:
            keys = (keys,) if isinstance(keys, str) else tuple(keys)
            if not keys or not all(isinstance(k, str) and k for k in keys):
                raise TypeError(
                    f"Record(keys={self.keys!r}): expected None (the whole "
                    "observation) or observation leaf names (strings)"
                )
            object.__setattr__(self, "keys", keys)
        m = self.max_steps
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise ValueError(
                f"Record(max_steps={m!r}): expected an int >= 1, the most steps "
                f"kept per recorded episode (default {DEFAULT_RECORD_STEPS})"
            )
        object.__setattr__(self, "max_steps", int(m))
        for name in ("frames", "states"):
            if getattr(self, name) not in (None, True, False):
                raise TypeError(
                    f"Record({name}={getattr(self, name)!r}): expected None, True "
                    "or False"
                )


def check_record(record: Any) -> Record | None:
    """``evaluate``'s ``record=``: None or a ``Record`` (else a TypeError)."""
    if record is None or isinstance(record, Record):
        return record
    raise TypeError(
        f"record={record!r}: expected None or jaxmesh.Record(episodes=[...], "
        "keys=None, max_steps=1000)"
    )


def check_record_budget(record: Record | None, episodes: int) -> None:
    """Refuses recorded episodes outside the budget with a ValueError."""
    out = [i for i in (record.episodes if record else ()) if i >= episodes]
    if out:
        raise ValueError(
            f"Record(episodes={list(record.episodes)}): episodes {out} are not in "
            f"the budget of {episodes} episodes (indices 0 .. {episodes - 1}); "
            "record episodes of the budget"
        )


def records_states(record: Record | None, env: Any, where: str) -> bool:
    """Whether a run records its JAX ``env``'s render states (None: a
    host-stepped env); a ValueError for ``Record(states=True)`` without
    ``render_state`` (``where``: the env's name)."""
    if record is None or record.states is False:
        return False
    has = callable(getattr(env, "render_state", None))
    if record.states and not has:
        raise ValueError(
            f"Record(states=True): {where} declares no render_state (only MuJoCo "
            "Playground and brax envs, run in the jitted loop, record their "
            "physics state); drop states=True (videos then replay the recorded "
            "actions, or use the frames captured on the host)"
        )
    return has


def observation_leaves(obs: Any, keys: Sequence[str] | None, where: str) -> Any:
    """The observation leaves ``keys`` names (None: the observation), of one
    observation or a batch.

    Raises:
      ValueError: a key the observation lacks, or keys for a single array.
    """
    if keys is None:
        return obs
    leaves = info_leaves(obs)
    if not leaves:
        raise ValueError(
            f"Record(keys={list(keys)}): the observation of {where} is one array, "
            "not a dict of named leaves; pass keys=None to record it"
        )
    missing = [k for k in keys if k not in leaves]
    if missing:
        raise ValueError(
            f"Record(keys=...): {missing[0]!r} is not an observation leaf of "
            f"{where} (it has {sorted(leaves)}); name one of them"
        )
    return {k: leaves[k] for k in keys}


#: A trajectory's per-step arrays (``[T, ...]``).
_STEP_ARRAYS = ("actions", "rewards", "terminated", "truncated")


def under(arrays: Any, prefix: str) -> dict[str, np.ndarray]:
    """The arrays named ``<prefix><name>``, by ``name``."""
    return {
        k[len(prefix) :]: np.asarray(arrays[k]) for k in arrays if k.startswith(prefix)
    }


@dataclasses.dataclass
class Trajectory:
    """One recorded episode, as numpy arrays.

    Attributes:
      episode, seed: its index in the budget and its seed.
      observations: ``[T + 1, ...]``: at the reset, then after each step (the
        whole observation, or a dict of ``Record.keys``' leaves).
      actions: ``[T, ...]``; rewards: ``[T]`` float32; terminated,
        truncated: ``[T]`` bool, each step's ends.
      length: the episode's length; ``T = min(length, max_steps)``.
      cut: the episode ran longer than ``Record.max_steps``.
      frames: ``[T + 1, H, W, 3]`` uint8 captured frames, or None.
      states: ``{name: [T + 1, ...]}`` render states, or None.
    """

    episode: int
    seed: int
    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    length: int
    cut: bool = False
    frames: np.ndarray | None = None
    states: dict | None = None

    @property
    def steps(self) -> int:
        """Steps held (``T``)."""
        return int(len(self.rewards))

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by a flat name (``observations/<key>`` for a dict)."""
        out: dict[str, np.ndarray] = {}
        obs = self.observations
        if isinstance(obs, dict):
            out.update({f"observations/{k}": np.asarray(v) for k, v in obs.items()})
        else:
            out["observations"] = np.asarray(obs)
        out.update({k: getattr(self, k) for k in _STEP_ARRAYS})
        if self.frames is not None:
            out["frames"] = self.frames
        for k, v in (self.states or {}).items():
            out[f"states/{k}"] = np.asarray(v)
        return out

    @classmethod
    def from_arrays(
        cls, arrays: dict, episode: int, seed: int, length: int, cut: bool
    ) -> Trajectory:
        """The inverse of ``arrays``."""
        obs = arrays.get("observations")
        frames = arrays.get("frames")
        return cls(
            episode=int(episode),
            seed=int(seed),
            observations=under(arrays, "observations/") if obs is None else obs,
            length=int(length),
            cut=bool(cut),
            frames=None if frames is None else np.asarray(frames),
            states=under(arrays, "states/") or None,
            **{k: np.asarray(arrays[k]) for k in _STEP_ARRAYS},
        )


def trajectories_from(
    recording: Any, episodes: np.ndarray, seeds, lengths
) -> list | None:
    """The ``Trajectory`` of every finished recorded episode, in order, of a
    host ``jaxmesh.core.tally.Recording`` (None: None) and the finished
    ``episodes`` with their ``seeds`` and ``lengths``."""
    if recording is None:
        return None
    at = {int(e): k for k, e in enumerate(np.asarray(episodes))}
    cap = int(np.shape(recording.rewards)[1])
    frames = recording.frames

    def kept(tree: Any, slot: int, stop: int) -> Any:
        return jax.tree.map(lambda b: np.array(b[slot, :stop]), tree)

    out = []
    for slot, ep in enumerate(np.asarray(recording.episodes).tolist()):
        k = at.get(int(ep))
        if k is None:
            continue
        length = int(lengths[k])
        t = min(length, cap)
        f = None
        if frames is not None and frames[slot]:
            f = np.stack(frames[slot][: t + 1])
        out.append(
            Trajectory(
                episode=int(ep),
                seed=int(seeds[k]),
                observations=kept(recording.observations, slot, t + 1),
                length=length,
                cut=length > cap,
                frames=f,
                # an env may have nothing to draw ({})
                states=kept(recording.states, slot, t + 1) or None,
                **{k: kept(getattr(recording, k), slot, t) for k in _STEP_ARRAYS},
            )
        )
    return out
