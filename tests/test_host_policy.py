"""jaxmesh.HostPolicy against plain loops that call the same numpy function on
the env's own functions (gymnax's reset_env/step_env, a gymnasium env)."""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import plain_loop, start_serve_env
from reference_loop import assert_matches, gymnax_fns, run_episode, schedule

import jaxmesh
from jaxmesh.adapt import Previous, State
from jaxmesh.host_policy import HostPolicy, HostPolicyError

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
SEEDS = [0, 7, 123, 5, 42, 9, 31]

_rng = np.random.default_rng(0)
W1 = (0.3 * _rng.normal(size=(4, 16))).astype(np.float32)
W2 = (0.02 * _rng.normal(size=(16,))).astype(np.float32)
LEAN = np.float32([0.0, 0.0, 1.0, 0.0])


def logits(obs):
    """A 4-16-1 MLP plus a lean term (numpy): episodes of differing lengths."""
    return np.tanh(obs @ W1) @ W2 + obs @ LEAN


def mlp(obs):
    """Batched: [B, 4] -> [B] actions."""
    return (logits(obs) > 0).astype(np.int32)


def jnp_mlp(obs):
    """The same MLP as a single-lane JAX policy."""
    return (jnp.tanh(obs @ W1) @ W2 + obs @ LEAN > 0).astype(jnp.int32)


def reference(fn, seeds, *, stochastic=False, **kw):
    """The plain gymnax loop calling ``fn`` on one row (the keys' bits as seeds)."""

    def policy(obs, key):
        row = np.asarray(obs, np.float32)[None]
        seeds = (np.asarray(jax.random.bits(key, dtype=jnp.uint32))[None],)
        out = fn(row, *seeds[:stochastic])[0]
        return out if out.ndim else out[None]

    return [run_episode(*REF, policy, s, **kw) for s in seeds]


@pytest.mark.parametrize("num_envs", [1, 3, 8])
def test_numpy_mlp_equals_the_plain_loop_and_the_jax_mlp(num_envs):
    result = jaxmesh.evaluate(HostPolicy(mlp), CARTPOLE, num_envs=num_envs, seeds=SEEDS)
    refs = reference(mlp, SEEDS)
    assert len({r.length for r in refs}) > 3  # the lanes' schedules differ
    assert_matches(result, refs)
    as_jax = jaxmesh.evaluate(jnp_mlp, CARTPOLE, num_envs=num_envs, seeds=SEEDS)
    np.testing.assert_array_equal(result.returns, as_jax.returns)


def test_unbatched_equals_batched():
    one = lambda obs: mlp(obs[None])[0]
    batched = jaxmesh.evaluate(HostPolicy(mlp), CARTPOLE, num_envs=3, seeds=SEEDS)
    single = jaxmesh.evaluate(
        HostPolicy(one, batched=False), CARTPOLE, num_envs=3, seeds=SEEDS
    )
    np.testing.assert_array_equal(single.returns, batched.returns)
    np.testing.assert_array_equal(single.lengths, batched.lengths)


