"""jaxmesh.evaluate against the reference loop (CONTRACT 1-5, 7-14, 16)."""

from __future__ import annotations

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles
from reference_loop import (
    assert_matches,
    gymnax_fns,
    run_episode,
    schedule,
    single,
)

import jaxmesh
from jaxmesh.adapt import Previous, State
from jaxmesh.run.build import default_plan_tile

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)


def lean(obs):
    """A good deterministic CartPole policy: 500 steps on most seeds."""
    return (obs[2] + 0.1 * obs[3] > 0).astype(jnp.int32)


def angle(obs):
    """Pushes the way the pole leans: episodes of 35-65 steps that differ by seed."""
    return (obs[2] > 0).astype(jnp.int32)


def chunk8(obs):
    """A chunk of 8 actions that depends on the observation."""
    k = jnp.arange(8)
    return (obs[2] + 0.05 * k * obs[3] + 0.01 * obs[1] > 0).astype(jnp.int32)


def noisy_chunk(obs, key):
    p = jax.nn.sigmoid(20.0 * obs[2] + 5.0 * obs[3])
    return jax.random.bernoulli(key, p, (8,)).astype(jnp.int32)


def reference(policy_chunk, seeds, **kw):
    return [run_episode(*REF, policy_chunk, s, **kw) for s in seeds]


SEEDS = [0, 7, 123, 99991, 2**31 - 1]


#: ``angle`` on this many lanes: one program shared by the tests of lanes and
#: budgets (each compiled program costs seconds; the budget is data).
LANES = 4


def test_per_step_policy_matches_reference():
    result = jaxmesh.evaluate(angle, CARTPOLE, num_envs=LANES, seeds=SEEDS)
    refs = reference(single(lambda o, k: angle(o)), SEEDS)
    assert len({r.length for r in refs}) > 1
    assert_matches(result, refs)
    # 5 episodes on 4 lanes: the first lane to finish takes the fifth.
    assert result.lanes.tolist() == schedule([r.length for r in refs], LANES)[0]
    np.testing.assert_array_equal(result.seeds, SEEDS)
    assert result.env_steps == result.lengths.sum()


def test_stochastic_per_step_policy_matches_reference():
    def pol(obs, key):
        return jax.random.bernoulli(key, jax.nn.sigmoid(10 * obs[2])).astype(jnp.int32)

    result = jaxmesh.evaluate(pol, "gymnax:CartPole-v1", num_envs=3, seeds=SEEDS)
    assert_matches(result, reference(single(pol), SEEDS))


@pytest.mark.parametrize("horizon", [1, 3, 8])
def test_chunks_replay_matches_reference(horizon):
    seeds = [1, 2, 3, 4]
    result = jaxmesh.evaluate(
        chunk8, CARTPOLE, horizon=horizon, num_envs=3, seeds=seeds
    )
    assert result.chunk == 8 and result.effective_horizon == horizon
    assert_matches(result, reference(lambda o, k: chunk8(o), seeds, horizon=horizon))


def test_chunk_shorter_than_horizon_uses_k():
    def chunk3(obs):
        return chunk8(obs)[:3]

    seeds = [5, 6, 7]
    result = jaxmesh.evaluate(chunk3, CARTPOLE, horizon=8, num_envs=2, seeds=seeds)
    assert result.effective_horizon == 3
    assert_matches(result, reference(lambda o, k: chunk3(o), seeds, horizon=8))


# l = min(lead, h): 1 (h = 8), h - 1 (h = 3), h itself, and a lead beyond h.
@pytest.mark.parametrize(("horizon", "lead"), [(8, 1), (3, 2), (8, 8), (3, 8)])
def test_prefetch_lead_matches_reference(lead, horizon):
    seeds = [10, 11, 12]
    result = jaxmesh.evaluate(
        noisy_chunk,
        CARTPOLE,
        horizon=horizon,
        chunking=jaxmesh.Chunking(prefetch_lead=lead),
        num_envs=2,
        seeds=seeds,
    )
    refs = reference(noisy_chunk, seeds, horizon=horizon, lead=lead)
    assert_matches(result, refs)
    assert result.asynchronous and "asynchronous" in result.summary()


