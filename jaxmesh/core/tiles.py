"""Compaction: run work only for the lanes that need it, in fixed-size tiles.

The lanes flagged in a mask are gathered (a cumsum and a scatter: ``jnp.nonzero``
with a static size)
and handed to a body ``tile`` indices at a time, inside a ``while_loop`` that
runs only as many tiles as are needed. The body always sees exactly ``tile``
indices, a number that never depends on the lane count, so what it computes for
a lane does not either; padding indices equal N (out of range): read them with
``mode="clip"`` and write with ``mode="drop"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def for_each_tile(
    need: jax.Array, tile: int, body: Callable[[jax.Array, Any], Any], carry: Any
) -> tuple[Any, jax.Array]:
    """Runs ``carry = body(idx, carry)`` over the lanes in ``need``, tile by tile.

    Args:
      need: [N] bool, the lanes to visit.
      tile: indices per body call.
      body: ``(idx[tile] int32, carry) -> carry``.
      carry: any pytree.

    Returns:
      The final carry and the number of tiles run.
    """
    n = need.shape[0]
    # One tile more than the lanes fill: the slice of tile i then moves with i
    # even when every lane fits in one tile. Were it the whole buffer, XLA
    # would see a loop-invariant body and hoist it out of the loop, running
    # the body (a whole reset) on every step, whether or not a lane needs it.
    n_pad = (-(-n // tile) + 1) * tile
    # The lanes in ``need``, in ascending order, then padding (N): what
    # ``jnp.nonzero(need, size=n_pad, fill_value=n)`` gives, written as one
    # cumsum and one scatter, which XLA compiles about a third faster.
    pos = jnp.cumsum(need, dtype=jnp.int32) - 1
    order = (
        jnp.full((n_pad,), n, jnp.int32)
        .at[jnp.where(need, pos, n_pad)]
        .set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    )
    n_tiles = (pos[-1] + 1 + tile - 1) // tile

    def loop(c):
        i, carry = c
        idx = jax.lax.dynamic_slice(order, (i * tile,), (tile,))
        return i + 1, body(idx, carry)

    _, carry = jax.lax.while_loop(lambda c: c[0] < n_tiles, loop, (jnp.int32(0), carry))
    return carry, n_tiles


def take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """Rows ``idx`` of ``x`` (padding indices read the last row)."""
    return jnp.take(x, idx, axis=0, mode="clip")


def put(x: jax.Array, idx: jax.Array, v: jax.Array) -> jax.Array:
    """``x`` with rows ``idx`` set to ``v`` (padding indices are dropped)."""
    return x.at[idx].set(v.astype(x.dtype), mode="drop")
