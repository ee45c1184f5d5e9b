"""Compaction: work only for the lanes that need it, ``tile`` indices at a
time in a ``while_loop``, so a lane's result never depends on how many share
its step. Padding indices equal N (read with ``mode="clip"``, write with
``mode="drop"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def for_each_tile(
    need: jax.Array, tile: int, body: Callable[[jax.Array, Any], Any], carry: Any
) -> tuple[Any, jax.Array]:
    """``carry = body(idx, carry)`` over the lanes in ``need``; also tiles run."""
    n = need.shape[0]
    # One tile more than the lanes fill: else, with every lane in one tile,
    # XLA would hoist the loop-invariant body (a whole reset) out of the loop
    # and run it on every step.
    order, count = _order(need, (-(-n // tile) + 1) * tile)
    n_tiles = (count + tile - 1) // tile

    def loop(c):
        i, carry = c
        idx = jax.lax.dynamic_slice(order, (i * tile,), (tile,))
        return i + 1, body(idx, carry)

    _, carry = jax.lax.while_loop(lambda c: c[0] < n_tiles, loop, (jnp.int32(0), carry))
    return carry, n_tiles


@dataclasses.dataclass(frozen=True)
class Rows:
    """The lanes an ``each`` body works on: a tile of lane indices (``idx``),
    or all lanes, those in ``keep`` updated."""

    idx: Any = None
    keep: Any = None

    def take(self, x: jax.Array) -> jax.Array:
        """The rows of ``x`` the call works on."""
        return x if self.idx is None else take(x, self.idx)

    def put(self, x: jax.Array, v: jax.Array) -> jax.Array:
        """``x`` with the call's (kept) rows set to ``v``."""
        if self.idx is not None:
            return put(x, self.idx, v)
        keep = jnp.reshape(self.keep, self.keep.shape + (1,) * (jnp.ndim(x) - 1))
        return jnp.where(keep, v.astype(x.dtype), x)


def each(
    need: jax.Array, tile: int, body: Callable[[Rows, Any], Any], carry: Any
) -> Any:
    """``carry = body(rows, carry)`` over the lanes in ``need`` for work most
    steps skip (a reset): when N <= tile one call on all lanes, the flagged
    ones keeping its values, else tile by tile. Not for a policy's plan:
    XLA:CPU can round a policy inside a ``cond`` differently (Acrobot, one
    lane), breaking equality across lane counts."""
    if need.shape[0] <= tile:
        return body(Rows(keep=need), carry)
    tiled = lambda idx, c: body(Rows(idx=idx), c)
    return for_each_tile(need, tile, tiled, carry)[0]


#: Lanes up to which ``prefix_count`` is one fused compare-and-sum over an
#: [N, N] mask; past them, a cumsum (about five kernels on XLA:CPU, but O(N)).
SMALL_PREFIX = 128


def prefix_count(mask: jax.Array) -> jax.Array:
    """``jnp.cumsum(mask, axis=-1)`` of a bool ``mask``, as int32."""
    n = mask.shape[-1]
    if n > SMALL_PREFIX:
        return jnp.cumsum(mask, axis=-1, dtype=jnp.int32)
    lane = jnp.arange(n, dtype=jnp.int32)
    upto = lane[None, :] <= lane[:, None]  # [lane, lanes up to it]
    return jnp.sum(upto & mask[..., None, :], axis=-1, dtype=jnp.int32)


def _order(need: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """``jnp.nonzero(need, size=size, fill_value=N)`` and the count, as one
    prefix count and one scatter (compiles about a third faster), in order."""
    n = need.shape[0]
    pos = prefix_count(need) - 1
    order = (
        jnp.full((size,), n, jnp.int32)
        .at[jnp.where(need, pos, size)]
        .set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    )
    return order, pos[-1] + 1


def take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """Rows ``idx`` of ``x`` (padding indices read the last row)."""
    return jnp.take(x, idx, axis=0, mode="clip")


def put(x: jax.Array, idx: jax.Array, v: jax.Array) -> jax.Array:
    """``x`` with rows ``idx`` set to ``v`` (padding indices are dropped)."""
    return x.at[idx].set(v.astype(x.dtype), mode="drop")
