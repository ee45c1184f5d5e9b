"""The agent's pure functions (``jaxmesh.core.agent``) on tiny hand-worked cases.

No env and no evaluation: a fake policy whose chunk says where it came from
(lane ``j`` at step ``t`` observes ``50 j + t``; a plan from observation ``o``
returns ``100 o + k`` at entry ``k``), so an executed action names the step of
its plan and the entry played. The step is ``agent.host_step`` jitted once per
configuration, as the host loop jits it; the window, pending-chunk and text
helpers are called eagerly on a few lanes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles

from jaxmesh.adapt import PendingChunk, Previous, State
from jaxmesh.core import agent
from jaxmesh.execution import Ensemble
from jaxmesh.types import Policy


@dataclasses.dataclass(frozen=True)
class ScalarEnv:
    """What ``make_config`` reads of an env: one continuous scalar action."""

    action_shape: tuple = ()
    action_dtype: object = jnp.float32


def chunk_policy(length=None, spec=None, tells=False):
    """A policy whose chunk entry k, planned from observation o, is 100 o + k.

    ``length``: K (None: as long as the run's ``execution_horizon``, which
    the policy is then told). With a spec, it reads input ``"obs"``'s newest
    frame. The same arguments give the same policy, so that tests of one
    configuration share its compiled step (``stepper``).
    """
    return _chunk_policy(length, None if spec is None else tuple(spec.items()), tells)


@functools.cache
def _chunk_policy(length, items, tells):
    spec = None if items is None else dict(items)

    def apply(params, inputs, keys, rstate, execution_horizon=None):
        o = inputs if spec is None else inputs["obs"]
        if o.ndim == 2:  # a stacked window: its newest frame
            o = o[:, -1]
        k = execution_horizon if length is None else length
        return 100 * o[:, None] + jnp.arange(k, dtype=o.dtype), rstate

    return Policy(
        name="chunks",
        apply=apply,
        stochastic=False,
        initial_state=None,
        native_chunk=None,
        spec=spec,
        default_params=lambda: None,
        place=lambda x: x,
        device=None,
        on_episode_end=None,
        takes_execution_horizon=tells,
    )


def config(policy, n=2, horizon=4, lead=0, chunk=4, delay=0, tile=2, **kwargs):
    return agent.make_config(
        ScalarEnv(),
        policy,
        num_envs=n,
        horizon=horizon,
        lead=lead,
        tile=tile,
        chunk=chunk,
        delay=delay,
        **kwargs,
    )


@functools.cache
def stepper(cfg, policy):
    """``agent.host_step`` for ``cfg`` jitted once (every lane's obs new)."""

    def step(state, obs, started, active, keys, t, episodes):
        return agent.host_step(
            cfg, policy, None, state, obs, started, active, keys, t, episodes=episodes
        )

    return jax.jit(step)


def play(cfg, policy, steps, active=None):
    """Runs ``steps`` agent steps from episode starts on every lane at step 0.

    Lane j observes ``50 j + t`` at its own step t, which only moves while the
    lane is active (``active``: [steps][N] bools; None: always). Returns the
    executed actions ([steps][N]; None where a lane was masked) and the last
    state.
    """
    n = cfg.num_envs
    lane = np.arange(n)
    obs0 = jnp.asarray(50.0 * lane, jnp.float32)
    state = agent.init(cfg, policy, obs0, jnp.zeros(n, bool))
    step = stepper(cfg, policy)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(n))
    t = np.zeros(n, np.int32)
    out = []
    for i in range(steps):
        on = np.ones(n, bool) if active is None else np.asarray(active[i], bool)
        obs = jnp.asarray(50.0 * lane + t, jnp.float32)
        state, action = step(
            state,
            obs,
            jnp.asarray([i == 0] * n),
            jnp.asarray(on),
            keys,
            jnp.asarray(t),
            jnp.asarray(lane, jnp.int32),
        )
        action = np.asarray(action)
        out.append([float(a) if m else None for a, m in zip(action, on, strict=True)])
        t = t + on
    return out, state


def lane(actions, j):
    return [row[j] for row in actions]


