"""Host-stepped gymnasium envs in process: ``jaxmesh.evaluate`` against a plain loop.

The reference is the plain gymnasium loop of ``gym_reference`` (written from the
contract, not from the engine).
"""

from __future__ import annotations

import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import (
    ID,
    SEEDS,
    SPEC,
    BreaksOnSeed,
    TrialEnv,
    check,
    chunky,
    disabled_vec,
    finished_match,
    lean,
    noisy,
    per_step,
    plain_loop,
    stacked,
    stacked_inputs,
    trial_policy,
)
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from reference_loop import assert_matches, first_hit, single

import jaxmesh


# Equality with the plain loop ------------------------------------------------------
def test_per_step_policy_matches_plain_loop():
    envs = [gym.make(ID) for _ in range(2)]
    got = jaxmesh.evaluate(lean, envs, seeds=SEEDS)
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    assert len({r.length for r in refs}) > 3  # the seeds give different episodes
    check(got, refs, 2)
    assert got.num_envs == 2 and got.env == f"gymnasium:{ID}"
    assert np.all(got.predict_calls == got.lengths)


def test_a_second_run_compiles_nothing():
    from conftest import compiles

    def tilt(obs):  # a policy object of this test's own: a fresh cache entry
        return (obs[2] > 0).astype(jnp.int32)

    first = jaxmesh.evaluate(tilt, [gym.make(ID) for _ in range(2)], seeds=SEEDS[:3])
    assert first.compile_time > 0
    with compiles() as seen:
        again = jaxmesh.evaluate(tilt, disabled_vec(2), seeds=SEEDS[3:])
    assert not seen and again.compile_time == 0
    assert again.num_episodes == len(SEEDS) - 3


def test_chunked_policy_with_prefetch_lead_matches_plain_loop():
    got = jaxmesh.evaluate(
        chunky, f"gymnasium:{ID}", num_envs=3, horizon=4, prefetch_lead=2, seeds=SEEDS
    )
    fn = jax.jit(chunky)
    refs = plain_loop(gym.make(ID), lambda x, key: fn(x), SEEDS, horizon=4, lead=2)
    assert len({r.length for r in refs}) > 3
    check(got, refs, 3)
    assert got.chunk == 6 and got.effective_horizon == 4 and got.asynchronous


def test_stochastic_policy_matches_plain_loop():
    got = jaxmesh.evaluate(noisy, disabled_vec(2), seeds=SEEDS)
    refs = plain_loop(gym.make(ID), single(jax.jit(noisy)), SEEDS)
    assert len({r.length for r in refs}) > 3
    check(got, refs, 2)


def test_frame_stack_and_previous_match_plain_loop():
    model = jaxmesh.Model(stacked, spec=SPEC)
    envs = [gym.make(ID) for _ in range(3)]
    got = jaxmesh.evaluate(model, envs, horizon=4, prefetch_lead=2, seeds=SEEDS)
    refs = plain_loop(
        gym.make(ID),
        jax.jit(stacked),
        SEEDS,
        horizon=4,
        lead=2,
        inputs=stacked_inputs,
    )
    assert len({r.length for r in refs}) > 3
    check(got, refs, 3)


@pytest.mark.parametrize("n", [1, 3])
def test_lanes_and_env_forms_give_identical_results(n):
    fn = jax.jit(chunky)
    refs = plain_loop(gym.make(ID), lambda x, key: fn(x), SEEDS, horizon=4)
    forms = {
        "list": [gym.make(ID) for _ in range(n)],
        "vector": disabled_vec(n),
        "id": f"gymnasium:{ID}",
    }
    results = {
        name: jaxmesh.evaluate(chunky, env, num_envs=n, horizon=4, seeds=SEEDS)
        for name, env in forms.items()
    }
    for name, got in results.items():
        assert got.num_envs == n, name
        check(got, refs, n)
    if n == 3:  # more episodes than lanes: lanes were reused
        assert len(set(results["list"].lanes.tolist())) == 3


@pytest.mark.parametrize("lead", [0, 1, 2, 4])
@pytest.mark.parametrize("n", [1, 3, 16])
def test_every_lead_and_lane_count_match_plain_loop(n, lead):
    envs = [gym.make(ID) for _ in range(n)]
    got = jaxmesh.evaluate(
        chunky, envs, num_envs=n, horizon=4, prefetch_lead=lead, seeds=SEEDS
    )
    fn = jax.jit(chunky)
    refs = plain_loop(gym.make(ID), lambda x, key: fn(x), SEEDS, horizon=4, lead=lead)
    check(got, refs, n)


