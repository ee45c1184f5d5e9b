"""What every driver hands its hooks (``jaxmesh.run.stream``), on fake hooks and
numpy results: finished episodes in episode order, steps in lane order with
their chunk position, the first hook error kept, a bad value raised with the
fix, and the frame of a run (compile, loop, hooks, failure)."""

from __future__ import annotations

import numpy as np
import pytest

import jaxmesh
from jaxmesh.core import tally
from jaxmesh.run import stream


class Hooks:
    """Records every hook call as ``(name, value)``."""

    def __init__(self, fail_at_step=None):
        self.calls = []
        self.fail_at_step = fail_at_step

    def on_episode_end(self, ep):
        self.calls.append(("episode", (ep.index, ep.seed, ep.return_, ep.lane)))

    def on_step(self, event):
        if event.t == self.fail_at_step:
            raise RuntimeError(f"hook failed at step {event.t}")
        self.calls.append(("step", (event.lane, event.t, event.planned, event.stale)))

    def on_run_end(self, result):
        self.calls.append(("run_end", result))


# Hooks ---------------------------------------------------------------------------
def test_hooks_list_takes_none_one_or_many():
    h = Hooks()
    assert stream.hooks_list(None) == []
    assert stream.hooks_list(h) == [h]
    assert stream.hooks_list([h, h]) == [h, h]


def test_an_object_without_hook_methods_is_refused():
    with pytest.raises(TypeError, match=r"hooks: 42 has none of the methods"):
        stream.hooks_list([Hooks(), 42])


def test_call_skips_hooks_without_the_method():
    class OnlyEnd:
        def __init__(self):
            self.got = []

        def on_run_end(self, result):
            self.got.append(result)

    a, b = OnlyEnd(), Hooks()
    stream.call([a, b], "on_run_end", "r")
    stream.call([a, b], "on_fault", {"event": "x"})  # neither has it
    assert a.got == ["r"] and b.calls == [("run_end", "r")]


# Steps ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("h", "lead", "planned", "stale"),
    [
        # h = 1: every step plans, synchronously
        (1, 0, [1, 1, 1, 1, 1, 1], [0] * 6),
        # h = 3 without a lead: steps 0 and 3 start chunks
        (3, 0, [1, 0, 0, 1, 0, 0], [0] * 6),
        # h = 3, lead 2: the first chunk is synchronous, the next ones were
        # planned 2 steps before they started
        (3, 2, [1, 0, 0, 1, 0, 0], [0, 0, 0, 2, 2, 2]),
    ],
)
def test_chunk_position(h, lead, planned, stale):
    got_planned, got_stale = stream.chunk_position(np.arange(6), h, lead)
    assert got_planned.tolist() == [bool(p) for p in planned]
    assert got_stale.tolist() == stale


def test_step_stream_emits_in_the_given_order():
    hooks = Hooks()
    steps = stream.StepStream([hooks, object()], 2, 1)
    assert steps
    ok = steps.emit(
        np.array([0, 2]),
        np.array([5, 6]),
        np.array([1, 2]),
        np.array([0.5, 1.5]),
        np.array([1.0, 2.0]),
        np.array([False, True]),
        np.array([False, False]),
    )
    assert ok
    assert hooks.calls == [("step", (0, 1, False, 0)), ("step", (2, 2, True, 1))]
    assert not stream.StepStream([object()], 1, 0)  # no hook has on_step


def test_emit_masked_takes_the_stepped_lanes():
    hooks = Hooks()
    steps = stream.StepStream([hooks], 1, 0)
    n = 4
    stepped = np.array([True, False, False, True])
    values = [np.arange(n)] * 2 + [np.zeros(n)] * 2 + [np.zeros(n, bool)] * 2
    assert steps.emit_masked(stepped, *values)
    assert [lane for _, (lane, *_) in hooks.calls] == [0, 3]
    assert steps.emit_masked(np.zeros(n, bool), *values)  # nothing stepped


