"""The agent step driven by a host loop gives the scan engine's results."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

import jaxmesh
from jaxmesh import make_agent
from jaxmesh.adapt import Previous, State


def policy(inp, key):
    frames, prev = inp["obs"], inp["prev"]
    logit = 20 * frames[-1, 2] + 5 * (frames[-1, 3] - frames[0, 3]) + 0.1 * prev
    return jax.random.bernoulli(key, jax.nn.sigmoid(logit), (6,)).astype(jnp.int32)


def test_host_loop_matches_scan():
    env, params = gymnax.make("CartPole-v1")
    model = jaxmesh.Model(policy, spec={"obs": State(stack=3), "prev": Previous()})
    seeds = [3, 1, 4, 1, 5]
    n = len(seeds)
    scan = jaxmesh.evaluate(
        model, (env, params), horizon=4, prefetch_lead=2, num_envs=2, seeds=seeds
    )

    agent = make_agent(model, (env, params), num_envs=n, horizon=4, prefetch_lead=2)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    reset = jax.jit(jax.vmap(lambda k: env.reset_env(k, params)))
    step = jax.jit(jax.vmap(lambda k, s, a: env.step_env(k, s, a, params)))
    trunc = jax.jit(jax.vmap(lambda s: env.is_truncated(s, params)))
    obs, state = reset(keys)
    active = np.ones(n, bool)
    started = np.ones(n, bool)
    t = np.zeros(n, np.int32)
    ret = np.zeros(n)
    ag = agent.init(obs, jnp.asarray(active))
    while active.any():
        ag, actions = agent.step(
            agent.params,
            ag,
            obs,
            jnp.asarray(started),
            jnp.asarray(active),
            keys,
            jnp.asarray(t),
        )
        step_keys = jax.vmap(
            lambda k, s: jax.random.fold_in(jax.random.fold_in(k, 0), s)
        )(keys, jnp.asarray(t))
        obs, state, reward, term, _ = step(step_keys, state, actions)
        done = np.asarray(term) | np.asarray(trunc(state))
        ret += np.where(active, np.asarray(reward), 0.0)
        t += active
        active &= ~done
        started[:] = False
    np.testing.assert_array_equal(ret, scan.returns)
    np.testing.assert_array_equal(t, scan.lengths)
