"""``jaxmesh eval``'s bad input that is only found once the policy meets the env
(params that do not fit its observations, a gymnasium id that does not exist,
in process and in worker processes): one line on stderr, exit status 2, and
no resume hint when no episode finished. Run as a user runs it: a real
``jaxmesh`` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxmesh.cli import main
from jaxmesh.cli.cache import CACHE_SWITCH_ENV

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **keys) -> Path:
    config = {
        "env": "gymnax:CartPole-v1",
        "policy": "cli_policies:tilt",
        "episodes": 6,
        "num_envs": 4,
        "output": str(tmp_path / "r.json"),
        **keys,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _eval(config: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONPATH": path}
    argv = [sys.executable, "-m", "jaxmesh.cli", "eval", str(config), "--no-progress"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    "keys, words",
    [
        # The shipped CartPole MLP (4 inputs) on Acrobot (6 observations):
        # flax's ScopeParamShapeError at the probe.
        (
            {"env": "gymnax:Acrobot-v1", "policy": "jaxmesh.zoo.cartpole:CartPoleMLP"},
            ["do not fit this env", "ScopeParamShapeError", "(6, 64)", "(4, 64)"],
        ),
        # gymnasium's NameNotFound, raised in a worker process.
        (
            {"env": "gymnasium:cli_policies:NoSuchEnv-v0", "workers": 2},
            ["cannot make the env", "NameNotFound", "NoSuchEnv", "<module>:<Id>"],
        ),
        # The same in process.
        (
            {"env": "gymnasium:cli_policies:NoSuchEnv-v0"},
            ["cannot make the env", "NameNotFound", "NoSuchEnv"],
        ),
    ],
    ids=["params-do-not-fit", "unknown-id-workers", "unknown-id"],
)
def test_bad_input_found_at_the_probe_is_one_line_exit_2(tmp_path, keys, words):
    proc = _eval(_config(tmp_path, **keys))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("jaxmesh eval: error: policy ")
    for word in words:
        assert word in lines[0]
    assert "resume" not in lines[0]
    assert not (tmp_path / "r.episodes.jsonl").exists()


def test_a_failure_before_any_episode_finished_gives_no_resume_hint(tmp_path):
    # A socket bound but not listening: the served env cannot be reached, a
    # failure of the run (its traceback kept), but nothing finished.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        config = _config(tmp_path, env=f"grpc://{address}")
        with pytest.raises(Exception, match=address) as info:
            main(["eval", str(config), "--no-progress"])
    notes = getattr(info.value, "__notes__", [])
    assert notes == ["No episode had finished: nothing to resume from."]
    assert not (tmp_path / "r.episodes.jsonl").exists()


def test_a_failure_after_an_episode_finished_gives_the_resume_command(tmp_path):
    config = _config(tmp_path, policy="cli_policies:FailsAtRunTime")
    with pytest.raises(ValueError, match="after episode 0") as info:
        main(["eval", str(config), "--no-progress"])
    note = info.value.__notes__[-1]  # the last: the CLI adds it last
    log = tmp_path / "r.episodes.jsonl"
    held = sum('"episode"' in line for line in log.read_text().splitlines())
    assert held >= 1
    assert note == (
        f"{held} finished episodes are in {log}; to run only the rest: "
        f"jaxmesh eval {config} --resume {log}"
    )
