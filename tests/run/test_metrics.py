"""Episode metrics and success (``evaluate(metrics=..., success=...)``) on every path.

Each run is compared with an independent plain loop over the env's own functions
(``reference_loop.run_episode``, written from the contract) that records the
info of every executed step and reduces it by hand: gymnax's ``info`` (CartPole's
``discount``), brax's ``state.metrics`` (a small brax env of our own), and a small
gymnasium env of our own that reports ``is_success`` (seed-dependent), stepped in
process and served by a real ``jaxmesh.EnvServer`` on 127.0.0.1. Lane counts
1, 3 and 16 with a chunked policy: the metrics never depend on them.
"""

from __future__ import annotations

import math
import re

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import lean
from gymnasium import spaces
from reference_loop import run_episode

import jaxmesh
from jaxmesh.remote.server import EnvServer

REDUCE = {
    "last": lambda v: v[-1],
    "sum": sum,
    "max": max,
    "mean": lambda v: sum(v) / len(v),
    "any": lambda v: any(x != 0 for x in v),
}


def by_hand(infos: list[dict], key: str, how: str):
    """A metric of one episode from its steps' infos (steps lacking the key are
    left out; none: NaN, or False for ``any``)."""
    values = [float(i[key]) for i in infos if key in i]
    if not values:
        return False if how == "any" else math.nan
    return REDUCE[how](values)


def check_metrics(result, infos, asked):
    for key, how in asked.items():
        want = [by_hand(ep, key, how) for ep in infos]
        got = result.metrics[key]
        if how == "any":
            assert got.dtype == bool
            assert got.tolist() == want, key
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=key)


def chunk4(a):
    """A chunk of 4 actions that wobbles around ``a``."""
    return jnp.stack([a, a, 1 - a, a])


# gymnax ----------------------------------------------------------------------------
GYMNAX_SEEDS = list(range(20))
CAP = 50  # some episodes truncated (discount 1 at the end), others terminated


def cartpole_chunky(obs):
    return chunk4((obs[2] > 0).astype(jnp.int32))


def gymnax_reference(seeds, horizon=4):
    import gymnax

    env, params = gymnax.make("CartPole-v1")
    reset = jax.jit(lambda key: env.reset_env(key, params))
    step_env = jax.jit(lambda k, s, a: env.step_env(k, s, a, params))
    infos: list = []

    def step(key, state, action):
        obs, state, reward, term, info = step_env(key, state, action)
        infos[-1].append({k: np.asarray(v) for k, v in info.items()})
        return obs, state, reward, term, env.is_truncated(state, params)

    policy = jax.jit(cartpole_chunky)
    episodes = []
    for s in seeds:
        infos.append([])
        episodes.append(
            run_episode(
                reset, step, lambda x, k: policy(x), s, horizon=horizon, cap=CAP
            )
        )
    return episodes, infos


_GYMNAX: dict = {}


def gymnax_refs():
    if not _GYMNAX:
        _GYMNAX["refs"] = gymnax_reference(GYMNAX_SEEDS)
    return _GYMNAX["refs"]


GYMNAX_ASKED = {"discount": "mean"}


# Each lane count reduces discount its own way (one program each): every
# reduction is checked by hand somewhere, here, in test_max_reduction_... or in
# test_brax_metrics_....
@pytest.mark.parametrize(("n", "how"), [(1, "mean"), (3, "last"), (16, "sum")])
def test_gymnax_metrics_and_success_match_the_plain_loop(n, how):
    refs, infos = gymnax_refs()
    asked = {"discount": how}
    result = jaxmesh.evaluate(
        cartpole_chunky,
        "gymnax:CartPole-v1",
        num_envs=n,
        horizon=4,
        seeds=GYMNAX_SEEDS,
        max_episode_steps=CAP,
        scoring=jaxmesh.Scoring(metrics=asked, success="discount", success_mode="end"),
        layout=jaxmesh.Layout(plan_tile=8),
    )
    assert result.lengths.tolist() == [r.length for r in refs]
    check_metrics(result, infos, asked)
    want = [bool(ep[-1]["discount"] != 0) for ep in infos]
    assert result.success.dtype == bool
    assert result.success.tolist() == want
    assert result.success_at_end.tolist() == want
    assert 0 < sum(want) < len(want)  # both kinds of episode
    assert result.success_rate == sum(want) / len(want)
    assert [e.success for e in result.episodes] == want
    once = [any(bool(i["discount"] != 0) for i in ep) for ep in infos]
    assert result.success_once.tolist() == once
    assert result.success_at_reset is None  # gymnax resets give no info