def test_frame_stack_and_previous_action_match_reference():
    def pol(inp):
        frames, prev = inp["obs"], inp["prev"]
        assert frames.shape == (3, 4) and prev.shape == ()
        score = frames[-1, 2] + 0.5 * (frames[-1, 2] - frames[0, 2]) + 0.01 * prev
        return (score > 0).astype(jnp.int32)

    model = jaxmesh.Model(pol, spec={"obs": State(stack=3), "prev": Previous()})

    def inputs(obs_h, act_h, t):
        frames = jnp.stack([obs_h[max(i, 0)] for i in range(t - 2, t + 1)])
        prev = act_h[t - 1] if t > 0 else jnp.int32(0)
        return {"obs": frames, "prev": prev}

    seeds = [3, 4, 5]
    for horizon in (1, 4):
        chunked = model
        if horizon > 1:
            chunked = jaxmesh.Model(
                lambda inp: jnp.repeat(pol(inp), 4),
                spec={"obs": State(stack=3), "prev": Previous()},
            )
        result = jaxmesh.evaluate(
            chunked, CARTPOLE, horizon=horizon, num_envs=2, seeds=seeds
        )
        refs = reference(
            lambda x, k, horizon=horizon: jnp.repeat(pol(x), horizon),
            seeds,
            horizon=horizon,
            inputs=inputs,
        )
        assert_matches(result, refs)


def test_max_episode_steps_truncates():
    result = jaxmesh.evaluate(
        lambda o: jnp.int32(0) * lean(o) + lean(o),
        CARTPOLE,
        seeds=[0, 1],
        max_episode_steps=9,
    )
    refs = reference(single(lambda o, k: lean(o)), [0, 1], cap=9)
    assert_matches(result, refs)
    assert (result.lengths <= 9).all()
    assert result.truncated[result.lengths == 9].all()


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(32)(x))
        return nn.Dense(3)(x)


ACROBOT = gymnax.make("Acrobot-v1")
ACROBOT_MLP = Mlp().init(jax.random.PRNGKey(1), jnp.zeros(6))


def acrobot_logits(obs):
    """A float MLP plus a push along the second joint's velocity.

    The push makes about half of the episodes swing up (66 to 142 steps) while
    the others hit the cap; the MLP makes the float rounding matter.
    """
    pump = 3.0 * obs[5] * jnp.array([-1.0, 0.0, 1.0])
    return Mlp().apply(ACROBOT_MLP, obs) + pump


def acrobot_policy(obs):
    return jnp.argmax(acrobot_logits(obs)).astype(jnp.int32)


def acrobot_reference(seeds, cap):
    """Reference episodes, and the smallest gap between the two best logits.

    The action is numpy's argmax of the logits, one observation at a time; the
    env's functions are jitted once for all the episodes.
    """
    logits = jax.jit(acrobot_logits)
    gaps = []

    def pol(obs, key):
        z = np.asarray(logits(obs))
        top = np.sort(z)
        gaps.append(top[-1] - top[-2])
        return np.asarray([np.argmax(z)], np.int32)

    fns = gymnax_fns(*ACROBOT)
    refs = [run_episode(*fns, pol, s, cap=cap) for s in seeds]
    return refs, min(gaps)


EPISODE_FIELDS = ("returns", "lengths", "terminated", "truncated", "predict_calls")


def assert_same_episodes(a, b):
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.seeds, b.seeds)
    for f in EPISODE_FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def test_invariance_across_lane_counts_on_chaotic_env():
    """Float MLP on Acrobot: every field of every episode is the same for every N.

    CONTRACT 4. With a pinned ``plan_tile`` the policy sees the same batch size
    whatever N is, so the results are bit-identical by construction. The default
    tile (``default_plan_tile``) promises that only for N >= 128 // h, where
    every N gets the same 128-row tile; fewer lanes get a smaller tile (8 rows
    for N <= 8, the next power of two up to 128), whose rows equal the large
    tile's only where the backend rounds a row the same at both batch sizes.
    The CPU does (measured for tiles of 8 rows and more), so on the CPU the
    default must agree too; elsewhere only N >= 128 is compared.
    """
    seeds = list(range(40, 64))  # 24 episodes: more than most lane counts
    cap = 200
    run = lambda n, tile=None: jaxmesh.evaluate(
        acrobot_policy,
        ACROBOT,
        num_envs=n,
        seeds=seeds,
        max_episode_steps=cap,
        layout=jaxmesh.Layout(plan_tile=tile),
    )
    # Pinned: fewer lanes than the tile (one lane is the default's N = 1),
    # exactly one tile, several tiles.
    pinned = {n: run(n, tile=16) for n in (3, 16, 64)}
    default_ns = (1, 64, 128) if jax.default_backend() == "cpu" else (128, 256)
    default = {n: run(n) for n in default_ns}
    assert default[128].plan_tile == 128 and pinned[3].plan_tile == 16

    refs, gap = acrobot_reference(seeds, cap)
    lengths = [r.length for r in refs]
    assert len(set(lengths)) > 10  # episodes of many lengths...
    assert any(r.terminated for r in refs) and any(r.truncated for r in refs)
    # ...so lanes are reused at different steps (the schedule depends on N).
    # The reference plans one row at a time; XLA rounds a batch of 1 and a tile
    # of rows differently by about 1e-6, so the comparison is exact only while
    # no decision is that close: check it rather than hope.
    assert gap > 1e-4
    for n, r in {**pinned, **default}.items():
        assert_matches(r, refs)
        assert r.lanes.tolist() == schedule(lengths, n)[0], n
        assert r.env_steps == sum(lengths)
    base = pinned[3]
    for r in [*pinned.values(), *default.values()]:
        assert_same_episodes(r, base)


