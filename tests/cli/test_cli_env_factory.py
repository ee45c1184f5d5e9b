"""A config's ``env: module:function`` (an env factory, as ``jaxmesh.evaluate``
takes one) in process and in worker processes, a refusal that names both
forms of an env of one's own, and ``--set policy=...`` that swaps the policy
without the file's ``policy_config``. Checked against a plain gymnasium loop."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from gym_reference import tilt_episodes

from jaxmesh.cli import main
from jaxmesh.cli.config import apply_overrides

ROOT_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "cartpole.yaml")

FACTORIES = textwrap.dedent(
    """
    import gymnasium as gym


    def make():
        return gym.make("CartPole-v1")


    def make_capped(max_episode_steps=500):
        return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)


    NOT_A_FACTORY = 3
    """
)


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of env factories in the working directory, as a user keeps
    one next to the config; its name."""
    monkeypatch.chdir(tmp_path)
    name = f"my_envs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    return name


def _config(tmp_path, **keys):
    config = {
        "policy": "cli_policies:tilt",
        "episodes": 6,
        "num_envs": 2,
        "output": str(tmp_path / "r.json"),
        **keys,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _episodes(tmp_path) -> list[tuple[float, int]]:
    eps = json.loads((tmp_path / "r.json").read_text())["episodes"]
    return [(ep["return"], ep["length"]) for ep in eps]


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "workers"])
def test_an_env_factory_in_yaml(tmp_path, capsys, factories, workers):
    extra = {"workers": workers} if workers else {}
    config = _config(tmp_path, env=f"{factories}:make", **extra)
    assert main(["eval", str(config), "--no-progress"]) == 0
    assert _episodes(tmp_path) == tilt_episodes(range(6))
    capsys.readouterr()


def test_env_config_is_the_factorys_keyword_arguments(tmp_path, capsys, factories):
    config = _config(
        tmp_path,
        env=f"{factories}:make_capped",
        env_config={"max_episode_steps": 5},
    )
    assert main(["eval", str(config), "--no-progress"]) == 0
    # Every tilt episode on CartPole lasts more than 5 steps: all are cut at 5.
    assert min(length for _, length in tilt_episodes(range(6))) > 5
    assert _episodes(tmp_path) == [(5.0, 5)] * 6
    capsys.readouterr()


@pytest.mark.parametrize(
    "env, words",
    [
        ("{m}:nope", ["has no attribute 'nope'"]),
        ("{m}:NOT_A_FACTORY", ["is an int, not an env factory"]),
        ("no_such_module_here:make", ["unknown env prefix 'no_such_module_here'"]),
    ],
    ids=["missing", "not-a-factory", "no-module"],
)
def test_a_bad_own_env_names_both_forms(tmp_path, capsys, factories, env, words):
    config = _config(tmp_path, env=env.format(m=factories))
    assert main(["eval", str(config), "--no-progress"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    for word in [*words, "gymnasium:<module>:<Id>", "<module>:<function>"]:
        assert word in line


def test_a_policy_swapped_on_the_command_line_drops_the_files_policy_config(
    tmp_path, capsys
):
    # configs/cartpole.yaml gives policy_config: {checkpoint: null} for its MLP;
    # the swapped-in function takes none.
    argv = ["eval", ROOT_CONFIG, "--no-progress", "--set", "policy=cli_policies:tilt"]
    argv += ["--set", "env=gymnasium:CartPole-v1", "--set", "episodes=6"]
    argv += ["--set", "num_envs=2", "--set", f"output={tmp_path / 'r.json'}"]
    assert main(argv) == 0
    assert _episodes(tmp_path) == tilt_episodes(range(6))
    capsys.readouterr()


def test_policy_config_overrides_survive_a_swap_in_any_order():
    config = {"policy": "a:A", "policy_config": {"x": 1}, "episodes": 3}
    swapped = ["policy_config.y=2", "policy=b:B"]
    assert apply_overrides(config, swapped) == {
        "policy": "b:B",
        "policy_config": {"y": 2},
        "episodes": 3,
    }
    # The file's own policy named again is no swap: its config stays.
    same = apply_overrides(config, ["policy=a:A", "policy_config.y=2"])
    assert same["policy_config"] == {"x": 1, "y": 2}
    assert apply_overrides(config, ["episodes=4"])["policy_config"] == {"x": 1}
