"""Adapter for gymnax 1.x environments (the engine owns resets)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(eq=False)
class GymnaxEnv:
    """A gymnax ``Environment`` with its params, as a jaxmesh single-lane env.

    Uses ``reset_env`` / ``step_env`` / ``is_truncated`` directly, never gymnax's
    auto-resetting ``step``: the engine decides when an episode starts.
    """

    env: Any
    params: Any = None
    name: str = ""

    def __post_init__(self):
        if self.params is None:
            self.params = self.env.default_params
        if not self.name:
            self.name = f"gymnax:{self.env.name}"
        space = self.env.action_space(self.params)
        if hasattr(space, "n") and not hasattr(space, "low"):
            self.num_actions = int(space.n)
            self.action_shape = ()
            self.action_dtype = jnp.dtype(getattr(space, "dtype", jnp.int32))
        else:
            self.num_actions = None
            self.action_shape = tuple(space.shape)
            self.action_dtype = jnp.dtype(getattr(space, "dtype", jnp.float32))
        self.max_episode_steps = (
            int(getattr(self.params, "max_steps_in_episode", 0)) or None
        )

    def reset(self, key: jax.Array):
        return self.env.reset_env(key, self.params)

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        obs, state, reward, terminated, _ = self.env.step_env(
            key, state, action, self.params
        )
        truncated = self.env.is_truncated(state, self.params)
        return (
            obs,
            state,
            jnp.asarray(reward, jnp.float32),
            jnp.asarray(terminated, bool),
            jnp.asarray(truncated, bool),
        )


def make(env_id: str, **kwargs) -> GymnaxEnv:
    try:
        import gymnax
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            f"env {env_id!r} needs gymnax: pip install 'jaxmesh[gymnax]'"
        ) from e
    if env_id not in gymnax.registered_envs:
        raise ValueError(
            f"unknown gymnax env {env_id!r}; registered gymnax envs are "
            f"{sorted(gymnax.registered_envs)}"
        )
    env, params = gymnax.make(env_id, **kwargs)
    return GymnaxEnv(env, params)
