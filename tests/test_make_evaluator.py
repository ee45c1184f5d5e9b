"""make_evaluator: the engine as a pure function of params (jit, vmap, nesting)."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from reference_loop import gymnax_fns, run_episode, single

import jaxmesh

ENV = gymnax.make("CartPole-v1")


def linear(w, obs):
    return (obs @ w > 0).astype(jnp.int32)


def test_jit_matches_reference_loop():
    run = jax.jit(jaxmesh.make_evaluator(linear, ENV, num_envs=3, episodes=5))
    w = jnp.array([0.0, 0.1, 1.0, 0.2])
    out = run(w)
    refs = [
        run_episode(*gymnax_fns(*ENV), single(lambda o, k: linear(w, o)), s)
        for s in range(5)
    ]
    np.testing.assert_array_equal(out.returns, [r.ret for r in refs])
    np.testing.assert_array_equal(out.lengths, [r.length for r in refs])
    assert int(out.env_steps) == sum(r.length for r in refs)


def test_vmap_over_population_matches_each_member():
    run = jaxmesh.make_evaluator(linear, ENV, num_envs=4, episodes=6)
    pop = jax.random.normal(jax.random.PRNGKey(0), (5, 4))
    batched = jax.jit(jax.vmap(run))(pop)
    assert batched.returns.shape == (5, 6)
    for i in range(5):
        w = pop[i]
        alone = jaxmesh.evaluate(
            lambda obs, w=w: linear(w, obs), ENV, num_envs=2, episodes=6
        )
        np.testing.assert_array_equal(batched.returns[i], alone.returns)
        np.testing.assert_array_equal(batched.lengths[i], alone.lengths)


def test_seeds_argument_and_nesting_in_a_jitted_step():
    run = jaxmesh.make_evaluator(linear, ENV, num_envs=2, episodes=3)

    @jax.jit
    def fitness_step(w, seeds):
        out = run(w, seeds)
        return w + 0.0 * jnp.mean(out.returns), jnp.mean(out.returns)

    w = jnp.array([0.0, 0.0, 1.0, 0.5])
    _, mean = fitness_step(w, jnp.array([7, 8, 9], jnp.int32))
    alone = jaxmesh.evaluate(lambda obs: linear(w, obs), ENV, seeds=[7, 8, 9])
    assert float(mean) == float(np.mean(alone.returns))


def test_model_params_are_replaced():
    model = jaxmesh.Model(linear, params=jnp.zeros(4))
    run = jax.jit(jaxmesh.make_evaluator(model, ENV, num_envs=2, episodes=2))
    w = jnp.array([0.0, 0.0, 1.0, 0.5])
    out = run(w)
    alone = jaxmesh.evaluate(lambda obs: linear(w, obs), ENV, episodes=2)
    np.testing.assert_array_equal(out.returns, alone.returns)
