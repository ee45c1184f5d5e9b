"""A lane's observation as named leaves (``jaxmesh.envs.gymnasium.leaves``), on
small gymnasium spaces worked out by hand: numpy and gymnasium only."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from jaxmesh.envs.gymnasium.leaves import ALIGN, ObsLayout, aligned_zeros


def box_only(space):
    """The leaf rule the tests use: a Box's shape and dtype, nothing else."""
    if not isinstance(space, spaces.Box):
        raise TypeError(f"not a Box: {space}")
    return space.shape, space.dtype


def layout(space):
    return ObsLayout(space, box_only, "env 'toy'")


#: A camera image beside a state and a Tuple of two scalars' boxes.
NESTED = spaces.Dict(
    {
        "cam": spaces.Dict({"rgb": spaces.Box(0, 255, (2, 2, 3), np.uint8)}),
        "state": spaces.Box(-1, 1, (3,), np.float32),
        "pair": spaces.Tuple(
            (spaces.Box(0, 1, (), np.float64), spaces.Box(0, 1, (2,), np.int32))
        ),
    }
)


def test_one_array_is_one_leaf_named_empty():
    got = layout(spaces.Box(-1, 1, (4,), np.float32))
    assert got.whole and got.names == ("",)
    assert got.shapes == {"": (4,)} and got.nbytes() == 16


def test_nested_leaves_are_named_by_their_path():
    got = layout(NESTED)
    assert not got.whole
    assert set(got.names) == {"cam/rgb", "state", "pair/0", "pair/1"}
    assert got.shapes["cam/rgb"] == (2, 2, 3)
    assert got.dtypes["pair/1"] == np.int32
    assert got.nbytes() == 12 + 12 + 8 + 8


def test_leaves_and_build_round_trip_the_nest():
    got = layout(NESTED)
    obs = {
        "cam": {"rgb": np.arange(12, dtype=np.uint8).reshape(2, 2, 3)},
        "state": [0.5, -0.5, 0.0],
        "pair": (0.25, [3, 4]),
    }
    leaves = got.leaves(obs, lane=0)
    assert leaves["state"].dtype == np.float32
    assert leaves["pair/1"].tolist() == [3, 4]
    back = got.build(leaves)
    assert isinstance(back["pair"], tuple)
    assert back["cam"]["rgb"][1, 1].tolist() == [9, 10, 11]
    assert back["pair"][0] == 0.25


def test_stack_rows_of_several_lanes():
    got = layout(spaces.Dict({"x": spaces.Box(0, 9, (2,), np.float32)}))
    rows = got.stack([{"x": [1, 2]}, {"x": [3, 4]}], [5, 6])
    assert rows["x"].tolist() == [[1, 2], [3, 4]]
    into = np.zeros((2, 2), np.float32)
    got.stack([{"x": [7, 8]}, {"x": [9, 0]}], [0, 1], out={"x": into})
    assert into.tolist() == [[7, 8], [9, 0]]


def test_a_bad_observation_names_its_lane_and_leaf():
    got = layout(NESTED)
    with pytest.raises(
        ValueError, match=r"lane 3 returned an observation without 'state'"
    ):
        got.leaves({"cam": {"rgb": np.zeros((2, 2, 3))}, "pair": (0, [0, 0])}, 3)
    bad = {"cam": {"rgb": np.zeros((2, 2))}, "state": [0, 0, 0], "pair": (0, [0, 0])}
    with pytest.raises(ValueError, match=r"lane 1 .*leaf 'cam/rgb' of shape \(2, 2\)"):
        got.stack([bad], [1])


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (spaces.Dict({}), "empty Dict"),
        (spaces.Dict({"a/b": spaces.Box(0, 1, (1,))}), "'a/b' is not a"),
    ],
)
def test_unusable_spaces_are_refused(space, match):
    with pytest.raises(TypeError, match=match):
        layout(space)


def test_select_keeps_the_policy_s_top_level_entries():
    got = layout(NESTED).select(["state", "pair"])
    assert set(got.names) == {"state", "pair/0", "pair/1"}
    assert layout(NESTED).select(["nope"]).names == layout(NESTED).names


def test_empty_leaves_are_zeros_on_aligned_memory():
    got = layout(NESTED).empty((3,), aligned=True)
    assert got["cam/rgb"].shape == (3, 2, 2, 3) and got["cam/rgb"].dtype == np.uint8
    for arr in got.values():
        assert arr.ctypes.data % ALIGN == 0 and not arr.any()
    odd = aligned_zeros((5,), np.float64)
    assert odd.ctypes.data % ALIGN == 0 and odd.tolist() == [0.0] * 5
