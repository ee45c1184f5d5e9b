"""Recording episodes (``record=jaxmesh.Record(...)``) on every path.

Each recorded trajectory is checked against an independent plain loop: gymnax's
own ``reset_env`` / ``step_env`` with the episode's keys (CONTRACT 5,
``reference_loop``), and a plain gymnasium loop (``gym_reference``), with a
chunked policy on N = 1 and N = 3 lanes (recorded episodes that do not run on
lane 0 included).
"""

from __future__ import annotations

import json

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID, SEEDS, chunky
from reference_loop import gymnax_fns, run_episode

from jaxmesh import Evaluator, Layout, evaluate
from jaxmesh.remote.server import EnvServer
from jaxmesh.results.record import Record, Trajectory
from jaxmesh.results.result import RunResult

RECORDED = [1, 4]
EPISODES = 6


def logged(reset, step):
    """``(reset, step)`` that also log every step's reward and ends."""
    log: list = []

    def step_and_log(key, state, action):
        obs, state, reward, term, trunc = step(key, state, action)
        log.append((float(reward), bool(term), bool(trunc)))
        return obs, state, reward, term, trunc

    return reset, step_and_log, log


def reference(reset, step, seed, cap=100_000):
    """The plain loop's trajectory of one episode: (Episode, rewards, ends)."""
    fn = jax.jit(chunky)
    reset, step, log = logged(reset, step)
    ep = run_episode(reset, step, lambda x, k: fn(x), seed, horizon=4, cap=cap)
    rewards, term, trunc = (np.asarray(c) for c in zip(*log, strict=True))
    return ep, rewards, term, trunc


def check_trajectory(tr: Trajectory, ref, steps=None) -> None:
    ep, rewards, term, trunc = ref
    t = ep.length if steps is None else steps
    assert tr.length == ep.length
    assert tr.cut == (t < ep.length)
    assert tr.observations.shape[0] == t + 1
    np.testing.assert_allclose(
        tr.observations, np.stack(ep.observations[: t + 1]), rtol=0, atol=1e-6
    )
    np.testing.assert_array_equal(tr.actions, np.stack(ep.actions[:t]))
    np.testing.assert_array_equal(tr.rewards, rewards[:t].astype(np.float32))
    np.testing.assert_array_equal(tr.terminated, term[:t])
    np.testing.assert_array_equal(tr.truncated, trunc[:t])


@pytest.fixture(scope="module")
def gymnax_refs():
    env, params = gymnax.make("CartPole-v1")
    reset, step = gymnax_fns(env, params)
    return {i: reference(reset, step, i) for i in RECORDED}


@pytest.fixture(scope="module")
def gymnax_plain():
    """Every budgeted episode of the plain loop (for the returns and lengths)."""
    env, params = gymnax.make("CartPole-v1")
    reset, step = gymnax_fns(env, params)
    return [reference(reset, step, i)[0] for i in range(EPISODES)]


#: Segments of 16 steps on one lane: the partial-result test's program too.
ONE_LANE = {"num_envs": 1, "layout": Layout(segment_steps=16)}


@pytest.mark.parametrize("n", [1, 3])
def test_gymnax_recording_equals_plain_loop(gymnax_refs, n):
    r = evaluate(
        chunky,
        "gymnax:CartPole-v1",
        horizon=4,
        **(ONE_LANE if n == 1 else {"num_envs": n}),
        episodes=EPISODES,
        record=Record(episodes=RECORDED),
    )
    assert [tr.episode for tr in r.trajectories] == RECORDED
    if n == 3:
        assert any(r.lanes[i] != 0 for i in RECORDED)  # not on lane 0
    for tr in r.trajectories:
        assert tr.seed == tr.episode
        assert tr.frames is None
        check_trajectory(tr, gymnax_refs[tr.episode])
        assert r.trajectory(tr.episode) is tr


