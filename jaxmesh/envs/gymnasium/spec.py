"""The agent side's view of gymnasium lanes, in JAX's dtypes: ``HostEnvSpec``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.envs.gymnasium.lanes import import_gymnasium, native_layout
from jaxmesh.envs.gymnasium.leaves import ObsLayout


def observation_layout(space: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """``native_layout`` in JAX's dtypes (float64: float32 unless x64 is on;
    Discrete: int32)."""
    shape, dtype = native_layout(space, where)
    if isinstance(space, import_gymnasium().spaces.Discrete):
        return shape, np.dtype(np.int32)
    return shape, np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def action_layout(space: Any, where: str) -> tuple[tuple[int, ...], Any, int | None]:
    """(action_shape, action_dtype, num_actions) the agent uses for a space:
    Discrete(n) -> ((), int32, n); Box -> (shape, float32, None); else TypeError."""
    spaces = import_gymnasium().spaces
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
    """What the agent builder needs of host-stepped lanes (jaxmesh's env protocol:
    ``reset`` is only traced for shapes, ``step`` never called)."""

    name: str
    layout: ObsLayout
    action_shape: tuple[int, ...]
    action_dtype: Any
    num_actions: int | None
    #: Simulated seconds per step (not in ``signature``: no code depends on it).
    dt: float | None = None

    def zeros(self, lead: tuple[int, ...] = ()) -> Any:
        """A zero observation (numpy) with leading axes ``lead``."""
        return self.layout.build(self.layout.empty(lead))

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        del key
        zeros = {n: jnp.asarray(x) for n, x in self.layout.empty().items()}
        return self.layout.build(zeros), jnp.zeros((), jnp.int32)

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        raise TypeError(
            f"{self.name} is stepped on the host by jaxmesh.evaluate; it has no "
            "jitted step (use it through jaxmesh.evaluate, not make_evaluator)"
        )

    def reading(self, keys: list[str | None]) -> HostEnvSpec:
        """The spec of the leaves a policy reads (``keys``: top-level keys, None
        for the whole observation)."""
        if None in keys or not keys:
            return self
        layout = self.layout.select([k for k in keys if k is not None])
        return (
            self if layout is self.layout else dataclasses.replace(self, layout=layout)
        )

    @property
    def signature(self) -> tuple:
        """A hashable summary: what compiled agent code depends on."""
        lay = self.layout
        return (
            repr(lay.skeleton),
            tuple((n, lay.shapes[n], str(lay.dtypes[n])) for n in lay.names),
            self.action_shape,
            str(jnp.dtype(self.action_dtype)),
            self.num_actions,
        )


def spec_for(
    name: str, obs_space: Any, act_space: Any, where: str, dt: float | None = None
) -> HostEnvSpec:
    """The ``HostEnvSpec`` of lanes with these spaces (TypeError: unsupported)."""
    a_shape, a_dtype, n = action_layout(act_space, where)
    layout = ObsLayout(obs_space, lambda s: observation_layout(s, where), where)
    return HostEnvSpec(name, layout, a_shape, a_dtype, n, dt)
