"""The host loop's usual step (every reward finite, every action in range, no
info with a key asked for) takes shortcuts; these tests check that what the
full rules decide stays decided the same: observations stacked in one call
are refused lane by lane, bad actions on gymnasium lanes are faults of their
step, and infos without the success key (or None) on some lanes leave the
others' success read. References are worked by hand."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import jaxmesh
from jaxmesh.core import tally as core_results
from jaxmesh.envs.gymnasium.leaves import SMALL_STACK, ObsLayout
from jaxmesh.host_policy import HostPolicy


def box(space):
    """The leaf rule of these tests: a Box's own shape and dtype."""
    return space.shape, space.dtype


def vector_layout(size: int) -> ObsLayout:
    return ObsLayout(spaces.Box(-9, 9, (size,), np.float32), box, "env 'toy'")


@pytest.mark.parametrize("size", [4, SMALL_STACK // 4])  # one call; a stack
def test_stacked_observations_are_cast_into_place(size):
    values = [np.arange(size, dtype=np.float64) + 0.5 * j + 0.1 for j in range(3)]
    into = np.zeros((3, size), np.float32)
    got = vector_layout(size).stack(values, [4, 5, 6], {"": into})
    assert got[""] is into
    for j, v in enumerate(values):  # each value rounded to float32 on its own
        assert into[j].tolist() == [float(np.float32(x)) for x in v.tolist()]


@pytest.mark.parametrize(
    ("rows", "lane", "shape"),
    [
        ([np.zeros(1)] * 3, 4, (1,)),  # every row would broadcast: still refused
        ([np.zeros(4), np.zeros(5), np.zeros(4)], 5, (5,)),
        ([np.zeros(4), np.zeros(4), np.zeros((1, 4))], 6, (1, 4)),
    ],
)
def test_a_row_of_another_shape_names_its_lane(rows, lane, shape):
    into = np.zeros((3, 4), np.float32)
    with pytest.raises(
        ValueError,
        match=rf"env 'toy' lane {lane} returned an observation of shape "
        rf"{shape!r}".replace("(", r"\(").replace(")", r"\)"),
    ):
        vector_layout(4).stack(rows, [4, 5, 6], {"": into})


def counting(make_action):
    """A batched fn that returns ``make_action(call, rows)``: call 0 is
    HostPolicy's probe (one row of zeros), then the agent step of h = 1 calls
    it once per step (step k: call k + 1), with every running lane."""
    calls = [0]

    def fn(obs):
        out = make_action(calls[0], obs.shape[0])
        calls[0] += 1
        return out

    return fn


def discrete(call, b):
    """Action 0, but -1 on lane 1 at step 3."""
    out = np.zeros(b, np.int32)
    if call == 3 + 1:
        out[1] = -1
    return out


def continuous(call, b):
    """Torque 0, but NaN on lane 0 at step 2."""
    out = np.zeros((b, 1), np.float32)
    if call == 2 + 1:
        out[0, 0] = np.nan
    return out


@pytest.mark.parametrize(
    ("env", "make_action", "where", "kind"),
    [
        ("CartPole-v1", discrete, (1, 6, 3, 1), core_results.ACTION_OUT_OF_RANGE),
        ("Pendulum-v1", continuous, (0, 5, 2, 0), core_results.ACTION_NOT_FINITE),
    ],
)
def test_a_bad_action_on_gymnasium_lanes_is_a_fault_of_its_step(
    env, make_action, where, kind
):
    """CartPole pushed left lasts 8 steps or more, Pendulum 200: no episode
    ends before the bad action; the run stops on it, naming its episode,
    seed, step and lane."""
    envs = [gym.make(env) for _ in range(2)]
    try:
        with pytest.raises(jaxmesh.BadValueError) as info:
            jaxmesh.evaluate(
                HostPolicy(counting(make_action)), envs, num_envs=2, seeds=[5, 6, 7]
            )
    finally:
        for e in envs:
            e.close()
    e = info.value
    assert (e.episode, e.seed, e.step, e.lane) == where
    assert e.kind == kind
    assert e.partial_result.num_episodes == 0


class Flag(gym.Env):
    """Three steps; odd seeds report ``is_success`` (True at step 2 only),
    even seeds an info of None."""

    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.odd, self.k = seed % 2 == 1, 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.k += 1
        info = {"is_success": self.k == 2} if self.odd else None
        return np.full(2, 0.1 * self.k, np.float32), 1.0, self.k >= 3, False, info


def test_infos_without_the_key_leave_the_others_success_read():
    pol = HostPolicy(lambda obs: np.zeros(obs.shape[0], np.int32))
    seeds = [0, 1, 2, 3, 5]
    result = jaxmesh.evaluate(pol, [Flag(), Flag()], num_envs=2, seeds=seeds)
    odd = [s % 2 == 1 for s in seeds]
    assert list(result.success_once) == [True if o else None for o in odd]
    assert list(result.success_at_end) == [False if o else None for o in odd]
    assert result.lengths.tolist() == [3] * 5
    assert result.returns.tolist() == [3.0] * 5
