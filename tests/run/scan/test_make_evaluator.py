"""make_evaluator: the engine as a pure function of params (jit, vmap, nesting).

Every result is compared with the reference loop, on policies and seeds whose
episodes differ (so that ignored seeds or params would show).
"""

from __future__ import annotations

import functools
import types

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
from jaxmesh.run.build import default_plan_tile

ENV = gymnax.make("CartPole-v1")
FNS = gymnax_fns(*ENV)
ANGLE = (0.0, 0.0, 1.0, 0.0)  # episodes of 35 to 65 steps
DAMPED = (0.0, 0.05, 1.0, 0.05)  # episodes of 68 to 180 steps


def linear(w, obs):
    return (obs @ w > 0).astype(jnp.int32)


_linear = jax.jit(linear)


@functools.cache
def _episode(w, seed, cap):
    w = jnp.asarray(w, jnp.float32)
    policy = single(lambda o, k: _linear(w, o))
    return run_episode(*FNS, policy, seed, cap=cap)


def reference(w, seeds, cap=100_000):
    return [_episode(tuple(float(x) for x in w), int(s), cap) for s in seeds]


def test_jit_matches_reference_loop():
    cap = 45  # some episodes end by the cap, others by the env
    run = jax.jit(
        jaxmesh.make_evaluator(
            linear, ENV, num_envs=3, episodes=8, max_episode_steps=cap
        )
    )
    out = run(jnp.array(ANGLE))
    refs = reference(ANGLE, range(8), cap)
    assert len({r.ret for r in refs}) > 1
    assert any(r.terminated for r in refs) and any(r.truncated for r in refs)
    assert_matches(out, refs)
    lengths = [r.length for r in refs]
    lanes, starts = schedule(lengths, 3)
    np.testing.assert_array_equal(out.lanes, lanes)
    assert np.asarray(out.done).all()
    assert int(out.env_steps) == sum(lengths)
    assert out.fault.first() is None
    # h = 1: each run step with a running lane plans one tile (3 lanes < tile)
    steps = max(s + n for s, n in zip(starts, lengths, strict=True))
    assert int(out.policy_rows) == default_plan_tile(1, 3) * steps


def test_seeds_argument_is_honoured():
    run = jax.jit(jaxmesh.make_evaluator(linear, ENV, num_envs=2, episodes=4))
    w = jnp.array(ANGLE)
    default = run(w)
    other = run(w, jnp.array([11, 12, 13, 14], jnp.int32))
    assert_matches(default, reference(ANGLE, range(4)))
    assert_matches(other, reference(ANGLE, [11, 12, 13, 14]))
    assert not np.array_equal(default.returns, other.returns)


def test_vmap_over_population_matches_each_member():
    run = jaxmesh.make_evaluator(linear, ENV, num_envs=2, episodes=4)
    pop = jnp.array([ANGLE, DAMPED, (0.0, 0.0, 1.0, 0.02)])
    batched = jax.jit(jax.vmap(run))(pop)
    assert batched.returns.shape == (3, 4)
    for i in range(3):
        member = jax.tree.map(lambda x, i=i: x[i], batched)
        assert_matches(member, reference(pop[i].tolist(), range(4)))
    assert len({tuple(np.asarray(r).tolist()) for r in batched.returns}) == 3


def test_nesting_in_a_jitted_step():
    run = jaxmesh.make_evaluator(linear, ENV, num_envs=2, episodes=3)

    @jax.jit
    def fitness_step(w, seeds):
        out = run(w, seeds)
        return w + 0.0 * jnp.mean(out.returns), out

    w = jnp.array(DAMPED)
    _, out = fitness_step(w, jnp.array([7, 8, 9], jnp.int32))
    assert_matches(out, reference(DAMPED, [7, 8, 9]))


def test_model_params_are_replaced():
    model = jaxmesh.Model(linear, params=jnp.zeros(4))
    run = jax.jit(jaxmesh.make_evaluator(model, ENV, num_envs=2, episodes=3))
    out = run(jnp.array(DAMPED))
    assert_matches(out, reference(DAMPED, range(3)))


def test_seeds_shape_is_checked_under_jit():
    run = jax.jit(jaxmesh.make_evaluator(linear, ENV, episodes=3))
    with pytest.raises(ValueError, match=r"shape \(3,\).*\(5,\)"):
        run(jnp.array(ANGLE), jnp.arange(5, dtype=jnp.int32))


def test_bad_values_are_reported_in_fault_without_raising():
    """One lane, so the first fault in run order is the first in episode order."""
    thr = 2.3  # the pole's angular velocity first exceeds it in episode 3

    def seven(w, obs):
        return jnp.where(obs[3] > thr, 7, linear(w, obs)).astype(jnp.int32)

    seeds = range(5)
    refs = reference(ANGLE, seeds)
    episode, step = first_hit(refs, lambda o: o[3] > thr)
    out = jax.jit(jaxmesh.make_evaluator(seven, ENV, num_envs=1, seeds=seeds))(
        jnp.array(ANGLE)
    )
    f = out.fault.first()
    assert f["kind"] == core_results.ACTION_OUT_OF_RANGE
    assert (f["episode"], f["step"], f["value"]) == (episode, step, 7.0)
    assert np.asarray(out.done).all()  # the whole budget was scored
    before = types.SimpleNamespace(
        **{f: getattr(out, f)[:episode] for f in core_results.EPISODE_FIELDS}
    )
    assert_matches(before, refs[:episode])

    k = 47  # a NaN reward on step 47: episode 2 is the first that long
    env = NanRewardAt(jaxmesh.make_env(ENV), k)
    out = jaxmesh.make_evaluator(linear, env, num_envs=1, seeds=seeds)(jnp.array(ANGLE))
    first = next(i for i, r in enumerate(refs) if r.length > k)
    f = out.fault.first()
    assert f["kind"] == core_results.REWARD_NOT_FINITE
    assert (f["episode"], f["step"]) == (first, k)
    assert np.isnan(f["value"])


def test_metrics_and_success_under_vmap():
    # gymnax CartPole's info["discount"] is 0 on the step the pole falls and 1
    # otherwise: its last value is "not terminated", its mean 1 - 1/length for a
    # fall and 1 for an episode cut by the cap (worked out from the env's rule).
    cap = 45
    run = jaxmesh.make_evaluator(
        linear,
        ENV,
        num_envs=2,
        episodes=6,
        max_episode_steps=cap,
        scoring=jaxmesh.Scoring(success="discount", metrics={"discount": "mean"}),
    )
    pop = jnp.array([ANGLE, DAMPED])
    out = jax.jit(jax.vmap(run))(pop)
    assert out.success.shape == out.metrics["discount"].shape == (2, 6)
    for i in range(2):
        refs = reference(pop[i].tolist(), range(6), cap)
        fell = np.array([r.terminated for r in refs])
        lengths = np.array([r.length for r in refs], np.float32)
        np.testing.assert_array_equal(np.asarray(out.success[i]), ~fell)
        np.testing.assert_allclose(
            np.asarray(out.metrics["discount"][i]),
            np.where(fell, 1 - 1 / lengths, 1.0),
            rtol=1e-6,
        )
    plain = jaxmesh.make_evaluator(linear, ENV, num_envs=2, episodes=6)(pop[0])
    assert plain.success is None and plain.metrics == {}
    with pytest.raises(ValueError, match="discout"):
        jaxmesh.make_evaluator(
            linear, ENV, episodes=2, scoring=jaxmesh.Scoring(metrics=["discout"])
        )
