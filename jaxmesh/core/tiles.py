"""Compaction: run work only for the lanes that need it, in fixed-size tiles.

The lanes flagged in a mask are gathered (a cumsum and a scatter: ``jnp.nonzero``
with a static size)
and handed to a body ``tile`` indices at a time, inside a ``while_loop`` that
runs only as many tiles as are needed. The body always sees exactly ``tile``
indices, a number that never depends on the lane count, so what it computes for
a lane does not either; padding indices equal N (out of range): read them with
``mode="clip"`` and write with ``mode="drop"``.

For work most steps skip (a reset), ``rarely=True`` puts all of it in a
``cond`` on whether any lane is flagged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def for_each_tile(
    need: jax.Array,
    tile: int,
    body: Callable[[jax.Array, Any], Any],
    carry: Any,
    *,
    rarely: bool = False,
) -> tuple[Any, jax.Array]:
    """Runs ``carry = body(idx, carry)`` over the lanes in ``need``, tile by tile.

    Args:
      need: [N] bool, the lanes to visit.
      tile: indices per body call.
      body: ``(idx[tile] int32, carry) -> carry``.
      carry: any pytree.
      rarely: most steps no lane needs the body (a reset): all of it then
        sits in a ``cond`` on whether any lane does, so such a step pays one
        reduction, and when every lane fits in one tile the body is called
        once, without the loop. Not for a policy's plan: XLA:CPU can round a
        policy compiled inside a ``cond`` differently from one in the loop
        (seen on Acrobot at one lane), which would break results' equality
        across lane counts.

    Returns:
      The final carry and the number of tiles run.
    """
    n = need.shape[0]
    if not rarely:
        return _tiled(need, tile, body, carry)
    if n <= tile:
        # One tile holds every lane: a single call, no loop.
        def one(carry):
            idx, _ = _order(need, tile)
            return body(idx, carry), jnp.int32(1)

    else:
        one = functools.partial(_tiled, need, tile, body)
    return jax.lax.cond(jnp.any(need), one, lambda c: (c, jnp.int32(0)), carry)


def _order(need: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """The lanes in ``need`` in ascending order, then padding (N), ``size`` of
    them; and how many lanes ``need`` has.

    What ``jnp.nonzero(need, size=size, fill_value=N)`` gives, written as one
    cumsum and one scatter, which XLA compiles about a third faster. The lanes
    fill the first rows, in order: a policy's row can round differently at
    another place in a batch.
    """
    n = need.shape[0]
    pos = jnp.cumsum(need, dtype=jnp.int32) - 1
    order = (
        jnp.full((size,), n, jnp.int32)
        .at[jnp.where(need, pos, size)]
        .set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    )
    return order, pos[-1] + 1


def _tiled(
    need: jax.Array, tile: int, body: Callable[[jax.Array, Any], Any], carry: Any
) -> tuple[Any, jax.Array]:
    """``for_each_tile`` as a loop over the tiles."""
    n = need.shape[0]
    # One tile more than the lanes fill: the slice of tile i then moves with i
    # even when every lane fits in one tile. Were it the whole buffer, XLA
    # would see a loop-invariant body and hoist it out of the loop, running
    # the body (a whole reset) on every step, whether or not a lane needs it.
    order, count = _order(need, (-(-n // tile) + 1) * tile)
    n_tiles = (count + tile - 1) // tile

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