def test_lane_assignment_and_budget():
    seeds = list(range(30))
    result = jaxmesh.evaluate(angle, CARTPOLE, num_envs=LANES, seeds=seeds)
    refs = reference(single(lambda o, k: angle(o)), seeds)
    assert_matches(result, refs)
    lanes, starts = schedule([r.length for r in refs], LANES)
    assert result.lanes.tolist() == lanes
    assert result.lanes[:4].tolist() == [0, 1, 2, 3]
    assert len(set(starts)) > 10  # lanes freed at many different steps
    assert result.env_steps == int(result.lengths.sum())
    assert [e.index for e in result.episodes] == list(range(30))


def test_fewer_episodes_than_lanes():
    result = jaxmesh.evaluate(angle, CARTPOLE, num_envs=LANES, episodes=3)
    assert result.num_episodes == 3
    assert result.lanes.tolist() == [0, 1, 2]
    assert result.env_steps == int(result.lengths.sum())
    assert_matches(result, reference(single(lambda o, k: angle(o)), [0, 1, 2]))


def test_budget_rules():
    empty = jaxmesh.evaluate(lean, CARTPOLE, episodes=0)
    assert empty.num_episodes == 0 and empty.env_steps == 0
    assert "episodes" in empty.summary()
    one = jaxmesh.evaluate(lean, CARTPOLE)
    assert one.seeds.tolist() == [0]
    by_seeds = jaxmesh.evaluate(lean, CARTPOLE, seeds=[5, 3])
    assert by_seeds.seeds.tolist() == [5, 3]
    with pytest.raises(ValueError, match="disagrees"):
        jaxmesh.evaluate(lean, CARTPOLE, episodes=3, seeds=[1, 2])


@pytest.mark.parametrize(
    ("plan_tile", "rows"), [(32, 32), (None, default_plan_tile(8, num_envs=8))]
)
def test_policy_rows_are_counted_in_tiles(plan_tile, rows):
    """Eight synchronized Pendulum lanes of 200 steps, h=8: 25 plans of one tile."""

    def hold(obs):
        return jnp.zeros((8, 1)) + 0.0 * obs[0]

    result = jaxmesh.evaluate(
        hold,
        "gymnax:Pendulum-v1",
        horizon=8,
        num_envs=8,
        episodes=8,
        layout=jaxmesh.Layout(plan_tile=plan_tile),
    )
    assert (result.lengths == 200).all() and result.truncated.all()
    assert result.plan_tile == rows
    assert result.policy_rows == 25 * rows  # 200 / 8 plan steps x one tile
    assert (result.predict_calls == 25).all()
    assert result.rows_per_step == pytest.approx(25 * rows / 1600)


def test_default_tile_fits_few_lanes():
    """128 // h rows for many lanes; few lanes get the next power of two (>= 8)."""
    assert default_plan_tile(1, 4) == 8
    assert default_plan_tile(1, 1) == 8
    assert default_plan_tile(1, 100) == 128
    assert default_plan_tile(1, 1024) == 128
    assert default_plan_tile(8, 256) == 16
    assert default_plan_tile(8, 4) == 8
    assert default_plan_tile(64, 1024) == 8


def test_four_lanes_plan_eight_rows():
    """h = 1 on 4 lanes: every step with a running lane plans one tile of 8 rows.

    Hand count: 4 episodes on 4 lanes all start at step 0, so the run has
    max(length) steps with at least one running lane, each one tile of 8 rows.
    """
    seeds = [0, 1, 2, 3]
    result = jaxmesh.evaluate(angle, CARTPOLE, num_envs=LANES, seeds=seeds)
    refs = reference(single(lambda o, k: angle(o)), seeds)
    assert_matches(result, refs)
    longest = max(r.length for r in refs)
    assert result.plan_tile == 8
    assert result.policy_rows == 8 * longest
    assert result.env_steps == sum(r.length for r in refs)


