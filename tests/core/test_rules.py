"""The episode rules (``jaxmesh.core.rules``) mean the same in numpy and jax.numpy,
and the scan engine and the host loop that call them give the same episodes.

First each rule on cases worked out by hand, run with numpy and with jax.numpy
under jit (as the host loops and the engine call them). Then ``Tally``, a tiny
JAX env whose episodes are hand-checkable, is evaluated twice with the same
policy and seeds: as a JAX env (the scan engine) and as a gymnasium ``Env``
that calls exactly the same jitted functions (the host loop). Lane
assignment with ties, the step cap, every metric reduction and the faults
(a NaN reward, an out-of-range action, both on one step) must agree.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces
from reference_loop import fold, schedule

import jaxmesh
from jaxmesh.core import rules
from jaxmesh.core import tally as core_results

NO, OUT, NOT_FINITE, REWARD = (
    core_results.NO_FAULT,
    core_results.ACTION_OUT_OF_RANGE,
    core_results.ACTION_NOT_FINITE,
    core_results.REWARD_NOT_FINITE,
)


def on_both(fn, *arrays, **static):
    """``fn(np, *arrays)`` and ``fn(jnp, *arrays)`` under jit, as numpy trees."""
    got_np = fn(np, *(np.asarray(a) for a in arrays), **static)
    jitted = jax.jit(lambda *a: fn(jnp, *a, **static))
    got_jnp = jitted(*(jnp.asarray(a) for a in arrays))
    as_np = lambda tree: jax.tree.map(np.asarray, tree)
    return as_np(got_np), as_np(got_jnp)


def assert_same(a, b):
    """Equal trees (NaN equal to NaN), numpy's dtypes against jax's (x64 off)."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype == np.float64:
            x = x.astype(np.float32)
        if x.dtype == np.int64:
            x = x.astype(np.int32)
        assert x.dtype == y.dtype, (x.dtype, y.dtype)
        np.testing.assert_array_equal(x, y)


# Lanes --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ended", "next_episode", "budget", "start", "episodes", "after"),
    [
        # ties on one step: lanes 1, 2 and 4 end; ascending lane order, and
        # the budget (5) leaves lane 4 without an episode
        ([0, 1, 1, 0, 1], 3, 5, [0, 1, 1, 0, 0], {1: 3, 2: 4}, 5),
        # the budget is exhausted: nothing starts
        ([1, 1, 0], 7, 7, [0, 0, 0], {}, 7),
        # the start of a run: lane j takes episode j, lanes past the budget none
        ([1, 1, 1, 1], 0, 2, [1, 1, 0, 0], {0: 0, 1: 1}, 2),
        # nothing ended
        ([0, 0, 0], 1, 9, [0, 0, 0], {}, 1),
    ],
)
def test_next_episodes(ended, next_episode, budget, start, episodes, after):
    ended = np.asarray(ended, bool)
    for got in on_both(
        rules.next_episodes, ended, np.int32(next_episode), np.int32(budget)
    ):
        s, eps, nxt = got
        assert s.tolist() == [bool(x) for x in start]
        assert {j: int(eps[j]) for j in np.flatnonzero(s)} == episodes
        assert int(nxt) == after


def test_a_whole_run_of_episodes_lane_by_lane():
    """3 lanes, 5 episodes, by hand: the start gives lanes 0-2 episodes 0-2;
    lane 1 ends (episode 3); then lanes 0 and 2 on one step (episode 4 to
    lane 0, lane 2 masked); then lane 1 again (masked: the budget is spent)."""
    nxt, got = 0, []
    for ended in ([1, 1, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0]):
        start, episode, nxt = rules.next_episodes(np, np.asarray(ended, bool), nxt, 5)
        got.append({j: int(episode[j]) for j in np.flatnonzero(start)})
    assert got == [{0: 0, 1: 1, 2: 2}, {1: 3}, {0: 4}, {}]
    assert int(nxt) == 5


