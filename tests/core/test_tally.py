"""The engine's results pytree (``jaxmesh.core.tally``) on a tiny hand-worked run.

Three episodes on two lanes, each step's reward and info values chosen here,
so that every per-episode number is worked out by hand:

======  =====  ============================  =================  ==========
episode  lane  rewards (return)              info ``x``         ends
======  =====  ============================  =================  ==========
0        0     1, 2, 3 (6.0)                 1, 5, 2            step 2, terminated
1        1     0.5, 0.25 (0.75)              3, 0               step 1, truncated
2        1     4, -1 (3.0)                   -2, -4             step 3, terminated
======  =====  ============================  =================  ==========

Info ``hit`` is 1 only on episode 0's last step. Reductions of ``x``, by
hand: last 2 / 0 / -4, sum 8 / 3 / -6, max 5 / 3 / -2, mean 8/3 / 1.5 / -3;
``hit`` any: True / False / False. Lane 0 runs 3 steps, lane 1 4: 7 env steps.

The run is driven here step by step, as the engine drives it (the rules'
accumulators, ``tally.record`` at the episode's end); the segment path writes
the same episodes into logs of rows and copies them to the host (``book``,
``write``). Besides: the buffer sizes, the start values of the reductions,
info flattening and the first fault.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core import rules, tally

# Per global step, per lane: (episode, reward, x, hit), None where masked.
STEPS = [
    [(0, 1.0, 1, 0), (1, 0.5, 3, 0)],
    [(0, 2.0, 5, 0), (1, 0.25, 0, 0)],
    [(0, 3.0, 2, 1), (2, 4.0, -2, 0)],
    [None, (2, -1.0, -4, 0)],
]
#: The episodes that end on each step, with (terminated, truncated).
ENDS = {(1, 1): (False, True), (2, 0): (True, False), (3, 2): (True, False)}
METRICS = (
    ("x", "last"),
    ("x", "sum"),
    ("x", "max"),
    ("x", "mean"),
    ("hit", "any"),
)
PREDICT_CALLS = {0: 2, 1: 1, 2: 1}  # hand-chosen, as an agent would count them

# The expected results, by hand.
RETURNS = [6.0, 0.75, 3.0]
LENGTHS = [3, 2, 2]
TERMINATED = [True, False, True]
TRUNCATED = [False, True, False]
LANES = [0, 1, 1]
X_LAST, X_SUM, X_MAX, X_MEAN = [2, 0, -4], [8, 3, -6], [5, 3, -2], [8 / 3, 1.5, -3]
HIT_ANY = [True, False, False]
END_ORDER = [1, 0, 2]  # the episodes in the order they end


def drive(res, split=None):
    """Runs ``STEPS`` through the rules' accumulators and ``tally.record``.

    Without a log (``res.rows`` None) each ended episode is written at its
    index (``Engine.run``); with one, at the next free row, its episode index
    in ``Results.index``, and a new segment begins after step ``split``: its
    rows count from 0 again, the run totals go on (``Engine.run_segment``).
    Returns the results after every step (a list).
    """
    n = 2
    acc = [jnp.zeros((n,), tally.metric_dtype(red)) for _, red in METRICS]
    ret, t = np.zeros(n, np.float32), np.zeros(n, np.int32)
    episode = [None, None]
    out = []
    for step, lanes in enumerate(STEPS):
        for j, cur in enumerate(lanes):
            if cur is not None and cur[0] != episode[j]:  # the lane begins one
                episode[j] = cur[0]
                ret[j], t[j] = 0.0, 0
                starting = jnp.arange(n) == j
                acc = [
                    rules.begin_metric(jnp, red, a, None, starting)[0]
                    for a, (_, red) in zip(acc, METRICS, strict=True)
                ]
        active = jnp.asarray([cur is not None for cur in lanes])
        info = {
            name: jnp.asarray([0 if c is None else c[i] for c in lanes])
            for name, i in (("x", 2), ("hit", 3))
        }
        acc = [
            rules.accumulate_metric(jnp, red, a, None, info[name], active)[0]
            for a, (name, red) in zip(acc, METRICS, strict=True)
        ]
        for j, cur in enumerate(lanes):
            if cur is not None:
                ret[j] += cur[1]
                t[j] += 1
        res = res.replace(env_steps=res.env_steps + int(active.sum()))
        for (s, ep), (term, trunc) in ENDS.items():
            if s != step:
                continue
            j = next(j for j, c in enumerate(lanes) if c is not None and c[0] == ep)
            lane = jnp.arange(n) == j
            t_end = jnp.asarray(t)
            metrics = {
                f"{name}_{red}": rules.finalize_metric(jnp, red, a, t_end)
                for a, (name, red) in zip(acc, METRICS, strict=True)
            }
            log = res.rows is not None
            at = jnp.where(lane, res.rows if log else ep, res.returns.shape[0])
            extra = {}  # the other lanes' entries are out of range: dropped
            if log:
                extra["index"] = jnp.full((n,), ep)
            res = tally.record(
                res,
                at,
                returns=jnp.asarray(ret),
                lengths=t_end,
                terminated=jnp.full((n,), term),
                truncated=jnp.full((n,), trunc),
                predict_calls=jnp.full((n,), PREDICT_CALLS[ep]),
                lanes=jnp.arange(n),
                done=jnp.ones((n,), bool),
                metrics=metrics,
                **extra,
            )
            if log:
                res = res.replace(rows=res.rows + 1)
        out.append(res)
        if step == split:
            res = res.replace(rows=jnp.int32(0))
    return out


NAMED = tuple((f"{name}_{red}", red) for name, red in METRICS)


def check_episodes(res, first=3):
    """``res``'s first episodes against the hand-worked table."""
    np.testing.assert_allclose(np.asarray(res.returns)[:first], RETURNS[:first])
    assert np.asarray(res.lengths)[:first].tolist() == LENGTHS[:first]
    assert np.asarray(res.terminated)[:first].tolist() == TERMINATED[:first]
    assert np.asarray(res.truncated)[:first].tolist() == TRUNCATED[:first]
    assert np.asarray(res.lanes)[:first].tolist() == LANES[:first]
    assert np.asarray(res.predict_calls)[:first].tolist() == [2, 1, 1][:first]
    assert np.asarray(res.done)[:first].all()
    m = {k: np.asarray(v)[:first] for k, v in res.metrics.items()}
    np.testing.assert_array_equal(m["x_last"], X_LAST[:first])
    np.testing.assert_array_equal(m["x_sum"], X_SUM[:first])
    np.testing.assert_array_equal(m["x_max"], X_MAX[:first])
    np.testing.assert_allclose(m["x_mean"], X_MEAN[:first], rtol=1e-6)
    assert m["hit_any"].tolist() == HIT_ANY[:first]


