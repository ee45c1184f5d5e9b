"""The host loop (``jaxmesh.run.host.loop``) on fake lanes and a fake agent, in numpy.

No gymnasium env, no policy program, nothing compiled: ``Lanes`` below is a
host-stepped env whose episode of seed s lasts s steps and pays each executed
action as its reward; ``Program`` is an agent step that plays ``t % 2`` at
each lane's step t (or whatever ``choose`` says). Which lane takes which
episode, the step cap, returns, plans, faults and lost lanes are checked
against values worked out by hand.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import jaxmesh
from jaxmesh.core import tally
from jaxmesh.errors import WorkerError
from jaxmesh.run import stream
from jaxmesh.run.host import loop


class Layout:
    """Two float32 leaves per lane: the episode's seed and its step."""

    names = ("seed", "t")

    def empty(self, lead=(), aligned=False):
        return {name: np.zeros(lead, np.float32) for name in self.names}

    def build(self, leaves):
        return dict(leaves)


@dataclasses.dataclass
class Lanes:
    """Host-stepped lanes: seed s lasts s steps; the reward is the action,
    or NaN at step ``nan[1]`` of seed ``nan[0]``."""

    n: int
    nan: tuple[int, int] | None = None

    def __post_init__(self):
        self.spec = SimpleNamespace(
            layout=Layout(),
            name="countdown",
            action_shape=(),
            action_dtype=np.int32,
            num_actions=2,
        )
        self.seed = np.zeros(self.n, np.int64)
        self.t = np.zeros(self.n, np.int64)
        self.resets: list[tuple[int, int, int]] = []  # (lane, seed, trial)

    def reset(self, js, seeds, trials):
        self.seed[js], self.t[js] = seeds, 0
        self.resets += list(zip(js, seeds, trials, strict=True))
        return {"seed": np.float32(seeds), "t": np.zeros(len(js), np.float32)}

    def step(self, actions, go, obs_leaves):
        reward = actions.astype(np.float32)
        if self.nan is not None:
            hit = go & (self.seed == self.nan[0]) & (self.t == self.nan[1])
            reward = np.where(hit, np.nan, reward).astype(np.float32)
        self.t[go] += 1
        obs_leaves["t"][go] = self.t[go]
        term = go & (self.t >= self.seed)
        return reward, term, np.zeros(self.n, bool)


@dataclasses.dataclass
class State:
    """What the loop reads of an agent state: plans per lane, rows in all."""

    predict_calls: np.ndarray
    rows: np.ndarray


class Step:
    """The agent step: ``choose(seed, t)`` per active lane (default ``t % 2``),
    a plan on every step (h = 1)."""

    def __init__(self, choose):
        self.choose = choose

    def keys_on_device(self, keys):
        return keys

    def __call__(
        self, params, state, obs, started, active, keys, t, moved, *rest, **kw
    ):
        assert (t == obs["t"]).all(), "the loop's step count is the env's"
        calls = np.where(started, 0, state.predict_calls) + active
        actions = np.where(active, self.choose(obs["seed"].astype(int), t), 0)
        rows = state.rows + active.sum()
        return State(calls, rows), actions.astype(np.int32)


class Program:
    def __init__(self, n, choose=lambda seed, t: t % 2):
        self.config = SimpleNamespace(h=1, lead=0, grid=None, spec=())
        self.layout = Layout()
        self.step = Step(choose)
        self.n = n

    def init(self, obs, active):
        return State(np.zeros(self.n, np.int32), np.zeros((), np.int32))


class Telemetry:
    def span(self, *args):
        pass

    def add(self, *args):
        pass


class NoMetrics:
    keys = ()
    active = False
    tracks_success = False

    def begin(self, js):
        pass


def local_run(seeds, n, cap=100, nan=None, choose=None, hooks=()):
    """A ``LocalRun`` of ``seeds`` on ``n`` fake lanes, and its results."""
    seeds = np.asarray(seeds, np.int64)
    res = tally.empty(seeds.size, n, np)
    out = stream.EpisodeStream(list(hooks), seeds, None, {})
    out.steps = stream.StepStream(list(hooks), 1, 0)
    program = Program(n) if choose is None else Program(n, choose)
    settings = SimpleNamespace(num_envs=n, max_steps=cap)
    given = loop.HostRun(program, None, Lanes(n, nan), settings, seeds, NoMetrics())
    run = loop.LocalRun(given, res, out, Telemetry())
    return run, res


def test_lanes_ties_and_the_cap():
    """Seeds (= lengths) 3 1 2 5 1 on 2 lanes, cap 3. Lane 1 ends episode 1
    at run step 0 and takes episode 2 (steps 1-2); at run step 2 both lanes
    end (a tie): lane 0 takes episode 3, lane 1 episode 4 (ascending lanes).
    Episode 0 terminates on the capped step, episode 3 is cut at 3 steps;
    lane 1 has nothing left after run step 3."""
    run, res = local_run([3, 1, 2, 5, 1], 2, cap=3)
    run.run()
    assert res.lanes.tolist() == [0, 1, 1, 0, 1]
    assert res.lengths.tolist() == [3, 1, 2, 3, 1]
    assert res.terminated.tolist() == [True, True, True, False, True]
    assert res.truncated.tolist() == [True, False, False, True, False]
    # action t % 2: one odd step in an episode of 2 or 3 steps
    assert res.returns.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert res.predict_calls.tolist() == [3, 1, 2, 3, 1]
    assert res.done.all()
    assert int(res.env_steps) == int(res.policy_rows) == 10
    # every reset: (lane, seed, trial index), in the order they happened
    assert run.lanes.resets == [(0, 3, 0), (1, 1, 1), (1, 2, 2), (0, 5, 3), (1, 1, 4)]