def test_next_episodes_under_jit_takes_traced_counters():
    """The engine's next episode and budget are traced scalars."""
    run = jax.jit(lambda e, n, b: rules.next_episodes(jnp, e, n, b))
    start, episode, nxt = run(jnp.asarray([True, False, True]), 4, 6)
    assert np.asarray(start).tolist() == [True, False, True]
    assert [int(episode[0]), int(episode[2])] == [4, 5]
    assert int(nxt) == 6


def test_step_cap():
    np_, jnp_ = on_both(lambda xp, t: rules.at_cap(xp, t, 5), np.int32([1, 4, 5, 6]))
    assert np_.tolist() == jnp_.tolist() == [False, False, True, True]


# Bad values -----------------------------------------------------------------------
def test_discrete_action_faults():
    actions = np.int32([0, 2, -1, 7, 1])
    active = np.array([1, 1, 1, 0, 1], bool)  # lane 3 is masked: never a fault
    got = on_both(lambda xp, a, m: rules.action_faults(xp, a, m, 2), actions, active)
    assert_same(*got)
    kinds, values = got[0]
    assert kinds.tolist() == [NO, OUT, OUT, NO, NO]
    assert values.tolist() == [0.0, 2.0, -1.0, 0.0, 0.0]


def test_continuous_action_faults_report_the_first_bad_component():
    nan, inf = np.nan, np.inf
    actions = np.float32([[0.0, nan, 1.0], [inf, nan, 0.0], [1.0, 2.0, 3.0]])
    got = on_both(
        lambda xp, a, m: rules.action_faults(xp, a, m, None),
        actions,
        np.ones(3, bool),
    )
    assert_same(*got)
    kinds, values = got[0]
    assert kinds.tolist() == [NOT_FINITE, NOT_FINITE, NO]
    assert np.isnan(values[0]) and values[1] == inf and values[2] == 0.0
    rows = on_both(lambda xp, a: rules.failing_actions(xp, a, None), actions)
    assert rows[0].tolist() == rows[1].tolist() == [True, True, False]


def test_a_nan_reward_and_a_bad_action_on_one_step():
    """Lane 0: both (the action wins: it went wrong first); lane 1: a NaN
    reward; lane 2: an inf reward on a lane that did not step; lane 3: a bad
    action; lane 4: nothing."""
    actions = np.int32([9, 1, 0, -3, 1])
    rewards = np.float32([np.nan, np.nan, np.inf, 1.0, 0.5])
    active = np.array([1, 1, 0, 1, 1], bool)

    def both(xp, a, r, m):
        kinds, values = rules.action_faults(xp, a, m, 2)
        return rules.reward_faults(xp, r, m, kinds, values)

    got = on_both(both, actions, rewards, active)
    assert_same(*got)
    kinds, values = got[0]
    assert kinds.tolist() == [OUT, REWARD, NO, OUT, NO]
    assert values[0] == 9.0 and np.isnan(values[1]) and values[3] == -3.0
    # A reward alone: no faults so far.
    alone = on_both(lambda xp, r, m: rules.reward_faults(xp, r, m), rewards, active)
    assert_same(*alone)
    assert alone[0][0].tolist() == [REWARD, REWARD, NO, NO, NO]


@pytest.mark.parametrize(
    ("num_actions", "actions", "bad", "kind"),
    [
        # discrete, 3 actions: -1 and 3 are out of [0, 3)
        (3, [[0, 2], [-1, 1], [3, 3]], [[0, 0], [1, 0], [1, 1]], OUT),
        # continuous [2, 2] actions, flattened per row
        (
            None,
            [[[0.0, 1.0], [2.0, 3.0]], [[np.nan, 0.0], [0.0, -np.inf]]],
            [[0, 0, 0, 0], [1, 0, 0, 1]],
            NOT_FINITE,
        ),
    ],
)
def test_bad_components(num_actions, actions, bad, kind):
    dtype = np.int32 if num_actions else np.float32
    actions = np.asarray(actions, dtype)
    got_np, got_jnp = on_both(
        lambda xp, a: rules.bad_components(xp, a, num_actions)[0], actions
    )
    assert got_np.tolist() == got_jnp.tolist() == np.asarray(bad, bool).tolist()
    assert rules.bad_components(np, actions, num_actions)[1] == kind
    rows = rules.failing_actions(np, actions, num_actions)
    assert rows.tolist() == np.asarray(bad, bool).any(axis=1).tolist()