@pytest.mark.parametrize("n", [1, 16])
def test_frame_stack_and_previous_match_plain_loop_at_any_lane_count(n):
    model = jaxmesh.Model(stacked, spec=SPEC)
    envs = [gym.make(ID) for _ in range(n)]
    got = jaxmesh.evaluate(model, envs, horizon=4, prefetch_lead=2, seeds=SEEDS)
    refs = plain_loop(
        gym.make(ID), jax.jit(stacked), SEEDS, horizon=4, lead=2, inputs=stacked_inputs
    )
    check(got, refs, n)


def test_max_episode_steps_truncates_like_the_plain_loop():
    got = jaxmesh.evaluate(lean, disabled_vec(3), seeds=SEEDS, max_episode_steps=12)
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS, cap=12)
    check(got, refs, 3)
    assert got.truncated.any() and got.lengths.max() == 12


def torque(obs):
    """Continuous actions (Pendulum's Box(-2, 2, (1,)))."""
    return jnp.clip(-2.0 * obs[1] - 0.5 * obs[2], -2.0, 2.0)[None]


def test_box_actions_match_plain_loop():
    seeds = [0, 5, 9]
    refs = plain_loop(gym.make("Pendulum-v1"), per_step(torque), seeds, cap=30)
    forms = (
        [gym.make("Pendulum-v1") for _ in range(2)],
        "gymnasium:Pendulum-v1",
        # 4 vector lanes, 2 used: lanes 2 and 3 play the idle action throughout
        disabled_vec(4, lambda: gym.make("Pendulum-v1")),
    )
    for env in forms:
        got = jaxmesh.evaluate(
            torque, env, num_envs=2, seeds=seeds, max_episode_steps=30
        )
        # float rewards: jaxmesh sums in float32, the plain loop in float64
        assert_matches(got, refs, rtol=1e-5)
        assert len(set(np.round(got.returns, 3))) == 3
        assert got.num_envs == 2 and got.lanes.tolist() == [0, 1, 0]


# trial_index (CONTRACT 6) ------------------------------------------------------------
@pytest.mark.parametrize("form", ["list", "vector"])
def test_trial_index_reaches_only_an_env_that_declares_it(form):
    seeds = [0, 3, 5, 7, 1, 11]  # episodes 0 and 1 end on the same step (a tie)
    for declares in (True, False):
        log: list = []
        make = lambda log=log, declares=declares: TrialEnv(log, declares)
        if form == "list":
            env = [make() for _ in range(2)]
        else:
            env = SyncVectorEnv([make] * 2, autoreset_mode=AutoresetMode.DISABLED)
        got = jaxmesh.evaluate(trial_policy, env, seeds=seeds)
        refs = plain_loop(TrialEnv([], declares), per_step(trial_policy), seeds)
        check(got, refs, 2)
        episode_resets = [(s, o) for s, o in log if s is not None]
        assert sorted(s for s, _ in episode_resets) == sorted(seeds)
        trials = {s: (o or {}).get("trial_index") for s, o in episode_resets}
        if declares:
            assert trials == {s: i for i, s in enumerate(seeds)}
            assert got.returns.tolist() == [
                (1 + i) * (2 + s % 3) for i, s in enumerate(seeds)
            ]
        else:
            assert all("trial_index" not in (o or {}) for _, o in log)
            assert got.returns.tolist() == [2 + s % 3 for s in seeds]


# Refusals ---------------------------------------------------------------------------
def test_a_next_step_vector_env_is_refused_with_the_fix(no_compile):
    vec = gym.make_vec(ID, num_envs=2, vectorization_mode="sync")
    with pytest.raises(ValueError, match="AutoresetMode.DISABLED") as e:
        jaxmesh.evaluate(lean, vec, episodes=2)
    assert "make_vec" in str(e.value) and "NEXT_STEP" in str(e.value)


def test_max_episode_seconds_is_refused_for_a_jax_env(no_compile):
    with pytest.raises(ValueError, match="max_episode_steps"):
        jaxmesh.evaluate(lean, "gymnax:CartPole-v1", max_episode_seconds=1.0)


class DictObs(gym.Env):
    observation_space = spaces.Dict({"x": spaces.Box(-1, 1, (2,), np.float32)})
    action_space = spaces.Discrete(2)


def narrow_cartpole():
    """CartPole whose observation bounds differ from the others' in one place."""
    env = gym.make(ID)
    space = env.observation_space
    high = space.high.copy()
    high[0] = 1.0
    return gym.wrappers.TransformObservation(
        env, lambda o: o, spaces.Box(-high, high, space.shape, space.dtype)
    )


