"""Bad input gets a clear exception before anything compiles (CONTRACT 1, 9, 11, 12)."""

from __future__ import annotations

import functools

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles
from reference_loop import (
    NanRewardAt,
    assert_matches,
    first_hit,
    gymnax_fns,
    run_episode,
    schedule,
    single,
)

import jaxmesh
from jaxmesh.core import tally as core_results
from jaxmesh.run import checks

ENV = "gymnax:CartPole-v1"


def good(obs):
    return (obs[2] > 0).astype(jnp.int32)


def angle(obs):
    """Pushes the way the pole leans: CartPole episodes of 35 to 65 steps."""
    return (obs[2] > 0).astype(jnp.int32)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"episodes": -1}, ValueError, "episodes=-1"),
        ({"episodes": 2.5}, TypeError, "episodes=2.5"),
        ({"num_envs": 0}, ValueError, "num_envs=0"),
        ({"num_envs": -4}, ValueError, "num_envs=-4"),
        ({"horizon": 0}, ValueError, "horizon=0"),
        ({"chunking": {"prefetch_lead": -1}}, ValueError, "prefetch_lead=-1"),
        ({"max_episode_steps": 0}, ValueError, "max_episode_steps=0"),
        ({"seeds": [0.5, 1.0]}, TypeError, "seeds must be a 1-D sequence of ints"),
        ({"seeds": "abc"}, TypeError, "seeds="),
        ({"seeds": [-1]}, ValueError, r"seeds must lie in \[0"),
        ({"episodes": 2, "seeds": [1]}, ValueError, "disagrees"),
    ],
)
def test_bad_settings(no_compile, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jaxmesh.evaluate(good, ENV, **kwargs)


def test_unknown_env_ids(no_compile):
    with pytest.raises(ValueError, match="unknown gymnax env 'NoSuchEnv-v0'"):
        jaxmesh.evaluate(good, "gymnax:NoSuchEnv-v0")
    with pytest.raises(ValueError, match="unknown env prefix 'mujoco'.*gymnax:<id>"):
        jaxmesh.evaluate(good, "mujoco:Ant")
    with pytest.raises(ValueError, match="unknown brax env 'nope'"):
        jaxmesh.evaluate(good, "brax:nope")
    with pytest.raises(TypeError, match="not an environment"):
        jaxmesh.evaluate(good, object())


def test_wrong_output_shape_names_both_shapes(no_compile):
    with pytest.raises(
        TypeError, match=r"returned shape \(2, 3\).*action shape is \(\)"
    ):
        jaxmesh.evaluate(lambda obs: jnp.tile(obs[:3], (2, 1)).astype(jnp.int32), ENV)


def test_logits_for_discrete_env(no_compile):
    with pytest.raises(TypeError, match="integer actions"):
        jaxmesh.evaluate(lambda obs: jnp.zeros(2), ENV)


def test_policy_arity(no_compile):
    with pytest.raises(TypeError, match="required positional arguments"):
        jaxmesh.evaluate(lambda a, b, c: a, ENV)
    with pytest.raises(TypeError, match="not callable"):
        jaxmesh.evaluate(42, ENV)


def chunk_of(obs, k):
    """A chunk of k actions computed from the observation.

    Constants alone (``jnp.zeros``) would be built eagerly, a compile of the
    policy's own, not of jaxmesh's.
    """
    return jnp.tile(obs[:1] > 0, k).astype(jnp.int32)


def test_native_chunk_errors(no_compile):
    chunk4 = jaxmesh.Model(lambda obs: chunk_of(obs, 4), native_chunk=4)
    with pytest.raises(ValueError, match="horizon=8 exceeds .* native_chunk=4"):
        jaxmesh.evaluate(chunk4, ENV, horizon=8)
    liar = jaxmesh.Model(lambda obs: chunk_of(obs, 6), native_chunk=4)
    with pytest.raises(
        ValueError, match="native_chunk=4 but its prediction has length 6"
    ):
        jaxmesh.evaluate(liar, ENV, horizon=2)
    with pytest.raises(ValueError, match="native_chunk"):
        jaxmesh.Model(good, native_chunk=0)


def test_horizon_without_chunks_warns_once_naming_the_policy():
    with pytest.warns(UserWarning, match="'good' returns single actions") as record:
        result = jaxmesh.evaluate(good, ENV, horizon=4, episodes=2)
    assert len([w for w in record if issubclass(w.category, UserWarning)]) == 1
    assert result.effective_horizon == 1
    assert (result.predict_calls == result.lengths).all()


def test_missing_spec_key_lists_env_keys(no_compile):
    model = jaxmesh.Model(good, spec={"x": jaxmesh.adapt.State(key="pixels")})
    with pytest.raises(ValueError, match="dict key"):
        jaxmesh.evaluate(model, ENV)
    with pytest.raises(TypeError, match="expected jaxmesh.adapt.State"):
        jaxmesh.Model(good, spec={"x": 3})


def test_seed_keys_are_prngkey_of_seed():
    """Episode with seed s starts from env.reset(PRNGKey(s)) (CONTRACT 5)."""
    import gymnax

    env, params = gymnax.make("Pendulum-v1")
    seeds = [0, 1, 12345, 2**31 - 1]
    result = jaxmesh.evaluate(
        lambda obs: jnp.zeros(1), (env, params), seeds=seeds, max_episode_steps=1
    )

    @jax.jit  # the env's own reset_env / step_env, compiled once for every seed
    def first_reward(s):
        _, state = env.reset_env(jax.random.PRNGKey(s), params)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(s), 0), 0)
        return env.step_env(key, state, jnp.zeros(1), params)[2]

    for s, got in zip(seeds, result.returns, strict=True):
        reward = first_reward(jnp.uint32(s))
        assert got == pytest.approx(float(reward), rel=1e-6)
    assert len(set(result.returns.tolist())) == len(seeds)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layout": {"plan_tile": 0}}, "plan_tile=0"),
        ({"layout": {"segment_steps": 0}}, "segment_steps=0"),
    ],
)
def test_zero_tile_or_segment(no_compile, kwargs, match):
    with pytest.raises(ValueError, match=match):
        jaxmesh.evaluate(good, ENV, episodes=2, **kwargs)


