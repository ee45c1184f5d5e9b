"""Interfaces shared across jaxmesh (brax ``training/types.py`` style)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

PyTree = Any
Obs = Any


@runtime_checkable
class Env(Protocol):
    """One environment lane, pure and single-lane; the engine vmaps it.

    The engine owns resets and episode accounting: ``step`` never auto-resets.
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


class Hooks(Protocol):
    """Host-side callbacks, called between scan segments (all optional)."""

    def on_run_start(self, info: dict) -> None: ...

    def on_episode_end(self, episode: Any) -> None: ...

    def on_run_end(self, result: Any) -> None: ...
