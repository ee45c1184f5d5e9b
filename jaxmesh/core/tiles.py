"""Compaction: run work only for the lanes that need it, in fixed-size tiles.

The lanes flagged in a mask are gathered (a cumsum and a scatter: ``jnp.nonzero``
with a static size)
and handed to a body ``tile`` indices at a time, inside a ``while_loop`` that
runs only as many tiles as are needed. The body always sees exactly ``tile``
indices, however many lanes are flagged, so what it computes for a lane does not
depend on how many others share its step; padding indices equal N (out of
range): read them with ``mode="clip"`` and write with ``mode="drop"``.

For work most steps skip (a reset), ``rarely`` puts all of it in a ``cond``
on whether any lane is flagged; when every lane fits in one tile it runs on all
lanes in place instead and keeps the flagged lanes' values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def for_each_tile(
    need: jax.Array,
    tile: int,
    body: Callable[[jax.Array, Any], Any],
    carry: Any,
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
    """The lanes one call of a ``rarely`` body works on: a tile of lane
    indices (``idx``, padding N), or all lanes in order, of which those in
    ``keep`` take the new values."""

    idx: Any = None
    keep: Any = None

    def take(self, x: jax.Array) -> jax.Array:
        """The rows of ``x`` the call works on."""
        return x if self.idx is None else take(x, self.idx)

    def put(self, x: jax.Array, v: jax.Array) -> jax.Array:
        """``x`` with the call's rows set to ``v`` (its kept rows, without a
        tile)."""
        if self.idx is not None:
            return put(x, self.idx, v)
        keep = jnp.reshape(self.keep, self.keep.shape + (1,) * (jnp.ndim(x) - 1))
        return jnp.where(keep, v.astype(x.dtype), x)


def rarely(
    need: jax.Array,
    tile: int,
    body: Callable[[Rows, Any], Any],
    carry: Any,
    any_need: Any = None,
) -> Any:
    """``carry = body(rows, carry)`` over the lanes in ``need``, for work most
    steps skip (a reset): all of it sits in a ``cond`` on whether any lane is
    flagged, so such a step pays one reduction (``any_need``: that flag,
    when the caller has it; None: computed here).

    When every lane fits in one tile (N <= tile), the body runs once on all
    lanes in order, and only the flagged lanes keep its values (``Rows.put``
    selects): the same rows a tile would compute, without the gather and
    scatter. Otherwise the flagged lanes are visited tile by tile. Not for a
    policy's plan: XLA:CPU can round a policy compiled inside a ``cond``
    differently from one in the loop (seen on Acrobot at one lane), which
    would break results' equality across lane counts.
    """
    if any_need is None:
        any_need = jnp.any(need)
    one = lambda c: each(need, tile, body, c)
    return jax.lax.cond(any_need, one, lambda c: c, carry)


def each(
    need: jax.Array, tile: int, body: Callable[[Rows, Any], Any], carry: Any
) -> Any:
    """``rarely``'s work without its ``cond``, for a caller that puts it in
    a ``cond`` of its own: all lanes in one call when they fit in a tile,
    else the flagged lanes tile by tile."""
    if need.shape[0] <= tile:
        return body(Rows(keep=need), carry)
    tiled = lambda idx, c: body(Rows(idx=idx), c)
    return for_each_tile(need, tile, tiled, carry)[0]


#: Lanes up to which ``prefix_count`` is one fused compare-and-sum over an
#: [N, N] mask; past them, a cumsum (which XLA:CPU compiles to about five
#: kernels, and which costs O(N) instead of O(N^2)).
SMALL_PREFIX = 128


def prefix_count(mask: jax.Array) -> jax.Array:
    """``jnp.cumsum(mask, axis=-1)`` of a bool ``mask`` ([..., N]), as int32:
    how many flagged lanes there are up to and including each lane."""
    n = mask.shape[-1]
    if n > SMALL_PREFIX:
        return jnp.cumsum(mask, axis=-1, dtype=jnp.int32)
    lane = jnp.arange(n, dtype=jnp.int32)
    upto = lane[None, :] <= lane[:, None]  # [lane, lanes up to it]
    return jnp.sum(upto & mask[..., None, :], axis=-1, dtype=jnp.int32)


def _order(need: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """The lanes in ``need`` in ascending order, then padding (N), ``size`` of
    them; and how many lanes ``need`` has.

    What ``jnp.nonzero(need, size=size, fill_value=N)`` gives, written as one
    prefix count and one scatter, which XLA compiles about a third faster. The lanes
    fill the first rows, in order: a policy's row can round differently at
    another place in a batch.
    """
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