def test_a_step_without_a_bad_value_has_no_fault():
    """numpy's shortcut for the usual step gives what the full rule gives."""
    actions, active = np.int32([0, 1, 1]), np.ones(3, bool)
    for xp_out in on_both(
        lambda xp, a, m: rules.action_faults(xp, a, m, 2), actions, active
    ):
        kinds, values = xp_out
        assert kinds.tolist() == [NO] * 3 and values.tolist() == [0.0] * 3
    rewards = np.float32([1.0, -2.0, 0.0])
    kinds, values = rules.reward_faults(np, rewards, active)
    assert kinds.tolist() == [NO] * 3 and values.tolist() == [0.0] * 3


# Metric reductions ------------------------------------------------------------------
#: Three steps of two lanes: lane 0's info has the key on steps 0 and 2 (values
#: 1 and 2; step 1's 3 is not there), lane 1's never. Lane 2 does not run.
VALUES = np.float32([[1.0, 5.0, 7.0], [3.0, 5.0, 7.0], [2.0, 5.0, 7.0]])
PRESENT = np.array([[1, 0, 0], [0, 0, 0], [1, 0, 0]], bool)
BY_HAND = {
    "last": [2.0, np.nan],
    "sum": [3.0, np.nan],
    "max": [2.0, np.nan],
    "mean": [1.5, np.nan],
    "any": [True, False],
}


def reduce_episode(xp, values, present, *, reduction, dtype):
    """An episode of the rows of ``values``: begin, a step per row, finalize."""
    n = values.shape[1]
    acc = xp.zeros(n, dtype)
    acc, count = rules.begin_metric(xp, reduction, acc, xp.zeros(n, xp.int32), True)
    for v, p in zip(values, present, strict=True):
        acc, count = rules.accumulate_metric(xp, reduction, acc, count, v, p)
    return rules.finalize_metric(xp, reduction, acc, count), count


@pytest.mark.parametrize("reduction", core_results.REDUCTIONS)
def test_every_reduction_with_a_key_absent_on_some_steps(reduction):
    dtype = bool if reduction == "any" else np.float32
    got = on_both(reduce_episode, VALUES, PRESENT, reduction=reduction, dtype=dtype)
    assert_same(*got)
    (value, count), _ = got
    assert count.tolist() == [2, 0, 0]
    want = BY_HAND[reduction]
    np.testing.assert_array_equal(value[:2], np.asarray(want, value.dtype))
    # The host's float64 accumulators stay float64.
    if reduction != "any":
        v64, _ = reduce_episode(
            np, VALUES, PRESENT, reduction=reduction, dtype=np.float64
        )
        assert v64.dtype == np.float64
        np.testing.assert_array_equal(v64[:2], want)


def test_begin_only_resets_the_starting_lanes():
    acc, count = np.float32([4.0, 5.0]), np.int32([3, 2])
    starting = np.array([True, False])
    for xp_acc, xp_count in on_both(
        lambda xp, a, c, s: rules.begin_metric(xp, "max", a, c, s),
        acc,
        count,
        starting,
    ):
        assert xp_acc.tolist() == [-np.inf, 5.0] and xp_count.tolist() == [0, 2]


def test_every_step_has_the_key_without_a_count():
    """The engine keeps no count: the episode's length divides the mean."""
    acc, _ = rules.accumulate_metric(
        jnp, "mean", jnp.float32([1.0]), None, jnp.float32([2.0]), jnp.bool_([True])
    )
    assert rules.finalize_metric(jnp, "mean", acc, jnp.int32([2])).tolist() == [1.5]
    assert rules.success(np, np.float64([0.0, 1.0, np.nan])).tolist() == [
        False,
        True,
        True,
    ]


