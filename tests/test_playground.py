"""MuJoCo Playground (MJX) envs against a plain loop over Playground's own
``env.reset(key)`` / ``env.step(state, action)``.

The reference resets episode s with ``jax.random.PRNGKey(s)`` (CONTRACT 5),
applies the config's ``episode_length`` itself (``t >= episode_length`` is
truncated; Playground's ``done`` is termination) and, for domain
randomization, draws the model from ``fold_in(PRNGKey(s), 7)`` and swaps it
into the env the way Playground's own randomization wrapper does
(``env._mjx_model``). One compile of the reference's reset and step (the model
an argument) serves every episode; episodes are short and lanes few, since MJX
compiles slowly on a CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")

import jaxmesh  # noqa: E402
from jaxmesh.envs import make_env, playground  # noqa: E402

LENGTH = 20
SEEDS = [3, 0, 7, 11, 5]
#: A fixed linear policy on CartpoleBalance's 5 observations.
W = jnp.array([[0.3, -0.5, 2.0, 0.4, 0.6]])


def policy(obs):
    return jnp.tanh(W @ obs)


def heavier_pole(model, key):
    """Scales the pole's mass (body 2) by a factor in [0.5, 3)."""
    scale = jax.random.uniform(key, (), minval=0.5, maxval=3.0)
    return model.replace(body_mass=model.body_mass.at[2].multiply(scale))


@pytest.fixture(scope="module")
def env():
    return make_env(
        "playground:CartpoleBalance", config_overrides={"episode_length": LENGTH}
    )


@pytest.fixture(scope="module")
def reference(env):
    """``run(seed, randomize=None) -> (return, length, terminated, truncated,
    sum of reward/upright, body_mass[2])``: a plain loop, one episode."""
    pg = env.env
    assert pg._config.impl == "jax" and pg._config.episode_length == LENGTH
    base = pg.mjx_model

    def swapped(fn):
        def call(model, *args):
            old = pg._mjx_model
            pg._mjx_model = model
            try:
                return fn(*args)
            finally:
                pg._mjx_model = old

        return jax.jit(call)

    reset, step = swapped(pg.reset), swapped(pg.step)
    act = jax.jit(policy)

    def run(seed, randomize=None):
        key = jax.random.PRNGKey(seed)
        model = base
        if randomize is not None:
            model = randomize(base, jax.random.fold_in(key, 7))
        state = reset(model, key)
        ret, upright, t = 0.0, 0.0, 0
        while True:
            state = step(model, state, act(state.obs))
            t += 1
            ret += float(state.reward)
            upright += float(state.metrics["reward/upright"])
            term, trunc = bool(state.done > 0.5), t >= LENGTH
            if term or trunc:
                mass = float(model.body_mass[2])
                return ret, t, term, trunc, upright, mass

    return run


def test_matches_plain_loop(env, reference):
    # One lane; the randomized test below runs 4 lanes (lane turnover), and
    # each MJX program costs tens of seconds to compile on a CPU.
    r = jaxmesh.evaluate(
        policy,
        env,
        num_envs=1,
        seeds=SEEDS,
        metrics={"reward/upright": "sum"},
    )
    ref = [reference(s) for s in SEEDS]
    np.testing.assert_allclose(r.returns, [x[0] for x in ref], rtol=1e-5)
    np.testing.assert_array_equal(r.lengths, [x[1] for x in ref])
    np.testing.assert_array_equal(r.terminated, [x[2] for x in ref])
    np.testing.assert_array_equal(r.truncated, [x[3] for x in ref])
    np.testing.assert_allclose(
        r.metrics["reward/upright"], [x[4] for x in ref], rtol=1e-5
    )
    assert r.env == "playground:CartpoleBalance"


def test_randomize_per_episode_matches_plain_loop(env, reference):
    r = jaxmesh.evaluate(
        policy,
        env,
        num_envs=4,
        seeds=SEEDS,
        randomize=heavier_pole,
        metrics={"model/body_mass/2": "last"},
    )
    ref = [reference(s, heavier_pole) for s in SEEDS]
    masses = [x[5] for x in ref]
    np.testing.assert_allclose(r.metrics["model/body_mass/2"], masses, rtol=1e-6)
    np.testing.assert_allclose(r.returns, [x[0] for x in ref], rtol=1e-5)
    np.testing.assert_array_equal(r.lengths, [x[1] for x in ref])
    np.testing.assert_array_equal(r.truncated, [x[3] for x in ref])
    # Lane j started episode j; the fifth went to the first lane to finish.
    assert list(r.lanes[:4]) == [0, 1, 2, 3]
    # The draws differ per episode and change the physics.
    assert len(set(np.round(masses, 6))) == len(SEEDS)
    plain = [reference(s)[0] for s in SEEDS]
    assert not np.allclose(r.returns, plain, rtol=1e-4)


def test_env_object_takes_its_config(env):
    from mujoco_playground import registry

    pg = registry.load(
        "CartpoleBalance",
        config_overrides={"impl": "jax", "episode_length": 7, "action_repeat": 2},
    )
    adapted = make_env(pg)
    assert isinstance(adapted, playground.PlaygroundEnv)
    assert (adapted.episode_length, adapted.action_repeat, adapted.limit) == (7, 2, 4)
    assert adapted.action_shape == (1,) and adapted.num_actions is None


def test_bad_input_is_refused_before_compiling():
    with pytest.raises(ValueError, match="did you mean 'CartpoleBalance'"):
        make_env("playground:CartpoleBalanc")
    with pytest.raises(ValueError, match="episode_lenght.*did you mean"):
        make_env("playground:CartpoleBalance", config_overrides={"episode_lenght": 5})
    with pytest.raises(TypeError, match="config_overrides"):
        make_env("playground:CartpoleBalance", episode_lenght=5)
    with pytest.raises(TypeError, match="randomize= is for MuJoCo Playground"):
        jaxmesh.evaluate(policy, "gymnax:Pendulum-v1", randomize=heavier_pole)
    with pytest.raises(TypeError, match="randomize= is for MuJoCo Playground"):
        jaxmesh.evaluate(policy, "gymnasium:Pendulum-v1", randomize=heavier_pole)


def test_bad_randomizer_is_refused(env):
    with pytest.raises(TypeError, match="expected a function"):
        playground.randomized(env, 3)
    with pytest.raises(TypeError, match="shape and dtype"):
        playground.randomized(
            env, lambda m, k: m.replace(body_mass=jnp.zeros(7, jnp.float32))
        )
