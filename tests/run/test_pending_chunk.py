"""Real-time-chunking inputs (CONTRACT 29): ``jaxmesh.adapt.PendingChunk``.

A policy that blends its own plan with the tail of its previous chunk is run
against a plain loop written here from the rule, not from the engine: a chunk
planned from the observation of step s has its entry i meant for step s + i
(CONTRACT 10 and 23: under a delay d its first d entries are skipped), and a
plan at step t is shown, as entry j, the previous chunk's entry for step t + j
(zeros and a False mask where it has none, and at an episode's first plan).
The chunk's entries differ per step, so a tail shifted by one changes the
actions; the nearest wrong rule is shown to give other returns.
"""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import fold, gymnax_fns

import jaxmesh
from jaxmesh.adapt import PendingChunk, State

K = 8  # chunk length
H = 4  # horizon
CAP = 13  # steps per episode (not a multiple of H)
SEEDS = [5, 2, 7, 11]
#: 3 lanes over 4 episodes: a lane is reused and plans are gathered from some
#: lanes of a tile, what one lane shows and more (one lane is checked by hand in
#: test_what_the_first_plans_see).
LANES = 3
W = jnp.asarray([0.7, -1.3, 0.4])


def own_plan(obs):
    """K actions, each step's differing from the last by 0.3."""
    return (jnp.tanh(jnp.dot(obs, W)) + 0.3 * jnp.arange(K) - 1.0)[:, None]


def blend(own, actions, mask, delay):
    """The new chunk: half own plan, half the pending tail where it is valid,
    moved by the delay (so the delay the policy is shown counts too)."""
    mixed = jnp.where(mask[:, None], 0.5 * own + 0.5 * actions, own)
    return mixed + 0.05 * delay


def rtc(inp):
    pending = inp["pending"]
    assert pending["delay"].shape == () and pending["mask"].dtype == jnp.bool_
    actions, mask, delay = pending["actions"], pending["mask"], pending["delay"]
    return blend(own_plan(inp["obs"]), actions, mask, delay)


MODEL = jaxmesh.Model(rtc, spec={"obs": State(), "pending": PendingChunk()})


@jax.jit
def _plan_np(obs, actions, mask, delay):
    return blend(own_plan(obs), actions, mask, delay)


# The reference rule ------------------------------------------------------------
class RtcRule:
    """CONTRACT 10/12/23 replay, and the tail of CONTRACT 29 from step alignment.

    A delay d plans at the playing chunk's cursor h - d a chunk whose entry i is
    for step t + i (it plays from entry d); a prefetch lead L plans there (at
    h - L) a chunk whose entry i is for step t + L + i (it plays from entry 0).
    ``shift`` moves the tail by that many entries: the nearest wrong rule.
    """

    def __init__(self, h, d, shift=0, lead=0):
        self.h, self.d, self.shift, self.lead, self.calls = h, d, shift, lead, 0

    def plan(self, t, obs, meant_for):
        """A chunk whose entry 0 is meant for step ``meant_for``."""
        actions, mask = np.zeros((K, 1), np.float32), np.zeros(K, bool)
        if self.last is not None:
            s, chunk = self.last  # its entry i is for step s + i
            for j in range(K):
                i = meant_for + j - s + self.shift
                if 0 <= i < K:
                    actions[j], mask[j] = chunk[i], True
        chunk = np.asarray(_plan_np(jnp.asarray(obs), actions, mask, self.d))
        self.last = (meant_for, chunk)
        self.calls += 1
        return chunk

    def act(self, t, obs):
        h, d, lead = self.h, self.d, self.lead
        early = d or lead  # the next plan is made this many steps early
        if t == 0:
            self.last = None
            self.playing, self.offset, self.pos = self.plan(t, obs, t), 0, 0
        if self.pos == h:  # exhausted: a plan now, or the early one takes over
            if early == 0:
                self.playing, self.offset = self.plan(t, obs, t), 0
            else:
                self.playing, self.offset = self.next, d
            self.pos = 0
        if early and self.pos == h - early:
            self.next = self.plan(t, obs, t + lead)
        action = self.playing[self.offset + self.pos]
        self.pos += 1
        return action