def test_max_reduction_and_no_success_signal_on_gymnax():
    # "mean", "last" and "sum": test_gymnax_metrics_and_success_match_the_plain_loop;
    # "any" (and "max" again): test_brax_metrics_and_success_match_brax_loop.
    refs, infos = gymnax_refs()
    for how in ("max",):
        result = jaxmesh.evaluate(
            cartpole_chunky,
            "gymnax:CartPole-v1",
            num_envs=3,
            horizon=4,
            seeds=GYMNAX_SEEDS,
            max_episode_steps=CAP,
            scoring=jaxmesh.Scoring(metrics={"discount": how}),
        )
        check_metrics(result, infos, {"discount": how})
        # CartPole's info has no success key: no signal, no rate (never 0).
        assert result.success is None and result.success_rate is None
        assert result.stats()["success_rate"] is None


# brax ------------------------------------------------------------------------------
def brax_drift():
    from brax.envs.base import Env, State

    class Drift(Env):
        """x moves by ``0.25 * action``; done once ``|x| >= 1``; metrics: ``x``
        and ``success`` (``x >= 1``: left through the right side)."""

        def reset(self, rng):
            x = jax.random.uniform(rng, (1,), minval=-0.6, maxval=0.6)
            return State(None, x, jnp.float32(0.0), jnp.float32(0.0), self._m(x))

        def _m(self, x):
            return {"x": x[0], "success": (x[0] >= 1.0).astype(jnp.float32)}

        def step(self, state, action):
            x = state.obs + 0.25 * action
            done = (jnp.abs(x[0]) >= 1.0).astype(jnp.float32)
            return state.replace(
                obs=x, reward=1.0 - x[0] ** 2, done=done, metrics=self._m(x)
            )

        observation_size = property(lambda self: 1)
        action_size = property(lambda self: 1)
        backend = property(lambda self: "none")

    return Drift()


def brax_push(obs):
    a = jnp.tanh(3.0 * obs)  # away from 0: the start's side decides success
    return jnp.stack([a, a, -a, a])


BRAX_SEEDS = list(range(8))
_BRAX: dict = {}


def brax_reference():
    """The brax env and each episode's step metrics, from brax's own functions
    (computed once: they do not depend on the lane count)."""
    if _BRAX:
        return _BRAX["env"], _BRAX["infos"]
    env = brax_drift()
    reset = jax.jit(lambda key: (env.reset(key).obs, env.reset(key)))
    step_fn = jax.jit(env.step)
    infos: list = []

    def step(key, bstate, action):
        bstate = step_fn(bstate, action)
        infos[-1].append({k: np.asarray(v) for k, v in bstate.metrics.items()})
        return bstate.obs, bstate, bstate.reward, bstate.done > 0.5, False

    policy = jax.jit(brax_push)
    for s in BRAX_SEEDS:
        infos.append([])
        run_episode(reset, step, lambda x, k: policy(x), s, horizon=4)
    _BRAX.update(env=env, infos=infos)
    return env, infos


# 8 episodes on 3 lanes: each lane runs several (a metric not reset between a
# lane's episodes shows), and lanes finish out of episode order.
@pytest.mark.parametrize("n", [3])
def test_brax_metrics_and_success_match_brax_loop(n):
    env, infos = brax_reference()
    seeds = BRAX_SEEDS
    asked = {"x": "max", "success": "any"}
    result = jaxmesh.evaluate(
        brax_push,
        env,
        num_envs=n,
        horizon=4,
        seeds=seeds,
        scoring=jaxmesh.Scoring(metrics=asked),
    )
    check_metrics(result, infos, asked)
    # ``success`` is in brax's metrics: kept without being asked (its last value).
    want = [bool(ep[-1]["success"] != 0) for ep in infos]
    assert 0 < sum(want) < len(want)
    assert result.success_at_end.tolist() == want
    once = [any(bool(i["success"] != 0) for i in ep) for ep in infos]
    assert result.success_once.tolist() == once
    assert result.success_key == "success"