def test_the_first_hook_error_is_kept_and_nothing_follows_it():
    hooks = Hooks(fail_at_step=1)
    steps = stream.StepStream([hooks], 1, 0)

    def emit(lanes, t):
        m = len(lanes)
        zeros = [np.zeros(m)] * 3 + [np.zeros(m, bool)] * 2
        episodes, actions, rewards, term, trunc = zeros
        return steps.emit(
            np.array(lanes), episodes, np.array(t), actions, rewards, term, trunc
        )

    assert not emit([0, 1, 2], [0, 1, 0])
    assert hooks.calls == [("step", (0, 0, True, 0))]  # lane 2's step never sent
    assert not emit([0], [0])
    assert hooks.calls == [("step", (0, 0, True, 0))]
    with pytest.raises(RuntimeError, match="hook failed at step 1"):
        steps.raise_error()
    steps.raise_error()  # raised once


# Episodes ------------------------------------------------------------------------
def results(n_episodes=3, lanes=2):
    res = tally.empty(n_episodes, lanes, np)
    res.returns[:] = [10.0, 20.0, 30.0][:n_episodes]
    res.lanes[:] = [0, 1, 0][:n_episodes]
    return res


def test_episodes_are_reported_in_episode_order():
    """Episode 1 ends first; it waits until episode 0 has ended."""
    hooks, seen = Hooks(), []
    seeds = np.array([7, 8, 9])
    out = stream.EpisodeStream([hooks], seeds, seen.append, {})
    res = results()
    res.done[1] = True
    out.update(res)
    assert hooks.calls == [] and seen == []
    res.done[0] = True
    out.update(res)
    assert hooks.calls == [
        ("episode", (0, 7, 10.0, 0)),
        ("episode", (1, 8, 20.0, 1)),
    ]
    assert seen == [0, 1]
    res.done[2] = True
    out.update(res)
    out.update(res)  # nothing new: nothing reported twice
    assert seen == [0, 1, 2]
    assert out.wants_episodes
    assert not stream.EpisodeStream([], seeds, None, {}).wants_episodes


def test_a_device_fault_is_raised_with_where_and_the_fix():
    out = stream.EpisodeStream([], np.array([11, 12]), None, {})
    res = results(2, 2)
    out.check_fault(res)  # no fault: nothing raised
    res.fault.kind[1] = tally.ACTION_NOT_FINITE
    res.fault.episode[1] = 1
    res.fault.step[1] = 4
    res.fault.value[1] = np.inf
    with pytest.raises(jaxmesh.BadValueError, match=r"NaN/inf") as info:
        out.check_fault(res)
    e = info.value
    assert (e.kind, e.episode, e.seed, e.step, e.lane) == (
        tally.ACTION_NOT_FINITE,
        1,
        12,
        4,
        1,
    )
    assert "episode 1 (seed 12), step 4, lane 1" in str(e)


def test_before_any_results_a_failure_keeps_nothing():
    out = stream.EpisodeStream([], np.array([1, 2]), None, {})
    exc = RuntimeError("boom")
    out.fail(exc, {"wall_time": 0.0})
    assert exc.partial_result is None
    assert "0 of 2 episodes had finished" in exc.__notes__[0]


# The frame of a run ----------------------------------------------------------------
class FakeEpisodes:
    """What ``drive`` uses of an ``EpisodeStream``."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.failed = None

    def result(self, res, timing):
        return {"res": res, **timing}

    def fail(self, exc, timing):
        self.failed = (exc, timing)


def test_drive_compiles_runs_and_reports():
    hooks = Hooks()
    out = FakeEpisodes([hooks])
    result = stream.drive(out, 0.0, lambda: 1.5, lambda: "results")
    assert result["res"] == "results" and result["compile_time"] == 1.5
    assert result["wall_time"] >= result["run_time"] >= 0.0
    assert hooks.calls == [("run_end", result)]
    assert out.failed is None


def test_drive_hands_a_failure_to_the_stream_and_raises_it():
    out = FakeEpisodes([Hooks()])

    def loop():
        raise ValueError("the loop failed")

    with pytest.raises(ValueError, match="the loop failed"):
        stream.drive(out, 0.0, lambda: 0.0, loop)
    exc, timing = out.failed
    assert isinstance(exc, ValueError) and timing["run_time"] == 0.0
    assert out.hooks[0].calls == []  # no on_run_end after a failure