# The chunk cursor ---------------------------------------------------------------
def test_without_a_lead_a_plan_each_time_the_chunk_is_exhausted():
    """h = 4: plans at steps 0, 4, 8, each played from entry 0."""
    policy = chunk_policy(4)
    actions, state = play(config(policy), policy, 10)
    assert lane(actions, 0) == [0, 1, 2, 3, 400, 401, 402, 403, 800, 801]
    assert lane(actions, 1) == [
        5000,
        5001,
        5002,
        5003,
        5400,
        5401,
        5402,
        5403,
        5800,
        5801,
    ]
    assert np.asarray(state.predict_calls).tolist() == [3, 3]
    assert np.asarray(state.cursor).tolist() == [2, 2]


def test_a_second_run_of_one_configuration_compiles_nothing():
    policy = chunk_policy(4)
    cfg = config(policy, lead=1)
    first, _ = play(cfg, policy, 5)
    with compiles() as seen:
        again, _ = play(cfg, policy, 5)
    assert seen == [] and again == first


def test_horizon_shorter_than_the_chunk_plays_its_first_h_entries():
    """K = 4, h = 2: plans at 0, 2, 4; entries 2 and 3 are never played."""
    policy = chunk_policy(4)
    actions, _ = play(config(policy, horizon=2), policy, 5)
    assert lane(actions, 0) == [0, 1, 200, 201, 400]


@pytest.mark.parametrize(
    ("lead", "want", "calls"),
    [
        # lead 1: the next chunk planned at cursor 3 (steps 3, 7) from that
        # step's observation, played from its entry 0 once this one ends
        (1, [0, 1, 2, 3, 300, 301, 302, 303, 700, 701], 3),
        # lead 2: planned at cursor 2 (steps 2, 6)
        (2, [0, 1, 2, 3, 200, 201, 202, 203, 600, 601], 3),
    ],
)
def test_a_prefetch_lead_plans_the_next_chunk_ahead(lead, want, calls):
    policy = chunk_policy(4)
    actions, state = play(config(policy, lead=lead), policy, 10)
    assert lane(actions, 0) == want
    assert lane(actions, 1) == [a + 5000 for a in want]
    assert np.asarray(state.predict_calls).tolist() == [calls, calls]


def test_an_inference_delay_skips_the_entries_meant_for_past_steps():
    """h = 3, d = 1 (a lead of 1): the first chunk plays entries 0-2; the next
    is planned at cursor 2 (step 2) and plays entries 1-3 from step 3 (entry
    0 was meant for step 2, already executed)."""
    policy = chunk_policy(4)
    cfg = config(policy, horizon=3, lead=1, delay=1)
    assert cfg.execution_horizon == 4
    actions, _ = play(cfg, policy, 10)
    assert lane(actions, 0) == [0, 1, 2, 201, 202, 203, 501, 502, 503, 801]


def test_a_policy_that_declares_execution_horizon_is_told_h_plus_d():
    """It returns as many actions as it is told: 4 at h = 3, d = 1."""
    policy = chunk_policy(None, tells=True)
    actions, _ = play(config(policy, horizon=3, lead=1, delay=1), policy, 4)
    assert lane(actions, 0) == [0, 1, 2, 201]


def test_a_chunk_shorter_than_what_the_run_executes_is_refused():
    policy = chunk_policy(3)
    cfg = config(policy, horizon=3, lead=1, delay=1, chunk=3)
    with pytest.raises(ValueError, match=r"chunks of 3 actions.*executes 4"):
        play(cfg, policy, 1)


def test_a_masked_lane_keeps_its_cursor_and_plans_nothing():
    """Lane 1 is masked on steps 1-3 of the run: its own step count, its
    cursor and its plans wait; lane 0 plays on."""
    policy = chunk_policy(4)
    on = [[1, 1], [1, 0], [1, 0], [1, 0], [1, 1], [1, 1], [1, 1], [1, 1]]
    actions, state = play(config(policy, lead=1), policy, 8, on)
    assert lane(actions, 0) == [0, 1, 2, 3, 300, 301, 302, 303]
    assert lane(actions, 1) == [5000, None, None, None, 5001, 5002, 5003, 5300]
    assert np.asarray(state.cursor).tolist() == [4, 1]
    assert np.asarray(state.predict_calls).tolist() == [3, 2]


