"""The chunk replay rules (jaxmesh.core.replay) on hand-worked cases, in numpy
and jax.numpy alike: h = 4 actions per chunk, without and with a lead of 1.

A lane's episode, step by step, h = 4, no lead: plans at t = 0, 4, 8 (cursor
4 = exhausted before each), plays chunk indices 0 1 2 3 0 1 2 3. With a lead
of 1 the next chunk is also planned at cursor 3 (t = 3, 7): its actions are
known from then on, through the end of the chunk after the playing one.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core import replay

XPS = [np, jnp]


@pytest.mark.parametrize("xp", XPS)
def test_due_without_a_lead_only_when_exhausted(xp):
    cursor = xp.asarray([0, 1, 3, 4])
    np.testing.assert_array_equal(replay.due(cursor, 4, 0), [False, False, False, True])


@pytest.mark.parametrize("xp", XPS)
def test_due_with_a_lead_at_the_prefetch_point_too(xp):
    cursor = xp.asarray([0, 1, 2, 3, 4])
    np.testing.assert_array_equal(
        replay.due(cursor, 4, 1), [False, False, False, True, True]
    )
    np.testing.assert_array_equal(
        replay.due(cursor, 4, 2), [False, False, True, False, True]
    )


@pytest.mark.parametrize("xp", XPS)
def test_per_lane_settings_under_a_sweep(xp):
    """Lane 0: h = 4, lead 1; lane 1: h = 2, no lead; lane 2: h = 3, lead 2."""
    h, lead = xp.asarray([4, 2, 3]), xp.asarray([1, 0, 2])
    np.testing.assert_array_equal(
        replay.due(xp.asarray([3, 1, 1]), h, lead), [True, False, True]
    )
    np.testing.assert_array_equal(
        replay.due(xp.asarray([2, 2, 2]), h, lead), [False, True, False]
    )


@pytest.mark.parametrize("xp", XPS)
def test_play_index_clamps_an_exhausted_cursor(xp):
    np.testing.assert_array_equal(
        replay.play_index(xp.asarray([0, 2, 3, 4]), 4, xp), [0, 2, 3, 3]
    )


@pytest.mark.parametrize("xp", XPS)
def test_known_until_without_a_lead(xp):
    """Played index 0 at t = 4: that chunk (steps 4-7) is known, so every
    action before step 8; indices 1-3 add nothing."""
    played, t = xp.asarray([0, 1, 3]), xp.asarray([4, 5, 7])
    np.testing.assert_array_equal(replay.known_until(played, t, 4, 0, xp), [8, -1, -1])


@pytest.mark.parametrize("xp", XPS)
def test_known_until_with_a_lead(xp):
    """Lead 1: index 3 played at t = 7 is the prefetch point of the chunk that
    began at 4; the next chunk (steps 8-11) is then known: before step 12."""
    played, t = xp.asarray([0, 2, 3]), xp.asarray([4, 6, 7])
    np.testing.assert_array_equal(replay.known_until(played, t, 4, 1, xp), [8, -1, 12])


def test_segment_offsets():
    assert replay.segment_offsets(4, 0) == [4, 8]
    assert replay.segment_offsets(4, 1) == [3, 4, 7, 8]
    assert replay.segment_offsets(1, 0) == [1, 2]