def test_cap_keeps_the_first_steps_in_buffers_sized_by_recorded_episodes(
    gymnax_refs, gymnax_plain
):
    ev = Evaluator(
        chunky,
        "gymnax:CartPole-v1",
        horizon=4,
        num_envs=3,
        record=Record(episodes=RECORDED, max_steps=5),
    )
    a = ev.run(episodes=EPISODES)
    for tr in a.trajectories:
        assert tr.cut and tr.steps == 5
        check_trajectory(tr, gymnax_refs[tr.episode], steps=5)
    programs = ev.programs()
    (program,) = ev._programs.values()
    rec = program.engine.carry_shape().results.recording
    assert rec.actions.shape == (2, 5)  # two episodes, whatever the budget
    assert rec.observations.shape == (2, 6, 4)
    # Other episodes, as many: the same program.
    b = ev.run(episodes=EPISODES, record=Record(episodes=[0, 5], max_steps=5))
    assert ev.programs() == programs and b.compile_time == 0.0
    assert [t.episode for t in a.trajectories] == RECORDED
    assert [t.episode for t in b.trajectories] == [0, 5]
    # Without a record, no buffers (the program built, not compiled).
    plain = Evaluator(chunky, "gymnax:CartPole-v1", horizon=4, num_envs=3)
    p = plain._program(None, plain.plan(None, EPISODES))
    assert p.engine.carry_shape().results.recording is None
    # A gymnax env declares no render state: none is kept.
    assert rec.states is None and a.trajectories[0].states is None
    # Recording changes no episode: every one is the plain loop's.
    for got in (a, b):
        np.testing.assert_array_equal(got.returns, [e.ret for e in gymnax_plain])
        np.testing.assert_array_equal(got.lengths, [e.length for e in gymnax_plain])


def test_bad_record_arguments():
    with pytest.raises(ValueError, match=r"not in the budget of 3 episodes"):
        evaluate(chunky, "gymnax:CartPole-v1", episodes=3, record=Record([5]))
    with pytest.raises(TypeError, match="jaxmesh.Record"):
        evaluate(chunky, "gymnax:CartPole-v1", episodes=3, record=[0])
    with pytest.raises(ValueError, match="one array"):
        evaluate(chunky, "gymnax:CartPole-v1", episodes=3, record=Record(keys="x"))
    with pytest.raises(ValueError, match="named twice"):
        Record([1, 1])
    with pytest.raises(ValueError, match="max_steps"):
        Record(max_steps=0)
    with pytest.raises(ValueError, match="devices="):
        evaluate(
            chunky,
            "gymnax:CartPole-v1",
            episodes=3,
            layout=Layout(devices=1),
            record=Record([0]),
        )


def test_states_need_an_env_that_declares_them():
    with pytest.raises(TypeError, match=r"Record\(states='yes'\)"):
        Record(states="yes")
    # Refused before anything compiles, naming the env.
    for env in ("gymnax:CartPole-v1", f"gymnasium:{ID}"):
        with pytest.raises(ValueError, match="declares no render_state") as e:
            evaluate(chunky, env, episodes=2, record=Record([0], states=True))
        assert "states=True" in str(e.value)


class DictObs(gym.ObservationWrapper):
    """CartPole's observation split into a dict (for ``keys``)."""

    def observation(self, obs):
        return {"pos": obs[:2], "vel": obs[2:]}


def test_keys_pick_observation_leaves():
    # A JAX env of jaxmesh's protocol with a dict observation.
    env, params = gymnax.make("CartPole-v1")

    class Split:
        name = "split"
        action_shape, action_dtype, num_actions = (), jnp.int32, 2
        max_steps = None

        def reset(self, key):
            obs, state = env.reset_env(key, params)
            return {"pos": obs[:2], "ang": obs[2:]}, state

        def step(self, key, state, action):
            obs, state, r, term, _ = env.step_env(key, state, action, params)
            trunc = env.is_truncated(state, params)
            return {"pos": obs[:2], "ang": obs[2:]}, state, r, term, trunc

    def pol(obs):
        return (obs["ang"][0] > 0).astype(jnp.int32)

    r = evaluate(pol, Split(), num_envs=2, episodes=3, record=Record([1], keys="ang"))
    (tr,) = r.trajectories
    assert set(tr.observations) == {"ang"}
    assert tr.observations["ang"].shape == (tr.length + 1, 2)
    with pytest.raises(ValueError, match="'vel' is not an observation leaf"):
        evaluate(pol, Split(), episodes=3, record=Record([1], keys="vel"))


