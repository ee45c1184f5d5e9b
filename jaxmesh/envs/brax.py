"""Adapter for ``brax.envs.Env`` environments."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

#: brax's own convention (``brax.envs.create(episode_length=1000)``).
DEFAULT_EPISODE_LENGTH = 1000


@dataclasses.dataclass(eq=False)
class BraxEnv:
    """A brax ``Env`` as a jaxmesh single-lane env.

    brax envs have no time limit of their own; the adapter reports
    ``truncated`` once ``episode_length`` steps are done (brax's EpisodeWrapper
    convention) and ``terminated`` from ``state.done``. brax steps take no key.
    """

    env: Any
    episode_length: int | None = DEFAULT_EPISODE_LENGTH
    name: str = ""

    def __post_init__(self):
        if not self.name:
            self.name = f"brax:{type(self.env).__name__.lower()}"
        self.num_actions = None
        self.action_shape = (int(self.env.action_size),)
        self.action_dtype = jnp.dtype(jnp.float32)
        self.max_episode_steps = self.episode_length

    def reset(self, key: jax.Array):
        state = self.env.reset(key)
        return state.obs, (state, jnp.int32(0))

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        del key
        bstate, t = state
        bstate = self.env.step(bstate, action)
        t = t + 1
        truncated = jnp.asarray(bstate.info.get("truncation", False), bool)
        if self.episode_length is not None:
            truncated = truncated | (t >= self.episode_length)
        terminated = jnp.asarray(bstate.done, jnp.float32) > 0.5
        return (
            bstate.obs,
            (bstate, t),
            jnp.asarray(bstate.reward, jnp.float32),
            terminated & ~truncated,
            truncated,
        )


def make(env_id: str, **kwargs) -> BraxEnv:
    try:
        from brax import envs
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            f"env {env_id!r} needs brax: pip install 'jaxmesh[brax]'"
        ) from e
    episode_length = kwargs.pop("episode_length", DEFAULT_EPISODE_LENGTH)
    try:
        env = envs.get_environment(env_id, **kwargs)
    except KeyError as e:
        raise ValueError(
            f"unknown brax env {env_id!r}; registered brax envs are "
            f"{sorted(envs._envs)}"
        ) from e
    return BraxEnv(env, episode_length=episode_length, name=f"brax:{env_id}")