def test_under_a_sweep_each_lane_paces_by_its_episode_s_cell():
    """Lane 0 runs episode 0 (h = 2, d = 0), lane 1 episode 1 (h = 3, d = 1):
    one program, the buffers sized for the largest h and d."""
    policy = chunk_policy(4)
    cfg = config(
        policy, horizon=3, lead=1, delay=1, grid=((2, 0), (3, 1)), cell_episodes=1
    )
    actions, state = play(cfg, policy, 6)
    assert lane(actions, 0) == [0, 1, 200, 201, 400, 401]
    assert lane(actions, 1) == [5000, 5001, 5002, 5201, 5202, 5203]
    assert np.asarray(state.setting).tolist() == [[2, 0], [3, 1]]


def test_due_and_can_skip():
    policy = chunk_policy(4)
    plain, led = config(policy), config(policy, lead=1)
    cursor = np.array([0, 1, 2, 3, 4])
    assert agent.plans_due(plain, cursor).tolist() == [False] * 4 + [True]
    assert agent.plans_due(led, cursor).tolist() == [False] * 3 + [True, True]
    # per lane (a sweep's cells): h = 2 with no lead, h = 4 with a lead of 1
    h, lead = np.array([2, 2, 4, 4, 4]), np.array([0, 0, 1, 1, 1])
    assert agent.plans_due(led, np.array([1, 2, 2, 3, 4]), h, lead).tolist() == [
        False,
        True,
        False,
        True,
        True,
    ]
    assert agent.can_skip(plain)
    assert not agent.can_skip(config(policy, horizon=1))
    stacked = chunk_policy(4, spec={"obs": State(stack=2)})
    assert not agent.can_skip(config(stacked))


def test_cell_setting_maps_episodes_to_their_cells():
    """Two episodes a cell; past the last cell, the last cell."""
    cfg = config(
        chunk_policy(8),
        horizon=8,
        lead=2,
        chunk=8,
        grid=((1, 0), (4, 1), (8, 2)),
        cell_episodes=2,
    )
    episodes = [0, 1, 2, 3, 4, 5, 9]
    want = [[1, 0], [1, 0], [4, 1], [4, 1], [8, 2], [8, 2], [8, 2]]
    assert agent.cell_setting(cfg, np.array(episodes), np).tolist() == want
    assert np.asarray(agent.cell_setting(cfg, jnp.array(episodes))).tolist() == want


def test_skip_replayed_moves_the_cursor_and_the_previous_action():
    """Lane 0 executed 2 replayed actions on the host, lane 1 none."""
    policy = chunk_policy(4, spec={"obs": State(), "prev": Previous(stack=2)})
    cfg = config(policy)
    state = agent.init(cfg, policy, jnp.zeros(2), jnp.ones(2, bool))
    chunk = jnp.asarray([[10.0, 11.0, 12.0, 13.0], [20.0, 21.0, 22.0, 23.0]])
    state = state.replace(chunk=chunk, cursor=jnp.asarray([1, 1]))
    state = agent.skip_replayed(cfg, state, jnp.asarray([2, 0]))
    assert np.asarray(state.cursor).tolist() == [3, 1]
    assert np.asarray(state.prev).tolist() == [12.0, 0.0]
    assert np.asarray(state.windows["prev"]).tolist() == [[0.0, 12.0], [0.0, 0.0]]


# Frame windows under lane masks --------------------------------------------------
def windows_config(n=3):
    policy = chunk_policy(4, spec={"obs": State(stack=3), "prev": Previous(stack=2)})
    return config(policy, n=n, tile=4), policy


def window(state, name="obs"):
    return np.asarray(state.windows[name]).tolist()


def test_a_reset_fills_the_window_with_the_reset_frame():
    cfg, policy = windows_config()
    state = agent.init(cfg, policy, jnp.asarray([1.0, 2.0, 3.0]), jnp.ones(3, bool))
    assert window(state) == [[1, 1, 1], [2, 2, 2], [3, 3, 3]]
    assert window(state, "prev") == [[0, 0], [0, 0], [0, 0]]
    assert np.asarray(state.cursor).tolist() == [4, 4, 4]  # exhausted: plan first
    assert np.asarray(state.fresh).tolist() == [True, True, True]