GYMNAX = None  # (env, params) with episodes of CAP steps
GYMNAX_FNS = None  # its (reset, step), jitted once


@pytest.fixture(scope="module", autouse=True)
def _gymnax():
    global GYMNAX, GYMNAX_FNS
    env, params = gymnax.make("Pendulum-v1")
    GYMNAX = (env, params.replace(max_steps_in_episode=CAP))
    GYMNAX_FNS = gymnax_fns(*GYMNAX)


def run_reference(env_kind, rule_of):
    """Per seed (return, length, plans) of the plain loop with a fresh rule."""
    out = []
    for seed in SEEDS:
        rule = rule_of()
        if env_kind == "gymnax":
            reset, step = GYMNAX_FNS
            key = jax.random.PRNGKey(seed)
            obs, state = reset(key)
        else:
            env = gym.make("Pendulum-v1")
            obs, _ = env.reset(seed=seed)
        ret, t, done = 0.0, 0, False
        while not done:
            action = np.asarray(rule.act(t, np.asarray(obs)), np.float32)
            if env_kind == "gymnax":
                obs, state, r, term, trunc = step(
                    fold(key, 0, t), state, jnp.asarray(action)
                )
            else:
                obs, r, term, trunc, _ = env.step(action)
            ret += float(r)
            t += 1
            done = bool(term) or bool(trunc) or t >= CAP
        out.append((ret, t, rule.calls))
    return out


def run(env_kind, num_envs, **kw):
    env = GYMNAX if env_kind == "gymnax" else "gymnasium:Pendulum-v1"
    cap = {} if env_kind == "gymnax" else {"max_episode_steps": CAP}
    return jaxmesh.evaluate(
        MODEL, env, num_envs=num_envs, seeds=SEEDS, horizon=H, **cap, **kw
    )


def assert_reference(result, ref):
    np.testing.assert_allclose(result.returns, [r[0] for r in ref], rtol=2e-5)
    np.testing.assert_array_equal(result.lengths, [r[1] for r in ref])
    np.testing.assert_array_equal(result.predict_calls, [r[2] for r in ref])


@pytest.mark.parametrize("d", [0, 2])
@pytest.mark.parametrize("env_kind", ["gymnax", "gymnasium"])
def test_pending_chunk_matches_the_rule(env_kind, d):
    ref = run_reference(env_kind, lambda: RtcRule(H, d))
    assert_reference(run(env_kind, LANES, chunking=jaxmesh.Chunking(delay=d)), ref)
    # The tail one entry late, or never shown: other returns.
    for wrong in (lambda: RtcRule(H, d, shift=1), lambda: RtcRule(H, d, shift=K)):
        got = [r[0] for r in run_reference(env_kind, wrong)]
        assert not np.allclose([r[0] for r in ref], got, rtol=1e-4)


