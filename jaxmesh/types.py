"""Interfaces shared across jaxmesh (brax ``training/types.py`` style)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jax

if TYPE_CHECKING:  # core.policy imports this module; the name is for hints only
    from jaxmesh.core.policy import Policy

PyTree = Any
Obs = Any


@runtime_checkable
class Env(Protocol):
    """One environment lane, pure and single-lane; the engine vmaps it.

    The engine owns resets and episode accounting: ``step`` never auto-resets.

    Optional: ``step_with_info(key, state, action) -> (observation, state,
    reward, terminated, truncated, info)``, the same step with the env's info
    pytree; ``evaluate(metrics=..., success=...)`` reads its leaves (gymnax's
    ``info``, brax's ``state.metrics``). An env without it has no metrics.
    """

    name: str
    action_shape: tuple[int, ...]
    action_dtype: Any
    num_actions: int | None  # discrete action count, None for continuous

    def reset(self, key: jax.Array) -> tuple[Obs, PyTree]:
        """Returns (observation, env state) of a fresh episode."""

    def step(
        self, key: jax.Array, state: PyTree, action: jax.Array
    ) -> tuple[Obs, PyTree, jax.Array, jax.Array, jax.Array]:
        """Returns (observation, state, reward, terminated, truncated)."""


@runtime_checkable
class PolicyLike(Protocol):
    """Anything the engine can evaluate besides a plain function.

    ``jaxmesh.Model`` is one; the core knows only this method, never the
    authoring layer behind it.
    """

    def as_policy(self, *, with_params: bool) -> Policy:
        """The engine's view of this object (see ``jaxmesh.core.policy.Policy``).

        Args:
          with_params: True when the caller passes params as a jit argument
            (``make_evaluator``, ``evaluate(params=...)``).
        """


@runtime_checkable
class InputDecl(Protocol):
    """One input of a spec (``jaxmesh.adapt.State``, ``Image``, ``Previous``).

    Attributes:
      stack: frames kept in the window (the policy sees a stacked window when
        above 1).
      reads_obs: the frame is made from the observation (pushed after every
        executed env step).
      reads_action: the frame is made from the executed action (pushed when
        the action is chosen).
    """

    stack: int
    reads_obs: bool
    reads_action: bool

    def frame(self, obs: Obs, action: Any = None) -> PyTree:
        """One lane's processed frame."""