@pytest.mark.parametrize(
    "env, error, words",
    [
        (DictObs(), TypeError, ["Dict", "FlattenObservation"]),
        ("gymnasium:CartPol-v1", ValueError, ["CartPole-v1"]),
        (lambda: [gym.make(ID)] * 2, ValueError, ["same Env object"]),
        (lambda: [gym.make(ID), "CartPole"], TypeError, ["entry 1", "str"]),
        (lambda: [gym.make(ID), narrow_cartpole()], TypeError, ["entry 1", "same"]),
    ],
)
def test_bad_host_envs_are_refused_before_anything_runs(env, error, words, no_compile):
    env = env() if callable(env) else env
    with pytest.raises(error) as e:
        jaxmesh.evaluate(lean, env, episodes=2)
    for w in words:
        assert w in str(e.value)


# max_episode_seconds (CONTRACT 18) -------------------------------------------------
class SlowEnv(gym.Env):
    """Each step sleeps ``delay`` seconds; an episode terminates after 20 steps."""

    observation_space = spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay=0.01):
        self.delay = delay

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        time.sleep(self.delay)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= 20, False, {}


def zero(obs):
    return jnp.int32(0)


def test_max_episode_seconds_truncates_a_slow_episode():
    free = jaxmesh.evaluate(zero, SlowEnv(), episodes=2)
    assert free.terminated.all() and free.lengths.tolist() == [20, 20]
    capped = jaxmesh.evaluate(zero, SlowEnv(), episodes=2, max_episode_seconds=0.05)
    assert capped.truncated.all() and not capped.terminated.any()
    assert np.all(capped.lengths < free.lengths) and np.all(capped.lengths >= 1)
    assert "depend on timing" in capped.summary()
    assert "depend on timing" not in free.summary()
    assert capped.to_dict()["settings"]["max_episode_seconds"] == 0.05


# Failures keep what finished (CONTRACT 20) ------------------------------------------
def test_a_hook_exception_keeps_finished_episodes():
    class Boom:
        def __init__(self):
            self.seen = []

        def on_episode_end(self, ep):
            self.seen.append(ep.index)
            if len(self.seen) == 3:
                raise RuntimeError("hook failed")

    hook = Boom()
    with pytest.raises(RuntimeError, match="hook failed") as e:
        jaxmesh.evaluate(
            lean, [gym.make(ID) for _ in range(2)], seeds=SEEDS, hooks=hook
        )
    partial = e.value.partial_result
    assert hook.seen == [0, 1, 2]
    assert {0, 1, 2} <= set(partial.indices.tolist())
    finished_match(partial, plain_loop(gym.make(ID), per_step(lean), SEEDS))


def test_an_env_exception_propagates_with_finished_episodes():
    bad = SEEDS[4]
    with pytest.raises(RuntimeError, match="simulator broke") as e:
        jaxmesh.evaluate(lean, [BreaksOnSeed(bad) for _ in range(2)], seeds=SEEDS)
    partial = e.value.partial_result
    assert 4 not in partial.indices.tolist()
    assert partial.num_episodes >= 3
    assert any("partial_result" in note for note in e.value.__notes__)
    finished_match(partial, plain_loop(gym.make(ID), per_step(lean), SEEDS))


def test_a_bad_action_raises_bad_value_error_at_its_step():
    def overshoot(obs):  # action 2 of Discrete(2) once the pole leans far
        return jnp.where(obs[2] > 0.05, 2, lean(obs)).astype(jnp.int32)

    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    episode, step = first_hit(refs, lambda o: o[2] > 0.05)
    with pytest.raises(jaxmesh.BadValueError) as e:
        jaxmesh.evaluate(overshoot, gym.make(ID), seeds=SEEDS)
    assert (e.value.episode, e.value.step, e.value.value) == (episode, step, 2.0)
    assert e.value.partial_result.indices.tolist() == list(range(episode))


def test_host_episode_keys_are_jax_prng_keys():
    """The host loops build episode keys without a jax call per episode."""
    from jaxmesh.run.checks import MAX_SEED
    from jaxmesh.run.host import episode_keys

    seeds = [0, 1, 7, 65_536, 123_456_789, MAX_SEED, *range(1000, 1010)]
    want = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])
    got = episode_keys(np.asarray(seeds))
    assert got.dtype == want.dtype and np.array_equal(got, want)
