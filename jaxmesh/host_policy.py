"""A policy that runs on the host with numpy values, through
``jax.pure_callback`` on a tile's real rows (CONTRACT 34; docs/policies.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh import adapt
from jaxmesh.errors import HostPolicyError, keep_callback_error
from jaxmesh.types import Policy


def _tree_rows(tree: Any, sel: Any) -> Any:
    return jax.tree.map(lambda x: np.asarray(x)[sel], tree)


def row_seeds(keys: jax.Array) -> jax.Array:
    """[B] uint32: the seed a stochastic ``fn`` gets for each row's plan key."""
    return jax.vmap(lambda k: jax.random.bits(k, dtype=jnp.uint32))(keys)


class HostPolicy:
    """A policy whose forward pass runs on the host: ``fn`` gets numpy values
    (docs/policies.md, "A host policy").

    Args:
      fn: ``fn(obs)`` (``fn(obs, seeds)`` when ``stochastic``) of the planning
        lanes' rows, each leaf ``[B, ...]``, returning ``[B, *action_shape]``
        (``[B, K, *action_shape]`` with ``native_chunk=K``); one lane's, with
        no B axis, when not ``batched``. It holds its own weights.
      batched: whether ``fn`` takes a batch of rows or one lane per call.
      native_chunk: the chunk length K ``fn`` returns (None: single actions).
      stochastic: pass ``fn`` one ``uint32`` seed per row, from its plan key.
      spec: input name -> ``jaxmesh.adapt`` declaration (``fn`` gets a dict).
      name: a display name (default: ``fn``'s name).
    """

    def __init__(
        self,
        fn: Callable,
        *,
        batched: bool = True,
        native_chunk: int | None = None,
        stochastic: bool = False,
        spec: dict | None = None,
        name: str | None = None,
    ):
        if not callable(fn):
            raise TypeError(f"HostPolicy: fn must be callable, got {fn!r}")
        k = native_chunk
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(
                f"HostPolicy: native_chunk must be a positive int, got {k!r}"
            )
        self.fn, self.batched, self.native_chunk = fn, batched, native_chunk
        self.stochastic, self.spec = stochastic, adapt.check_spec(spec)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self._outputs: dict = {}  # input shapes -> one row's output struct

    def __repr__(self) -> str:
        return f"HostPolicy({self.name!r}, batched={self.batched})"

    def _forward(self, obs: Any, seeds: np.ndarray | None) -> np.ndarray:
        """``fn`` over B rows (``seeds``: [B] uint32, or None)."""
        if self.batched:
            return np.asarray(self.fn(obs, *(() if seeds is None else (seeds,))))
        b = jax.tree.leaves(obs)[0].shape[0]
        lane = lambda i: (_tree_rows(obs, i),) + (() if seeds is None else (seeds[i],))
        return np.stack([np.asarray(self.fn(*lane(i))) for i in range(b)])

    def _output(self, inputs: Any) -> jax.ShapeDtypeStruct:
        """One row's output struct: ``fn`` on a row of zeros, once per shape."""
        leaves, tree = jax.tree.flatten(inputs)
        key = (tree, tuple((x.shape[1:], jnp.dtype(x.dtype)) for x in leaves))
        if key not in self._outputs:
            zeros = [np.zeros((1,) + s, d) for s, d in key[1]]
            seeds = np.zeros(1, np.uint32) if self.stochastic else None
            try:
                out = self._forward(tree.unflatten(zeros), seeds)
            except Exception as exc:
                raise HostPolicyError(
                    f"host policy {self.name!r} raised {type(exc).__name__}: {exc} "
                    "on one row of zeros, which it is called with first to learn "
                    "the shape and dtype of what it returns; make fn accept any "
                    "observation of the env's shape",
                    policy=self.name,
                    lanes=[],
                ) from exc
            dtype = jax.dtypes.canonicalize_dtype(out.dtype)
            self._outputs[key] = jax.ShapeDtypeStruct(out.shape[1:], dtype)
        return self._outputs[key]

    def plan(
        self,
        obs: Any,
        seeds: np.ndarray | None,
        lanes: Any,
        row: Any,
        episodes: Any = None,
    ) -> np.ndarray:
        """``fn`` on B rows (``seeds``: [B] uint32 or None), checked to be
        ``[B, *row.shape]``; ``lanes`` and ``episodes`` (or None) for an error
        to name (HostPolicyError: ``fn`` raised, or returned another shape)."""
        b = np.shape(lanes)[0]
        where = lambda: dict(  # built on an error only
            policy=self.name,
            lanes=np.asarray(lanes).tolist(),
            episodes=None if episodes is None else np.asarray(episodes).tolist(),
        )
        try:
            got = self._forward(obs, seeds)
        except Exception as exc:
            raise HostPolicyError(
                f"host policy {self.name!r} raised {type(exc).__name__}: {exc} "
                f"(planning lanes {where()['lanes']}); the run stopped there",
                **where(),
            ) from exc
        if got.shape != (b, *row.shape):
            raise HostPolicyError(
                f"host policy {self.name!r} returned shape {got.shape} for "
                f"{b} rows (lanes {where()['lanes']}); expected "
                f"{(b, *row.shape)}, as it returned for a row of zeros",
                **where(),
            )
        return got.astype(row.dtype, copy=False)

    def _host(self, inputs: Any, meta: Any, row: Any) -> np.ndarray:
        """The callback: ``fn`` on the real rows, zeros in the padding rows;
        ``meta`` ([3, tile] int32, one array: each argument costs a copy) holds
        each row's lane (-1: padding), episode (-1: not told) and seed."""
        meta = np.asarray(meta)
        rows = meta[0]
        real = rows >= 0
        whole = bool(real.all())
        sel = slice(None) if whole else np.flatnonzero(real)
        if not whole and sel.size == 0:
            return np.zeros((rows.shape[0],) + row.shape, row.dtype)
        seeds = meta[2].view(np.uint32)[sel] if self.stochastic else None
        told = meta[1][sel]
        episodes = told if (told >= 0).all() else None
        try:
            got = self.plan(_tree_rows(inputs, sel), seeds, rows[sel], row, episodes)
        except HostPolicyError as exc:
            raise keep_callback_error(exc) from exc.__cause__
        if whole:
            return got
        out = np.zeros((rows.shape[0],) + row.shape, row.dtype)
        out[sel] = got
        return out

    def apply(
        self,
        params: Any,
        inputs: Any,
        keys: jax.Array,
        rstate: Any,
        rows: Any = None,
        episodes: Any = None,
    ) -> tuple[jax.Array, Any]:
        """``Policy.apply`` over a tile: ``rows`` ([tile] int32) each row's
        lane, -1 for padding (None: all real); ``episodes`` (None: not told)."""
        del params
        b = keys.shape[0]
        lanes = jnp.arange(b, dtype=jnp.int32) if rows is None else rows
        told = jnp.full((b,), -1, jnp.int32) if episodes is None else episodes
        seeds = (
            jax.lax.bitcast_convert_type(row_seeds(keys), jnp.int32)
            if self.stochastic
            else jnp.zeros((b,), jnp.int32)
        )
        meta = jnp.stack([lanes, jnp.where(lanes >= 0, told, -1), seeds])
        row = self._output(inputs)
        result = jax.ShapeDtypeStruct((b,) + row.shape, row.dtype)
        host = lambda i, m: self._host(i, m, row)
        out = jax.pure_callback(host, result, inputs, meta, vmap_method="sequential")
        return out, rstate

    def as_policy(self, *, with_params: bool = False) -> Policy:
        """The engine's view of this policy (``jaxmesh.types.PolicyLike``)."""
        del with_params  # fn holds its own weights
        return Policy(
            name=self.name,
            apply=self.apply,
            stochastic=self.stochastic,
            native_chunk=self.native_chunk,
            spec=self.spec,
            declares_chunk=self.native_chunk is not None,
            takes_rows=True,
            host=self,
        )