def test_more_lanes_than_episodes_masks_the_rest():
    run, res = local_run([2, 1], 4)
    run.run()
    assert res.lanes.tolist() == [0, 1]
    assert run.episode.tolist() == [-1, -1, -1, -1]
    assert not run.active.any()
    assert [lane for lane, _, _ in run.lanes.resets] == [0, 1]


class Steps:
    def __init__(self):
        self.events = []

    def on_step(self, event):
        self.events.append(event)


def test_on_step_sees_every_step_in_lane_order():
    hook = Steps()
    run, _ = local_run([2, 1, 1], 2, hooks=[hook])
    run.run()
    got = [(e.lane, e.episode, e.t, e.terminated) for e in hook.events]
    assert got == [
        (0, 0, 0, False),
        (1, 1, 0, True),
        (0, 0, 1, True),
        (1, 2, 0, True),
    ]


def test_an_out_of_range_action_stops_the_run_before_its_step():
    """Seed 4's episode (episode 1, lane 1) plays 5 at its step 2 (run step
    2). Lane 0 ran episode 0 (step 0) and episode 2 (steps 1-2): episode 2
    ends on the fault's own step and is done."""
    bad = lambda seed, t: np.where((seed == 4) & (t == 2), 5, t % 2)
    run, res = local_run([1, 4, 2], 2, choose=bad)
    with pytest.raises(jaxmesh.BadValueError) as info:
        run.run()
    e = info.value
    assert (e.kind, e.episode, e.seed, e.step, e.lane) == (
        tally.ACTION_OUT_OF_RANGE,
        1,
        4,
        2,
        1,
    )
    assert e.value == 5.0
    assert run.lanes.t[1] == 2  # the bad action was not executed
    assert res.done.tolist() == [True, False, True]


def test_a_nan_reward_is_a_fault_of_its_step():
    """Seed 3 (episode 0, lane 0) pays NaN at its step 1, the step on which
    episode 1 (seed 2, lane 1) ends: that one is done, the faulty one not."""
    run, res = local_run([3, 2], 2, nan=(3, 1))
    with pytest.raises(jaxmesh.BadValueError) as info:
        run.run()
    e = info.value
    assert (e.kind, e.episode, e.step, e.lane) == (tally.REWARD_NOT_FINITE, 0, 1, 0)
    assert np.isnan(e.value)
    assert res.done.tolist() == [False, True]
    assert res.returns[1] == 1.0


def test_lost_lanes_hand_their_episodes_to_the_others():
    """4 episodes on 3 lanes: lane 1 is lost while it runs episode 1; the
    lowest free lane runs it again before the unstarted episode 3."""
    run, _ = local_run([5, 5, 5, 5], 3)
    run.take_next(np.ones(3, bool))
    assert run.episode.tolist() == [0, 1, 2]
    assert run.lose_lanes(np.array([1])) == [1]
    assert run.dead.tolist() == [False, True, False]
    assert run.rerun == [1]  # no free lane yet
    free = np.array([True, True, False])  # lane 0's episode ended; lane 1 is dead
    run.take_next(free)
    assert run.episode.tolist() == [1, -1, 2]
    assert run.rerun == []
    run.take_next(np.array([False, False, True]))
    assert run.episode.tolist() == [1, -1, 3]


def test_an_episode_whose_worker_dies_twice_is_named():
    run, _ = local_run([5, 6], 2)
    run.take_next(np.ones(2, bool))
    run.requeue(np.array([1]))
    assert run.rerun == [1] and run.losses == {1: 1}
    assert not run.active[1]
    run.take_next(np.array([False, True]))
    assert run.episode.tolist() == [0, 1]
    with pytest.raises(WorkerError, match=r"episode 1 \(seed 6\).*twice") as info:
        run.requeue(np.array([1]))
    assert (info.value.episode, info.value.seed) == (1, 6)


def test_a_seed_that_resets_differently_warns_once():
    run, _ = local_run([7, 7, 7], 3)
    run.take_next(np.ones(3, bool))  # the same seed three times: one digest
    assert not run.warned_seeds
    run.obs_leaves["t"][2] = 1.0  # lane 2's reset observation differs
    with pytest.warns(UserWarning, match=r"seed 7 \(episodes 0 and 2\)"):
        run.seen_resets([2])
    assert run.warned_seeds


def test_lane_setting_without_a_sweep_is_the_config_s():
    run, _ = local_run([1], 2)
    h, lead = run.lane_setting(np.array([0, 1]))
    assert h.tolist() == [1, 1] and lead.tolist() == [0, 0]
    assert run.replays_next().tolist() == [False, False]