def test_hooks_stream_episodes_in_order():
    seen = []

    class Hooks:
        def on_run_start(self, info):
            seen.append(("start", info["episodes"]))

        def on_episode_end(self, ep):
            seen.append(ep)

        def on_run_end(self, result):
            seen.append(("end", result.num_episodes))

    seeds = list(range(10))
    result = jaxmesh.evaluate(
        angle,
        CARTPOLE,
        num_envs=3,
        seeds=seeds,
        hooks=Hooks(),
        layout=jaxmesh.Layout(segment_steps=5),
    )
    assert seen[0] == ("start", 10) and seen[-1] == ("end", 10)
    eps = seen[1:-1]
    assert [e.index for e in eps] == list(range(10))  # in order, each once
    # Later episodes ended before earlier ones (on another lane), so the stream
    # really had to hold them back.
    refs = reference(single(lambda o, k: angle(o)), seeds)
    lengths = [r.length for r in refs]
    lanes, starts = schedule(lengths, 3)
    ends = [s + n for s, n in zip(starts, lengths, strict=True)]
    assert any(ends[j] < ends[i] for i in range(10) for j in range(i + 1, 10))
    assert result.lanes.tolist() == lanes
    assert_matches(result, refs)
    assert [e.seed for e in eps] == seeds
    assert eps == result.episodes


def test_changing_only_the_budget_compiles_nothing():
    def pol(obs):  # a policy object of this test alone: no program cached yet
        return angle(obs)

    with compiles() as first:
        a = jaxmesh.evaluate(pol, CARTPOLE, num_envs=8, episodes=100)
    assert first, "the first call should compile its program"
    with compiles() as later:
        b = jaxmesh.evaluate(pol, CARTPOLE, num_envs=8, episodes=200)
        c = jaxmesh.evaluate(pol, CARTPOLE, num_envs=8, episodes=300)
        d = jaxmesh.evaluate(pol, CARTPOLE, num_envs=8, seeds=[9, 8, 7])
    assert not later, f"a new budget compiled {later}"
    assert b.compile_time == c.compile_time == d.compile_time == 0.0
    assert (a.num_episodes, b.num_episodes, c.num_episodes) == (100, 200, 300)
    # the same program gives each budget its own episodes, the same where shared
    assert_same_episodes(a, jaxmesh.evaluate(pol, CARTPOLE, num_envs=8, episodes=100))
    np.testing.assert_array_equal(c.returns[:200], b.returns)
    refs = reference(single(lambda o, k: angle(o)), [9, 8, 7])
    assert_matches(d, refs)


def test_evaluator_reuses_its_program():
    def linear(w, obs):
        return (obs @ w > 0).astype(jnp.int32)

    ev = jaxmesh.Evaluator(linear, CARTPOLE, takes_params=True, num_envs=4)
    w1 = jnp.array([0.0, 0.0, 1.0, 0.0])
    w2 = jnp.array([0.0, 0.05, 1.0, 0.05])
    with compiles() as first:
        a = ev.run(episodes=5, params=w1)
    assert first
    with compiles() as later:
        b = ev.run(episodes=9, params=w1)
        c = ev.run(seeds=[3, 4], params=w2)
    assert not later, f"a new budget or new params compiled {later}"
    assert len(ev.programs()) == 1
    np.testing.assert_array_equal(b.returns[:5], a.returns)
    refs = reference(single(lambda o, k: linear(w2, o)), [3, 4])
    assert_matches(c, refs)
    with pytest.raises(TypeError, match="takes_params=True"):
        ev.run(episodes=2)


def test_new_settings_make_a_new_program():
    # One Model object of this test alone (no program cached yet) for both
    # facets: new settings, then the same settings on another device.
    model = jaxmesh.Model(angle)

    jaxmesh.clear_cache()
    jaxmesh.evaluate(model, CARTPOLE, num_envs=4, episodes=3)
    assert len(jaxmesh.cache_info()) == 1
    with compiles() as seen:
        jaxmesh.evaluate(model, CARTPOLE, num_envs=8, episodes=3)
    assert seen, "new settings must compile a new program"
    info = jaxmesh.cache_info()
    assert [i["settings"]["num_envs"] for i in info] == [4, 8]
    assert all(i["programs"] == 1 for i in info)
    # The same Model object on another device is another program.
    cpu = jax.devices("cpu")[0]
    model.device = cpu
    with compiles() as seen:
        jaxmesh.evaluate(model, CARTPOLE, num_envs=8, episodes=3)
    assert seen, "a new device must compile a new program"
    info = jaxmesh.cache_info()
    assert [i["device"] for i in info] == [None, None, str(cpu)]
    assert [i["settings"]["num_envs"] for i in info] == [4, 8, 8]
    jaxmesh.clear_cache()
    assert jaxmesh.cache_info() == []