def test_make_evaluator_seeds_shape():
    run = jaxmesh.make_evaluator(lambda w, obs: good(obs), ENV, episodes=3)
    w = np.zeros(4, np.float32)
    cases = [
        (np.arange(4, dtype=np.int32), r"\(4,\)"),
        (np.zeros((1, 3), np.int32), r"\(1, 3\)"),
        (np.zeros(3, np.float32), "float32"),
    ]
    cases = [(jnp.asarray(seeds), given) for seeds, given in cases]
    with compiles() as seen:  # rejected before the engine is built or compiled
        for seeds, given in cases:
            with pytest.raises(ValueError, match=rf"shape \(3,\).*got .*{given}"):
                run(w, seeds)
    assert not seen, f"compiled before rejecting bad seeds: {seen}"


def test_hooks_that_are_not_hook_objects(no_compile):
    with pytest.raises(TypeError, match="has none of the methods"):
        jaxmesh.evaluate(good, ENV, hooks=print)
    with pytest.raises(TypeError, match="on_episode_end"):
        jaxmesh.evaluate(good, ENV, hooks=[object()])


# Failures while running ---------------------------------------------------------

CARTPOLE = gymnax.make("CartPole-v1")
CARTPOLE_FNS = gymnax_fns(*CARTPOLE)
PENDULUM = gymnax.make("Pendulum-v1")
PENDULUM_FNS = gymnax_fns(*PENDULUM)


def reference(env, policy, seeds, **kw):
    fns = {id(CARTPOLE): CARTPOLE_FNS, id(PENDULUM): PENDULUM_FNS}.get(id(env))
    fns = fns or gymnax_fns(*env)  # jitted once per env, not once per call
    return [run_episode(*fns, single(policy), s, **kw) for s in seeds]


_ANGLE_POLICY = jax.jit(angle)


@functools.cache
def _angle_episode(seed):
    return run_episode(*CARTPOLE_FNS, single(lambda o, k: _ANGLE_POLICY(o)), seed)


