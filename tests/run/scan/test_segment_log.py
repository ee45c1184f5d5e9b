"""Segments write ended episodes into a log sized by the lanes and read seeds
from a window: every budget runs on one program, and what a segment carries and
what the host reads after it do not grow with the budget (docs/evaluation.md,
"One program for every budget")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles
from reference_loop import schedule

import jaxmesh
from jaxmesh.run.scan import placement

LANES = 4


class Countdown:
    """An env whose episode is a closed-form function of its seed.

    The reset reads the seed back from its key (``PRNGKey(s)`` holds ``s`` in
    its second word, ``s < 2**32``). Episode length ``1 + s % 5``; the
    observation is ``(s % 7, t)``; a step's reward is ``1 + action``.
    """

    name = "countdown"
    action_shape = ()
    action_dtype = jnp.int32
    num_actions = 2

    def reset(self, key):
        seed = jax.random.key_data(key)[1].astype(jnp.int32)
        return self._obs(seed, 0), (seed, jnp.int32(0))

    @staticmethod
    def _obs(seed, t):
        return jnp.stack([seed % 7, t]).astype(jnp.float32)

    def step(self, key, state, action):
        seed, t = state
        t = t + 1
        term = t >= 1 + seed % 5
        reward = 1.0 + action.astype(jnp.float32)
        return self._obs(seed, t), (seed, t), reward, term, jnp.bool_(False)


def policy(obs):
    return (obs[0] > 3).astype(jnp.int32)


def expected(seeds):
    """Per episode: length, return, predict calls (one plan a step), lanes."""
    seeds = np.asarray(seeds)
    lengths = 1 + seeds % 5
    returns = lengths * (1.0 + (seeds % 7 > 3))
    return lengths, returns, schedule(lengths.tolist(), LANES)[0]


@pytest.fixture(scope="module")
def evaluator():
    # Long segments: 4 lanes of 1-5 step episodes fill the 1024-row log
    # (core.results.log_capacity) well before 2048 steps.
    return jaxmesh.Evaluator(
        policy, Countdown(), num_envs=LANES, layout=jaxmesh.Layout(segment_steps=2048)
    )


def test_many_segments_match_the_closed_form(evaluator):
    # Past one seed window (carry.window_size: 4 * 1024 + 4 here): the host
    # puts new windows as the lanes move on.
    seeds = (np.arange(10_000) * 7919 + 13) % 100_003
    r = evaluator.run(seeds=seeds)
    lengths, returns, lanes = expected(seeds)
    np.testing.assert_array_equal(r.lengths, lengths)
    np.testing.assert_array_equal(r.returns, returns)
    np.testing.assert_array_equal(r.predict_calls, lengths)
    np.testing.assert_array_equal(r.lanes, lanes)
    assert r.terminated.all() and not r.truncated.any()
    assert r.env_steps == lengths.sum()


def test_one_program_for_every_budget(evaluator):
    evaluator.run(episodes=3)
    big = evaluator.run(episodes=9000)
    assert len(evaluator.programs()) == 1
    assert big.compile_time == 0.0
    lengths, returns, _ = expected(np.arange(9000))
    np.testing.assert_array_equal(big.lengths, lengths)
    np.testing.assert_array_equal(big.returns, returns)


def test_trial_indices_follow_the_window():
    # Episode i starts from initial state i (its own "seed" field), past
    # several windows; the reset key's seed is then unused.
    t = 10_000
    start = (np.arange(t) * 104_729 + 5) % 99_991
    obs = jax.vmap(Countdown._obs)(jnp.asarray(start), jnp.zeros(t, jnp.int32))
    states = (obs, (jnp.asarray(start, jnp.int32), jnp.zeros(t, jnp.int32)))
    r = jaxmesh.evaluate(
        policy,
        Countdown(),
        num_envs=LANES,
        episodes=t,
        starts=jaxmesh.Starts(initial_states=states),
        layout=jaxmesh.Layout(segment_steps=2048),
    )
    lengths, returns, lanes = expected(start)
    np.testing.assert_array_equal(r.lengths, lengths)
    np.testing.assert_array_equal(r.returns, returns)
    np.testing.assert_array_equal(r.lanes, lanes)


class Seen:
    """An ``on_episode_end`` hook (as the CLI's progress bar), in order."""

    def __init__(self):
        self.indices = []

    def on_episode_end(self, ep):
        self.indices.append(ep.index)


def test_segment_buffers_and_host_reads_do_not_depend_on_the_budget(monkeypatch):
    carried, read = [], []
    compile_segment = placement.SingleDevice.compile

    def compile(self, engine, params, steps):
        segment = compile_segment(self, engine, params, steps)

        def run(params, state, res):
            leaves = jax.tree.leaves((state, res))
            carried.append(sorted(x.nbytes for x in leaves))
            return segment(params, state, res)

        return run

    device_get = jax.device_get

    def counted(tree):
        leaves = jax.tree.leaves(tree)
        read.append(sum(x.nbytes for x in leaves if isinstance(x, jax.Array)))
        return device_get(tree)

    monkeypatch.setattr(placement.SingleDevice, "compile", compile)
    monkeypatch.setattr(jax, "device_get", counted)
    ev = jaxmesh.Evaluator(
        policy, Countdown(), num_envs=LANES, layout=jaxmesh.Layout(segment_steps=16)
    )
    runs = {}
    for budget in (50, 6000):
        carried.clear()
        read.clear()
        seen = Seen()
        ev.run(episodes=budget, hooks=seen)
        assert seen.indices == list(range(budget))
        runs[budget] = (len(carried), {tuple(c) for c in carried}, max(read))
    (few, small_shapes, small_read), (many, big_shapes, big_read) = runs.values()
    assert many > 10 * few  # the larger budget ran many more segments
    # Every segment of either budget carried the same device buffers...
    assert small_shapes == big_shapes and len(big_shapes) == 1
    # ...and no host read after a segment was larger for the larger budget.
    assert big_read == small_read
    assert len(ev.programs()) == 1


@pytest.mark.parametrize("steps", [2**31, 2**32])
def test_segment_steps_past_int32_is_refused_before_compiling(steps):
    with compiles() as seen, pytest.raises(ValueError) as info:
        jaxmesh.evaluate(
            policy,
            Countdown(),
            num_envs=LANES,
            layout=jaxmesh.Layout(segment_steps=steps),
        )
    message = str(info.value)
    assert f"segment_steps={steps}" in message and "2,147,483,647" in message
    assert seen == []


def test_the_largest_segment_steps_runs():
    r = jaxmesh.evaluate(
        policy,
        Countdown(),
        num_envs=LANES,
        episodes=5,
        layout=jaxmesh.Layout(segment_steps=2**31 - 1),
    )
    np.testing.assert_array_equal(r.lengths, expected(np.arange(5))[0])


def test_a_mesh_puts_new_windows_too():
    # The same budget past one seed window on a one-device mesh
    # (placement.DeviceMesh): its windows are put per device, and the lanes
    # and agent state go on into the next segment.
    ev = jaxmesh.Evaluator(
        policy,
        Countdown(),
        num_envs=LANES,
        layout=jaxmesh.Layout(segment_steps=2048, devices=1),
    )
    assert isinstance(ev.placement, placement.DeviceMesh)
    seeds = (np.arange(10_000) * 7919 + 13) % 100_003
    r = ev.run(seeds=seeds)
    lengths, returns, lanes = expected(seeds)
    np.testing.assert_array_equal(r.lengths, lengths)
    np.testing.assert_array_equal(r.returns, returns)
    np.testing.assert_array_equal(r.lanes, lanes)
