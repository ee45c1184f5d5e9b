"""``jaxmesh eval`` on the shipped config, run in-process, against a Python loop."""

from __future__ import annotations

import json
from pathlib import Path

import gymnax
import jax
import numpy as np
import pytest

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.zoo import cartpole

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cartpole.yaml"
EPISODE_KEYS = {
    "index",
    "seed",
    "return",
    "length",
    "terminated",
    "truncated",
    "predict_calls",
    "lane",
}


def reference_returns(params, seeds):
    """Returns and lengths from gymnax's own reset_env / step_env, one by one."""
    env, env_params = gymnax.make("CartPole-v1")

    @jax.jit
    def one_step(key, t, state, obs):
        step_key = jax.random.fold_in(jax.random.fold_in(key, 0), t)
        action = cartpole.apply(params, obs)
        obs, state, reward, done, _ = env.step_env(step_key, state, action, env_params)
        return obs, state, reward, done, env.is_truncated(state, env_params)

    out = []
    for seed in seeds:
        key = jax.random.PRNGKey(seed)
        obs, state = env.reset_env(key, env_params)
        total, t, done, truncated = 0.0, 0, False, False
        while not (done or truncated):
            obs, state, reward, done, truncated = one_step(key, t, state, obs)
            done, truncated = bool(done), bool(truncated)
            total += float(reward)
            t += 1
        out.append((total, t))
    return out


def run_eval(tmp_path, *extra):
    out = tmp_path / "r.json"
    argv = ["eval", str(CONFIG), "--set", "episodes=20", "--set", "num_envs=8"]
    argv += ["--set", f"output={out}", *extra]
    return main(argv), out


def test_eval_shipped_config(tmp_path, capsys):
    code, out = run_eval(tmp_path)
    captured = capsys.readouterr()
    assert code == 0
    assert str(out) in captured.out
    assert "mean return" in captured.out
    assert "20/20" in captured.err  # the progress bar reached the budget
    data = json.loads(out.read_text())
    assert {"policy", "env", "settings", "totals", "episodes"} <= set(data)
    assert data["env"] == "gymnax:CartPole-v1"
    assert data["settings"]["num_envs"] == 8
    assert data["totals"]["episodes"] == 20
    assert len(data["episodes"]) == 20
    assert all(set(ep) == EPISODE_KEYS for ep in data["episodes"])
    assert [ep["seed"] for ep in data["episodes"]] == list(range(20))
    assert data["totals"]["mean_return"] >= 495.0

    params = jaxmesh.load_params(cartpole.DEFAULT_PATH)
    for seed, (ret, length) in zip(
        (0, 7), reference_returns(params, (0, 7)), strict=True
    ):
        assert data["episodes"][seed]["return"] == ret
        assert data["episodes"][seed]["length"] == length


def test_eval_checkpoint_override_matches_reference(tmp_path):
    # A fresh (untrained) MLP: short episodes (tens of steps) of varied length,
    # so that returns differ from seed to seed. Short, because in long failing
    # episodes the jitted and the vmapped CartPole physics round differently and
    # the trajectories drift apart, an honest float difference, not a bug.
    params = cartpole.init(jax.random.PRNGKey(3))
    jaxmesh.save_params(tmp_path / "fresh", params)
    code, out = run_eval(
        tmp_path,
        "--set",
        f"policy_config.checkpoint={tmp_path / 'fresh'}",
        "--no-progress",
    )
    assert code == 0
    episodes = json.loads(out.read_text())["episodes"]
    reference = reference_returns(params, range(20))
    assert len({length for _, length in reference}) > 5  # varied episodes
    got = [(ep["return"], ep["length"]) for ep in episodes]
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize(
    "override, message",
    [
        ("bogus=1", "unknown config key(s) ['bogus']"),
        ("episodes=-3", "episodes=-3"),
        ("episodes", "expected KEY=VALUE"),
        ("episodes.x=1", "not a mapping"),
    ],
)
def test_bad_set_exits_2(tmp_path, capsys, override, message):
    assert main(["eval", str(CONFIG), "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err
    if override == "bogus=1":
        assert "policy_config" in err and "num_envs" in err  # the allowed keys


def test_missing_config_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["eval", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and "not found" in err


def test_missing_checkpoint_exits_2(tmp_path, capsys):
    bad = tmp_path / "no_ckpt"
    code = main(["eval", str(CONFIG), "--set", f"policy_config.checkpoint={bad}"])
    assert code == 2
    assert "no_ckpt" in capsys.readouterr().err


def test_describe_prints_the_models_envelope(capsys):
    assert main(["describe", "jaxmesh.zoo.cartpole:CartPoleMLP"]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["schema_version"] == 1
    assert envelope["name"] == "CartPoleMLP"
    assert envelope["corners"] == ["predict"]
    assert envelope["native_chunk"] is None
    assert "checkpoint" in envelope["params"]


def test_describe_bad_target_exits_2(capsys):
    assert main(["describe", "jaxmesh.zoo.cartpole:NoSuchModel"]) == 2
    assert "NoSuchModel" in capsys.readouterr().err