@pytest.mark.parametrize(
    ("reduction", "start"),
    [("last", np.nan), ("sum", 0.0), ("max", -np.inf), ("mean", 0.0), ("any", False)],
)
def test_each_reduction_starts_from_its_own_value(reduction, start):
    dtype = bool if reduction == "any" else np.float32
    acc, count = rules.begin_metric(
        np, reduction, np.ones(2, dtype), None, np.array([True, False])
    )
    assert count is None
    np.testing.assert_array_equal(acc, np.asarray([start, 1], dtype))


def test_any_counts_a_negative_value_and_last_keeps_the_newest():
    acc, _ = rules.accumulate_metric(
        np, "any", np.zeros(3, bool), None, np.float32([-0.5, 0.0, 2.0]), True
    )
    assert acc.tolist() == [True, False, True]
    acc, count = rules.accumulate_metric(
        np, "last", np.float32([1.0, 1.0]), np.int64([1, 1]), [7.0, 8.0], [1, 0]
    )
    assert acc.tolist() == [7.0, 1.0] and count.tolist() == [2, 1]


# Episode keys -------------------------------------------------------------------------
def test_episode_keys_are_prngkey_of_the_seed(monkeypatch):
    seeds = np.int32([0, 1, 7, 65_536, 2**31 - 1])
    want = np.stack([np.asarray(jax.random.PRNGKey(int(s))) for s in seeds])
    got_np, got_jnp = on_both(rules.episode_keys, seeds)
    np.testing.assert_array_equal(got_np, want)
    np.testing.assert_array_equal(got_jnp, want)
    assert got_np.dtype == want.dtype
    # Where jax's keys were not the [0, seed] pairs, numpy asks jax per seed.
    monkeypatch.setattr(rules, "_keys_are_seed_pairs", lambda impl, x64: False)
    np.testing.assert_array_equal(rules.episode_keys(np, seeds), want)


# The scan engine and the host loop on the same rule cases ---------------------------
class Tally:
    """A tiny JAX env (jaxmesh's protocol) whose episodes are worked out by hand.

    Reset draws, from the episode's key, a length ``L`` in [2, 7] and a class
    ``c`` in [0, 3]; the observation is ``(t, L, c)``. A step pays
    ``1 + 0.5 * action + 0.25 * t`` and terminates at step L. Its info:
    ``t`` (steps done), ``r`` (0.25 t), ``pos`` (c - t), ``half``
    (0.5 action + c) and ``hit`` (action 1 at step 3). With ``nan=(c0, k)``
    the reward is NaN at step k of episodes with ``c >= c0``.

    On the seeds below (hand-checked with ``reset``): seed: (L, c) =
    0: (5, 0), 2: (5, 0), 10: (5, 0), 3: (7, 3), 4: (4, 2), 5: (3, 0),
    6: (6, 2), 7: (3, 2), 8: (5, 1), 9: (3, 1), 11: (5, 3), 12: (4, 2).
    """

    action_shape = ()
    action_dtype = jnp.int32
    num_actions = 2

    def __init__(self, nan: tuple[int, int] | None = None):
        self.nan = nan
        self.name = f"Tally(nan={nan})"

    def reset(self, key):
        r = jax.random.randint(key, (2,), 0, 1000)
        length, c = 2 + r[0] % 6, r[1] % 4
        obs = jnp.stack([0, length, c]).astype(jnp.float32)
        return obs, (jnp.int32(0), length, c)

    def step(self, key, state, action):
        return self.step_with_info(key, state, action)[:5]

    def step_with_info(self, key, state, action):
        t, length, c = state
        reward = 1.0 + 0.5 * action + 0.25 * t
        if self.nan is not None:
            c0, k = self.nan
            reward = jnp.where((c >= c0) & (t == k), jnp.nan, reward)
        info = {
            "t": t + 1,
            "r": 0.25 * t,
            "pos": (c - t).astype(jnp.float32),
            "half": 0.5 * action + c,
            "hit": (action == 1) & (t == 3),
        }
        obs = jnp.stack([t + 1, length, c]).astype(jnp.float32)
        state = (t + 1, length, c)
        trunc = jnp.zeros((), bool)  # the run's cap is the only limit
        return obs, state, jnp.float32(reward), t + 1 >= length, trunc, info


