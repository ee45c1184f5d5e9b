"""``jaxmesh.check_seeds``, ``evaluate(..., check_seeds=True)`` and ``jaxmesh
check-env``: is an env reproducible from its seed, and does the seed matter?

The references are envs whose behaviour is known by construction: gymnasium's
CartPole (seeded resets, deterministic physics), a wrapper that resets from
the global ``np.random`` state instead of the seed (as an env that ignores its
seed does), one that always resets with the same seed, and a MetaWorld-like
env that picks its task by the trial index and ignores the seed.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gym_reference import ID, TrialEnv, lean

import jaxmesh
from jaxmesh.cli import main


class IgnoresSeed(gym.Wrapper):
    """CartPole reset from the global ``np.random`` state, not from its seed."""

    def reset(self, *, seed=None, options=None):
        del seed
        return self.env.reset(seed=int(np.random.randint(1 << 30)), options=options)


class SameSeed(gym.Wrapper):
    """CartPole reset with seed 7 whatever seed it is given: reproducible, but
    the seed changes nothing."""

    def reset(self, *, seed=None, options=None):
        del seed
        return self.env.reset(seed=7, options=options)


class TaskByTrial(TrialEnv):
    """Like MetaWorld: the task (here the observation) follows the trial index,
    and ``reset(seed=...)`` changes nothing."""

    def __init__(self):
        super().__init__([], declares=True)

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=0, options=options)


IGNORES_ID = "jaxmesh-test/IgnoresSeed-v0"
if IGNORES_ID not in gym.registry:
    gym.register(IGNORES_ID, entry_point=lambda: IgnoresSeed(gym.make(ID)))


class Count:
    def __init__(self):
        self.started = 0

    def on_run_start(self, info):
        self.started += 1


def test_cartpole_is_reproducible_and_seed_sensitive():
    for env in (f"gymnasium:{ID}", gym.make(ID)):
        report = jaxmesh.check_seeds(env)
        assert isinstance(report, jaxmesh.SeedReport)
        assert report.reproducible and report.seed_sensitive
        assert "gymnasium:CartPole-v1 is reproducible and seed-sensitive" in (
            report.message
        )
        assert "5 step(s) of action 0" in report.message


def test_an_env_that_ignores_its_seed_is_not_reproducible():
    report = jaxmesh.check_seeds(IgnoresSeed(gym.make(ID)), seed=3, other=4)
    assert not report.reproducible
    assert "not reproducible" in report.message
    assert "two resets with seed 3 differed in the reset observation" in (
        report.message
    )


def test_an_env_deaf_to_its_seed_is_reproducible_but_not_seed_sensitive():
    report = jaxmesh.check_seeds(SameSeed(gym.make(ID)))
    assert report.reproducible and not report.seed_sensitive
    assert "not seed-sensitive" in report.message


def test_a_task_chosen_by_trial_index_gets_the_same_trial_index_each_reset():
    env = TaskByTrial()
    report = jaxmesh.check_seeds(env)
    # Every reset had trial_index 0: the seed is the only thing that changed,
    # and it changed nothing.
    assert [options for _, options in env.log] == [{"trial_index": 0}] * 3
    assert report.reproducible and not report.seed_sensitive


def test_a_jax_env_is_checked_through_its_keys():
    report = jaxmesh.check_seeds("gymnax:CartPole-v1")
    assert report.reproducible and report.seed_sensitive


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"seed": 2, "other": 2}, ValueError, "two different seeds"),
        ({"seed": -1}, ValueError, "seed=-1"),
        ({"steps": 1.5}, TypeError, "steps=1.5"),
        ({"token": "t"}, ValueError, "for a served env"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        jaxmesh.check_seeds(f"gymnasium:{ID}", **kwargs)


def test_evaluate_check_seeds_refuses_an_env_that_ignores_its_seed():
    count = Count()
    with pytest.raises(ValueError, match="check_seeds=True: env gymnasium:Cart"):
        jaxmesh.evaluate(
            lean,
            [IgnoresSeed(gym.make(ID)), gym.make(ID)],
            episodes=2,
            starts=jaxmesh.Starts(check_seeds=True),
            hooks=count,
        )
    assert count.started == 0  # refused before the run started


def test_evaluate_check_seeds_passes_a_reproducible_env_and_a_jax_env():
    seeds = [3, 1]
    plain = jaxmesh.evaluate(lean, f"gymnasium:{ID}", seeds=seeds, num_envs=2)
    checked = jaxmesh.evaluate(
        lean,
        f"gymnasium:{ID}",
        seeds=seeds,
        num_envs=2,
        starts=jaxmesh.Starts(check_seeds=True),
    )
    np.testing.assert_array_equal(checked.returns, plain.returns)
    # A JAX env is reproducible by construction: accepted, nothing checked.
    got = jaxmesh.evaluate(
        lean,
        "gymnax:CartPole-v1",
        episodes=2,
        num_envs=2,
        starts=jaxmesh.Starts(check_seeds=True),
    )
    assert got.num_episodes == 2


def test_evaluate_check_seeds_refuses_a_served_env_before_connecting():
    with pytest.raises(ValueError, match="jaxmesh check-env grpc://127.0.0.1:9"):
        jaxmesh.evaluate(
            lean,
            "grpc://127.0.0.1:9",
            episodes=1,
            starts=jaxmesh.Starts(check_seeds=True),
        )
    with pytest.raises(TypeError, match="check_seeds='yes'"):
        jaxmesh.evaluate(
            lean,
            f"gymnasium:{ID}",
            episodes=1,
            starts=jaxmesh.Starts(check_seeds="yes"),
        )


def test_check_seeds_of_a_served_env():
    server = jaxmesh.EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=1)
    with server.start():
        report = jaxmesh.check_seeds(f"grpc://{server.address}")
    assert report.reproducible and report.seed_sensitive
    assert f"at grpc://{server.address}" in report.message


def test_cli_check_env(capsys):
    assert main(["check-env", f"gymnasium:{ID}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "is reproducible and seed-sensitive" in out[0]
    assert main(["check-env", f"gymnasium:{IGNORES_ID}", "--seed", "4"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "two resets with seed 4 differed" in out[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["gymnasium:CartPol-v1"], "unknown gymnasium env 'CartPol-v1'"),
        (["gymnasium:CartPole-v1", "--other", "0"], "two different seeds"),
        (["gymnasium:CartPole-v1", "--token", "t"], "are for a served env"),
        (["grpc://127.0.0.1"], "is not 'grpc://host:port'"),
    ],
)
def test_cli_check_env_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert main(["check-env", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("jaxmesh check-env: error: ")
    assert message in lines[0] and "Traceback" not in err
