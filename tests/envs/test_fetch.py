"""The Fetch suite (``jaxmesh.zoo.fetch``) against a plain gymnasium-robotics loop.

The reference makes the Fetch task with gymnasium-robotics' own id, flattens its
observation with gymnasium's wrapper, and steps it with the scripted policy
(jitted, one lane) until the env ends the episode, recording each episode's return,
length, whether ``info["is_success"]`` was ever true, and its last value.
"""

from __future__ import annotations

import gymnasium as gym
import gymnasium_robotics
import jax
import numpy as np
import pytest

import jaxmesh
from jaxmesh.zoo import fetch

SEEDS = [0, 3, 7]


def plain_fetch(task: str, seeds) -> list[tuple[float, int, bool, bool]]:
    gym.register_envs(gymnasium_robotics)
    env = gym.wrappers.FlattenObservation(gym.make(task))
    act = jax.jit(fetch.scripted)
    out = []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            total, length, done, once = 0.0, 0, False, False
            while not done:
                obs, reward, term, trunc, info = env.step(np.asarray(act(obs)))
                total += float(reward)
                length += 1
                once = once or bool(info["is_success"])
                done = term or trunc
            out.append((total, length, once, bool(info["is_success"])))
    finally:
        env.close()
    return out


@pytest.fixture(scope="module")
def suite_result():
    tasks = {
        flat.removesuffix("Flat-v4"): f"gymnasium:jaxmesh.zoo.fetch:{flat}"
        for flat in fetch.TASKS
    }
    suite = jaxmesh.Suite(tasks, seeds=SEEDS)
    return jaxmesh.evaluate(fetch.scripted, suite, num_envs=2)


@pytest.mark.parametrize("flat", list(fetch.TASKS))
def test_each_fetch_task_equals_the_plain_loop(suite_result, flat):
    result = suite_result.tasks[flat.removesuffix("Flat-v4")]
    ref = plain_fetch(fetch.TASKS[flat], SEEDS)
    np.testing.assert_allclose(result.returns, [r[0] for r in ref], rtol=1e-6)
    np.testing.assert_array_equal(result.lengths, [r[1] for r in ref])
    np.testing.assert_array_equal(result.success_once, [r[2] for r in ref])
    np.testing.assert_array_equal(result.success_at_end, [r[3] for r in ref])
    np.testing.assert_array_equal(result.success, result.success_once)  # headline
    assert result.success_key == "is_success"


def test_reach_is_solved(suite_result):
    assert suite_result.tasks["FetchReach"].success_rate == 1.0