@functools.cache
def jitted(env):
    """``env``'s reset and step_with_info, jitted once for every lane."""
    return jax.jit(env.reset), jax.jit(env.step_with_info)


class AsGym(gym.Env):
    """A jaxmesh-protocol env as a gymnasium ``Env``, calling the same jitted
    functions: ``reset(seed=s)`` resets with ``PRNGKey(s)`` and step t gets
    the scan's env key, ``fold_in(fold_in(PRNGKey(s), 0), t)``."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, env):
        self._reset, self._step = jitted(env)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.key, self.t = jax.random.PRNGKey(seed), 0
        obs, self.state = self._reset(self.key)
        return np.asarray(obs), {}

    def step(self, action):
        key = fold(self.key, 0, self.t)
        out = self._step(key, self.state, jnp.int32(action))
        obs, self.state, reward, term, trunc, info = out
        self.t += 1
        info = {k: np.asarray(v) for k, v in info.items()}
        return np.asarray(obs), float(reward), bool(term), bool(trunc), info


#: Episodes 0-2 last 5 steps: the three lanes end on one step (a tie) and take
#: episodes 3, 4, 5 in lane order. Seeds 3 (L = 7) is cut by the cap at 6;
#: seed 6 (L = 6) terminates on the capped step (both flags). 12 episodes on 3
#: lanes: the last lanes to end are masked.
SEEDS = [0, 2, 10, 3, 4, 5, 6, 7, 8, 9, 11, 12]
LENGTHS = [5, 5, 5, 6, 4, 3, 6, 3, 5, 3, 5, 4]
N, CAP = 3, 6
METRICS = {"t": "last", "r": "sum", "pos": "max", "half": "mean", "hit": "any"}


def alternate(obs):
    """Action ``t % 2``: never out of range."""
    return (obs[0] % 2).astype(jnp.int32)


def bad_at(c, k):
    """``alternate``, but action 5 at step k of episodes of class c."""

    def policy(obs):
        bad = (obs[2] == c) & (obs[0] == k)
        return jnp.where(bad, 5, alternate(obs)).astype(jnp.int32)

    return policy


def both_paths(policy, nan=None, **kwargs):
    """``evaluate`` on Tally as a JAX env and as gymnasium Envs (one per lane):
    the two results, or the two ``BadValueError``s."""
    out = []
    tally = Tally(nan)  # the host lanes call the scan's own env functions
    for env in (tally, [AsGym(tally) for _ in range(N)]):
        try:
            out.append(
                jaxmesh.evaluate(
                    policy,
                    env,
                    num_envs=N,
                    seeds=SEEDS,
                    max_episode_steps=CAP,
                    **kwargs,
                )
            )
        except jaxmesh.BadValueError as e:
            out.append(e)
    return out


FIELDS = ("returns", "lengths", "terminated", "truncated", "predict_calls", "lanes")


def assert_same_episodes(scan, host):
    np.testing.assert_array_equal(scan.indices, host.indices)
    np.testing.assert_array_equal(scan.seeds, host.seeds)
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(scan, f), getattr(host, f), err_msg=f)
    assert scan.metrics.keys() == host.metrics.keys()
    for k, v in scan.metrics.items():
        np.testing.assert_array_equal(v, host.metrics[k], err_msg=k)


def test_lanes_cap_and_every_reduction_agree():
    scan, host = both_paths(
        alternate, scoring=jaxmesh.Scoring(metrics=METRICS, success="hit")
    )
    assert_same_episodes(scan, host)
    for kind in ("success", "success_once", "success_at_end"):
        assert getattr(scan, kind).tolist() == getattr(host, kind).tolist()
    assert scan.env_steps == host.env_steps == sum(LENGTHS)
    # By hand: the lengths, the cap and the lanes (ties in lane order).
    assert scan.lengths.tolist() == LENGTHS
    lanes, starts = schedule(LENGTHS, N)
    assert scan.lanes.tolist() == lanes
    assert starts[3:6] == [5, 5, 5] and lanes[3:6] == [0, 1, 2]
    assert scan.truncated.tolist() == [L == CAP for L in LENGTHS]
    assert scan.terminated.tolist() == [s != 3 for s in SEEDS]
    # Every reduction, by hand: action t % 2, so 1 on odd steps.
    L = np.asarray(LENGTHS)
    c = np.asarray([0, 0, 0, 3, 2, 0, 2, 2, 1, 1, 3, 2])
    np.testing.assert_array_equal(scan.metrics["t"], L)
    np.testing.assert_array_equal(scan.metrics["r"], 0.25 * L * (L - 1) / 2)
    np.testing.assert_array_equal(scan.metrics["pos"], c)
    # (a float32 metric: the mean rounded once, as float32 division rounds it)
    half = (c + 0.5 * (L // 2) / L).astype(np.float32)
    np.testing.assert_array_equal(scan.metrics["half"], half)
    assert scan.metrics["hit"].tolist() == (L >= 4).tolist()
    # "hit" is true at step 3 only: at the end of the 4-step episodes, once in
    # every episode of 4 steps or more.
    assert scan.success_at_end.tolist() == (L == 4).tolist()
    assert scan.success_once.tolist() == scan.success.tolist() == (L >= 4).tolist()
    np.testing.assert_array_equal(
        scan.returns, L + 0.5 * (L // 2) + 0.25 * L * (L - 1) / 2
    )


def assert_same_fault(scan, host):
    assert isinstance(scan, jaxmesh.BadValueError), scan
    assert isinstance(host, jaxmesh.BadValueError), host
    fields = ("kind", "episode", "seed", "step", "lane")
    assert [getattr(scan, f) for f in fields] == [getattr(host, f) for f in fields]
    np.testing.assert_array_equal(scan.value, host.value)
    assert_same_episodes(scan.partial_result, host.partial_result)
    return scan


def test_a_nan_reward_agrees():
    """Episode 3 (seed 3, c = 3) starts on lane 0 at run step 5; its reward at
    step 2 (run step 7) is NaN. Episodes 0-2 ended at run step 4, episode 5
    on the fault's own step: they are the partial result."""
    e = assert_same_fault(
        *both_paths(alternate, nan=(3, 2), scoring=jaxmesh.Scoring(metrics=METRICS))
    )
    assert (e.kind, e.episode, e.seed, e.step, e.lane) == (REWARD, 3, 3, 2, 0)
    assert np.isnan(e.value)
    assert e.partial_result.indices.tolist() == [0, 1, 2, 5]


def test_an_out_of_range_action_agrees():
    """Episode 4 (seed 4, c = 2) on lane 1 from run step 5 plays 5 at its step
    1 (run step 6): only episodes 0-2 have ended."""
    e = assert_same_fault(
        *both_paths(bad_at(2, 1), scoring=jaxmesh.Scoring(metrics=METRICS))
    )
    assert (e.kind, e.episode, e.seed, e.step, e.lane, e.value) == (
        OUT,
        4,
        4,
        1,
        1,
        5.0,
    )
    assert e.partial_result.indices.tolist() == [0, 1, 2]


def test_a_nan_reward_and_a_bad_action_on_one_step_agree():
    """Run step 7: episode 3 (lane 0) plays 5 at its step 2, where its reward
    would be NaN too, and episode 4 (lane 1) meets a NaN reward at its step 2.
    The action is what went wrong first, and the lowest episode is reported."""
    e = assert_same_fault(*both_paths(bad_at(3, 2), nan=(2, 2)))
    assert (e.kind, e.episode, e.step, e.lane, e.value) == (OUT, 3, 2, 0, 5.0)
    assert e.partial_result.indices.tolist() == [0, 1, 2, 5]