def test_a_masked_lane_s_window_does_not_move():
    cfg, policy = windows_config()
    state = agent.init(cfg, policy, jnp.asarray([1.0, 2.0, 3.0]), jnp.ones(3, bool))
    mask = jnp.asarray([True, False, True])
    state = agent.observe(cfg, state, jnp.asarray([10.0, 20.0, 30.0]), mask)
    assert window(state) == [[1, 1, 10], [2, 2, 2], [3, 3, 30]]
    # Without a mask every lane moves.
    state = agent.observe(cfg, state, jnp.asarray([11.0, 21.0, 31.0]))
    assert window(state) == [[1, 10, 11], [2, 2, 21], [3, 30, 31]]
    # The action window moves on the lanes that executed one.
    state = agent._executed(cfg, state, mask, jnp.asarray([5.0, 6.0, 7.0]))
    assert window(state, "prev") == [[0, 5], [0, 0], [0, 7]]
    assert np.asarray(state.prev).tolist() == [5.0, 0.0, 7.0]
    assert np.asarray(state.cursor).tolist() == [5, 4, 5]


def test_begin_refills_only_the_starting_lanes():
    cfg, policy = windows_config()
    state = agent.init(cfg, policy, jnp.asarray([1.0, 2.0, 3.0]), jnp.ones(3, bool))
    state = agent.observe(cfg, state, jnp.asarray([10.0, 20.0, 30.0]))
    everyone = jnp.ones(3, bool)
    state = agent._executed(cfg, state, everyone, jnp.asarray([5.0, 6.0, 7.0]))
    state = state.replace(
        cursor=jnp.asarray([1, 2, 3]), predict_calls=jnp.asarray([4, 5, 6])
    )
    starting = jnp.asarray([False, True, False])
    state = agent.begin(cfg, policy, state, starting, jnp.asarray([7.0, 8.0, 9.0]))
    assert window(state) == [[1, 1, 10], [8, 8, 8], [3, 3, 30]]
    assert window(state, "prev") == [[0, 5], [0, 0], [0, 7]]
    assert np.asarray(state.prev).tolist() == [5.0, 0.0, 7.0]
    assert np.asarray(state.cursor).tolist() == [1, 4, 3]
    assert np.asarray(state.predict_calls).tolist() == [4, 0, 6]
    assert np.asarray(state.fresh).tolist() == [False, True, False]


def test_policy_inputs_give_a_window_or_its_one_frame():
    cfg, policy = windows_config(n=2)
    state = agent.init(cfg, policy, jnp.asarray([1.0, 2.0]), jnp.ones(2, bool))
    state = agent.observe(cfg, state, jnp.asarray([3.0, 4.0]))
    seen = agent.policy_inputs(cfg, state.windows, state.texts)
    assert np.asarray(seen["obs"]).tolist() == [[1, 1, 3], [2, 2, 4]]
    assert np.asarray(seen["prev"]).tolist() == [[0, 0], [0, 0]]
    one = chunk_policy(4, spec={"obs": State()})
    cfg1 = config(one)
    state1 = agent.init(cfg1, one, jnp.asarray([1.0, 2.0]), jnp.ones(2, bool))
    seen = agent.policy_inputs(cfg1, state1.windows, state1.texts)
    assert np.asarray(seen["obs"]).tolist() == [1.0, 2.0]


# The pending chunk ---------------------------------------------------------------
def test_tail_start_by_planning_time():
    """Synchronous: the next plan comes at cursor h - d; planned ahead: at h."""
    assert agent.tail_start(4, 0, False) == 4
    assert agent.tail_start(4, 1, False) == 3
    assert agent.tail_start(4, 1, True) == 4


def test_shifted_pads_the_tail_with_zeros():
    out = jnp.asarray([[0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0]])
    tail, valid = agent._shifted(out, jnp.asarray([1, 3]), 4)
    assert np.asarray(tail).tolist() == [[1, 2, 3, 0], [13, 0, 0, 0]]
    assert np.asarray(valid).tolist() == [3, 1]
    tail, valid = agent._shifted(out, 4, 4)  # nothing left
    assert np.asarray(tail).tolist() == [[0] * 4, [0] * 4]
    assert np.asarray(valid).tolist() == [0, 0]


