"""Step hooks: ``on_step(jaxmesh.StepEvent)`` on the scan, in process and served.

The reference is a plain loop written from the contract (``reference_loop``:
chunk m covers steps [m*h, (m+1)*h), planned at ``m*h - l`` for m >= 1), whose
env step also logs each step's reward and ends, and ``reference_loop.schedule``
for which lane runs which episode from which run step (CONTRACT 3). Which steps
are planned and how stale their chunks are is written out by hand below.
"""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID
from reference_loop import assert_matches, gymnax_fns, run_episode, schedule

import jaxmesh
from jaxmesh.remote.server import EnvServer

H, LEAD = 4, 2
SEEDS = [3, 1, 4, 15, 9]

#: Steps 0..11 of an episode at h = 4, lead 2, worked out from CONTRACT 10 and
#: 12: a chunk starts at t = 0, 4, 8 (planned); the first is planned from the
#: reset observation (stale 0), the others 2 steps before they start.
PLANNED = [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
STALE = [0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2]


def chunk4(obs):
    """Deterministic chunks of 4 that wobble (CartPole episodes of ~10-40 steps)."""
    a = (obs[2] > 0).astype(jnp.int32)
    return jnp.stack([a, 1 - a, a, a])


class Log:
    """A hook that keeps every step event and episode end, in arrival order."""

    def __init__(self):
        self.calls = []

    def on_step(self, event):
        self.calls.append(("step", event))

    def on_episode_end(self, ep):
        self.calls.append(("end", ep.index))

    @property
    def events(self):
        return [e for kind, e in self.calls if kind == "step"]


class Ends:
    """A hook without ``on_step``."""

    def on_episode_end(self, ep):
        pass


class Boom(Exception):
    pass


class RaisesAt:
    """An on_step hook that raises ``Boom`` on its ``at``-th event."""

    def __init__(self, at):
        self.at, self.seen = at, 0

    def on_step(self, event):
        self.seen += 1
        if self.seen == self.at:
            raise Boom(f"hook failed at event {self.seen}")


# The reference -----------------------------------------------------------------
def reference(reset, step, seeds):
    """Per episode: the reference ``Episode`` and its steps' (reward, term, trunc)."""
    fn = jax.jit(chunk4)
    out = []
    for seed in seeds:
        log = []

        def logged(key, state, action, log=log):
            obs, state, reward, term, trunc = step(key, state, action)
            log.append((float(reward), bool(term), bool(trunc)))
            return obs, state, reward, term, trunc

        ep = run_episode(reset, logged, lambda x, k: fn(x), seed, horizon=H, lead=LEAD)
        out.append((ep, log))
    return out


def expected_steps(episode, ep, log):
    """The events of one episode, by hand: (episode, t, action, reward, ends,
    planned, stale), t ascending."""
    rows = []
    for t, (a, (r, te, tr)) in enumerate(zip(ep.actions, log, strict=True)):
        planned = t % H == 0
        stale = 0 if t < H else LEAD
        if t < len(PLANNED):  # the table above, checked against the rule
            assert (planned, stale) == (bool(PLANNED[t]), STALE[t])
        rows.append((episode, t, int(a), r, te, tr, planned, stale))
    return rows


def row(e):
    return (e.episode, e.t, int(e.action), e.reward, e.terminated, e.truncated,
            e.planned, e.stale)  # fmt: skip


def expected_in_step_order(refs, n):
    """Every event of the run, in run-step order and ascending lane (CONTRACT 3)."""
    lanes, starts = schedule([ep.length for ep, _ in refs], n)
    keyed = []
    for i, (ep, log) in enumerate(refs):
        for r in expected_steps(i, ep, log):
            keyed.append(((starts[i] + r[1], lanes[i]), (lanes[i],) + r))
    return [v for _, v in sorted(keyed)]


def check_order_with_episode_ends(log):
    """An episode's last step event comes before its on_episode_end."""
    last_step = {}
    for k, (kind, x) in enumerate(log.calls):
        if kind == "step" and (x.terminated or x.truncated):
            last_step[x.episode] = k
        if kind == "end":
            assert last_step[x] < k


# Scan path (gymnax) ------------------------------------------------------------
@pytest.fixture(scope="module")
def gymnax_refs():
    env, params = gymnax.make("CartPole-v1")
    reset, step = gymnax_fns(env, params)
    return reference(reset, step, SEEDS)


@pytest.mark.parametrize("n", [1, 3])
def test_scan_events_equal_the_plain_loop(gymnax_refs, n):
    log = Log()
    kw = dict(
        horizon=H,
        chunking=jaxmesh.Chunking(prefetch_lead=LEAD),
        num_envs=n,
        seeds=SEEDS,
    )
    got = jaxmesh.evaluate(chunk4, "gymnax:CartPole-v1", hooks=log, **kw)
    plain = jaxmesh.evaluate(chunk4, "gymnax:CartPole-v1", **kw)
    got_rows = [(e.lane,) + row(e) for e in log.events]
    assert got_rows == expected_in_step_order(gymnax_refs, n)
    assert all(isinstance(e, jaxmesh.StepEvent) for e in log.events)
    assert all(isinstance(e.action, np.ndarray | np.generic) for e in log.events)
    check_order_with_episode_ends(log)
    # Hooks never change results.
    assert_matches(got, [ep for ep, _ in gymnax_refs])
    for field in ("returns", "lengths", "terminated", "truncated", "predict_calls"):
        np.testing.assert_array_equal(getattr(got, field), getattr(plain, field))


def test_scan_without_on_step_compiles_the_plain_program():
    ev = jaxmesh.Evaluator(chunk4, "gymnax:CartPole-v1", horizon=H, num_envs=2)
    ev.run(episodes=2, hooks=Ends())
    [plain_key] = ev.programs()
    ev.run(episodes=2, hooks=Log())
    [events_key] = [k for k in ev.programs() if k != plain_key]
    assert events_key[-1] == "on_step"
    plain_text = ev._programs[plain_key].segment.as_text().lower()
    events_text = ev._programs[events_key].segment.as_text().lower()
    # The callback is an instruction named after it ("%io_callback.10 = ...").
    assert "%io_callback" not in plain_text
    assert "%io_callback" in events_text
    # A second run with a step hook reuses its program.
    ev.run(episodes=3, hooks=Log())
    assert len(ev.programs()) == 2


def test_scan_hook_that_raises_ends_the_run_with_its_own_exception(gymnax_refs):
    hook = RaisesAt(40)
    with pytest.raises(Boom, match="event 40") as info:
        jaxmesh.evaluate(
            chunk4,
            "gymnax:CartPole-v1",
            horizon=H,
            chunking=jaxmesh.Chunking(prefetch_lead=LEAD),
            num_envs=3,
            seeds=SEEDS,
            hooks=hook,
        )
    assert hook.seen == 40  # no event after the one that raised
    partial = info.value.partial_result
    refs = [ep for ep, _ in gymnax_refs]
    # Finished episodes only, each equal to the loop; the run stopped early.
    assert partial.num_episodes < len(SEEDS)
    assert_matches(partial, [refs[i] for i in partial.indices])
    # Every episode whose last step came before event 40 is in it.
    order = expected_in_step_order(gymnax_refs, 3)
    ended = {r[1] for r in order[:40] if r[5] or r[6]}
    assert set(partial.indices.tolist()) == ended


def test_scan_step_hooks_with_devices_are_refused_before_compiling():
    with pytest.raises(ValueError, match="on_step.*devices="):
        jaxmesh.evaluate(
            chunk4,
            "gymnax:CartPole-v1",
            num_envs=1,
            hooks=Log(),
            layout=jaxmesh.Layout(devices=1),
        )


# Host-stepped: gymnasium in process, and served ----------------------------------
@pytest.fixture(scope="module")
def gym_refs():
    env = gym.make(ID)
    out = []
    for seed in SEEDS:

        def reset(key, seed=seed):
            return env.reset(seed=seed)[0], None

        def step(key, state, action):
            obs, reward, term, trunc, _ = env.step(int(action))
            return obs, None, reward, term, trunc

        out += reference(reset, step, [seed])
    return out


def test_in_process_events_equal_the_plain_loop(gym_refs):
    log = Log()
    kw = dict(horizon=H, chunking=jaxmesh.Chunking(prefetch_lead=LEAD), seeds=SEEDS)
    got = jaxmesh.evaluate(chunk4, [gym.make(ID) for _ in range(3)], hooks=log, **kw)
    plain = jaxmesh.evaluate(chunk4, [gym.make(ID) for _ in range(3)], **kw)
    assert [(e.lane,) + row(e) for e in log.events] == expected_in_step_order(
        gym_refs, 3
    )
    check_order_with_episode_ends(log)
    assert_matches(got, [ep for ep, _ in gym_refs])
    np.testing.assert_array_equal(got.returns, plain.returns)
    np.testing.assert_array_equal(got.lengths, plain.lengths)


def test_in_process_hook_that_raises_keeps_finished_episodes(gym_refs):
    hook = RaisesAt(30)
    with pytest.raises(Boom) as info:
        jaxmesh.evaluate(
            chunk4,
            [gym.make(ID) for _ in range(3)],
            horizon=H,
            chunking=jaxmesh.Chunking(prefetch_lead=LEAD),
            seeds=SEEDS,
            hooks=hook,
        )
    assert hook.seen == 30
    partial = info.value.partial_result
    order = expected_in_step_order(gym_refs, 3)
    assert set(partial.indices.tolist()) == {r[1] for r in order[:30] if r[5] or r[6]}
    refs = [ep for ep, _ in gym_refs]
    assert_matches(partial, [refs[i] for i in partial.indices])


def test_served_events_equal_the_plain_loop_per_lane(gym_refs):
    log = Log()
    kw = dict(
        horizon=H,
        chunking=jaxmesh.Chunking(prefetch_lead=LEAD),
        num_envs=2,
        seeds=SEEDS,
    )
    with EnvServer([gym.make(ID) for _ in range(2)], "127.0.0.1:0") as server:
        url = f"grpc://{server.address}"
        got = jaxmesh.evaluate(chunk4, url, hooks=log, **kw)
        plain = jaxmesh.evaluate(chunk4, url, **kw)
        with pytest.raises(Boom) as info:
            jaxmesh.evaluate(chunk4, url, hooks=RaisesAt(25), **kw)
    refs = [ep for ep, _ in gym_refs]
    assert_matches(got, refs)
    np.testing.assert_array_equal(got.returns, plain.returns)
    np.testing.assert_array_equal(got.lengths, plain.lengths)
    # Served lanes move at their own pace: each lane's events come in its own
    # order, every step of every episode once, on the lane that ran it.
    expected = [
        r for i, (ep, lg) in enumerate(gym_refs) for r in expected_steps(i, ep, lg)
    ]
    assert sorted(row(e) for e in log.events) == sorted(expected)
    for j in range(2):
        mine = [row(e) for e in log.events if e.lane == j]
        assert mine == sorted(mine)  # episodes ascending, t ascending
        assert {r[0] for r in mine} == set(np.flatnonzero(got.lanes == j).tolist())
    check_order_with_episode_ends(log)
    partial = info.value.partial_result
    assert partial.num_episodes < len(SEEDS)
    assert_matches(partial, [refs[i] for i in partial.indices])
