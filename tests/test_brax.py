"""The brax adapter on brax's own cheap ``fast`` env, against brax's functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from brax import envs
from reference_loop import run_episode, single

import jaxmesh


def push(obs):
    return jnp.tanh(jnp.array([1.0 - obs[1]]))


def brax_fns(env, cap):
    reset = jax.jit(lambda key: (env.reset(key).obs, (env.reset(key), 0)))

    @jax.jit
    def _step(state, action):
        return env.step(state, action)

    def step(key, state, action):
        bstate, t = state
        bstate = _step(bstate, action)
        return bstate.obs, (bstate, t + 1), bstate.reward, bstate.done > 0.5, False

    return reset, step


def test_fast_env_matches_brax_loop():
    env = envs.get_environment("fast")
    result = jaxmesh.evaluate(
        push, "brax:fast", num_envs=3, episodes=4, max_episode_steps=30
    )
    refs = [
        run_episode(*brax_fns(env, 30), single(lambda o, k: push(o)), s, cap=30)
        for s in range(4)
    ]
    np.testing.assert_allclose(result.returns, [r.ret for r in refs], rtol=1e-5)
    assert result.lengths.tolist() == [30] * 4
    assert result.truncated.all() and not result.terminated.any()


def test_brax_env_object_and_default_episode_length():
    env = envs.get_environment("fast")
    chunk = lambda obs: jnp.ones((4, 1)) * obs[0]
    result = jaxmesh.evaluate(chunk, env, horizon=4, num_envs=2, episodes=2)
    assert result.lengths.tolist() == [1000, 1000]  # brax's episode_length default
    assert (result.predict_calls == 250).all()
