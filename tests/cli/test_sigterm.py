"""SIGTERM to ``jaxmesh eval`` (a batch system's stop, ``kill``, ``timeout``)
stops the run as Ctrl-C does: one line on stderr with the true count of the
finished episodes, where they are and the command that runs only the rest;
exit status 143 (128 + SIGTERM); no worker process left. A real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import jaxmesh
from jaxmesh.cli.cache import CACHE_SWITCH_ENV

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    """The child processes of ``pid`` (Linux /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(x) for x in (task / "children").read_text().split()}
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "workers"])
def test_sigterm_prints_the_resume_line_as_ctrl_c_does(tmp_path, workers):
    log = tmp_path / "r.episodes.jsonl"
    config = tmp_path / "run.yaml"
    keys = {"env": "gymnasium:CartPole-v1", "policy": "cli_policies:tilt"}
    keys.update(episodes=200_000, num_envs=4, output=str(tmp_path / "r.json"))
    if workers:
        keys["workers"] = workers
    config.write_text(yaml.safe_dump(keys))
    path = os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONPATH": path}
    argv = [sys.executable, "-m", "jaxmesh.cli", "eval", str(config), "--no-progress"]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        # Until the run has finished an episode (the log holds one).
        while not (log.exists() and '"episode"' in log.read_text()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        children = _children(proc.pid)
        assert len(children) >= workers
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 128 + signal.SIGTERM, err
    held = jaxmesh.load_episode_log(log).num_episodes
    assert held >= 1
    assert err.splitlines() == [
        f"jaxmesh eval: terminated (SIGTERM). {held} finished episodes are in "
        f"{log}; to run only the rest: jaxmesh eval {config} --resume {log}"
    ]
    assert not [pid for pid in children if _alive(pid)]
