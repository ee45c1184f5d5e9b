"""The brax adapter against a plain loop over brax's own reset/step.

The reference applies ``episode_length`` itself (``t + 1 >= episode_length``
is truncated, independently of the adapter) and compares every episode's
terminated, truncated, length and return.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax import base, envs
from brax.envs.base import Env, State
from brax.envs.wrappers import training
from reference_loop import run_episode, single

import jaxmesh
from jaxmesh import make_env


def push(obs):
    return jnp.tanh(jnp.array([1.0 - obs[1]]))


class Drift(Env):
    """x moves by ``speed * action``; done once ``|x| >= 1``; reward ``1 - x**2``.

    A brax env (defined outside brax) that terminates, unlike ``fast``.
    """

    def __init__(self, spread: float = 0.5, speed: float = 0.25):
        self.spread, self.speed = spread, speed

    def reset(self, rng):
        x = jax.random.uniform(rng, (1,), minval=-self.spread, maxval=self.spread)
        return State(None, x, jnp.float32(0.0), jnp.float32(0.0))

    def step(self, state, action):
        x = state.obs + self.speed * action
        done = (jnp.abs(x[0]) >= 1.0).astype(jnp.float32)
        return state.replace(obs=x, reward=1.0 - x[0] ** 2, done=done)

    @property
    def observation_size(self):
        return 1

    @property
    def action_size(self):
        return 1

    @property
    def backend(self):
        return "none"


class Slide(Drift):
    """q moves by qd, qd by ``0.1 * action``; ``obs = q``, reward ``-q**2``.

    A brax env with a pipeline state (what brax's renderer draws) and no
    physics engine behind it.
    """

    sys = None  # brax's renderer reads env.sys (replaced in the test)

    @staticmethod
    def pipeline(q, qd):
        return base.State(
            q=q,
            qd=qd,
            x=base.Transform.create(pos=jnp.zeros(3)),
            xd=base.Motion.create(vel=jnp.zeros(3)),
            contact=None,
        )

    def reset(self, rng):
        q = jax.random.uniform(rng, (1,), minval=-0.5, maxval=0.5)
        return State(self.pipeline(q, jnp.zeros(1)), q, jnp.float32(0), jnp.float32(0))

    def step(self, state, action):
        ps = state.pipeline_state
        qd = ps.qd + 0.1 * action
        q = ps.q + qd
        return state.replace(
            pipeline_state=self.pipeline(q, qd), obs=q, reward=-(q[0] ** 2)
        )


def settle(obs):
    return -jnp.tanh(2.0 * obs)


def away(obs):
    return jnp.tanh(2.0 * obs)  # pushes away from 0: faster from further out


@functools.cache
def jitted(env):
    """The env's own reset (with its obs) and step, jitted once per env."""
    reset = jax.jit(lambda key: (env.reset(key).obs, (env.reset(key), 0)))
    return reset, jax.jit(env.step)


#: brax's "fast", the reference of both runs of it.
FAST = envs.get_environment("fast")


def brax_fns(env, episode_length):
    """(reset, step) over the env's own functions, truncating on its own."""
    reset, _step = jitted(env)

    def step(key, state, action):
        bstate, t = state
        bstate = _step(bstate, action)
        truncated = t + 1 >= episode_length
        return bstate.obs, (bstate, t + 1), bstate.reward, bstate.done > 0.5, truncated

    return reset, step


def reference(env, policy, seeds, episode_length=1000, cap=100_000):
    fns = brax_fns(env, episode_length)
    return [
        run_episode(*fns, single(lambda o, k: policy(o)), s, cap=cap) for s in seeds
    ]


def assert_episodes(result, refs):
    assert result.terminated.tolist() == [r.terminated for r in refs]
    assert result.truncated.tolist() == [r.truncated for r in refs]
    assert result.lengths.tolist() == [r.length for r in refs]
    np.testing.assert_allclose(result.returns, [r.ret for r in refs], rtol=1e-5)


def test_fast_env_matches_brax_loop():
    result = jaxmesh.evaluate(
        push, "brax:fast", num_envs=3, episodes=4, max_episode_steps=30
    )
    refs = reference(FAST, push, range(4), cap=30)
    assert_episodes(result, refs)
    assert result.truncated.all() and not result.terminated.any()


def test_episode_length_kwarg_truncates_fast_env():
    env = make_env("brax:fast", episode_length=50)
    result = jaxmesh.evaluate(push, env, num_envs=2, episodes=3)
    refs = reference(FAST, push, range(3), episode_length=50)
    assert_episodes(result, refs)
    assert result.lengths.tolist() == [50] * 3 and result.truncated.all()


def test_terminating_env_matches_brax_loop(monkeypatch):
    monkeypatch.setitem(envs._envs, "drift", Drift)
    env = make_env("brax:drift", episode_length=6, spread=0.8)
    assert env.name == "brax:drift"
    result = jaxmesh.evaluate(away, env, num_envs=3, episodes=8)
    refs = reference(Drift(spread=0.8), away, range(8), episode_length=6)
    assert_episodes(result, refs)
    assert {r.terminated for r in refs} == {True, False}  # both ends occur


@pytest.mark.parametrize(
    "episode_length, length, terminated, truncated",
    [(4, 4, True, True), (3, 3, False, True), (5, 4, True, False)],
)
def test_done_on_the_capped_step(episode_length, length, terminated, truncated):
    # Hand-worked: x starts at 0 and moves 0.25 a step, so done fires on step 4.
    env = jaxmesh.envs.BraxEnv(Drift(spread=0.0), episode_length=episode_length)
    result = jaxmesh.evaluate(lambda o: jnp.ones(1), env, num_envs=2, episodes=2)
    assert result.lengths.tolist() == [length] * 2
    ret = sum(1.0 - (0.25 * t) ** 2 for t in range(1, length + 1))
    np.testing.assert_allclose(result.returns, [ret] * 2)
    assert result.terminated.tolist() == [terminated] * 2
    assert result.truncated.tolist() == [truncated] * 2


@pytest.mark.parametrize(
    "episode_length, terminated, truncated",
    [(4, True, True), (3, False, True)],
)
def test_episode_wrapper_limit_is_truncation(episode_length, terminated, truncated):
    # brax's EpisodeWrapper forces done at its limit; that is truncation, and
    # a real termination on its last step is both.
    env = training.EpisodeWrapper(Drift(spread=0.0), episode_length, 1)
    result = jaxmesh.evaluate(lambda o: jnp.ones(1), env, episodes=1)
    assert result.lengths.tolist() == [min(episode_length, 4)]
    assert result.terminated.tolist() == [terminated]
    assert result.truncated.tolist() == [truncated]


def test_brax_env_object_and_default_episode_length():
    env = envs.get_environment("fast")
    chunk = lambda obs: jnp.ones((4, 1)) * obs[0]
    result = jaxmesh.evaluate(chunk, env, horizon=4, num_envs=2, episodes=2)
    assert result.lengths.tolist() == [1000, 1000]  # brax's episode_length default
    assert (result.predict_calls == 250).all()


def test_unknown_brax_id_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean 'ant'\\?") as e:
        make_env("brax:antt")
    assert "walker2d" not in str(e.value)


def test_bad_brax_kwargs_are_refused_naming_them(monkeypatch):
    monkeypatch.setitem(envs._envs, "drift", Drift)
    with pytest.raises(TypeError, match="'sped'"):
        make_env("brax:drift", sped=0.5)
    with pytest.raises(ValueError, match="episode_length=0"):
        make_env("brax:drift", episode_length=0)


def test_recorded_states_equal_brax_loop(monkeypatch):
    env = Slide()
    adapter = jaxmesh.envs.BraxEnv(env, episode_length=12)
    record = jaxmesh.Record(episodes=[0, 2])
    r = jaxmesh.evaluate(settle, adapter, num_envs=2, episodes=3, record=record)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    for tr in r.trajectories:
        s = reset(jax.random.PRNGKey(tr.seed))
        states = [s.pipeline_state]
        for _ in range(tr.length):
            s = step(s, settle(s.obs))
            states.append(s.pipeline_state)
        assert sorted(tr.states) == ["q", "qd"]
        np.testing.assert_allclose(tr.states["q"], [p.q for p in states], atol=1e-6)
        np.testing.assert_allclose(tr.states["qd"], [p.qd for p in states], atol=1e-6)
    # brax's renderer gets the recorded states; nothing is replayed.
    from brax.io import image

    from jaxmesh.results import video

    def no_replay(*args):
        raise AssertionError("a recorded episode's states were replayed")

    drawn = lambda sys, states, height, width: [np.asarray(p.q) for p in states]
    monkeypatch.setattr(video, "replay_states", no_replay)
    monkeypatch.setattr(image, "render_array", drawn)
    frames = video.episode_frames(r, episode=2, env=adapter)
    np.testing.assert_array_equal(np.stack(frames), r.trajectory(2).states["q"])
