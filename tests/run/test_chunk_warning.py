"""A chunk nobody declared, played at horizon 1, warns once (CONTRACT 11).

The forgetful policy below means one CartPole action but returns one per
observation entry, an int vector of 4: read as a chunk of 4 actions, of which
horizon 1 plays the first. A chunk that is declared (``native_chunk``, a
``predict_chunk`` corner, an ``execution_horizon`` parameter) or asked for (a
horizon above 1, an ensemble) is meant and says nothing.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh

MATCH = r"shape \(4,\) per lane, read as a chunk of 4 actions"


def forgetful(obs):  # meant: (obs[2] + 0.5 > 0), one action
    return (obs + 0.5 > 0).astype(jnp.int32)


def first_of_forgetful(obs):  # what horizon 1 plays of it: the chunk's first
    return int(obs[0] + 0.5 > 0)


def chunk_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "read as a chunk" in str(w.message)]


def quiet(run):
    """Runs ``run()`` and returns the undeclared-chunk warnings it gave."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run()
    return chunk_warnings(seen)


def plain_gym_loop(policy, seeds):
    """Returns of a plain gymnasium loop, one env, one action per step."""
    env = gym.make("CartPole-v1")
    out = []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        ret, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(policy(obs))
            ret += float(r)
            done = term or trunc
        out.append(ret)
    return np.array(out)


def test_forgetful_policy_on_a_jax_env_warns_once_naming_the_fix():
    with pytest.warns(UserWarning, match=MATCH) as record:
        result = jaxmesh.evaluate(forgetful, "gymnax:CartPole-v1", episodes=3)
    (message,) = chunk_warnings(record)
    assert "'forgetful'" in message
    assert "Discrete(2)" in message
    assert "only each chunk's first action is played" in message
    assert "return shape ()" in message and "obs[2]" in message
    assert "native_chunk=4" in message and "execution_horizon" in message
    assert result.effective_horizon == 1
    assert (result.predict_calls == result.lengths).all()


def test_an_evaluator_warns_once_over_its_runs():
    ev = jaxmesh.Evaluator(forgetful, "gymnax:CartPole-v1", num_envs=2)
    with pytest.warns(UserWarning, match=MATCH) as record:
        ev.run(episodes=2)
        ev.run(episodes=3)
    assert len(chunk_warnings(record)) == 1


def test_forgetful_policy_on_a_host_stepped_env_warns_and_plays_the_first_action():
    seeds = [0, 1, 2]
    with pytest.warns(UserWarning, match=MATCH) as record:
        result = jaxmesh.evaluate(
            forgetful, "gymnasium:CartPole-v1", num_envs=2, seeds=seeds, workers=0
        )
    assert len(chunk_warnings(record)) == 1
    np.testing.assert_array_equal(
        result.returns, plain_gym_loop(first_of_forgetful, seeds)
    )


def chunk_of(obs, k):
    return jnp.repeat((obs[2] > 0).astype(jnp.int32), k)


class Chunker(jaxmesh.Model):
    def predict_chunk(self, obs):  # a corner that says "chunks"
        return chunk_of(obs, 4)


def told(obs, execution_horizon: int = 4):
    return chunk_of(obs, execution_horizon)


@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "gymnasium:CartPole-v1"])
@pytest.mark.parametrize(
    "policy",
    [
        jaxmesh.Model(lambda obs: chunk_of(obs, 4), native_chunk=4),
        Chunker(),
        told,
    ],
    ids=["native_chunk", "predict_chunk", "execution_horizon"],
)
def test_a_declared_chunk_at_horizon_1_says_nothing(policy, env):
    run = lambda: jaxmesh.evaluate(policy, env, num_envs=2, episodes=2, horizon=1)
    assert quiet(run) == []


def test_a_chunk_asked_for_says_nothing():
    # A horizon above 1 asks for chunks: the forgetful policy's K = 4 is played.
    run = lambda: jaxmesh.evaluate(forgetful, "gymnax:CartPole-v1", horizon=4)
    assert quiet(run) == []

    # An ensemble plans every step (horizon 1) and executes all of every chunk.
    def head(obs):  # Pendulum: 3 actions of shape (1,), undeclared
        return jnp.tile(jnp.clip(-obs[1:2], -2.0, 2.0), (3, 1))

    chunking = jaxmesh.Chunking(execution=jaxmesh.Ensemble(m=0.01))
    run = lambda: jaxmesh.evaluate(
        head, "gymnax:Pendulum-v1", episodes=1, chunking=chunking
    )
    assert quiet(run) == []


def test_single_actions_at_horizon_1_say_nothing():
    run = lambda: jaxmesh.evaluate(first_jax, "gymnax:CartPole-v1", episodes=2)
    assert quiet(run) == []


def first_jax(obs):
    return (obs[2] + 0.5 > 0).astype(jnp.int32)
