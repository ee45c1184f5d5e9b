"""The agent side's view of gymnasium lanes: layouts in JAX's dtypes, ``HostEnvSpec``.

``HostEnvSpec`` describes host-stepped lanes to the agent builder in jaxmesh's
own env protocol (shapes only: it is never stepped). Observations are converted
to the dtype JAX computes in (float64 -> float32 unless x64 is on; a Discrete
observation -> int32).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.envs.gymnasium.lanes import _gym

__all__ = ["HostEnvSpec", "action_layout", "observation_layout", "spec_for"]


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
    #: Simulated seconds per step; None where the env has none (not part of
    #: ``signature``: no compiled code depends on it).
    dt: float | None = None

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


def spec_for(
    name: str, obs_space: Any, act_space: Any, where: str, dt: float | None = None
) -> HostEnvSpec:
    """The ``HostEnvSpec`` of lanes with these spaces (TypeError: unsupported)."""
    shape, dtype = observation_layout(obs_space, where)
    a_shape, a_dtype, n = action_layout(act_space, where)
    return HostEnvSpec(name, shape, dtype, a_shape, a_dtype, n, dt)