def angle_refs(seeds):
    """Reference CartPole episodes of ``angle`` (kept: several tests share them)."""
    return [_angle_episode(s) for s in seeds]


def finished_before(refs, num_envs, step):
    """Indices of the episodes whose last run step is before ``step``."""
    lengths = [r.length for r in refs]
    _, starts = schedule(lengths, num_envs)
    return {
        i for i, (s, n) in enumerate(zip(starts, lengths, strict=True)) if s + n <= step
    }


def assert_partial(partial, refs, indices, rtol=0.0):
    """``partial`` holds exactly ``indices``, each equal to its reference episode."""
    assert partial is not None
    assert partial.indices.tolist() == sorted(indices)
    assert_matches(partial, [refs[i] for i in sorted(indices)], rtol=rtol)


def hook_once(index):
    class Boom(RuntimeError):
        pass

    class Hooks:
        def on_episode_end(self, ep):
            if ep.index == index:
                raise Boom("stop")

    return Boom, Hooks()


def test_hook_exception_aborts_with_its_type_and_keeps_finished():
    seeds = list(range(24))
    boom, hooks = hook_once(4)
    with pytest.raises(boom) as info:
        jaxmesh.evaluate(
            angle,
            CARTPOLE,
            num_envs=2,
            seeds=seeds,
            hooks=hooks,
            layout=jaxmesh.Layout(segment_steps=8),
        )
    partial = info.value.partial_result
    assert isinstance(partial, jaxmesh.RunResult)
    refs = angle_refs(seeds)
    # The hook ran after the segment in which episode 4 ended: the partial result
    # is what had finished by the end of that segment, episode 4 among them.
    lengths = [r.length for r in refs]
    end4 = schedule(lengths, 2)[1][4] + lengths[4]
    boundary = -(-end4 // 8) * 8
    expected = finished_before(refs, 2, boundary)
    assert 4 in expected and len(expected) < 24
    assert_partial(partial, refs, expected)
    assert any("partial_result" in note for note in info.value.__notes__)


@functools.cache
def raise_at_reset_of(seed):
    """A policy that raises from inside the compiled segment (a host callback)
    when it plans from the reset observation of the episode with ``seed``.

    One function per seed: the runs that fail on the same seed share a program.
    """
    env, params = CARTPOLE
    target = np.asarray(env.reset_env(jax.random.PRNGKey(seed), params)[0])

    def check(obs):
        rows = np.asarray(obs).reshape(-1, 4)
        if np.any(np.all(rows == target, axis=-1)):
            raise RuntimeError(f"planned the first step of seed {seed}")

    def policy(obs):
        jax.debug.callback(check, obs)
        return angle(obs)

    return policy


@pytest.mark.parametrize("hooks", [None, "with_hook"])
def test_partial_result_after_a_failure_inside_a_segment(hooks):
    """The policy fails while planning episode 20's first step, mid-segment.

    Expected: at least every episode finished by the last segment boundary
    before the failure, at most those finished before the failing step; each
    equal to the reference, and no unfinished one.
    """
    seeds = list(range(24))
    n, seg = 4, 16
    if hooks is not None:
        hooks = type("Keep", (), {"on_episode_end": lambda self, ep: None})()
    with pytest.raises(Exception, match="planned the first step of seed 20") as info:
        jaxmesh.evaluate(
            raise_at_reset_of(20),
            CARTPOLE,
            num_envs=n,
            seeds=seeds,
            layout=jaxmesh.Layout(segment_steps=seg),
            hooks=hooks,
        )
    refs = angle_refs(seeds)
    _, starts = schedule([r.length for r in refs], n)
    fail_step = starts[20]
    assert fail_step > seg  # the failure is not in the first segment
    at_least = finished_before(refs, n, fail_step // seg * seg)
    at_most = finished_before(refs, n, fail_step)
    assert at_least  # episodes had finished before the failing segment
    partial = info.value.partial_result
    assert partial is not None, "finished episodes were lost"
    got = set(partial.indices.tolist())
    assert at_least <= got <= at_most, (sorted(at_least), sorted(got), sorted(at_most))
    assert_partial(partial, refs, got)


# Bad values at run time ---------------------------------------------------------


def test_action_out_of_range_on_the_first_step():
    def seven(obs):
        return jnp.int32(7) + 0 * angle(obs)

    with pytest.raises(jaxmesh.BadValueError, match="out of range") as info:
        jaxmesh.evaluate(seven, CARTPOLE, num_envs=4, seeds=[5, 6, 7, 8, 9, 10])
    e = info.value
    # every lane met it on step 0: the lowest lane's, episode 0 (seed 5)
    assert (e.episode, e.seed, e.step, e.lane, e.value) == (0, 5, 0, 0, 7.0)
    assert e.kind == core_results.ACTION_OUT_OF_RANGE
    assert "episode 0 (seed 5), step 0" in str(e) and "7.0" in str(e)
    assert e.partial_result.num_episodes == 0


def test_action_out_of_range_where_a_condition_first_holds():
    """7 only once the pole's angular velocity exceeds 2.3; one lane, so the
    first such step in episode order is the one reported (hand-checked: seeds
    0-2 never exceed it, seed 3 does)."""
    seeds = [0, 1, 2, 3, 4]
    thr = 2.3

    def pol(obs):
        return jnp.where(obs[3] > thr, 7, angle(obs)).astype(jnp.int32)

    refs = angle_refs(seeds)
    episode, step = first_hit(refs, lambda o: o[3] > thr)
    assert episode == 3 and step > 0
    with pytest.raises(jaxmesh.BadValueError) as info:
        jaxmesh.evaluate(pol, CARTPOLE, num_envs=1, seeds=seeds)
    e = info.value
    assert (e.episode, e.seed, e.step, e.value) == (episode, 3, step, 7.0)
    assert f"step {step}" in str(e)
    assert_partial(e.partial_result, refs, range(episode))


def torque(w, obs):
    """Pendulum torque ``w[0]`` while the angular velocity is positive, else
    ``w[1]``: the torques are params (data), so every pair runs on one program."""
    return jnp.where(obs[2] > 0, w[0], w[1])[None]


def test_non_finite_continuous_action():
    nan = jnp.array([jnp.nan, jnp.nan])  # NaN whatever the observation
    with pytest.raises(jaxmesh.BadValueError, match="non-finite") as info:
        jaxmesh.evaluate(torque, PENDULUM, num_envs=2, seeds=[4, 5, 6], params=nan)
    e = info.value
    assert (e.episode, e.seed, e.step, e.lane) == (0, 4, 0, 0)
    assert np.isnan(e.value) and e.kind == core_results.ACTION_NOT_FINITE

    # inf once the angular velocity exceeds 5 (seed 0 never does, seed 1 does)
    def pol(obs):
        return jnp.where(obs[2] > 5.0, jnp.inf, 0.0)[None]

    seeds = [0, 1, 2]
    # The reference of the episodes the checks read: 0 (finished) and 1 (hit).
    refs = reference(PENDULUM, lambda o, k: jnp.zeros(1), seeds[:2])
    episode, step = first_hit(refs, lambda o: o[2] > 5.0)
    assert episode == 1
    with pytest.raises(jaxmesh.BadValueError) as info:
        jaxmesh.evaluate(pol, PENDULUM, num_envs=1, seeds=seeds)
    e = info.value
    assert (e.episode, e.seed, e.step, e.value) == (1, 1, step, np.inf)
    assert_partial(e.partial_result, refs, [0], rtol=1e-5)


def nan_reward_env(k):
    return NanRewardAt(jaxmesh.make_env(CARTPOLE), k)


#: Reward NaN at step 46, the last step of seed 0's episode (47 steps, hand-
#: checked); one env object, so that the two tests below share one program.
NAN_K = 46
NAN_ENV = nan_reward_env(NAN_K)


def test_nan_reward_from_the_env():
    """Reward NaN at step 46: episodes of at most 46 steps end before it."""
    seeds = [1, 2, 3, 4, 5]
    refs = angle_refs(seeds)
    k = NAN_K
    episode = next(i for i, r in enumerate(refs) if r.length > k)
    assert episode == 1  # hand-checked: 36 steps, then 49
    assert refs[episode].length > k + 1  # step k is not that episode's last
    with pytest.raises(jaxmesh.BadValueError, match="reward") as info:
        jaxmesh.evaluate(angle, NAN_ENV, num_envs=1, seeds=seeds)
    e = info.value
    assert (e.episode, e.seed, e.step) == (episode, seeds[episode], k)
    assert e.kind == core_results.REWARD_NOT_FINITE and np.isnan(e.value)
    assert_partial(e.partial_result, refs, range(episode))


def test_bad_value_on_an_episode_s_last_step_is_not_a_finished_episode():
    seeds = [0, 1]
    refs = angle_refs(seeds)
    k = refs[0].length - 1  # episode 0's last step
    assert k == NAN_K
    with pytest.raises(jaxmesh.BadValueError) as info:
        jaxmesh.evaluate(angle, NAN_ENV, num_envs=1, seeds=seeds)
    assert (info.value.episode, info.value.step) == (0, k)
    assert info.value.partial_result.num_episodes == 0


def test_no_false_alarm_at_the_bounds():
    # actions 0 and num_actions - 1 on CartPole, +-2 (the bounds) on Pendulum
    seeds = [0, 1, 2]
    # The settings of test_hook_exception_aborts_...: its program, run to the end.
    r = jaxmesh.evaluate(
        angle, CARTPOLE, num_envs=2, seeds=seeds, layout=jaxmesh.Layout(segment_steps=8)
    )
    assert_matches(r, angle_refs(seeds))

    # test_non_finite_continuous_action's program, with the bounds as torques
    bang = jnp.array([2.0, -2.0])
    r = jaxmesh.evaluate(torque, PENDULUM, num_envs=2, seeds=[0], params=bang)
    ref = reference(PENDULUM, lambda o, k: torque(bang, o), [0])
    assert_matches(r, ref, rtol=1e-5)


# Budgets that cannot fit ------------------------------------------------------


def test_huge_budget_is_refused_before_allocating(no_compile):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"episodes=1,000,000,000") as info:
            jaxmesh.evaluate(good, ENV, episodes=10**9)
        with pytest.raises(ValueError, match="memory"):
            jaxmesh.evaluate(good, ENV, seeds=range(10**9))
        with pytest.raises(ValueError, match="memory"):
            jaxmesh.make_evaluator(lambda w, obs: good(obs), ENV, episodes=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 10**9 seeds alone would be 4 GB: nothing of the budget's size was built
    assert peak < 64 * 2**20, f"allocated {peak:,} bytes before refusing"
    msg = str(info.value)
    assert "GiB" in msg and "smaller budget" in msg and "on_episode_end" in msg


def test_small_free_memory_refuses_a_modest_budget(monkeypatch):
    mib = 2**20
    monkeypatch.setattr(checks, "free_memory", lambda device=None: (None, 8 * mib))
    with pytest.raises(ValueError, match=r"of host memory.*smaller budget"):
        jaxmesh.evaluate(good, ENV, episodes=100_000)
    # 1 MiB of device memory: make_evaluator's budget-sized device buffers
    # (100,000 episodes x 23 bytes, in a 131,072 bucket: 2.9 MiB) do not fit;
    # an evaluate run's device buffers are sized by its lanes, so only its
    # host results count (100,000 x 49 bytes: 4.7 MiB of the 64 MiB free).
    monkeypatch.setattr(checks, "free_memory", lambda device=None: (mib, 64 * mib))
    with pytest.raises(ValueError, match=r"of device memory"):
        jaxmesh.make_evaluator(lambda w, obs: good(obs), ENV, episodes=100_000)
    assert checks.resolve_budget(100_000, None, "tiny device").size == 100_000
    # a budget that fits runs (on test_hook_exception_aborts_...'s program)
    fits = dict(num_envs=2, layout=jaxmesh.Layout(segment_steps=8), episodes=3)
    assert jaxmesh.evaluate(angle, CARTPOLE, **fits).num_episodes == 3
