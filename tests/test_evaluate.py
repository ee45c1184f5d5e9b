"""jaxmesh.evaluate against the reference loop (CONTRACT 1-5, 7-14, 16)."""

from __future__ import annotations

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import assert_matches, gymnax_fns, run_episode, single

import jaxmesh
from jaxmesh.adapt import Previous, State

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)


def lean(obs):
    """A mediocre deterministic CartPole policy: episodes of varied length."""
    return (obs[2] + 0.1 * obs[3] > 0).astype(jnp.int32)


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


def test_per_step_policy_matches_reference():
    result = jaxmesh.evaluate(lean, CARTPOLE, num_envs=2, seeds=SEEDS)
    assert_matches(result, reference(single(lambda o, k: lean(o)), SEEDS))
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


@pytest.mark.parametrize("lead", [1, 2, 8])
@pytest.mark.parametrize("horizon", [3, 8])
def test_prefetch_lead_matches_reference(lead, horizon):
    seeds = [10, 11, 12]
    result = jaxmesh.evaluate(
        noisy_chunk,
        CARTPOLE,
        horizon=horizon,
        prefetch_lead=lead,
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


def test_invariance_across_lane_counts_on_chaotic_env():
    """Float MLP on Acrobot: bit-identical episodes for every N (CONTRACT 4)."""
    mlp = Mlp()
    params = mlp.init(jax.random.PRNGKey(1), jnp.zeros(6))

    def pol(obs):
        return jnp.argmax(mlp.apply(params, obs)).astype(jnp.int32)

    seeds = list(range(40, 110))  # more episodes than the largest lane count
    results = [
        jaxmesh.evaluate(pol, "gymnax:Acrobot-v1", num_envs=n, seeds=seeds, horizon=1)
        for n in (1, 3, 16, 64)
    ]
    for r in results[1:]:
        np.testing.assert_array_equal(r.returns, results[0].returns)
        np.testing.assert_array_equal(r.lengths, results[0].lengths)
    env, env_params = gymnax.make("Acrobot-v1")
    refs = [
        run_episode(*gymnax_fns(env, env_params), single(lambda o, k: pol(o)), s)
        for s in seeds[:2]
    ]
    np.testing.assert_allclose(results[0].returns[:2], [r.ret for r in refs])


def simulate_lanes(lengths, n):
    """Which lane runs each episode, from the episodes' lengths (CONTRACT 3)."""
    lane_of = {}
    free_at = {}
    nxt = 0
    for j in range(min(n, len(lengths))):
        lane_of[j] = j
        free_at[j] = lengths[j]
        nxt += 1
    while nxt < len(lengths):
        t = min(free_at.values())
        for j in sorted(j for j, ft in free_at.items() if ft == t):
            if nxt < len(lengths):
                lane_of[nxt] = j
                free_at[j] = t + lengths[nxt]
                nxt += 1
            else:
                del free_at[j]
    return [lane_of[i] for i in range(len(lengths))]


def test_lane_assignment_and_budget():
    seeds = list(range(30))
    result = jaxmesh.evaluate(lean, CARTPOLE, num_envs=4, seeds=seeds)
    assert result.lanes.tolist() == simulate_lanes(result.lengths.tolist(), 4)
    assert result.lanes[:4].tolist() == [0, 1, 2, 3]
    assert result.env_steps == int(result.lengths.sum())
    assert [e.index for e in result.episodes] == list(range(30))


def test_fewer_episodes_than_lanes():
    result = jaxmesh.evaluate(lean, CARTPOLE, num_envs=16, episodes=3)
    assert result.num_episodes == 3
    assert result.lanes.tolist() == [0, 1, 2]
    assert result.env_steps == int(result.lengths.sum())
    assert_matches(result, reference(single(lambda o, k: lean(o)), [0, 1, 2]))


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


@pytest.mark.parametrize(("plan_tile", "rows"), [(32, 32), (None, 16)])
def test_policy_rows_are_counted_in_tiles(plan_tile, rows):
    """Eight synchronized Pendulum lanes of 200 steps, h=8: 25 plans of one tile.

    The default tile at h = 8 is 128 // 8 = 16 rows.
    """

    def hold(obs):
        return jnp.zeros((8, 1)) + 0.0 * obs[0]

    result = jaxmesh.evaluate(
        hold,
        "gymnax:Pendulum-v1",
        horizon=8,
        num_envs=8,
        episodes=8,
        plan_tile=plan_tile,
    )
    assert (result.lengths == 200).all() and result.truncated.all()
    assert result.plan_tile == rows
    assert result.policy_rows == 25 * rows  # 200 / 8 plan steps x one tile
    assert (result.predict_calls == 25).all()
    assert result.rows_per_step == pytest.approx(25 * rows / 1600)


def test_hooks_stream_episodes_in_order():
    seen = []

    class Hooks:
        def on_run_start(self, info):
            seen.append(("start", info["episodes"]))

        def on_episode_end(self, ep):
            seen.append(ep)

        def on_run_end(self, result):
            seen.append(("end", result.num_episodes))

    result = jaxmesh.evaluate(
        lean, CARTPOLE, num_envs=3, episodes=10, hooks=Hooks(), segment_steps=5
    )
    assert seen[0] == ("start", 10) and seen[-1] == ("end", 10)
    eps = seen[1:-1]
    assert sorted(e.index for e in eps) == list(range(10))
    assert all(e == result.episode(e.index) for e in eps)


def test_hook_exception_aborts_with_its_type_and_keeps_finished():
    class Boom(RuntimeError):
        pass

    class Hooks:
        def on_episode_end(self, ep):
            if ep.index == 4:
                raise Boom("stop")

    with pytest.raises(Boom) as info:
        jaxmesh.evaluate(
            lean, CARTPOLE, num_envs=2, episodes=50, hooks=Hooks(), segment_steps=8
        )
    partial = info.value.partial_result
    done = partial["done"]
    assert done[4] and 0 < done.sum() < 50
    refs = reference(single(lambda o, k: lean(o)), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(partial["returns"][:5], [r.ret for r in refs])


def test_no_recompilation_on_second_call():
    traces = []

    def pol(obs):
        traces.append(1)
        return lean(obs)

    jaxmesh.evaluate(pol, CARTPOLE, num_envs=4, episodes=6)
    n = len(traces)
    second = jaxmesh.evaluate(pol, CARTPOLE, num_envs=4, seeds=[9, 8, 7, 6, 5, 4])
    assert len(traces) == n
    assert second.compile_time == 0.0