def test_a_run_indexed_by_episode():
    res = tally.empty(4, 2, metrics=NAMED)
    after = drive(res)
    last = after[-1]
    check_episodes(last)
    # Capacity 4, budget 3: the fourth entry is never written.
    assert not bool(last.done[3]) and float(last.returns[3]) == 0.0
    assert int(last.env_steps) == 7
    # After step 1 only episode 1 has ended; after step 2, 0 and 1.
    assert np.asarray(after[1].done).tolist() == [False, True, False, False]
    assert np.asarray(after[2].done).tolist() == [True, True, False, False]
    assert float(after[2].returns[0]) == 6.0 and float(after[2].returns[2]) == 0.0


def test_a_segments_log_copied_to_the_host():
    """Rows in the order the episodes end (1, 0, 2), each naming its episode;
    two segments (the first ends after step 1), each log copied to the host
    by ``write`` into the buffers ``book`` made, indexed by episode."""
    log = tally.empty(4, 2, metrics=NAMED, log=True)
    full = drive(log)[-1]
    assert int(full.rows) == 3
    assert np.asarray(full.index)[:3].tolist() == END_ORDER
    np.testing.assert_allclose(
        np.asarray(full.returns)[:3], [RETURNS[e] for e in END_ORDER]
    )
    # Segment 1 wrote episode 1 (row 0); segment 2's log starts its rows at 0
    # again and holds episodes 0 and 2.
    after = drive(log, split=1)
    seg1, seg2 = jax.tree.map(np.asarray, (after[1], after[-1]))
    assert int(seg1.rows) == 1 and int(seg2.rows) == 2
    assert seg2.index[:2].tolist() == [0, 2]
    host = tally.book(seg1, 3)
    assert host.index is None and host.rows is None
    assert np.asarray(host.returns).tolist() == [0.0, 0.0, 0.0]
    host = tally.write(host, seg1)
    assert np.asarray(host.done).tolist() == [False, True, False]
    assert float(host.returns[1]) == 0.75
    host = tally.write(host, seg2)
    check_episodes(host)
    assert int(host.env_steps) == 7  # the last log's run totals


