"""Adapter for gymnax 1.x environments (the engine owns resets)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.envs import timing
from jaxmesh.envs.brax import StepWithInfo
from jaxmesh.envs.names import check_id, need
from jaxmesh.envs.timing import step_seconds


@dataclasses.dataclass(eq=False)
class GymnaxEnv(StepWithInfo):
    """A gymnax ``Environment`` with its params as a jaxmesh single-lane env
    (never gymnax's auto-resetting ``step``: the engine starts episodes)."""

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
        discrete = hasattr(space, "n") and not hasattr(space, "low")
        self.num_actions = int(space.n) if discrete else None
        self.action_shape = () if discrete else tuple(space.shape)
        default = jnp.int32 if discrete else jnp.float32
        self.action_dtype = jnp.dtype(getattr(space, "dtype", default))

    @property
    def dt(self) -> float | None:
        return step_seconds(self.params)

    def reset(self, key: jax.Array):
        return self.env.reset_env(key, self.params)

    def step_with_info(self, key: jax.Array, state: Any, action: jax.Array):
        """``step`` and ``step_env``'s ``info`` (``Scoring(metrics=...)`` reads it)."""
        return _step(self.env, key, state, action, self.params)


def _step(env: Any, key: jax.Array, state: Any, action: jax.Array, params: Any):
    obs, state, reward, terminated, info = env.step_env(key, state, action, params)
    reward, terminated = jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, bool)
    truncated = jnp.asarray(env.is_truncated(state, params), bool)
    return obs, state, reward, terminated, truncated, info


def make(env_id: str, **kwargs: Any) -> GymnaxEnv:
    """A registered gymnax env (``"CartPole-v1"``) as a ``GymnaxEnv``: kwargs
    that are fields of its params (``max_steps_in_episode=50``) replace them,
    the rest go to ``gymnax.make``. ValueError for an unknown id (naming the
    closest), TypeError for a keyword neither takes."""
    gymnax = need("gymnax", env_id, "gymnax")
    how = "gymnax.registered_envs lists them"
    check_id("gymnax env", env_id, gymnax.registered_envs, how)
    env, params = gymnax.make(env_id)
    fields = set()
    if dataclasses.is_dataclass(params):
        fields = {f.name for f in dataclasses.fields(params)}
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


@dataclasses.dataclass(eq=False)
class GymnaxTasks(StepWithInfo):
    """Several param sets of one gymnax env as one env (``task_batch``): the
    state carries its episode's params, so lanes step different tasks side by
    side; ``reset_task(key, task)`` starts one of task ``task``."""

    env: Any
    params: Any  # every leaf stacked on a leading task axis
    name: str
    action_shape: tuple
    action_dtype: Any
    num_actions: int | None

    @property
    def dt(self) -> float | None:
        """The tasks' seconds per step when they all share one; else None."""
        first = jax.tree.map(lambda p: p[0], self.params)
        dt = step_seconds(first)
        same = all(
            np.allclose(np.asarray(getattr(self.params, n)), dt)
            for n in timing.NAMES
            if hasattr(self.params, n)
        )
        return dt if dt is not None and same else None

    def reset_task(self, key: jax.Array, task: Any):
        params = jax.tree.map(lambda p: p[task], self.params)
        obs, state = self.env.reset_env(key, params)
        return obs, (state, params)

    def reset(self, key: jax.Array):
        return self.reset_task(key, 0)

    def step_with_info(self, key: jax.Array, state: Any, action: jax.Array):
        inner, params = state
        obs, inner, *rest = _step(self.env, key, inner, action, params)
        return (obs, (inner, params), *rest)


def _signature(params: Any) -> tuple:
    leaves, tree = jax.tree.flatten(params)
    return tree, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves)


def task_batch(envs: list[GymnaxEnv]) -> GymnaxTasks | None:
    """One ``GymnaxTasks`` over ``envs``, or None unless they are one gymnax env
    class with params of one structure, shapes and dtypes."""
    first = envs[0]
    if not all(isinstance(e, GymnaxEnv) for e in envs):
        return None
    if any(type(e.env) is not type(first.env) for e in envs):
        return None
    sig = _signature(first.params)
    if any(_signature(e.params) != sig for e in envs[1:]):
        return None
    # Stacked in numpy: no XLA program for it (jnp.asarray keeps JAX's dtypes).
    stacked = jax.tree.map(
        lambda *p: jnp.asarray(np.stack([np.asarray(x) for x in p])),
        *[e.params for e in envs],
    )
    same = (first.name, first.action_shape, first.action_dtype, first.num_actions)
    return GymnaxTasks(first.env, stacked, *same)
