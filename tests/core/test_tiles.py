"""Tile compaction (``jaxmesh.core.tiles``) on hand-worked masks.

Five lanes, tiles of two: the flagged lanes are visited in ascending order,
two at a time, the last tile padded with N (out of range), and only as many
tiles run as the flagged lanes fill.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core import tiles

N, TILE = 5, 2


@functools.cache
def visits():
    """``for_each_tile`` over [N] masks (jitted once): the indices each tile
    saw (row i: tile i; -1: no such tile) and the number of tiles run."""

    def run(need):
        log = jnp.full((N, TILE), -1, jnp.int32)

        def body(idx, carry):
            log, i = carry
            return log.at[i].set(idx), i + 1

        (log, _), n_tiles = tiles.for_each_tile(need, TILE, body, (log, 0))
        return log, n_tiles

    return jax.jit(run)


@pytest.mark.parametrize(
    ("need", "seen"),
    [
        # lanes 1, 2 and 4: two tiles, the second padded with N = 5
        ([0, 1, 1, 0, 1], [[1, 2], [4, 5]]),
        # every lane: three tiles
        ([1, 1, 1, 1, 1], [[0, 1], [2, 3], [4, 5]]),
        # one lane: one tile
        ([0, 0, 0, 1, 0], [[3, 5]]),
        # none: no tile runs
        ([0, 0, 0, 0, 0], []),
    ],
)
def test_for_each_tile_visits_the_flagged_lanes_in_order(need, seen):
    log, n_tiles = visits()(jnp.asarray(need, bool))
    log = np.asarray(log).tolist()
    assert int(n_tiles) == len(seen)
    assert log[: len(seen)] == seen
    assert all(row == [-1, -1] for row in log[len(seen) :])


def test_order_puts_the_flagged_lanes_first_then_padding():
    order_of = jax.jit(tiles._order, static_argnums=1)
    order, count = order_of(jnp.asarray([1, 0, 1, 1, 0], bool), 8)
    assert np.asarray(order).tolist() == [0, 2, 3, 5, 5, 5, 5, 5]
    assert int(count) == 3


def test_take_reads_padding_as_the_last_row_and_put_drops_it():
    x = jnp.asarray([[0.0, 1.0], [10.0, 11.0], [20.0, 21.0]])
    idx = jnp.asarray([2, 0, 3])  # 3 = N: padding
    v = jnp.asarray([[7, 7], [8, 8], [9, 9]], jnp.int32)
    taken, got = jax.jit(lambda x, i, v: (tiles.take(x, i), tiles.put(x, i, v)))(
        x, idx, v
    )
    assert np.asarray(taken).tolist() == [[20, 21], [0, 1], [20, 21]]
    assert got.dtype == x.dtype
    assert np.asarray(got).tolist() == [[8, 8], [10, 11], [7, 7]]


def add_lane_numbers(rows, x):
    """An ``each`` body: each lane it works on adds its lane number + 1."""
    lanes = jnp.arange(x.shape[0], dtype=x.dtype)
    return rows.put(x, rows.take(x) + rows.take(lanes) + 1)


@pytest.mark.parametrize("tile", [8, 2], ids=["one-tile", "tiled"])
def test_each_changes_only_the_flagged_lanes(tile):
    """N <= tile: the body runs once on every lane and the flagged lanes keep
    its values; N > tile: the flagged lanes are visited tile by tile. The
    same values either way."""
    run = jax.jit(lambda need, x: tiles.each(need, tile, add_lane_numbers, x))
    x = jnp.asarray([100.0, 200.0, 300.0, 400.0, 500.0])
    got = run(jnp.asarray([0, 1, 0, 1, 1], bool), x)
    assert np.asarray(got).tolist() == [100.0, 202.0, 300.0, 404.0, 505.0]
    none = run(jnp.zeros(N, bool), x)
    assert np.asarray(none).tolist() == np.asarray(x).tolist()


def test_rows_without_a_tile_select_the_kept_lanes():
    rows = tiles.Rows(keep=jnp.asarray([True, False, True]))
    x = jnp.asarray([[1, 1], [2, 2], [3, 3]], jnp.int32)
    assert rows.take(x) is x
    got = rows.put(x, jnp.full((3, 2), 9.0))
    assert got.dtype == jnp.int32
    assert np.asarray(got).tolist() == [[9, 9], [2, 2], [9, 9]]


@pytest.mark.parametrize("n", [1, 5, tiles.SMALL_PREFIX, tiles.SMALL_PREFIX + 3])
def test_prefix_count_counts_the_flagged_lanes_up_to_each(n):
    """Both ways (one fused sum up to ``SMALL_PREFIX`` lanes, a cumsum past
    it) against a plain loop, on one mask and on two stacked."""
    rng = np.random.default_rng(n)
    masks = rng.random((2, n)) < 0.4

    def loop(mask):
        out, seen = [], 0
        for flag in mask:
            seen += int(flag)
            out.append(seen)
        return out

    got = jax.jit(tiles.prefix_count)(jnp.asarray(masks))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), [loop(m) for m in masks])
    one = tiles.prefix_count(jnp.asarray(masks[0]))
    np.testing.assert_array_equal(np.asarray(one), loop(masks[0]))
