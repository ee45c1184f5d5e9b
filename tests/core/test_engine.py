"""The scan engine's window and segment arithmetic (``jaxmesh.core.engine``),
on hand-worked cases.

A segment reads its seeds from a *window* of ``WINDOW_LOGS * capacity + N``
of them starting at ``base``, and writes the episodes that end into a *log*
of ``capacity`` rows; it stops when the log could not hold another step's
ends (``rows + N > capacity``), after ``max_steps`` steps, or at the end of
the budget. The pure parts (the window's size, base and contents, whether a
window serves a segment, the first lanes) are checked on small numbers
worked out here; then ``Count``, an env whose episode with seed s lasts
``s % 3 + 1`` steps, is run segment by segment on one compiled program:
segment 1 of its hand-worked schedule below, then a budget larger than the
window, driven as the host drives it, against the lanes of CONTRACT 3
computed from the lengths alone (``reference_loop.schedule``).

Two lanes, a log of 4 rows, seeds 0..7 (lengths 1 2 3 1 2 3 1 2):
lane 0 runs episodes 0 (steps 1), 2 (3); lane 1 runs 1 (2), 3 (1), 4 (2).
Episode 0 ends on step 1, 1 on step 2, 3 on step 3: the log then holds 3 rows
and 3 + 2 > 4, so segment 1 stops after 3 steps with rows for episodes
0, 1, 3 and episodes 2 (lane 0) and 4 (lane 1) under way; the next
unstarted episode is 5.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import assert_matches, gymnax_fns, run_episode, schedule, single

import jaxmesh
from jaxmesh.core import agent, carry, engine, policy, tally

XPS = [np, jnp]


@dataclasses.dataclass(frozen=True)
class Count:
    """A JAX env (jaxmesh's protocol): the episode with seed s lasts
    ``s % 3 + 1`` steps, each paying 1; the observation is the step count.

    ``PRNGKey(s)`` is ``[0, s]`` (threefry, CONTRACT 5), so reset reads the
    seed back from its key's second word.
    """

    action_shape: tuple = ()
    action_dtype: object = jnp.float32
    num_actions: int | None = None
    name: str = "Count"

    def reset(self, key):
        length = (key[1] % 3 + 1).astype(jnp.int32)
        return jnp.float32(0), (jnp.int32(0), length)

    def step(self, key, state, action):
        t, length = state
        t = t + 1
        done = t >= length
        return t.astype(jnp.float32), (t, length), jnp.float32(1), done, False


def zero_action(obs):
    return obs * 0


def make_engine(n, capacity, trials=None):
    pol = policy.resolve_policy(zero_action, with_params=False)
    cfg = carry.EngineConfig(
        capacity=capacity,
        max_steps=100,
        agent=agent.make_config(
            Count(), pol, num_envs=n, horizon=1, lead=0, tile=n, chunk=None
        ),
        trials=trials,
    )
    return engine.Engine(pol, Count(), cfg)


@functools.cache
def count_engine():
    """The engine of the runs below: two lanes, a log of 4 rows (window 18)."""
    return make_engine(2, 4)


# The window --------------------------------------------------------------------
def test_window_size_is_four_logs_and_the_lanes():
    assert carry.WINDOW_LOGS == 4
    assert carry.window_size(make_engine(3, 8).config) == 4 * 8 + 3
    assert carry.window_size(make_engine(1, 1024).config) == 4097


@pytest.mark.parametrize(
    ("next_episode", "base", "seeds"),
    [
        # lanes may still begin episodes up to N = 3 before the next unstarted
        (0, 0, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 0]),
        (2, 0, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 0]),
        (5, 2, [102, 103, 104, 105, 106, 107, 108, 109, 0, 0, 0]),
        (13, 10, [0] * 11),  # past the budget: zeros (masked lanes read seed 0)
    ],
)
def test_a_window_starts_n_before_the_next_episode(next_episode, base, seeds):
    eng = make_engine(3, 2)  # window: 4 * 2 + 3 = 11 seeds
    window = carry.window(eng.config, np.arange(100, 110), next_episode)
    assert int(window["base"]) == base
    assert window["seeds"].tolist() == seeds
    assert window["seeds"].dtype == np.int32 and "trial_of" not in window


def test_a_window_cuts_the_trial_indices_as_the_seeds():
    trials = carry.TrialReset(reset=None)
    eng = make_engine(3, 2, trials=trials)
    trial_of = np.arange(20, 30)
    window = carry.window(eng.config, np.arange(100, 110), 5, trial_of=trial_of)
    assert window["trial_of"].tolist() == [22, 23, 24, 25, 26, 27, 28, 29, 0, 0, 0]
    lanes = count_engine().first_carry(np.arange(3, dtype=np.int32)).lanes
    lanes = lanes.replace(trials=(None, "data"))
    lanes = carry.with_window(lanes, window)
    assert lanes.trials[0] is window["trial_of"] and lanes.trials[1] == "data"
    assert lanes.seeds is window["seeds"] and int(lanes.base) == 2


@pytest.mark.parametrize(
    ("base", "next_episode", "fits"),
    [
        # N = 3, capacity 2, window 11: it fits when base <= next - N and
        # next + capacity <= base + 11
        (0, 0, True),
        (0, 9, True),
        (0, 10, False),  # episodes up to 11 may begin: past the window's 10
        (2, 4, False),  # a lane may begin episode 1, before the window
        (2, 5, True),
        (2, 11, True),
        (2, 12, False),
    ],
)
def test_whether_a_window_serves_a_segment(base, next_episode, fits):
    assert carry.window_fits(make_engine(3, 2).config, base, next_episode) is fits


def test_a_window_that_fits_holds_every_episode_a_segment_may_begin():
    """By brute force against plain slicing: whenever the window made for
    ``made`` is said to fit a segment starting at ``nxt``, it holds the seed of
    every episode from ``nxt - N`` (lanes about to begin one) to ``nxt +
    capacity - 1`` (the most a segment hands over); and a new window always
    fits the segment it was made for. Made for ``next_episode = base + N``,
    it serves segments up to ``3 * capacity`` episodes later, so a new one is
    put every few segments."""
    n, cap = 3, 2
    eng = make_engine(n, cap)
    seeds = np.arange(1000, 1060)
    for made in range(60):
        window = carry.window(eng.config, seeds, made)
        base = int(window["base"])
        assert carry.window_fits(eng.config, base, made)
        served = [nxt for nxt in range(70) if carry.window_fits(eng.config, base, nxt)]
        # base + N = made (base 0: from 0) to base + 3 capacity + N
        first = 0 if base == 0 else base + n
        assert served == list(range(first, base + 3 * cap + n + 1)), (made, served)
        for nxt in served:
            for e in range(max(0, nxt - n), min(nxt + cap, seeds.size)):
                assert window["seeds"][e - base] == seeds[e], (made, nxt, e)


@pytest.mark.parametrize("xp", XPS)
@pytest.mark.parametrize(
    ("budget", "episodes", "next_episode"),
    [
        (2, [0, 1, carry.NO_EPISODE, carry.NO_EPISODE], 2),
        (4, [0, 1, 2, 3], 4),
        (6, [0, 1, 2, 3], 4),
        (0, [carry.NO_EPISODE] * 4, 0),
    ],
)
def test_the_first_lanes(xp, budget, episodes, next_episode):
    """Lane j begins episode j (CONTRACT 3); every lane is reset on the first
    step, a lane past the budget holding no episode."""
    first = carry.first_lanes(xp, 4, xp.int32(budget))
    assert np.asarray(first["episode"]).tolist() == episodes
    assert np.asarray(first["start"]).tolist() == [True] * 4
    assert int(first["next_episode"]) == next_episode


# Configuration -----------------------------------------------------------------
def test_the_accumulators_are_the_metrics_then_the_success_keys():
    base = make_engine(1, 4).config
    assert base.accumulators == () and not base.reads_info
    cfg = dataclasses.replace(base, metrics=(("x", "sum"),), success="ok")
    assert cfg.accumulators == (("x", "sum"), ("ok", "last"), ("ok", "any"))
    assert cfg.reads_info
    assert dataclasses.replace(base, metrics=(("x", "max"),)).reads_info


def test_a_batched_env_is_one_with_step_lanes():
    class Pool:
        def step_lanes(self, active, state, action): ...

    assert engine.batched(Pool()) and not engine.batched(Count())


def test_env_stream_is_the_episode_keys_stream_0():
    """Docs, "Keys": env step t uses ``fold_in(fold_in(k, 0), t)``; the
    inner ``fold_in`` is ``env_stream``."""
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray([3, 5]))
    want = [jax.random.fold_in(jax.random.PRNGKey(s), 0) for s in (3, 5)]
    np.testing.assert_array_equal(engine.env_stream(keys), np.stack(want))


# Segments ----------------------------------------------------------------------
def segment(eng, state, res, steps=1000):
    """One segment, and what the host reads after it: ``(state, log, rows)``
    with rows a dict of the log's rows by field."""
    state, log = eng.run_segment(None, state, res, steps)
    log = jax.device_get(log)
    n = int(log.rows)
    rows = {f: np.asarray(getattr(log, f))[:n].tolist() for f in ("index", "lengths")}
    rows["lanes"] = np.asarray(log.lanes)[:n].tolist()
    return state, log, rows


def test_segment_1_stops_when_the_log_could_not_hold_another_step():
    """The module docstring's hand-worked segment 1, and segment 2 after it
    (steps 4-6: episodes 2, 4 and 6 end; the log is full again)."""
    eng = count_engine()
    first = eng.first_carry(np.arange(8, dtype=np.int32))
    state, log, rows = segment(eng, (first.lanes, first.agent), first.results)
    assert rows == {"index": [0, 1, 3], "lengths": [1, 2, 1], "lanes": [0, 1, 1]}
    lanes = jax.device_get(state[0])
    assert int(lanes.n_done) == 3 and int(lanes.next_episode) == 5
    # Lane 0 is 2 steps into episode 2; lane 1 was handed episode 4 and
    # begins it on the next step.
    assert lanes.episode.tolist() == [2, 4]
    assert lanes.active.tolist() == [True, False]
    assert lanes.start.tolist() == [False, True] and int(lanes.t[0]) == 2
    assert int(log.env_steps) == 6  # both lanes ran steps 1-3
    # Segment 2: lane 0 ends 2 (step 4) and takes 5; lane 1 ends 4 (step 5),
    # takes 6, ends it (step 6) and takes 7.
    state, log, rows = segment(eng, state, log)
    assert rows == {"index": [2, 4, 6], "lengths": [3, 2, 1], "lanes": [0, 1, 1]}
    lanes = jax.device_get(state[0])
    assert int(lanes.next_episode) == 8 and lanes.episode.tolist() == [5, 7]


def test_a_segment_of_max_steps():
    """One step: only episode 0 (length 1) ends, and lane 0 takes episode 2."""
    eng = make_engine(2, 4)
    first = eng.first_carry(np.arange(8, dtype=np.int32))
    state, log, rows = segment(eng, (first.lanes, first.agent), first.results, 1)
    assert rows == {"index": [0], "lengths": [1], "lanes": [0]}
    assert int(jax.device_get(state[0]).next_episode) == 3


def test_a_budget_past_the_window_segment_by_segment():
    """60 episodes of shuffled seeds over windows of 18: the host puts a new
    window whenever the one at hand does not fit (as the scan backend does),
    copies each log into its book, and every episode has its own seed's
    length and the lane CONTRACT 3 gives it."""
    eng = count_engine()
    seeds = np.random.default_rng(0).permutation(200)[:60].astype(np.int32)
    lengths = [int(s) % 3 + 1 for s in seeds]
    lanes_want, _ = schedule(lengths, 2)
    first = eng.first_carry(seeds)
    state, res = (first.lanes, first.agent), first.results
    base, book, windows = 0, None, 1
    for _ in range(200):
        state, log = eng.run_segment(None, state, res, 1000)
        res = log
        log, n_done, next_episode = jax.device_get(
            (log, state[0].n_done, state[0].next_episode)
        )
        book = tally.write(tally.book(log, seeds.size) if book is None else book, log)
        if n_done == seeds.size:
            break
        if not carry.window_fits(eng.config, base, int(next_episode)):
            window = carry.window(eng.config, seeds, int(next_episode))
            state = (carry.with_window(state[0], window), state[1])
            base, windows = int(window["base"]), windows + 1
    assert book.lengths.tolist() == lengths
    assert book.returns.tolist() == [float(x) for x in lengths]
    assert book.lanes.tolist() == lanes_want
    assert book.done.all() and int(book.env_steps) == sum(lengths)
    assert windows > 1  # the run needed more than its first window


# A cheap reset: on every lane, or in tiles --------------------------------------
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-MinAtar"])
@pytest.mark.parametrize("where_lanes", [engine.WHERE_RESET_LANES, 0])
def test_a_cheap_reset_gives_the_reference_episodes_either_way(
    env_id, where_lanes, monkeypatch
):
    """gymnax's reset is cheap: on up to ``WHERE_RESET_LANES`` lanes every lane
    resets in one batch when any starts an episode, past them the starting
    lanes reset in tiles (forced here with 0). Both give each episode of a plain
    loop over gymnax's own functions, on CartPole (whose step reads no key) and
    Breakout-MinAtar (whose sticky actions read the step's key)."""
    import gymnax

    monkeypatch.setattr(engine, "WHERE_RESET_LANES", where_lanes)
    env_obj, env_params = gymnax.make(env_id)
    ref = gymnax_fns(env_obj, env_params)
    act = jax.jit(lambda o: (jnp.sum(o) > 2).astype(jnp.int32))
    result = jaxmesh.evaluate(
        jaxmesh.Model(lambda p, o: act(o), params={}, name=f"cheap{where_lanes}"),
        f"gymnax:{env_id}",
        episodes=50,
        num_envs=40,
        max_episode_steps=300,
    )
    refs = [
        run_episode(*ref, single(lambda o, key: act(o)), int(s), cap=300)
        for s in result.seeds
    ]
    assert_matches(result, refs)
