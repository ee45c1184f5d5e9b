"""``jaxmesh.Model``: a policy with up to four predict corners.

The four corners are ``predict`` (one lane, one action), ``predict_chunk`` (one
lane, a chunk of K actions), ``predict_batch`` and ``predict_chunk_batch`` (a
batch of lanes). An author implements any of them; the engine derives the rest
and always calls a batched corner (``vmap`` lifts a single-lane corner).

Corners read weights from ``self.params``. A corner that has a ``key`` argument
is stochastic and receives a PRNG key (one per lane). A model that defines
``initial_state()`` is recurrent: its corners take ``state=`` and return
``(output, new_state)``; the engine carries the state per lane and resets it at
each episode start.

Example::

    class Chunker(jaxmesh.Model):
        native_chunk = 8

        def predict_chunk(self, obs):
            return jnp.zeros((8,), jnp.int32)

    jaxmesh.Model(lambda obs: obs[2] > 0, spec={"obs": jaxmesh.adapt.State()})
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from jaxmesh import adapt

CORNERS = ("predict", "predict_chunk", "predict_batch", "predict_chunk_batch")


def positional_arity(fn: Callable) -> int | None:
    """Number of required positional parameters ``fn`` takes (None: unknowable).

    Parameters with defaults do not count, so ``lambda obs, w=w: ...`` takes one.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    n = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and (
            p.default is p.empty
        ):
            n += 1
    return n


def takes_param(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _check_native_chunk(value: Any, who: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{who}: native_chunk={value!r} must be a positive int (the chunk length "
            "K the model emits) or None"
        )
    return value


class Model:
    """Base class for authored policies, or a wrapper around a function.

    Args:
      fn: optional single-lane function to wrap. Without ``params`` it is
        ``fn(obs)`` or ``fn(obs, key)``; with ``params`` it is
        ``fn(params, obs)`` or ``fn(params, obs, key)``. It returns one action or
        a chunk; which one is told from the output shape.
      spec: optional dict of input name to ``jaxmesh.adapt`` declaration.
      native_chunk: the chunk length K the model emits, if it emits chunks.
      params: the weights pytree corners read as ``self.params``.
      name: a display name (defaults to the class or function name).
    """

    native_chunk: int | None = None
    spec: dict | None = None
    params: Any = None

    def __init__(
        self,
        fn: Callable | None = None,
        *,
        spec: dict | None = None,
        native_chunk: int | None = None,
        params: Any = None,
        name: str | None = None,
    ):
        self._fn = fn
        if fn is not None and not callable(fn):
            raise TypeError(f"Model(fn={fn!r}): fn must be callable")
        if spec is not None:
            self.spec = spec
        self.spec = adapt.check_spec(self.spec)
        if native_chunk is not None:
            self.native_chunk = native_chunk
        self.native_chunk = _check_native_chunk(self.native_chunk, self.name_hint(name))
        if params is not None:
            self.params = params
        self._name = name
        self._fn_takes_params = fn is not None and params is not None
        if fn is None and not self.corners():
            raise TypeError(
                f"{type(self).__name__} implements none of the corners {CORNERS}: "
                "define at least one (e.g. predict(self, obs)) or wrap a function "
                "with jaxmesh.Model(fn)"
            )

    def name_hint(self, name: str | None = None) -> str:
        if name:
            return name
        fn = getattr(self, "_fn", None)
        if fn is not None:
            return getattr(fn, "__name__", type(fn).__name__)
        return type(self).__name__

    @property
    def name(self) -> str:
        return self.name_hint(self._name)

    def corners(self) -> tuple[str, ...]:
        """The corners this model implements itself (not derived)."""
        if self._fn is not None:
            return ()
        return tuple(
            c for c in CORNERS if getattr(type(self), c) is not getattr(Model, c)
        )

    @property
    def recurrent(self) -> bool:
        return type(self).initial_state is not Model.initial_state

    def initial_state(self) -> Any:
        """Single-lane recurrent state at an episode start (recurrent models)."""
        return None

    def on_episode_end(self, episode_id: int) -> None:
        """Host-side hook, once per ended episode, in episode order."""

    def close(self) -> None:
        """Releases resources; ``evaluate`` never calls it."""

    @contextlib.contextmanager
    def bound(self, params: Any):
        """Temporarily binds ``params`` (possibly traced) as ``self.params``."""
        old = self.params
        self.params = params
        try:
            yield self
        finally:
            self.params = old

    # The four corners. Authored subclasses override any of them.
    def predict(self, obs):  # pragma: no cover - placeholder, never called
        raise NotImplementedError

    def predict_chunk(self, obs):  # pragma: no cover
        raise NotImplementedError

    def predict_batch(self, obs):  # pragma: no cover
        raise NotImplementedError

    def predict_chunk_batch(self, obs):  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


__all__ = ["Model", "CORNERS"]
