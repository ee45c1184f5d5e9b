"""Bad input gets a clear exception before anything compiles (CONTRACT 1, 9, 11, 12)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmesh
from jaxmesh import driver as evaluate_mod

ENV = "gymnax:CartPole-v1"


def good(obs):
    return (obs[2] > 0).astype(jnp.int32)


@pytest.fixture
def no_compile(monkeypatch):
    """Fails the test if anything reaches XLA compilation."""

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before rejecting bad input")

    monkeypatch.setattr(evaluate_mod._Compiled, "get_many", refuse)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"episodes": -1}, ValueError, "episodes=-1"),
        ({"episodes": 2.5}, TypeError, "episodes=2.5"),
        ({"num_envs": 0}, ValueError, "num_envs=0"),
        ({"num_envs": -4}, ValueError, "num_envs=-4"),
        ({"horizon": 0}, ValueError, "horizon=0"),
        ({"prefetch_lead": -1}, ValueError, "prefetch_lead=-1"),
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
    with pytest.raises(ValueError, match="registered gymnax envs"):
        jaxmesh.evaluate(good, "gymnax:NoSuchEnv-v0")
    with pytest.raises(ValueError, match="PREFIX:NAME"):
        jaxmesh.evaluate(good, "mujoco:Ant")
    with pytest.raises(ValueError, match="registered brax envs"):
        jaxmesh.evaluate(good, "brax:nope")
    with pytest.raises(TypeError, match="not an environment"):
        jaxmesh.evaluate(good, object())


def test_wrong_output_shape_names_both_shapes(no_compile):
    with pytest.raises(
        TypeError, match=r"returned shape \(2, 3\).*action shape is \(\)"
    ):
        jaxmesh.evaluate(lambda obs: jnp.zeros((2, 3), jnp.int32), ENV)


def test_logits_for_discrete_env(no_compile):
    with pytest.raises(TypeError, match="integer actions"):
        jaxmesh.evaluate(lambda obs: jnp.zeros(2), ENV)


def test_policy_arity(no_compile):
    with pytest.raises(TypeError, match="required positional arguments"):
        jaxmesh.evaluate(lambda a, b, c: a, ENV)
    with pytest.raises(TypeError, match="not callable"):
        jaxmesh.evaluate(42, ENV)


def test_native_chunk_errors(no_compile):
    chunk4 = jaxmesh.Model(lambda obs: jnp.zeros(4, jnp.int32), native_chunk=4)
    with pytest.raises(ValueError, match="horizon=8 exceeds .* native_chunk=4"):
        jaxmesh.evaluate(chunk4, ENV, horizon=8)
    liar = jaxmesh.Model(lambda obs: jnp.zeros(6, jnp.int32), native_chunk=4)
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
    for s, got in zip(seeds, result.returns, strict=True):
        _, state = env.reset_env(jax.random.PRNGKey(s), params)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(s), 0), 0)
        _, _, reward, _, _ = env.step_env(key, state, jnp.zeros(1), params)
        assert got == pytest.approx(float(reward), rel=1e-6)
    assert len(set(result.returns.tolist())) == len(seeds)
