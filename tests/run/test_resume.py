"""Resuming a run: ``evaluate(..., resume=result)`` runs only what ``result``
lacks, and the whole budget then equals an uninterrupted run.

References: the plain gymnasium loop of ``gym_reference`` (written from the
contract) for host-stepped envs, a worked-out return for the trial-index env,
and an uninterrupted run on the same settings for a JAX env (the claim under
test is exactly "the same as without the interruption"). Runs are interrupted
by a hook that raises once a given episode has ended.
"""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID, TrialEnv, lean, per_step, plain_loop, trial_policy
from reference_loop import assert_matches

import jaxmesh

SEEDS = list(range(20))


class Stop(Exception):
    pass


class StopAt:
    """Raises once episode ``index`` has ended."""

    def __init__(self, index: int):
        self.index = index

    def on_episode_end(self, ep):
        if ep.index == self.index:
            raise Stop(ep.index)


class Seen:
    """Records the episode indices and the run-start info a hook receives."""

    def __init__(self):
        self.indices: list[int] = []
        self.start: dict = {}
        self.ended = None

    def on_run_start(self, info):
        self.start = info

    def on_episode_end(self, ep):
        self.indices.append(ep.index)

    def on_run_end(self, result):
        self.ended = result


def interrupted(policy, env, at, **kw):
    with pytest.raises(Stop) as e:
        jaxmesh.evaluate(policy, env, hooks=StopAt(at), **kw)
    return e.value.partial_result