def test_record_drops_an_entry_out_of_range():
    res = tally.empty(2, 3)
    res = tally.record(
        res,
        jnp.asarray([1, 2, 5]),
        returns=jnp.asarray([1.5, 2.5, 3.5]),
        lengths=jnp.asarray([4, 5, 6]),
    )
    assert np.asarray(res.returns).tolist() == [0.0, 1.5]
    assert np.asarray(res.lengths).tolist() == [0, 4]


def test_empty_buffers_by_what_is_asked():
    res = tally.empty(8, 3, np, metrics=(("x", "sum"), ("hit", "any")))
    for name in tally.EPISODE_FIELDS + ("done",):
        assert getattr(res, name).shape == (8,)
        assert not getattr(res, name).any()
    assert res.returns.dtype == np.float32 and res.lengths.dtype == np.int32
    assert res.terminated.dtype == bool
    assert res.metrics["x"].dtype == np.float32 and res.metrics["hit"].dtype == bool
    assert res.fault.kind.shape == (3,) and res.fault.value.dtype == np.float32
    assert res.index is None and res.rows is None
    assert all(getattr(res, f) is None for f in tally.SUCCESS_FIELDS)
    # A JAX env's success: no presence masks; with at-reset flags.
    ok = tally.empty(8, 3, np, success=True, has_success=False, at_reset=True)
    present = [f for f in tally.SUCCESS_FIELDS if getattr(ok, f) is not None]
    assert present == ["success", "success_once", "success_at_reset"]
    # A host-stepped env's: every flag with its presence mask.
    host = tally.empty(8, 3, np, success=True, at_reset=True)
    assert all(getattr(host, f).shape == (8,) for f in tally.SUCCESS_FIELDS)
    log = tally.empty(8, 3, np, log=True)
    assert log.index.shape == (8,) and int(log.rows) == 0


def test_per_episode_and_replacing_it():
    res = tally.empty(2, 1, np, metrics=(("x", "max"),), success=True)
    names = set(tally.per_episode(res))
    assert names == {
        "returns",
        "lengths",
        "terminated",
        "truncated",
        "predict_calls",
        "lanes",
        "done",
        "metrics/x",
        "success",
        "has_success",
        "success_once",
    }
    new = tally.replace_per_episode(
        res, {"metrics/x": np.asarray([7.0, 8.0]), "returns": np.asarray([1.0, 2.0])}
    )
    assert new.metrics["x"].tolist() == [7.0, 8.0]
    assert new.returns.tolist() == [1.0, 2.0]
    assert new.lengths is res.lengths


@pytest.mark.parametrize(
    ("episodes", "capacity"),
    [(0, 4096), (1, 4096), (4096, 4096), (4097, 8192), (10_000, 16_384)],
)
def test_capacity_for_a_budget(episodes, capacity):
    assert tally.capacity_for(episodes) == capacity


