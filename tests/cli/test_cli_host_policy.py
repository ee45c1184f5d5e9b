"""``jaxmesh eval`` with a host policy: ``policy: module:fn`` with ``host: true``
(a numpy function run as ``jaxmesh.HostPolicy(fn)``), or a module attribute that
is a ``HostPolicy``; episodes against a plain gymnasium loop."""

from __future__ import annotations

import json

import pytest
import yaml
from gym_reference import tilt_episodes

from jaxmesh.cli import main


def _eval(tmp_path, **keys) -> int:
    config = {
        "env": "gymnasium:CartPole-v1",
        "episodes": 6,
        "num_envs": 3,
        "output": str(tmp_path / "r.json"),
        **keys,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["eval", str(path), "--no-progress"])


def _episodes(tmp_path) -> list[tuple[float, int]]:
    eps = json.loads((tmp_path / "r.json").read_text())["episodes"]
    return [(ep["return"], ep["length"]) for ep in eps]


@pytest.mark.parametrize(
    "keys",
    [
        {"policy": "cli_policies:tilt_np", "host": True},
        {"policy": "cli_policies:tilt_host"},
    ],
    ids=["host-key", "instance"],
)
def test_a_host_policy_from_yaml_plays_the_plain_loops_episodes(tmp_path, capsys, keys):
    assert _eval(tmp_path, **keys) == 0
    assert _episodes(tmp_path) == tilt_episodes(range(6))
    capsys.readouterr()


@pytest.mark.parametrize(
    "keys, words",
    [
        ({"policy": "cli_policies:tilt", "host": True}, "host: true wraps a function"),
        ({"policy": "cli_policies:tilt_np", "host": "yes"}, "host='yes': expected"),
    ],
    ids=["a-model", "not-a-bool"],
)
def test_host_is_refused_where_it_cannot_apply(tmp_path, capsys, keys, words):
    assert _eval(tmp_path, **keys) == 2
    assert words in capsys.readouterr().err