def mlp_policy():
    """A float MLP: a resumed run must round each episode as before."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    w1 = jax.random.normal(k1, (4, 32)) * 0.5
    w2 = jax.random.normal(k2, (32, 2)) * 0.5

    def policy(params, obs):
        return jnp.argmax(jnp.tanh(obs @ params["w1"]) @ params["w2"])

    return policy, {"w1": w1, "w2": w2}


def test_a_resumed_jax_run_equals_an_uninterrupted_one():
    policy, params = mlp_policy()
    kw = dict(num_envs=8, seeds=SEEDS, params=params)
    whole = jaxmesh.evaluate(policy, "gymnax:CartPole-v1", **kw)
    # Short segments: the hook hears of episodes (and stops the run) early.
    partial = interrupted(
        policy, "gymnax:CartPole-v1", 9, layout=jaxmesh.Layout(segment_steps=16), **kw
    )
    assert 0 < partial.num_episodes < len(SEEDS)
    # The partial result carries what a resume checks, and survives JSON.
    partial = jaxmesh.RunResult.from_dict(json.loads(json.dumps(partial.to_dict())))
    seen = Seen()
    got = jaxmesh.evaluate(
        policy, "gymnax:CartPole-v1", resume=partial, hooks=seen, num_envs=3,
        seeds=SEEDS, params=params,
    )  # fmt: skip
    assert got.indices.tolist() == list(range(len(SEEDS)))
    for f in ("seeds", "returns", "lengths", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(got, f), getattr(whole, f), err_msg=f)
    np.testing.assert_array_equal(got.predict_calls, whole.predict_calls)
    # Hooks see the budget's indices, only of the episodes that ran now.
    missing = sorted(set(range(len(SEEDS))) - set(partial.indices.tolist()))
    assert sorted(seen.indices) == missing
    assert seen.start["episodes"] == len(SEEDS)
    assert seen.ended is not None and seen.ended.num_episodes == len(SEEDS)
    # Env steps count the budget's episodes once, as the uninterrupted run's do
    # (not the interrupted run's steps of episodes it never finished); the
    # rate is the resumed part's own.
    assert got.env_steps == whole.env_steps == int(whole.lengths.sum())
    assert got.resumed_part["env_steps"] == int(whole.lengths[missing].sum())
    assert got.resumed_part["episodes"] == len(missing)


def test_a_resumed_gymnasium_run_equals_the_plain_loop():
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    kw = dict(num_envs=4, seeds=SEEDS)
    partial = interrupted(lean, f"gymnasium:{ID}", 6, **kw)
    got = jaxmesh.evaluate(lean, f"gymnasium:{ID}", resume=partial, **kw)
    assert got.indices.tolist() == list(range(len(SEEDS)))
    assert_matches(got, refs)
    # A complete result resumes to itself, running nothing.
    again = jaxmesh.evaluate(lean, f"gymnasium:{ID}", resume=got, **kw)
    assert_matches(again, refs)
    # ... and is refused for another run all the same, though nothing runs.
    with pytest.raises(ValueError, match="env"):
        jaxmesh.evaluate(lean, "gymnasium:MountainCar-v0", resume=got, **kw)
    with pytest.raises(ValueError, match="horizon"):
        jaxmesh.evaluate(lean, f"gymnasium:{ID}", resume=got, horizon=4, **kw)


def test_a_resumed_episode_gets_its_budget_trial_index():
    """Episode i pays 1 + i per step (TrialEnv): a resumed run must hand the
    episodes it runs their index in the budget, not in the resumed part."""
    want = [(1 + i) * (2 + s % 3) for i, s in enumerate(SEEDS)]
    envs = lambda: [TrialEnv([]) for _ in range(2)]  # noqa: E731
    partial = interrupted(trial_policy, envs(), 5, num_envs=2, seeds=SEEDS)
    got = jaxmesh.evaluate(trial_policy, envs(), resume=partial, seeds=SEEDS)
    np.testing.assert_array_equal(got.returns, want)


def test_trial_index_base_shifts_every_trial_index_and_is_kept_by_a_resume():
    """Episode i pays 1 + trial index per step (TrialEnv): 1 + 100 + i."""
    want = [(101 + i) * (2 + s % 3) for i, s in enumerate(SEEDS)]
    envs = lambda: [TrialEnv([]) for _ in range(2)]  # noqa: E731
    got = jaxmesh.evaluate(
        trial_policy, envs(), seeds=SEEDS, starts=jaxmesh.Starts(trial_index_base=100)
    )
    np.testing.assert_array_equal(got.returns, want)
    assert got.trial_index_base == 100
    partial = interrupted(
        trial_policy,
        envs(),
        5,
        num_envs=2,
        seeds=SEEDS,
        starts=jaxmesh.Starts(trial_index_base=100),
    )
    again = jaxmesh.RunResult.from_dict(partial.to_dict())
    assert again.trial_index_base == 100
    resumed = jaxmesh.evaluate(
        trial_policy,
        envs(),
        resume=again,
        seeds=SEEDS,
        starts=jaxmesh.Starts(trial_index_base=100),
    )
    np.testing.assert_array_equal(resumed.returns, want)
    with pytest.raises(ValueError, match="trial_index_base"):
        jaxmesh.evaluate(trial_policy, envs(), resume=again, seeds=SEEDS)
    with pytest.raises(ValueError, match="drop trial_index_base="):
        jaxmesh.evaluate(
            lean, "gymnax:CartPole-v1", starts=jaxmesh.Starts(trial_index_base=3)
        )
    with pytest.raises(ValueError, match="trial_index_base=-1"):
        jaxmesh.evaluate(
            trial_policy, envs(), starts=jaxmesh.Starts(trial_index_base=-1)
        )


def test_a_resume_of_another_run_is_refused_naming_what_differs():
    policy, params = mlp_policy()
    env = "gymnax:CartPole-v1"
    kw = dict(num_envs=4, seeds=SEEDS, params=params)
    partial = interrupted(policy, env, 3, layout=jaxmesh.Layout(segment_steps=16), **kw)
    with pytest.raises(ValueError, match="horizon"), pytest.warns(UserWarning):
        jaxmesh.evaluate(policy, env, resume=partial, horizon=2, **kw)
    with pytest.raises(ValueError, match="seed for episode 0"):
        jaxmesh.evaluate(
            policy, env, resume=partial, num_envs=4, seeds=[7] * 20, params=params
        )
    with pytest.raises(ValueError, match="max_episode_steps"):
        jaxmesh.evaluate(policy, env, resume=partial, max_episode_steps=50, **kw)
    other = jax.tree.map(lambda x: x + 1.0, params)
    with pytest.raises(ValueError, match="params"):
        jaxmesh.evaluate(
            policy, env, resume=partial, num_envs=4, seeds=SEEDS, params=other
        )
    with pytest.raises(ValueError, match="env"):
        jaxmesh.evaluate(policy, f"gymnasium:{ID}", resume=partial, **kw)
    with pytest.raises(ValueError, match="this budget has 3 episodes"):
        jaxmesh.evaluate(
            policy, env, resume=partial, num_envs=4, episodes=3, params=params
        )
    with pytest.raises(TypeError, match="RunResult"):
        jaxmesh.evaluate(policy, env, resume={"episodes": []}, **kw)


def test_an_episode_log_resumes_a_run_and_tolerates_a_cut_last_line(tmp_path):
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    path = tmp_path / "run.jsonl"
    kw = dict(num_envs=4, seeds=SEEDS)
    with pytest.raises(Stop):
        jaxmesh.evaluate(
            lean,
            f"gymnasium:{ID}",
            hooks=[jaxmesh.EpisodeLog(path), StopAt(7)],
            **kw,
        )
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["run"]["env"] == f"gymnasium:{ID}"
    records = [json.loads(x) for x in lines[1:]]
    written = [r["episode"]["index"] for r in records if "episode" in r]
    assert 7 in written
    assert "totals" in records[-1]  # the failed run's work, written last
    with open(path, "a") as f:  # a run killed while writing a line
        f.write('{"episode": {"index": 19, "se')
    done = jaxmesh.load_episode_log(path)
    assert sorted(done.indices.tolist()) == sorted(written)
    assert_matches(done, [refs[i] for i in done.indices])
    got = jaxmesh.evaluate(
        lean,
        f"gymnasium:{ID}",
        resume=done,
        hooks=jaxmesh.EpisodeLog(path),
        **kw,
    )
    assert_matches(got, refs)
    # The log now holds every episode of the budget.
    full = jaxmesh.load_episode_log(path)
    assert full.indices.tolist() == list(range(len(SEEDS)))
    assert_matches(full, refs)


class IgnoresSeed(gym.Wrapper):
    """CartPole whose reset ignores its seed (as MetaWorld's does): each reset
    draws its start from the env's own running generator."""

    def __init__(self):
        super().__init__(gym.make(ID))
        self.draws = np.random.default_rng(0)

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=int(self.draws.integers(1 << 30)))


def test_a_seed_reset_twice_to_different_observations_warns_once():
    with pytest.warns(UserWarning, match="seed 0 .episodes 0 and 2") as got:
        jaxmesh.evaluate(lean, [IgnoresSeed()], seeds=[0, 1, 0, 1, 0])
    assert len([w for w in got if "reset observations" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a seeded env repeats itself: no warning
        jaxmesh.evaluate(lean, [gym.make(ID)], seeds=[0, 1, 0, 1, 0])


def test_trial_index_base_reaches_a_served_env():
    from jaxmesh.remote.server import EnvServer

    log = []
    with EnvServer([TrialEnv(log) for _ in range(2)], "127.0.0.1:0") as server:
        got = jaxmesh.evaluate(
            trial_policy,
            f"grpc://{server.address}",
            num_envs=2,
            seeds=SEEDS,
            starts=jaxmesh.Starts(trial_index_base=7),
        )
    assert sorted(o["trial_index"] for _, o in log) == [7 + i for i in range(20)]
    np.testing.assert_array_equal(
        got.returns, [(8 + i) * (2 + s % 3) for i, s in enumerate(SEEDS)]
    )
