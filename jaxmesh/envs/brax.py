"""Adapter for ``brax.envs.Env`` environments."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.envs.names import check_id, need
from jaxmesh.envs.timing import step_seconds

#: brax's own convention (``brax.envs.create(episode_length=1000)``).
DEFAULT_EPISODE_LENGTH = 1000

#: The pipeline-state fields brax's renderer (``brax.io.image.render_array``) sets.
RENDER_FIELDS = ("q", "qd", "mocap_pos", "mocap_quat")


class StepWithInfo:
    """``step``: ``step_with_info`` without its info (the JAX adapters' own)."""

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        return self.step_with_info(key, state, action)[:5]


@dataclasses.dataclass(eq=False)
class BraxEnv(StepWithInfo):
    """A brax ``Env`` as a jaxmesh single-lane env: ``truncated`` after
    ``episode_length`` steps (None: no limit) or a wrapper's
    ``info["truncation"]``, ``terminated`` from ``state.done`` otherwise."""

    env: Any
    episode_length: int | None = DEFAULT_EPISODE_LENGTH
    name: str = ""

    def __post_init__(self):
        if self.episode_length is not None:
            hint = " (steps before truncated), or None for no limit"
            self.episode_length = positive_int(
                "episode_length", self.episode_length, hint
            )
        if not self.name:
            inner = getattr(self.env, "unwrapped", self.env)
            self.name = f"brax:{type(inner).__name__.lower()}"
        self.num_actions = None
        self.action_shape = (int(self.env.action_size),)
        self.action_dtype = jnp.dtype(jnp.float32)

    @property
    def dt(self) -> float | None:
        return step_seconds(self.env)

    def reset(self, key: jax.Array):
        return self.reset_with_info(key)[:2]

    def reset_with_info(self, key: jax.Array):
        """``reset`` and brax's ``state.metrics`` of the reset state."""
        state = self.env.reset(key)
        return state.obs, (state, jnp.int32(0)), dict(state.metrics)

    def step_with_info(self, key: jax.Array, state: Any, action: jax.Array):
        """``step`` and brax's ``state.metrics`` (``Scoring(metrics=...)``)."""
        del key
        bstate, t = state
        bstate = self.env.step(bstate, action)
        t = t + 1
        done = jnp.asarray(bstate.done, jnp.float32) > 0.5
        # brax's EpisodeWrapper sets done at its limit, flagged in truncation.
        limit = jnp.asarray(bstate.info.get("truncation", 0.0), jnp.float32) > 0.5
        truncated = limit
        if self.episode_length is not None:
            truncated = truncated | (t >= self.episode_length)
        reward, info = jnp.asarray(bstate.reward, jnp.float32), dict(bstate.metrics)
        return bstate.obs, (bstate, t), reward, done & ~limit, truncated, info

    def render_state(self, state: Any) -> dict:
        """The ``RENDER_FIELDS`` a lane's pipeline state has (``Record.states``)."""
        ps = state[0].pipeline_state
        return {k: getattr(ps, k) for k in RENDER_FIELDS if hasattr(ps, k)}


def from_env(env: Any) -> BraxEnv:
    """A brax ``Env`` as a ``BraxEnv``, ``episode_length`` from an
    ``EpisodeWrapper`` among its wrappers, else 1000."""
    from brax.envs.wrappers import training

    inner = env
    while inner is not None:
        if isinstance(inner, training.EpisodeWrapper):
            length = math.ceil(inner.episode_length / inner.action_repeat)
            return BraxEnv(env, episode_length=length)
        inner = getattr(inner, "env", None)
    return BraxEnv(env)


def make(env_id: str, **kwargs: Any) -> BraxEnv:
    """A registered brax env (``"ant"``) as a ``BraxEnv``: ``episode_length``
    (default 1000; None: no limit), the rest for ``brax.envs.get_environment``.
    ValueError for an unknown id (naming the closest) or a bad
    ``episode_length``, TypeError for a keyword the env does not take."""
    envs = need("brax.envs", env_id, "brax")
    episode_length = kwargs.pop("episode_length", DEFAULT_EPISODE_LENGTH)
    check_id("brax env", env_id, envs._envs, "brax.envs.register_environment adds one")
    try:
        env = envs.get_environment(env_id, **kwargs)
    except TypeError as e:
        raise TypeError(
            f"brax env {env_id!r} does not take {sorted(kwargs)} ({e}): pass "
            "episode_length or arguments of its constructor"
        ) from e
    return BraxEnv(env, episode_length=episode_length, name=f"brax:{env_id}")


def positive_int(name: str, value: Any, hint: str = "") -> int:
    """``value`` as an int >= 1 (ValueError naming ``name``, then ``hint``)."""
    try:
        n = operator.index(value)
    except TypeError:
        n = 0
    if isinstance(value, bool) or n < 1:
        raise ValueError(f"{name}={value!r}: expected an int >= 1{hint}")
    return n