def test_what_the_first_plans_see():
    """By hand, gymnax, h = 4, d = 2: the first plan sees nothing; the second
    (step 2) the first chunk's entries 2..7 (two to run, then the rest); the
    third (step 6) the second chunk's entries 4..7."""
    seen = []

    def spy(inp):
        p = inp["pending"]
        jax.debug.callback(
            lambda a, m, d: seen.append((np.array(a[:, 0]), np.array(m), int(d))),
            p["actions"],
            p["mask"],
            p["delay"],
        )
        return jnp.broadcast_to(jnp.arange(K, dtype=jnp.float32)[:, None], (K, 1)) + (
            10 * p["mask"].sum()
        )

    model = jaxmesh.Model(spy, spec={"obs": State(), "pending": PendingChunk()})
    jaxmesh.evaluate(
        model,
        GYMNAX,
        num_envs=1,
        episodes=1,
        horizon=H,
        chunking=jaxmesh.Chunking(delay=2),
    )
    # One call per row of a plan's tile (its padding rows repeat the lane).
    plans = [x for i, x in enumerate(seen) if i == 0 or not _same(x, seen[i - 1])]
    (a0, m0, d0), (a1, m1, d1), (a2, m2, _) = plans[:3]
    assert d0 == d1 == 2
    assert not m0.any() and not a0.any()
    # chunk 0 = arange(K) (no mask): entries 2..7, mask 6 long
    np.testing.assert_array_equal(a1, [2, 3, 4, 5, 6, 7, 0, 0])
    np.testing.assert_array_equal(m1, [True] * 6 + [False] * 2)
    # chunk 1 = arange(K) + 60: its entries 4..7
    np.testing.assert_array_equal(a2, [64, 65, 66, 67, 0, 0, 0, 0])
    np.testing.assert_array_equal(m2, [True] * 4 + [False] * 4)


@pytest.mark.parametrize("lead", [2, H])
def test_pending_chunk_under_a_prefetch_lead_matches_the_rule(lead):
    """A lead's chunk starts playing where the old one stops: its tail is the
    old chunk's prev[h:] (at lead = h the first prefetch, planned on the
    episode's first step, sees the chunk planned just before it)."""
    ref = run_reference("gymnax", lambda: RtcRule(H, 0, lead=lead))
    assert_reference(
        run("gymnax", 3, chunking=jaxmesh.Chunking(prefetch_lead=lead)), ref
    )
    wrong = run_reference("gymnax", lambda: RtcRule(H, 0, shift=1, lead=lead))
    assert not np.allclose([r[0] for r in ref], [r[0] for r in wrong], rtol=1e-4)


def _same(x, y):
    return all(np.array_equal(a, b) for a, b in zip(x, y, strict=True))


def test_pending_chunk_errors(no_compile):
    with pytest.raises(ValueError, match="Ensemble.*no chunk's tail"):
        jaxmesh.evaluate(
            MODEL, GYMNAX, chunking=jaxmesh.Chunking(execution=jaxmesh.Ensemble())
        )
    single = jaxmesh.Model(
        lambda inp: own_plan(inp["obs"])[0],
        spec={"obs": State(), "pending": PendingChunk()},
    )
    with pytest.raises(ValueError, match="single actions"):
        jaxmesh.evaluate(single, GYMNAX)
    wrong = jaxmesh.Model(
        lambda inp: own_plan(inp["obs"]),
        spec={"obs": State(), "pending": PendingChunk(4)},
    )
    with pytest.raises(ValueError, match="length=4.*chunks of K=8"):
        jaxmesh.evaluate(wrong, GYMNAX, horizon=H)
    with pytest.raises(ValueError, match="length=0"):
        PendingChunk(length=0)


def test_pending_chunk_on_a_served_env_matches_the_rule():
    from jaxmesh.remote.server import EnvServer

    # In process: the EnvServer ``jaxmesh serve-env`` runs.
    with EnvServer("gymnasium:Pendulum-v1", "127.0.0.1:0", lanes=3) as server:
        got = jaxmesh.evaluate(
            MODEL,
            f"grpc://{server.address}",
            num_envs=3,
            seeds=SEEDS,
            horizon=H,
            chunking=jaxmesh.Chunking(delay=2),
            max_episode_steps=CAP,
        )
    assert_reference(got, run_reference("gymnasium", lambda: RtcRule(H, 2)))


def test_a_sweep_shows_each_lane_its_cells_delay():
    """One program over delays 0 and 2: each cell is the rule's episodes."""
    s = jaxmesh.sweep(MODEL, GYMNAX, delay=[0, 2], horizon=[H], seeds=SEEDS, num_envs=3)
    assert s.programs == 1
    for d in (0, 2):
        assert_reference(
            s.get(delay=d, horizon=H),
            run_reference("gymnax", lambda d=d: RtcRule(H, d)),
        )