def gym_reference(seed, cap=100_000):
    env = gym.make(ID)

    def reset(key):
        return env.reset(seed=seed)[0], None

    def step(key, state, action):
        obs, reward, term, trunc, _ = env.step(int(action))
        return obs, None, reward, term, trunc

    return reference(reset, step, seed, cap)


@pytest.mark.parametrize("n", [1, 3])
def test_gymnasium_recording_equals_plain_loop(n):
    envs = [gym.make(ID, render_mode="rgb_array") for _ in range(n)]
    seeds = SEEDS[:EPISODES]
    r = evaluate(chunky, envs, horizon=4, seeds=seeds, record=Record(episodes=RECORDED))
    for tr in r.trajectories:
        check_trajectory(tr, gym_reference(seeds[tr.episode]))
        # one rgb frame per observation, captured during the run
        assert tr.frames.shape[0] == tr.length + 1 and tr.frames.shape[-1] == 3
    if n == 3:
        assert any(r.lanes[i] != 0 for i in RECORDED)


def test_gymnasium_frames_need_rgb_array():
    with pytest.raises(ValueError, match="render_mode"):
        evaluate(chunky, gym.make(ID), episodes=2, record=Record([0], frames=True))
    # horizon=4 on one lane: the agent step of the test above, at n = 1
    r = evaluate(chunky, gym.make(ID), horizon=4, episodes=2, record=Record([0]))
    assert r.trajectories[0].frames is None  # no render_mode: no frames


def test_gymnasium_id_cap_and_seconds():
    ref = gym_reference(SEEDS[0])
    r = evaluate(
        chunky,
        f"gymnasium:{ID}",
        horizon=4,
        num_envs=1,
        seeds=SEEDS[:2],
        record=Record([0], max_steps=4),
    )
    (tr,) = r.trajectories
    check_trajectory(tr, ref, steps=4)
    assert tr.frames.shape[0] == 5  # made with render_mode="rgb_array"


@pytest.mark.parametrize("n", [1, 3])
def test_served_recording_equals_plain_loop(n):
    seeds = SEEDS[:EPISODES]
    with EnvServer([gym.make(ID) for _ in range(n)], "127.0.0.1:0") as server:
        r = evaluate(
            chunky,
            f"grpc://{server.address}",
            horizon=4,
            num_envs=n,
            seeds=seeds,
            record=Record(episodes=RECORDED),
        )
    for tr in r.trajectories:
        check_trajectory(tr, gym_reference(seeds[tr.episode]))
        assert tr.frames is None


def test_to_dict_and_npz_round_trip(tmp_path):
    r = evaluate(
        chunky,
        [gym.make(ID, render_mode="rgb_array") for _ in range(2)],
        horizon=4,
        seeds=SEEDS[:3],
        record=Record(episodes=[0, 2], max_steps=10),
    )
    d = r.to_dict()
    assert [x["episode"] for x in d["recorded"]] == [0, 2]
    assert d["recorded"][0]["steps"] == min(10, int(r.lengths[0]))
    back = RunResult.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.trajectories is None
    path = r.save_trajectories(tmp_path / "traj.npz")
    back = back.load_trajectories(path)
    for a, b in zip(r.trajectories, back.trajectories, strict=True):
        for field in ("episode", "seed", "length", "cut"):
            assert getattr(a, field) == getattr(b, field)
        for k, v in a.arrays().items():
            np.testing.assert_array_equal(v, b.arrays()[k])
    assert back.to_dict() == d


def test_partial_result_keeps_finished_recordings():
    class Stop:
        def on_episode_end(self, ep):
            if ep.index == 2:
                raise RuntimeError("stop")

    with pytest.raises(RuntimeError) as info:
        evaluate(
            chunky,
            "gymnax:CartPole-v1",
            horizon=4,
            **ONE_LANE,
            episodes=EPISODES,
            hooks=Stop(),
            record=Record(RECORDED),
        )
    partial = info.value.partial_result
    assert [t.episode for t in partial.trajectories] == [1]  # 4 never finished
