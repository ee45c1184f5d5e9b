"""Success once, at the end and at reset (CONTRACT 25), and ``success_mode``.

Each path is checked against a plain loop over the env's own functions:
``Flicker``, a gymnasium env whose ``info["is_success"]`` is true at chosen
steps (by the seed: only at step 3, from the reset on, only at the last step,
never, only at reset), run in process and served; and ``JaxFlicker``, the
same patterns as a pure-JAX env (``jaxmesh.types.Env`` with
``reset_with_info`` and ``step_with_info``), run in the scan engine.
"""

from __future__ import annotations

import re

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxmesh
from jaxmesh.remote.server import EnvServer

#: seed % 5 -> which steps succeed (t: the 1-based step just executed, L: the
#: episode's length; "reset": the reset's info).
PATTERNS = ("step 3 only", "from reset", "last step only", "never", "reset only")
SEEDS = list(range(12))
HORIZON = 3


def length_of(seed: int) -> int:
    return 4 + seed % 3


def succeeds(pattern: int, t, length):
    """Whether step t (1-based; 0: the reset) shows success, by hand."""
    return {
        0: t == 3,
        1: t >= 0,
        2: t == length,
        3: t < 0,
        4: t == 0,
    }[pattern]


# The gymnasium env and its plain loop -------------------------------------------------
class Flicker(gym.Env):
    """Success at chosen steps; the action does nothing. ``reset_key``: the
    reset's info has ``is_success`` (else it is empty)."""

    observation_space = spaces.Box(-100.0, 100.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, reset_key: bool = True):
        self.reset_key = reset_key

    def _obs(self):
        return np.array([self.t, self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pattern, self.length, self.t = seed % 5, length_of(seed), 0
        info = {"is_success": succeeds(self.pattern, 0, self.length)}
        return self._obs(), info if self.reset_key else {}

    def step(self, action):
        self.t += 1
        info = {"is_success": succeeds(self.pattern, self.t, self.length)}
        return self._obs(), 0.0, self.t >= self.length, False, info


def gym_loop(seeds, reset_key=True):
    """Per seed (once, at end, at reset) from a plain loop over one env."""
    env = Flicker(reset_key)
    out = []
    for s in seeds:
        _, info = env.reset(seed=s)
        at_reset = bool(info["is_success"]) if "is_success" in info else None
        flags, done = [], False
        while not done:
            _, _, term, trunc, info = env.step(0)
            flags.append(bool(info["is_success"]))
            done = term or trunc
        out.append((any(flags), flags[-1], at_reset))
    return out


def chunk_policy(obs):
    """Chunks of 3 zeros: a served lane replays them in one call."""
    return jnp.zeros((HORIZON,), jnp.int32)


def check(result, want, mode):
    once, end, reset = (list(x) for x in zip(*want, strict=True))
    assert result.success_once.tolist() == once
    assert result.success_at_end.tolist() == end
    assert result.success.tolist() == (once if mode == "once" else end)
    assert result.success_mode == mode
    assert result.success_once_rate == sum(once) / len(once)
    assert result.success_at_end_rate == sum(end) / len(end)
    assert result.success_rate == result.success.mean()
    if None in reset:
        assert result.success_at_reset is None
        assert result.successes_at_reset is None
    else:
        assert result.success_at_reset.tolist() == reset
        assert result.successes_at_reset == sum(reset)
    for i, ep in enumerate(result.episodes):
        assert (ep.success_once, ep.success_at_end, ep.success_at_reset) == want[i]


def test_reference_covers_every_kind_of_episode():
    want = gym_loop(SEEDS)
    assert {w[:2] for w in want} == {(True, False), (True, True), (False, False)}
    assert {w[2] for w in want} == {True, False}
    assert any(w[2] and not w[0] for w in want)  # successful at reset only


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("mode", ["once", "end"])
def test_in_process_matches_the_plain_loop(n, mode):
    result = jaxmesh.evaluate(
        chunk_policy,
        [Flicker() for _ in range(n)],
        horizon=HORIZON,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(success_mode=mode),
    )
    assert result.success_key == "is_success"
    check(result, gym_loop(SEEDS), mode)


@pytest.mark.parametrize("horizon", [1, HORIZON])
def test_served_matches_the_plain_loop(horizon):
    with EnvServer([Flicker() for _ in range(3)], "127.0.0.1:0") as server:
        result = jaxmesh.evaluate(
            chunk_policy,
            f"grpc://{server.address}",
            num_envs=3,
            horizon=horizon,
            seeds=SEEDS,
            scoring=jaxmesh.Scoring(success="is_success"),
        )
    check(result, gym_loop(SEEDS), "once")


def test_a_reset_without_the_key_is_unknown_never_false():
    envs = [Flicker(reset_key=False) for _ in range(2)]
    result = jaxmesh.evaluate(chunk_policy, envs, horizon=HORIZON, seeds=SEEDS)
    check(result, gym_loop(SEEDS, reset_key=False), "once")
    assert re.search(r"successful at reset +unknown", result.summary())
    assert "success_at_reset" not in result.to_dict()["episodes"][0]


def test_summary_names_the_headline_and_shows_both_rates():
    want = gym_loop(SEEDS)
    result = jaxmesh.evaluate(
        chunk_policy,
        [Flicker()],
        horizon=HORIZON,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(success_mode="end"),
    )
    once = sum(w[0] for w in want) / len(want)
    end = sum(w[1] for w in want) / len(want)
    text = result.summary()
    assert "(success at end, the headline)" in text
    assert re.search(rf"success once +{once:.1%}\n", text)
    assert re.search(rf"success at end +{end:.1%}\n", text)
    assert f"{sum(w[2] for w in want)} of {len(want)} episodes" in text
    stats = result.stats()
    assert stats["success_mode"] == "end" and stats["success_rate"] == end
    assert stats["success_once_rate"] == once
    assert stats["success_at_end_rate"] == end


def test_results_json_round_trip_and_an_older_file():
    result = jaxmesh.evaluate(
        chunk_policy,
        [Flicker()],
        horizon=HORIZON,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(success_mode="end"),
    )
    d = result.to_dict()
    back = jaxmesh.RunResult.from_dict(d)
    assert back.to_dict() == d
    assert d["settings"]["success_mode"] == "end"
    for name in ("success_once", "success_at_end", "success_at_reset", "success"):
        assert getattr(back, name).tolist() == getattr(result, name).tolist()
    # A file from before both were kept: "success" was the flag at the end.
    del d["settings"]["success_mode"]
    for ep in d["episodes"]:
        for key in ("success_once", "success_at_end", "success_at_reset"):
            del ep[key]
    old = jaxmesh.RunResult.from_dict(d)
    assert old.success_mode == "end" and old.success_once is None
    assert old.success_at_end.tolist() == result.success_at_end.tolist()
    assert old.success_rate == result.success_at_end_rate


def test_resume_refuses_another_success_mode():
    envs = [Flicker() for _ in range(2)]
    done = jaxmesh.evaluate(
        chunk_policy,
        envs,
        horizon=HORIZON,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(success_mode="end"),
    )
    with pytest.raises(ValueError, match="success_mode 'end'.*'once'"):
        jaxmesh.evaluate(chunk_policy, envs, horizon=HORIZON, seeds=SEEDS, resume=done)
    d = done.to_dict()
    d["episodes"] = d["episodes"][:5]  # a run cut short
    part = jaxmesh.RunResult.from_dict(d)
    with pytest.raises(ValueError, match="success_mode 'end'.*'once'"):
        jaxmesh.evaluate(chunk_policy, envs, horizon=HORIZON, seeds=SEEDS, resume=part)
    again = jaxmesh.evaluate(
        chunk_policy,
        envs,
        horizon=HORIZON,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(success_mode="end"),
        resume=part,
    )
    check(again, gym_loop(SEEDS), "end")


# A pure-JAX env and its plain loop --------------------------------------------------
class JaxFlicker:
    """``Flicker`` as a jaxmesh single-lane env: the seed is the key's second
    word (``PRNGKey(s) == [0, s]``). ``reset_info``: it has ``reset_with_info``."""

    name = "flicker"
    action_shape = ()
    action_dtype = jnp.dtype(jnp.int32)
    num_actions = 2

    def __init__(self, reset_info: bool = True):
        if reset_info:
            self.reset_with_info = self._reset_with_info

    def _reset_with_info(self, key):
        seed = key[1].astype(jnp.int32)
        pattern, length = seed % 5, 4 + seed % 3
        obs = jnp.stack([0, length]).astype(jnp.float32)
        state = (jnp.int32(0), length, pattern)
        return obs, state, {"success": self._succeeds(pattern, 0, length)}

    def reset(self, key):
        return self._reset_with_info(key)[:2]

    @staticmethod
    def _succeeds(pattern, t, length):
        cases = [succeeds(p, t, length) for p in range(len(PATTERNS))]
        return jnp.asarray(jnp.stack(cases)[pattern], jnp.float32)

    def step(self, key, state, action):
        return self.step_with_info(key, state, action)[:5]

    def step_with_info(self, key, state, action):
        t, length, pattern = state
        t = t + 1
        obs = jnp.stack([t, length]).astype(jnp.float32)
        info = {"success": self._succeeds(pattern, t, length)}
        done = t >= length
        return obs, (t, length, pattern), jnp.float32(0.0), done, jnp.bool_(0), info


def jax_loop(seeds, reset_info=True):
    """Per seed (once, at end, at reset) from a plain loop over the env's own
    reset_with_info / step_with_info (env-step keys as CONTRACT 5 says)."""
    env = JaxFlicker()
    reset, step = jax.jit(env._reset_with_info), jax.jit(env.step_with_info)
    out = []
    for s in seeds:
        key = jax.random.PRNGKey(s)
        _, state, info = reset(key)
        at_reset = bool(info["success"] != 0) if reset_info else None
        env_key = jax.random.fold_in(key, 0)
        flags, t, done = [], 0, False
        while not done:
            k = jax.random.fold_in(env_key, t)
            _, state, _, term, trunc, info = step(k, state, jnp.int32(0))
            flags.append(bool(info["success"] != 0))
            t, done = t + 1, bool(term) or bool(trunc)
        out.append((any(flags), flags[-1], at_reset))
    return out


@pytest.fixture(scope="module")
def jax_evaluator():
    """One compiled program for the JAX env's tests (the headline is not part
    of it)."""
    return jaxmesh.Evaluator(chunk_policy, JaxFlicker(), num_envs=3, horizon=HORIZON)


def test_jax_env_matches_the_plain_loop_in_both_modes(jax_evaluator):
    want = jax_loop(SEEDS)
    assert [w[:2] for w in want] == [w[:2] for w in gym_loop(SEEDS)]
    result = jax_evaluator.run(seeds=SEEDS)
    assert result.success_key == "success"
    check(result, want, "once")
    check(jax_evaluator.run(seeds=SEEDS, success_mode="end"), want, "end")
    assert len(jax_evaluator.programs()) == 1


def test_jax_env_without_reset_info_has_no_at_reset():
    result = jaxmesh.evaluate(
        chunk_policy,
        JaxFlicker(reset_info=False),
        num_envs=3,
        horizon=HORIZON,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(success_mode="end"),
    )
    check(result, jax_loop(SEEDS, reset_info=False), "end")


# success_mode's checks -------------------------------------------------------------
@pytest.mark.parametrize("bad", ["first", "END", None, 1])
def test_a_bad_success_mode_is_refused_before_compiling(bad):
    traced = []

    def policy(obs):
        traced.append(1)
        return jnp.int32(0)

    for env in (JaxFlicker(), [Flicker()], "gymnax:CartPole-v1"):
        with pytest.raises(ValueError, match=rf"success_mode={bad!r}.*'once', 'end'"):
            jaxmesh.evaluate(
                policy, env, episodes=2, scoring=jaxmesh.Scoring(success_mode=bad)
            )
    with pytest.raises(ValueError, match="success_mode"):
        jaxmesh.Evaluator(
            policy, JaxFlicker(), scoring=jaxmesh.Scoring(success_mode=bad)
        )
    assert not traced


def test_cli_success_mode_key(tmp_path, capsys):
    from jaxmesh.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(
        "env: gymnax:CartPole-v1\npolicy: cli_policies:tilt\nepisodes: 2\n"
        "success_mode: sometimes\n"
    )
    assert main(["eval", str(config)]) == 2
    assert "success_mode='sometimes'" in capsys.readouterr().err