def test_fn_sees_only_the_lanes_that_plan():
    calls = []

    def counted(obs):
        calls.append(obs.shape[0])
        return mlp(obs)

    seeds = SEEDS[:5]
    layout = jaxmesh.Layout(plan_tile=2)
    result = jaxmesh.evaluate(
        HostPolicy(counted), CARTPOLE, num_envs=3, seeds=seeds, layout=layout
    )
    lengths = result.lengths.tolist()
    # By hand: at each run step, the lanes running an episode plan, in tiles
    # of 2 (the last one partial); the first call is the shape probe on zeros.
    _, starts = schedule(lengths, 3)
    expect = [1]
    for t in range(max(s + n for s, n in zip(starts, lengths, strict=True))):
        active = sum(s <= t < s + n for s, n in zip(starts, lengths, strict=True))
        expect += [2] * (active // 2) + [1] * (active % 2)
    assert calls == expect
    assert sum(calls) == 1 + sum(lengths)
    assert result.policy_rows == sum(lengths)  # real rows, no tile padding


def chunk4(obs):
    """[B, 4] -> [B, 4] chunks: the MLP's action, then a wobble."""
    a = mlp(obs)
    return np.stack([a, a, 1 - a, a], axis=1)


def test_native_chunk_with_horizon_replay():
    pol = HostPolicy(chunk4, native_chunk=4)
    result = jaxmesh.evaluate(pol, CARTPOLE, num_envs=3, seeds=SEEDS, horizon=4)
    assert_matches(result, reference(chunk4, SEEDS, horizon=4))
    assert result.predict_calls.sum() < result.lengths.sum()


def noisy(obs, seeds):
    """Stochastic: each row's action drawn from a numpy generator of its seed."""
    p = 1 / (1 + np.exp(-logits(obs)))
    u = np.array([np.random.default_rng(int(s)).random() for s in seeds])
    return (u < p).astype(np.int32)


def test_stochastic_seeds_follow_the_episode_not_the_lanes():
    refs = reference(noisy, SEEDS, stochastic=True)
    for n in (1, 4):
        result = jaxmesh.evaluate(
            HostPolicy(noisy, stochastic=True), CARTPOLE, num_envs=n, seeds=SEEDS
        )
        assert_matches(result, refs)


def test_spec_passes_processed_inputs():
    def framed(inp):
        obs, prev = inp["obs"], inp["prev"]  # [B, 2, 4], [B]
        assert obs.shape[1:] == (2, 4) and prev.ndim == 1
        return mlp(obs[:, -1] + 0.01 * (obs[:, -1] - obs[:, 0]) + 0.001 * prev[:, None])

    spec = {"obs": State(stack=2), "prev": Previous()}
    pol = HostPolicy(framed, spec=spec)
    result = jaxmesh.evaluate(pol, CARTPOLE, num_envs=3, seeds=SEEDS)

    def inputs(obs_h, act_h, t):
        frames = np.stack([obs_h[max(i, 0)] for i in (t - 1, t)])
        prev = np.int32(act_h[t - 1]) if t > 0 else np.int32(0)
        return {"obs": frames[None], "prev": np.asarray([prev])}

    refs = [
        run_episode(*REF, lambda x, key: framed(x)[:1], s, inputs=inputs) for s in SEEDS
    ]
    assert_matches(result, refs)


def test_gymnasium_in_process_and_in_workers():
    refs = plain_loop(gym.make("CartPole-v1"), lambda obs, key: mlp(obs[None]), SEEDS)
    for workers in (0, 2):
        result = jaxmesh.evaluate(
            HostPolicy(mlp),
            "gymnasium:CartPole-v1",
            num_envs=3,
            seeds=SEEDS,
            workers=workers,
        )
        assert_matches(result, refs)


def test_gymnasium_stochastic_and_chunked_equal_the_plain_loop():
    def seeded(obs, key):
        return noisy(
            obs[None], np.asarray(jax.random.bits(key, dtype=jnp.uint32))[None]
        )

    env = gym.make("CartPole-v1")
    for pol, ref, kw in (
        (HostPolicy(noisy, stochastic=True), seeded, {}),
        (
            HostPolicy(chunk4, native_chunk=4),
            lambda o, k: chunk4(o[None])[0],
            {"horizon": 4},
        ),
    ):
        refs = plain_loop(env, ref, SEEDS, **kw)
        for n in (1, 3):
            result = jaxmesh.evaluate(
                pol, "gymnasium:CartPole-v1", num_envs=n, seeds=SEEDS, **kw
            )
            assert_matches(result, refs)
            # One row per plan: the plans counted by hand from the lengths.
            h = kw.get("horizon", 1)
            plans = sum(-(-r.length // h) for r in refs)
            assert result.policy_rows == result.predict_calls.sum() == plans


def test_a_served_env():
    proc, address = start_serve_env("gymnasium:CartPole-v1", "--lanes", "3")
    try:
        result = jaxmesh.evaluate(
            HostPolicy(mlp), f"grpc://{address}", num_envs=3, seeds=SEEDS
        )
    finally:
        proc.kill()
        proc.wait()
    refs = plain_loop(gym.make("CartPole-v1"), lambda obs, key: mlp(obs[None]), SEEDS)
    assert_matches(result, refs)


def test_a_raising_fn_names_the_policy_and_keeps_finished_episodes():
    planned = []

    def breaks(obs):
        planned.append(obs.shape[0])
        if sum(planned) > 120:
            raise ValueError("the model fell over")
        return mlp(obs)

    layout = jaxmesh.Layout(segment_steps=8)
    with pytest.raises(jaxmesh.HostPolicyError) as e:
        jaxmesh.evaluate(
            HostPolicy(breaks), CARTPOLE, num_envs=2, seeds=SEEDS, layout=layout
        )
    text = str(e.value)
    assert "host policy 'breaks' raised ValueError: the model fell over" in text
    assert "planning lanes" in text
    assert e.value.policy == "breaks" and set(e.value.lanes) <= {0, 1}
    # The scan tells the callback each row's episode; the run adds its seed.
    partial = e.value.partial_result
    assert e.value.episodes and len(e.value.episodes) == len(e.value.lanes)
    assert e.value.seeds == [SEEDS[i] for i in e.value.episodes]
    assert not set(e.value.episodes) & set(partial.indices)
    lane, episode = e.value.lanes[0], e.value.episodes[0]
    assert f"lane {lane}: episode {episode}, seed {SEEDS[episode]}" in text
    assert isinstance(e.value.__cause__, ValueError)
    partial = e.value.partial_result
    assert partial is not None and partial.num_episodes >= 1
    refs = reference(mlp, SEEDS)
    assert_matches(partial, [refs[i] for i in partial.indices])
    planned.clear()
    planned.append(-(10**6))  # the same policy, now far from its failure
    rest = jaxmesh.evaluate(
        HostPolicy(breaks), CARTPOLE, num_envs=2, seeds=SEEDS, resume=partial
    )
    assert_matches(rest, refs)


def test_a_wrong_shape_names_the_policy():
    # Right for the probe's one row of zeros, wrong for two lanes.
    pol = HostPolicy(lambda obs: np.zeros((1,), np.int32), name="one_row")
    with pytest.raises(HostPolicyError) as e:
        jaxmesh.evaluate(pol, CARTPOLE, num_envs=2, seeds=SEEDS[:2])
    assert "host policy 'one_row' returned shape (1,) for 2 rows" in str(e.value)
    with pytest.raises(ValueError, match="native_chunk"):
        HostPolicy(mlp, native_chunk=0)
    assert issubclass(HostPolicyError, RuntimeError)


def test_a_raising_fn_on_a_gymnasium_env_is_a_host_policy_error_too():
    def breaks(obs):  # fine on the row of zeros it is probed with first
        if np.any(obs != 0):
            raise KeyError("no such joint")
        return np.zeros(len(obs), np.int64)

    with pytest.raises(HostPolicyError, match="raised KeyError") as e:
        jaxmesh.evaluate(
            HostPolicy(breaks), "gymnasium:CartPole-v1", num_envs=2, seeds=SEEDS[:2]
        )
    assert isinstance(e.value.__cause__, KeyError)
    assert e.value.partial_result is not None
    assert e.value.partial_result.num_episodes == 0
    # Episode i runs on lane i at the first step; the error names both.
    assert e.value.lanes == [0, 1] and e.value.episodes == [0, 1]
    assert e.value.seeds == SEEDS[:2]
    assert f"lane 1: episode 1, seed {SEEDS[1]}" in str(e.value)

    def never(obs):
        raise KeyError("no such joint")

    with pytest.raises(HostPolicyError, match="on one row of zeros") as e:
        jaxmesh.evaluate(HostPolicy(never), "gymnasium:CartPole-v1", episodes=1)
    assert isinstance(e.value.__cause__, KeyError)
