"""make_env: user-defined gymnax and protocol envs, the end rule, ids, kwargs."""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces
from gymnax.environments.classic_control.cartpole import CartPole
from reference_loop import assert_matches, gymnax_fns, run_episode, single

import jaxmesh
from jaxmesh import make_env


# A gymnax env written by a user, outside gymnax's package ----------------------
@struct.dataclass
class WalkState(environment.EnvState):
    pos: jax.Array
    time: int


@struct.dataclass
class WalkParams(environment.EnvParams):
    goal: int = 5  # terminated once pos >= goal
    spread: int = 4  # reset pos is uniform in [0, spread)
    slip: float = 0.3  # chance that a step does not move
    max_steps_in_episode: int = 8


class Walk(environment.Environment):
    """Action 1 steps right, 0 left; the reward is the position after the step."""

    @property
    def default_params(self) -> WalkParams:
        return WalkParams()

    def reset_env(self, key, params):
        state = WalkState(pos=jax.random.randint(key, (), 0, params.spread), time=0)
        return self.get_obs(state), state

    def step_env(self, key, state, action, params):
        stay = jax.random.bernoulli(key, params.slip)
        pos = state.pos + jnp.where(stay, 0, 2 * action - 1)
        state = WalkState(pos=pos, time=state.time + 1)
        return self.get_obs(state), state, pos.astype(float), pos >= params.goal, {}

    def get_obs(self, state, params=None, key=None):
        return jnp.array([state.pos, state.time], jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)

    @property
    def name(self) -> str:
        return "Walk-test"


class LongPole(CartPole):
    """A user's subclass of a real gymnax env: a pole twice as long."""

    @property
    def default_params(self):
        return super().default_params.replace(length=1.0, polemass_length=0.1)

    @property
    def name(self) -> str:
        return "LongPole"


def right(obs):
    return jnp.int32(1)


def lean(obs):
    return (obs[2] + 0.1 * obs[3] > 0).astype(jnp.int32)


#: ``lean`` as the reference's chunk of one, jitted (as the run's policy is):
#: one call a step instead of an eager op per operation.
lean_chunk = jax.jit(lambda obs, key: lean(obs)[None])


def test_user_gymnax_subclass_matches_its_own_functions():
    env = Walk()
    result = jaxmesh.evaluate(right, env, num_envs=3, episodes=8)
    fns = gymnax_fns(env, env.default_params)  # compiled once for every seed
    refs = [run_episode(*fns, single(lambda o, k: 1), s) for s in range(8)]
    assert_matches(result, refs)
    assert len({r.length for r in refs}) > 1  # seeds and step keys matter
    assert {r.terminated for r in refs} == {True, False}


def test_user_gymnax_env_with_its_params_as_tuple():
    env, params = Walk(), WalkParams(goal=6, slip=0.1, max_steps_in_episode=20)
    result = jaxmesh.evaluate(right, (env, params), num_envs=2, episodes=5)
    fns = gymnax_fns(env, params)
    refs = [run_episode(*fns, single(lambda o, k: 1), s) for s in range(5)]
    assert_matches(result, refs)
    assert make_env((env, params)).name == "gymnax:Walk-test"


def test_user_subclass_of_a_real_gymnax_env():
    env = LongPole()
    result = jaxmesh.evaluate(lean, env, num_envs=2, episodes=4)
    fns = gymnax_fns(env, env.default_params)
    refs = [run_episode(*fns, lean_chunk, s) for s in range(4)]  # 500 steps each
    assert_matches(result, refs)


def test_without_gymnax_loaded_nothing_is_a_gymnax_env(monkeypatch):
    monkeypatch.delitem(sys.modules, "gymnax.environments.environment")
    with pytest.raises(TypeError, match="action_shape"):
        make_env(Walk())


# The end rule (jaxmesh.envs): terminated and truncated can both be True ---------
@pytest.mark.parametrize(
    "limit, length, ret, terminated, truncated",
    [
        (4, 4, 1 + 2 + 3 + 4, True, True),  # reaches the goal on the capped step
        (3, 3, 1 + 2 + 3, False, True),
        (5, 4, 1 + 2 + 3 + 4, True, False),
    ],
)
def test_gymnax_goal_on_the_capped_step(limit, length, ret, terminated, truncated):
    # Hand-worked: pos starts at 0 (spread 1) and never slips, so the goal 4 is
    # reached on step 4 with rewards 1, 2, 3, 4.
    params = WalkParams(goal=4, spread=1, slip=0.0, max_steps_in_episode=limit)
    result = jaxmesh.evaluate(right, (Walk(), params), num_envs=2, episodes=2)
    assert result.lengths.tolist() == [length] * 2
    assert result.returns.tolist() == [ret] * 2
    assert result.terminated.tolist() == [terminated] * 2
    assert result.truncated.tolist() == [truncated] * 2


