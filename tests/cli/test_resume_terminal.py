"""A run resumes whether or not its output is a terminal: ``jaxmesh eval`` run
in a real pseudo-terminal, its episode log cut short as a killed run leaves it,
then resumed through a pipe (as ``tee``, ``nohup`` or a batch job run it), and
the reverse. JAX colours a jaxpr's text when stdout is a terminal; the run's
identity (``jaxmesh.run.identity``) must not see that."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxmesh.cli.cache import CACHE_SWITCH_ENV

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    path = os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p
    )
    return {**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONPATH": path}


def _in_terminal(argv: list[str]) -> tuple[int, str]:
    """Runs ``argv`` with stdin, stdout and stderr on a new pseudo-terminal;
    its exit status and everything it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=_env()
    )
    os.close(follower)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's last writer closed it
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        rc = proc.wait(timeout=120)
    return rc, out.decode(errors="replace")


def _in_pipe(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def _episodes(path: Path) -> list[dict]:
    """A result JSON's episodes, less their lane and checksum (a resumed run
    deals its episodes to lanes of its own)."""
    eps = json.loads(path.read_text())["episodes"]
    return [{k: v for k, v in ep.items() if k not in ("lane", "check")} for ep in eps]


@pytest.mark.parametrize("first", ["terminal", "pipe"])
def test_a_run_resumes_across_terminal_and_pipe(tmp_path, first):
    run = {"terminal": _in_terminal, "pipe": _in_pipe}
    then = "pipe" if first == "terminal" else "terminal"
    config = tmp_path / "run.yaml"
    out = tmp_path / "r.json"
    config.write_text(
        yaml.safe_dump(
            {
                "env": "gymnax:CartPole-v1",
                "policy": "cli_policies:tilt",
                "episodes": 6,
                "num_envs": 4,
                "output": str(out),
            }
        )
    )
    argv = [sys.executable, "-m", "jaxmesh.cli", "eval", str(config), "--no-progress"]
    rc, text = run[first](argv)
    assert rc == 0, text
    if first == "terminal":  # a terminal's line discipline ends lines with CR LF
        assert "\r\n" in text
    whole = _episodes(out)
    log = tmp_path / "r.episodes.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 1 + 6 + 1  # the run line, 6 episodes, the totals
    # A run killed after 3 episodes, while writing the fourth line.
    log.write_text("\n".join(lines[:4]) + '\n{"episode": {"ind')
    out.unlink()

    rc, text = run[then]([*argv, "--resume", str(log)])

    assert rc == 0, text
    assert "is not this call's" not in text
    assert _episodes(out) == whole


def test_a_suite_started_in_a_terminal_resumes_through_a_pipe(tmp_path):
    # A JAX env's task (its env digest is a traced program) and a gymnasium
    # one (the policy's digest is); a suite resumes from its output JSON.
    config = tmp_path / "suite.yaml"
    out = tmp_path / "suite.json"
    config.write_text(
        yaml.safe_dump(
            {
                "policy": "cli_policies:tilt",
                "tasks": {"a": "gymnax:CartPole-v1", "b": "gymnasium:CartPole-v1"},
                "episodes": 4,
                "num_envs": 2,
                "output": str(out),
            }
        )
    )
    argv = [sys.executable, "-m", "jaxmesh.cli", "eval", str(config), "--no-progress"]
    rc, text = _in_terminal(argv)
    assert rc == 0, text
    whole = json.loads(out.read_text())
    cut = json.loads(out.read_text())
    for task in cut["tasks"].values():  # each task stopped after 2 episodes
        task["episodes"] = task["episodes"][:2]
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(cut))

    rc, text = _in_pipe([*argv, "--resume", str(earlier)])

    assert rc == 0, text
    again = json.loads(out.read_text())
    for name in ("a", "b"):
        got, want = (
            [
                {k: v for k, v in ep.items() if k not in ("lane", "check")}
                for ep in r["tasks"][name]["episodes"]
            ]
            for r in (again, whole)
        )
        assert got == want