# gymnasium, in process and served ----------------------------------------------------
class Reach(gym.Env):
    """A small env with a seed-dependent success.

    The observation is (position, goal, step); an action of 1 moves the
    position up by 1 (0: stays). The goal is ``2 + seed % 4``; an episode lasts
    ``3 + seed % 5`` steps. Every step's info has ``is_success`` (position >=
    goal, a bool) and ``dist`` (goal - position); with ``drop`` set, episodes
    whose seed is a multiple of ``drop`` report neither.
    """

    observation_space = spaces.Box(-100.0, 100.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, drop: int | None = None):
        self.drop = drop

    def _obs(self):
        return np.array([self.pos, self.goal, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_ = seed or 0
        self.pos, self.goal, self.t = 0, 2 + self.seed_ % 4, 0
        return self._obs(), {}

    def step(self, action):
        self.pos += int(action)
        self.t += 1
        info = {
            "is_success": self.pos >= self.goal,
            "dist": float(self.goal - self.pos),
        }
        if self.drop and self.seed_ % self.drop == 0:
            info = {}
        return self._obs(), 1.0, False, self.t >= 3 + self.seed_ % 5, info


def reach_policy(obs):
    """Moves on odd steps only: whether the goal is reached depends on the seed."""
    up = (obs[2] % 2 == 1).astype(jnp.int32)
    return jnp.stack([up, up, 1 - up, up])


GYM_SEEDS = list(range(13))
_GYM: dict = {}


def gym_reference(seeds, drop=None, horizon=4):
    """Reference episodes and infos of Reach (computed once per arguments)."""
    key = (tuple(seeds), drop, horizon)
    if key not in _GYM:
        _GYM[key] = _gym_reference(seeds, drop, horizon)
    return _GYM[key]


def _gym_reference(seeds, drop, horizon):
    env = Reach(drop)
    infos: list = []

    def reset(key, seed):
        obs, _ = env.reset(seed=seed)
        return obs, None

    def step(key, state, action):
        obs, reward, term, trunc, info = env.step(int(action))
        infos[-1].append(info)
        return obs, None, reward, term, trunc

    policy = jax.jit(reach_policy)
    episodes = []
    for s in seeds:
        infos.append([])
        episodes.append(
            run_episode(
                lambda k, s=s: reset(k, s),
                step,
                lambda x, k: policy(x),
                s,
                horizon=horizon,
            )
        )
    return episodes, infos


GYM_ASKED = {"dist": "mean", "is_success": "any"}


def check_reach(result, seeds, drop=None):
    refs, infos = gym_reference(seeds, drop)
    assert result.lengths.tolist() == [r.length for r in refs]
    check_metrics(result, infos, GYM_ASKED)
    want = [
        bool(ep[-1]["is_success"]) if ep and "is_success" in ep[-1] else None
        for ep in infos
    ]
    assert [e.success_at_end for e in result.episodes] == want
    if None in want:
        assert result.success_at_end_rate is None
    else:
        assert result.success_at_end.dtype == bool
        assert 0 < sum(want) < len(want)
        assert result.success_at_end_rate == sum(want) / len(want)
    assert result.success_key == "is_success"
    return want


@pytest.mark.parametrize("n", [1, 3, 16])
def test_gymnasium_is_success_in_process(n):
    envs = [Reach() for _ in range(n)]
    result = jaxmesh.evaluate(
        reach_policy,
        envs,
        num_envs=n,
        horizon=4,
        seeds=GYM_SEEDS,
        scoring=jaxmesh.Scoring(metrics=GYM_ASKED),
    )
    check_reach(result, GYM_SEEDS)


@pytest.mark.parametrize("n", [1, 3, 16])
def test_gymnasium_is_success_served(n):
    with EnvServer([Reach() for _ in range(n)], "127.0.0.1:0") as server:
        result = jaxmesh.evaluate(
            reach_policy,
            f"grpc://{server.address}",
            num_envs=n,
            horizon=4,
            seeds=GYM_SEEDS,
            scoring=jaxmesh.Scoring(metrics=GYM_ASKED, success="is_success"),
        )
    check_reach(result, GYM_SEEDS)


def test_an_episode_without_the_signal_gives_no_rate():
    envs = [Reach(drop=5) for _ in range(3)]
    result = jaxmesh.evaluate(
        reach_policy,
        envs,
        num_envs=3,
        horizon=4,
        seeds=GYM_SEEDS,
        scoring=jaxmesh.Scoring(metrics=GYM_ASKED),
    )
    want = check_reach(result, GYM_SEEDS, drop=5)
    assert want[0] is None and want[5] is None  # seeds 0, 5, 10
    assert result.success_rate is None
    assert result.stats()["success_rate"] is None
    assert "n/a" in result.summary()
    assert math.isnan(result.metrics["dist"][0])


def test_served_success_alone_and_auto_mode():
    with EnvServer([Reach() for _ in range(3)], "127.0.0.1:0") as server:
        address = f"grpc://{server.address}"
        named = jaxmesh.evaluate(
            reach_policy,
            address,
            horizon=4,
            seeds=GYM_SEEDS,
            scoring=jaxmesh.Scoring(success="is_success"),
        )
        # Auto mode asks for success / is_success, as in process.
        auto = jaxmesh.evaluate(reach_policy, address, horizon=4, seeds=GYM_SEEDS)
    with EnvServer([gym.make("CartPole-v1") for _ in range(3)], "127.0.0.1:0") as s:
        # An env with neither key: no success, never a silent 0.
        none = jaxmesh.evaluate(lean, f"grpc://{s.address}", episodes=3)
    refs, infos = gym_reference(GYM_SEEDS)
    want = [bool(ep[-1]["is_success"]) for ep in infos]
    assert named.success_at_end.tolist() == want and named.metrics == {}
    assert auto.success_at_end.tolist() == want
    assert auto.success_key == "is_success"
    assert auto.success_at_end_rate == sum(want) / len(want)
    assert none.success is None and none.success_rate is None


def wilson(k, n, z=1.959963984540054):
    """The Wilson score interval, from its formula."""
    p = k / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return center - half, center + half


def test_round_trip_summary_and_episode_records():
    result = jaxmesh.evaluate(
        reach_policy,
        [Reach() for _ in range(3)],
        horizon=4,
        seeds=GYM_SEEDS,
        scoring=jaxmesh.Scoring(metrics=GYM_ASKED),
    )
    d = result.to_dict()
    back = jaxmesh.RunResult.from_dict(d)
    assert back.to_dict() == d
    assert back.success.tolist() == result.success.tolist()
    assert back.success_rate == result.success_rate
    for key in GYM_ASKED:
        np.testing.assert_array_equal(back.metrics[key], result.metrics[key])
    assert d["settings"]["metrics"] == GYM_ASKED
    assert d["episodes"][1]["success"] == bool(result.success[1])
    assert set(d["episodes"][1]["metrics"]) == set(GYM_ASKED)
    k, n = int(result.success.sum()), result.num_episodes
    low, high = wilson(k, n)
    text = result.summary()
    assert re.search(
        rf"success rate \(success once, the headline\) +{k / n:.1%}\n", text
    )
    assert re.search(
        rf"success rate, 95% Wilson interval +\[{low:.1%}, {high:.1%}\]\n", text
    )
    for key in GYM_ASKED:
        assert f"metric {key} ({GYM_ASKED[key]}), mean" in text
    stats = result.stats()
    assert stats["success_interval"] == pytest.approx([low, high])
    assert stats["metrics"]["dist"]["mean"] == pytest.approx(
        float(np.mean(result.metrics["dist"]))
    )
    # A run without metrics writes the episodes it always wrote.
    plain = jaxmesh.evaluate(
        reach_policy,
        [Reach()],
        horizon=4,
        seeds=[0],
        scoring=jaxmesh.Scoring(success=False),
    )
    assert "success" not in plain.to_dict()["episodes"][0]
    assert jaxmesh.RunResult.from_dict(plain.to_dict()).success is None


def test_partial_result_keeps_metrics():
    class Breaks(Reach):
        def step(self, action):
            if self.seed_ == 7 and self.t == 2:
                raise RuntimeError("the simulator broke")
            return super().step(action)

    with pytest.raises(RuntimeError) as info:
        jaxmesh.evaluate(
            reach_policy,
            [Breaks() for _ in range(3)],  # test_gymnasium_is_success_in_process[3]
            horizon=4,
            seeds=GYM_SEEDS,
            scoring=jaxmesh.Scoring(metrics=GYM_ASKED),
        )
    partial = info.value.partial_result
    refs, infos = gym_reference(GYM_SEEDS)
    assert partial.num_episodes > 0
    for j, i in enumerate(partial.indices):
        assert partial.success_at_end[j] == bool(infos[i][-1]["is_success"])
        assert partial.metrics["dist"][j] == pytest.approx(
            by_hand(infos[i], "dist", "mean")
        )


def test_bad_names_and_reductions_are_refused():
    with pytest.raises(ValueError, match="did you mean 'discount'"):
        jaxmesh.evaluate(
            cartpole_chunky,
            "gymnax:CartPole-v1",
            episodes=2,
            scoring=jaxmesh.Scoring(metrics=["discont"]),
        )
    with pytest.raises(ValueError, match="reduction 'median'"):
        jaxmesh.evaluate(
            cartpole_chunky,
            "gymnax:CartPole-v1",
            episodes=2,
            scoring=jaxmesh.Scoring(metrics={"discount": "median"}),
        )
    with pytest.raises(ValueError, match="'nope' is not in the info"):
        jaxmesh.evaluate(
            cartpole_chunky,
            "gymnax:CartPole-v1",
            episodes=2,
            scoring=jaxmesh.Scoring(success="nope"),
        )
    with pytest.raises(TypeError, match="metrics="):
        jaxmesh.evaluate(
            cartpole_chunky,
            "gymnax:CartPole-v1",
            episodes=2,
            scoring=jaxmesh.Scoring(metrics=3),
        )
    with pytest.raises(ValueError, match="'distance' is not in the info.*'dist'"):
        jaxmesh.evaluate(
            reach_policy,
            [Reach()],
            horizon=4,
            seeds=[1, 2],
            scoring=jaxmesh.Scoring(metrics=["distance"]),
        )
    with EnvServer([Reach()], "127.0.0.1:0") as server:
        with pytest.raises(ValueError, match="'distance' is not in the info"):
            jaxmesh.evaluate(
                reach_policy,
                f"grpc://{server.address}",
                horizon=4,
                seeds=[1],
                scoring=jaxmesh.Scoring(metrics=["distance"]),
            )


def test_cli_metrics_key(tmp_path, capsys):
    import json

    from jaxmesh.cli import main

    out = tmp_path / "r.json"
    config = tmp_path / "c.yaml"
    config.write_text(
        "env: gymnax:CartPole-v1\npolicy: cli_policies:tilt\nepisodes: 5\n"
        f"num_envs: 2\nmetrics: {{discount: sum}}\nsuccess: discount\noutput: {out}\n"
    )
    assert main(["eval", str(config), "--no-progress"]) == 0
    assert "metric discount (sum), mean" in capsys.readouterr().out
    d = json.loads(out.read_text())
    # discount is 1 on every step but a terminal one: its sum is length - 1.
    for ep in d["episodes"]:
        assert ep["metrics"]["discount"] == ep["length"] - 1
        assert ep["success_at_end"] is False
        assert ep["success_once"] is (ep["length"] > 1)
    config.write_text(
        "env: gymnax:CartPole-v1\npolicy: cli_policies:tilt\nepisodes: 5\n"
        "metrics: {discount: median}\n"
    )
    assert main(["eval", str(config)]) == 2
    assert "median" in capsys.readouterr().err
    config.write_text(
        "env: gymnax:CartPole-v1\npolicy: cli_policies:tilt\nepisodes: 5\n"
        "metrics: [discont]\n"
    )
    assert main(["eval", str(config)]) == 2
    err = capsys.readouterr().err
    assert "discount" in err and len(err.strip().splitlines()) == 1