def test_gymnax_cartpole_falls_on_the_capped_step():
    # The plain loop finds the step on which CartPole falls for seed 3 under an
    # always-right policy; capping the env there must report both flags.
    env, params = CartPole(), CartPole().default_params
    fall = run_episode(*gymnax_fns(env, params), single(lambda o, k: 1), 3)
    assert fall.terminated and not fall.truncated
    env_capped = make_env("gymnax:CartPole-v1", max_steps_in_episode=fall.length)
    result = jaxmesh.evaluate(right, env_capped, seeds=[3])
    assert result.lengths.tolist() == [fall.length]
    assert result.terminated.tolist() == [True]
    assert result.truncated.tolist() == [True]


# An env of jaxmesh's own protocol (jaxmesh.types.Env) ---------------------------
class Thermostat:
    """Heats (action 2), holds (1) or cools (0) a noisy temperature."""

    name = "thermostat"
    action_shape = ()
    action_dtype = jnp.int32
    num_actions = 3

    def reset(self, key):
        temp = jax.random.uniform(key, (), minval=-1.0, maxval=1.0)
        return jnp.stack([temp]), (temp, jnp.int32(0))

    def step(self, key, state, action):
        temp, t = state
        temp = temp + 0.3 * (action - 1) + 0.2 * jax.random.normal(key)
        t = t + 1
        return jnp.stack([temp]), (temp, t), -jnp.abs(temp), jnp.abs(temp) > 2.0, t >= 9


def thermo_policy(obs):
    return jnp.where(obs[0] > 0, 2, 1).astype(jnp.int32)  # a bad one: heats


def test_protocol_env_matches_a_plain_loop():
    env = Thermostat()
    assert make_env(env) is env
    result = jaxmesh.evaluate(thermo_policy, env, num_envs=3, episodes=7)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    refs = [
        run_episode(reset, step, single(lambda o, k: thermo_policy(o)), s)
        for s in range(7)
    ]
    np.testing.assert_allclose(result.returns, [r.ret for r in refs], rtol=1e-5)
    assert result.lengths.tolist() == [r.length for r in refs]
    assert result.terminated.tolist() == [r.terminated for r in refs]
    assert result.truncated.tolist() == [r.truncated for r in refs]
    assert {r.terminated for r in refs} == {True, False}


class NoActionCount:
    """Thermostat without num_actions."""

    name, action_shape, action_dtype = "no-count", (), jnp.int32
    reset, step = Thermostat.reset, Thermostat.step


def test_protocol_env_missing_num_actions_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"lacks num_actions \(the number of discrete"):
        make_env(NoActionCount())
    with pytest.raises(TypeError, match="lacks num_actions"):
        jaxmesh.evaluate(thermo_policy, NoActionCount(), episodes=1)


def test_object_lacking_everything_names_each_attribute():
    with pytest.raises(TypeError) as e:
        make_env(object())
    for attr in ("name", "action_shape", "action_dtype", "num_actions", "reset"):
        assert f"{attr} (" in str(e.value)


@pytest.mark.parametrize(
    "attr, value",
    [("num_actions", 0), ("num_actions", 2.0), ("action_shape", (1.5,)), ("step", 3)],
)
def test_protocol_env_with_a_bad_value_is_refused_naming_it(attr, value):
    env = Thermostat()
    setattr(env, attr, value)
    with pytest.raises(TypeError, match=attr):
        make_env(env)


# Ids and their kwargs --------------------------------------------------------------
def error(env: Any, **kwargs: Any) -> str:
    with pytest.raises((ValueError, TypeError)) as e:
        make_env(env, **kwargs)
    assert "\n" not in str(e.value)  # one paragraph
    return str(e.value)


def test_unknown_gymnax_id_suggests_the_closest():
    msg = error("gymnax:CartPol-v1")
    assert "did you mean 'CartPole-v1'" in msg
    assert "Seaquest-MinAtar" not in msg  # not the whole registry
    assert "did you mean 'CartPole-v1'?" in error("gymnax:cartpole-v1")


def test_unknown_prefix_and_missing_prefix_suggest_the_closest():
    assert "did you mean 'gymnax'?" in error("gymax:CartPole-v1")
    # The closest first (Playground's ids join the hints once it is imported).
    assert "did you mean 'gymnax:CartPole-v1'" in error("CartPole-v1")


def test_gymnax_kwargs_reach_params_and_constructor():
    env = make_env("gymnax:CartPole-v1", max_steps_in_episode=20, gravity=9.0)
    assert (env.params.max_steps_in_episode, env.params.gravity) == (20, 9.0)
    result = jaxmesh.evaluate(lean, env, num_envs=2, episodes=3)
    fns = gymnax_fns(env.env, env.params)
    refs = [run_episode(*fns, lean_chunk, s) for s in range(3)]
    assert_matches(result, refs)
    assert result.lengths.max() <= 20


def test_bad_kwargs_are_refused_naming_them():
    assert "'episode_lenght'" in error("gymnax:CartPole-v1", episode_lenght=5)
    assert "['max_steps_in_episode']" in error(Walk(), max_steps_in_episode=5)
