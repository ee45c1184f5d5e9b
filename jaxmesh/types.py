"""Interfaces shared across jaxmesh: the protocols and ``Policy``, the engine's
view of a policy. It imports nothing of jaxmesh, so every module can import it.
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
    """One environment lane, pure; the engine vmaps it, and owns resets and
    episode accounting (``step`` never auto-resets). Optional:
    ``step_with_info`` and ``reset_with_info``, the same with the env's info
    (docs/evaluation.md, "Episode metrics and success"), and ``dt``, simulated
    seconds per step, for ``Chunking(delay_ms=)``.
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
      apply: ``apply(params, inputs, keys, rstate) -> (outputs, rstate)`` over a
        batch of rows (one key per row, used only when ``stochastic``).
      initial_state: one lane's recurrent state at an episode start (None: no
        state).
      native_chunk: the declared chunk length K, or None.
      spec: input name -> declaration (``jaxmesh.adapt``); None: the whole
        observation.
      default_params: the params a run uses when none are given (loaded, on
        ``device``; default: none).
      place: puts a pytree on ``device`` (None: jax's default; default: as it
        is).
      on_episode_end: a host hook called with each ended episode's index, in
        order, or None.
      takes_execution_horizon: ``apply`` takes ``execution_horizon=E``, the
        actions executed from one plan (CONTRACT 24).
      declares_chunk: the policy says it returns chunks (CONTRACT 11).
      takes_rows: ``apply`` takes ``rows=``, each row's lane ([tile] int32, -1
        for padding).
      host: the ``jaxmesh.HostPolicy`` behind ``apply`` (a host loop calls it
        directly: ``jaxmesh.run.host.direct``), or None.
    """

    name: str
    apply: Callable[..., tuple[Any, Any]]
    stochastic: bool = False
    initial_state: Callable[[], Any] | None = None
    native_chunk: int | None = None
    spec: dict | None = None
    default_params: Callable[[], Any] = lambda: None
    place: Callable[[Any], Any] = lambda tree: tree
    device: Any = None
    on_episode_end: Callable[[int], None] | None = None
    takes_execution_horizon: bool = False
    declares_chunk: bool = False
    takes_rows: bool = False
    host: Any = None


@runtime_checkable
class PolicyLike(Protocol):
    """Anything the engine can evaluate besides a plain function (a
    ``jaxmesh.Model``): the core knows only this method."""

    def as_policy(self, *, with_params: bool) -> Policy:
        """The engine's view of this object; ``with_params``: the caller passes
        params as a jit argument (``make_evaluator``, ``evaluate(params=)``)."""


@runtime_checkable
class InputDecl(Protocol):
    """One input of a spec (``jaxmesh.adapt.State``, ``Image``, ``Previous``):
    ``stack`` frames kept (a stacked window above 1), each made from the
    observation (``reads_obs``: pushed after every step) or the executed action
    (``reads_action``: pushed when it is chosen)."""

    stack: int
    reads_obs: bool
    reads_action: bool

    def frame(self, obs: Obs, action: Any = None) -> PyTree:
        """One lane's processed frame."""
