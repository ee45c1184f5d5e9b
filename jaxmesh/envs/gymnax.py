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
    ``terminated`` is ``step_env``'s own (gymnax 1.x keeps time limits out of
    it) and ``truncated`` is ``is_truncated``; both can be True on one step
    (see ``jaxmesh.envs``).
    """

    env: Any
    params: Any = None
    name: str = ""

    def __post_init__(self):
        if self.params is None:
            self.params = self.env.default_params
        if not self.name:
            self.name = f"gymnax:{self.env.name}"
        try:
            space = self.env.action_space(self.params)
        except NotImplementedError as e:
            raise TypeError(
                f"gymnax env {type(self.env).__name__} does not implement "
                "action_space(params): jaxmesh needs it for the action shape and "
                "dtype; return a gymnax spaces.Discrete or spaces.Box"
            ) from e
        if hasattr(space, "n") and not hasattr(space, "low"):
            self.num_actions = int(space.n)
            self.action_shape = ()
            self.action_dtype = jnp.dtype(getattr(space, "dtype", jnp.int32))
        else:
            self.num_actions = None
            self.action_shape = tuple(space.shape)
            self.action_dtype = jnp.dtype(getattr(space, "dtype", jnp.float32))

    def reset(self, key: jax.Array):
        return self.env.reset_env(key, self.params)

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        return self.step_with_info(key, state, action)[:5]

    def step_with_info(self, key: jax.Array, state: Any, action: jax.Array):
        """``step`` and the env's ``info`` dict (``step_env``'s own), the source
        of episode metrics (``evaluate(metrics=...)``)."""
        obs, state, reward, terminated, info = self.env.step_env(
            key, state, action, self.params
        )
        truncated = self.env.is_truncated(state, self.params)
        return (
            obs,
            state,
            jnp.asarray(reward, jnp.float32),
            jnp.asarray(terminated, bool),
            jnp.asarray(truncated, bool),
            info,
        )


def make(env_id: str, **kwargs: Any) -> GymnaxEnv:
    """A registered gymnax env as a ``GymnaxEnv``.

    Args:
      env_id: a gymnax id, e.g. ``"CartPole-v1"`` (no ``gymnax:`` prefix).
      **kwargs: fields of the env's params (``max_steps_in_episode=50``)
        replace their defaults; the rest go to ``gymnax.make``.

    Raises:
      ValueError: for an unknown id, naming the closest registered ones.
      TypeError: for a keyword the env takes neither as a param nor in its
        constructor.
    """
    try:
        import gymnax
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            f"env {env_id!r} needs gymnax: pip install 'jaxmesh[gymnax]'"
        ) from e
    if env_id not in gymnax.registered_envs:
        from jaxmesh.envs.names import unknown_id

        raise ValueError(
            unknown_id(
                "gymnax env",
                env_id,
                gymnax.registered_envs,
                "gymnax.registered_envs lists them",
            )
        )
    env, params = gymnax.make(env_id)
    fields = (
        {f.name for f in dataclasses.fields(params)}
        if dataclasses.is_dataclass(params)
        else set()
    )
    ctor = {k: v for k, v in kwargs.items() if k not in fields}
    if ctor:
        try:
            env, params = gymnax.make(env_id, **ctor)
        except TypeError as e:
            raise TypeError(
                f"gymnax env {env_id!r} does not take {sorted(ctor)} ({e}); its "
                f"params are {sorted(fields)}: pass those, or arguments of its "
                "constructor"
            ) from e
    given = {k: v for k, v in kwargs.items() if k in fields}
    if given:
        params = params.replace(**given)
    return GymnaxEnv(env, params)