def test_pending_value_masks_the_valid_entries():
    tail = jnp.asarray([[5.0, 6.0, 0.0], [7.0, 0.0, 0.0]])
    got = agent.pending_value(tail, jnp.asarray([2, 1]), 1)
    assert np.asarray(got["mask"]).tolist() == [
        [True, True, False],
        [True] + [False] * 2,
    ]
    assert np.asarray(got["delay"]).tolist() == [1, 1]
    assert np.asarray(got["actions"]).tolist() == np.asarray(tail).tolist()


def test_pending_zeros_at_an_episode_start():
    policy = chunk_policy(4, spec={"obs": State(), "pending": PendingChunk()})
    cfg = config(policy, horizon=3, lead=1, delay=1)
    got = agent.pending_zeros(cfg, 2, 4)
    assert np.asarray(got["actions"]).tolist() == [[0.0] * 4] * 2
    assert not np.asarray(got["mask"]).any()
    assert np.asarray(got["delay"]).tolist() == [1, 1]


def test_a_plan_s_tail_is_what_the_next_plan_sees():
    """h = 2, no delay: a plan from step t's observation o leaves entries 2-3
    (those meant for the next plan's first steps) as the tail."""
    spec = {"obs": State(), "pending": PendingChunk()}
    policy = chunk_policy(4, spec=spec)
    cfg = config(policy, horizon=2)
    _, state = play(cfg, policy, 3)  # plans at steps 0 and 2
    assert np.asarray(state.tail).tolist() == [[202, 203, 0, 0], [5202, 5203, 0, 0]]
    assert np.asarray(state.tail_len).tolist() == [2, 2]
    restarted = agent.begin(
        cfg, policy, state, jnp.asarray([True, False]), jnp.zeros(2)
    )
    assert np.asarray(restarted.tail_len).tolist() == [0, 2]
    assert np.asarray(restarted.tail)[0].tolist() == [0, 0, 0, 0]


# Text inputs ----------------------------------------------------------------------
def test_text_zeros_in_numpy_and_jax():
    leaves, treedef = jax.tree.flatten({"ids": 0, "len": 0})
    texts = (("task", treedef, (((3,), jnp.dtype(jnp.int32)), ((), jnp.dtype(bool)))),)
    cfg = dataclasses.replace(config(chunk_policy(4)), texts=texts)
    for xp in (np, jnp):
        got = agent.text_zeros(cfg, 2, xp)
        assert np.asarray(got["task"]["ids"]).tolist() == [[0, 0, 0], [0, 0, 0]]
        assert np.asarray(got["task"]["len"]).tolist() == [False, False]
        assert got["task"]["ids"].dtype == np.int32
    assert agent.text_zeros(config(chunk_policy(4)), 2) == {}


# Temporal ensembling -------------------------------------------------------------
def test_ensemble_action_averages_the_chunks_covering_the_step():
    """K = 2, one lane: slot 0 holds the chunk planned at step 0 ([1, 3]),
    slot 1 the one planned at step 1 ([5, 7]). Step 0 sees slot 0's entry 0
    alone; step 1 slot 0's entry 1 and slot 1's entry 0."""
    cfg = dataclasses.replace(
        config(chunk_policy(2), n=1, chunk=2),
        ensemble=Ensemble(aggregation="average"),
        chunk_len=2,
    )
    ring = jnp.asarray([[[1.0, 3.0], [5.0, 7.0]]])
    assert np.asarray(agent.ensemble_action(cfg, ring, jnp.asarray([0]))).tolist() == [
        1.0
    ]
    assert np.asarray(agent.ensemble_action(cfg, ring, jnp.asarray([1]))).tolist() == [
        4.0
    ]
    latest = dataclasses.replace(cfg, ensemble=Ensemble(aggregation="latest_only"))
    assert np.asarray(
        agent.ensemble_action(latest, ring, jnp.asarray([1]))
    ).tolist() == [5.0]