@pytest.mark.parametrize(
    ("n", "pow2"), [(0, 1), (1, 1), (2, 2), (3, 4), (5, 8), (1024, 1024), (1025, 2048)]
)
def test_pow2_at_least(n, pow2):
    assert tally.pow2_at_least(n) == pow2


@pytest.mark.parametrize(
    ("lanes", "rows"),
    # 32 rows per lane, at least 1024, a power of two: 33 lanes -> 1056 -> 2048
    [(1, 1024), (32, 1024), (33, 2048), (64, 2048), (100, 4096)],
)
def test_log_capacity_by_the_lanes(lanes, rows):
    assert tally.log_capacity(lanes) == rows


@pytest.mark.parametrize(
    ("reduction", "start", "dtype"),
    [
        ("any", False, bool),
        ("max", -np.inf, np.float32),
        ("sum", 0.0, np.float32),
        ("mean", 0.0, np.float32),
        ("last", np.nan, np.float32),
    ],
)
def test_each_reduction_starts_from_its_own_value(reduction, start, dtype):
    np.testing.assert_array_equal(tally.metric_start(reduction), start)
    assert tally.metric_dtype(reduction) is dtype


def test_info_leaves_flatten_nested_mappings():
    info = {"a": 1, "b": {"c": 2, "d": {"e": 3}}, "f": np.zeros(2)}
    leaves = tally.info_leaves(info)
    assert list(leaves) == ["a", "b/c", "b/d/e", "f"]
    assert [leaves[k] for k in ("a", "b/c", "b/d/e")] == [1, 2, 3]
    assert tally.info_leaves(None) == {} and tally.info_leaves((1, 2)) == {}


def test_a_lanes_first_fault_is_kept_and_the_lowest_episode_reported():
    fault = tally.empty(4, 3).fault
    assert fault.first() is None
    # Step 2 of episode 5 on lane 1: a NaN action (kind 2).
    fault = fault.update(
        jnp.asarray([0, 2, 0]),
        jnp.asarray([0.0, jnp.nan, 0.0]),
        jnp.asarray([4, 5, 6]),
        jnp.asarray([1, 2, 3]),
    )
    # Later, lane 0 (episode 4) and lane 1 (episode 5) again: lane 1 keeps
    # its first fault.
    fault = fault.update(
        jnp.asarray([1, 3, 0]),
        jnp.asarray([7.0, 9.0, 0.0]),
        jnp.asarray([4, 5, 6]),
        jnp.asarray([8, 9, 9]),
    )
    assert np.asarray(fault.kind).tolist() == [1, 2, 0]
    assert np.asarray(fault.step).tolist() == [8, 2, 0]
    assert np.isnan(float(fault.value[1]))
    # The lowest episode among the faults: episode 4, on lane 0.
    want = {"kind": 1, "episode": 4, "step": 8, "lane": 0, "value": 7.0}
    assert fault.first() == want


def test_an_empty_recording_has_a_row_per_recorded_episode():
    obs = {"pos": jax.ShapeDtypeStruct((2,), jnp.float32)}
    rec = tally.empty_recording([3, 7], 5, obs, (3,), jnp.float32)
    assert np.asarray(rec.episodes).tolist() == [3, 7]
    assert rec.observations["pos"].shape == (2, 6, 2)  # reset + 5 steps
    assert rec.actions.shape == (2, 5, 3) and rec.rewards.shape == (2, 5)
    assert rec.terminated.dtype == bool and rec.states is None
    states = {"qpos": jax.ShapeDtypeStruct((4,), jnp.float32)}
    rec = tally.empty_recording([1], 2, obs, (), jnp.int32, np, states)
    assert rec.states["qpos"].shape == (1, 3, 4)
    assert isinstance(rec.actions, np.ndarray) and rec.actions.dtype == np.int32
