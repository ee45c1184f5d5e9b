"""Interfaces shared across jaxmesh (brax ``training/types.py`` style): the
protocols and ``Policy``, the engine's view of a policy. This module imports
nothing of jaxmesh, so every other module can import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax

PyTree = Any
Obs = Any


@runtime_checkable
class Env(Protocol):
    """One environment lane, pure and single-lane; the engine vmaps it.

    The engine owns resets and episode accounting: ``step`` never auto-resets.
    Optional: ``step_with_info`` and ``reset_with_info``, the same with the
    env's info pytree (docs/evaluation.md, "Episode metrics and success"), and
    ``dt``, simulated seconds per step, for ``Chunking(delay_ms=)``.
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


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    """A policy as the engine sees it.

    Attributes:
      name: a display name for messages.
      apply: ``apply(params, inputs, keys, rstate) -> (outputs, rstate)`` over a
        batch of rows (one key per row, used only when ``stochastic``).
      stochastic: whether ``apply`` uses the keys.
      initial_state: one lane's recurrent state at an episode start, or None
        for a policy without state.
      native_chunk: the declared chunk length K, or None.
      spec: input name -> declaration (``jaxmesh.adapt``), or None for the
        whole observation.
      default_params: the params a run uses when none are given (loaded, on
        ``device``); ``lambda: None`` for a plain function.
      place: puts a pytree (params, observations) on ``device``; the identity
        when ``device`` is None.
      device: the resolved ``jax.Device``, or None for jax's default.
      on_episode_end: a host hook called with each ended episode's index, in
        episode order; None when the policy has none.
      takes_execution_horizon: ``apply`` is called with
        ``execution_horizon=E``, the actions executed from one plan (CONTRACT 24).
      declares_chunk: the policy says it returns chunks (CONTRACT 11).
      takes_rows: ``apply`` is called with ``rows=``, each row's lane ([tile]
        int32, -1 for a padding row).
      host: the ``jaxmesh.HostPolicy`` behind ``apply`` (called directly by a
        host loop with no device work: ``jaxmesh.run.host.direct``), or None.
    """

    name: str
    apply: Callable[..., tuple[Any, Any]]
    stochastic: bool
    initial_state: Callable[[], Any] | None
    native_chunk: int | None
    spec: dict | None
    default_params: Callable[[], Any]
    place: Callable[[Any], Any]
    device: Any
    on_episode_end: Callable[[int], None] | None
    takes_execution_horizon: bool = False
    declares_chunk: bool = False
    takes_rows: bool = False
    host: Any = None


@runtime_checkable
class PolicyLike(Protocol):
    """Anything the engine can evaluate besides a plain function.

    ``jaxmesh.Model`` is one; the core knows only this method, never the
    authoring layer behind it.
    """

    def as_policy(self, *, with_params: bool) -> Policy:
        """The engine's view of this object (a ``Policy``, above).

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
