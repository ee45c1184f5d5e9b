"""``jaxmesh eval`` when the disk fills during a run: the episode log stops
with whole lines only and says how many episodes it holds, the run goes on,
its result is written whole or not at all (no empty or cut file), and a
failed run's finished episodes go to a file of their own with a true count.

Disks fill for real, without root: ``/dev/full`` (every write fails with
ENOSPC), a log's open descriptor pointed at ``/dev/full`` mid-run, and a file
size limit (``RLIMIT_FSIZE``: a write past it fails with EFBIG) on a real
``jaxmesh`` process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from gym_reference import tilt_episodes

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.cli.cache import CACHE_SWITCH_ENV

ROOT = Path(__file__).resolve().parents[2]
ENV = "gymnasium:CartPole-v1"


def _config(folder: Path, **keys) -> Path:
    config = {
        "env": ENV,
        "policy": "cli_policies:tilt",
        "episodes": 8,
        "num_envs": 2,
        "output": str(folder / "r.json"),
        **keys,
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _returns_lengths(episodes: list[dict]) -> list[tuple[float, int]]:
    return [(ep["return"], ep["length"]) for ep in episodes]


def _log_lines(path: Path) -> list[dict]:
    """Every line of a log, each whole JSON (fails on a cut line)."""
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


# The policy module of the mid-run test, imported from the working directory.
FILLS_LOG = textwrap.dedent(
    '''
    import os

    import jaxmesh
    from cli_policies import tilt_fn

    SEEN = []


    class FillsLog(jaxmesh.Model):
        """tilt; after its third episode the disk of the file named by
        $FILL_LOG is full: the file's open descriptor now writes to
        /dev/full, where every write fails with ENOSPC."""

        def predict(self, obs):
            return tilt_fn(obs)

        def on_episode_end(self, episode_id):
            SEEN.append(episode_id)
            log = os.environ.get("FILL_LOG")
            if not log or len(SEEN) != 3:
                return
            full = os.open("/dev/full", os.O_WRONLY)
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{fd}") == log:
                        os.dup2(full, int(fd))
                except OSError:
                    pass
            os.close(full)
    '''
)


def test_a_log_whose_disk_fills_mid_run_stops_with_whole_lines(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fills_log_policy.py").write_text(FILLS_LOG)
    config = _config(tmp_path, policy="fills_log_policy:FillsLog")
    log = tmp_path / "r.episodes.jsonl"
    monkeypatch.setenv("FILL_LOG", str(log))

    assert main(["eval", str(config), "--no-progress"]) == 1

    err = capsys.readouterr().err
    reference = tilt_episodes(range(8))
    whole = json.loads((tmp_path / "r.json").read_text())["episodes"]
    assert _returns_lengths(whole) == reference  # the run went on
    lines = _log_lines(log)  # whole lines only: the cut one was taken back
    held = [x["episode"] for x in lines if "episode" in x]
    assert 1 <= len(held) < 8
    assert all(ep in whole for ep in held)
    assert jaxmesh.load_episode_log(log).num_episodes == len(held)
    warning, error = [x for x in err.splitlines() if x.startswith("jaxmesh eval:")]
    assert warning == (
        f"jaxmesh eval: warning: the episode log {log} cannot be written (No "
        f"space left on device); it holds the {len(held)} episodes written "
        "before, and the run goes on without it (its result holds every episode)"
    )
    assert error.startswith(f"jaxmesh eval: error: the episode log {log} stopped")

    # The log resumes: only the episodes it lacks run again.
    monkeypatch.delenv("FILL_LOG")
    (tmp_path / "r.json").unlink()
    assert main(["eval", str(config), "--no-progress", "--resume", str(log)]) == 0
    again = json.loads((tmp_path / "r.json").read_text())["episodes"]
    assert _returns_lengths(again) == reference
    capsys.readouterr()


def test_a_failed_run_whose_log_cannot_be_written_keeps_its_episodes(tmp_path, capsys):
    # The log on /dev/full: its first line already fails. The policy raises
    # after its first episode (a failure of the run, after episodes finished).
    config = _config(tmp_path, policy="cli_policies:FailsAtRunTime")
    argv = ["eval", str(config), "--no-progress", "--episode-log", "/dev/full"]
    with pytest.raises(ValueError, match="failure while running") as info:
        main(argv)
    note = info.value.__notes__[-1]
    partial = tmp_path / "r.partial.json"
    kept = json.loads(partial.read_text())["episodes"]
    assert len(kept) >= 1
    assert note == (
        f"{len(kept)} finished episodes are in {partial} (the episode log "
        f"/dev/full holds 0); to run only the rest: jaxmesh eval {config} "
        f"--episode-log /dev/full --resume {partial}"
    )
    assert _returns_lengths(kept) == tilt_episodes(ep["seed"] for ep in kept)
    assert "cannot be written (No space left on device)" in capsys.readouterr().err


#: Runs argv[2:] with files limited to argv[1] bytes: a write past the limit
#: fails with EFBIG (SIGXFSZ ignored, so it does not kill the process).
LIMITED = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "size = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _run_with_files_limited(tmp_path: Path, size: int, episodes: int):
    """``jaxmesh eval`` of a CartPole config in ``tmp_path/out``, its working
    folder ``cwd`` and temporary folder ``tmp``, every file it writes limited
    to ``size`` bytes; the process and the three folders."""
    out, cwd, tmp = (tmp_path / name for name in ("out", "cwd", "tmp"))
    for folder in (out, cwd, tmp):
        folder.mkdir()
    config = _config(out, episodes=episodes)
    path = os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp)}
    env.update({CACHE_SWITCH_ENV: "0", "PYTHONDONTWRITEBYTECODE": "1"})
    argv = [sys.executable, "-c", LIMITED, str(size), sys.executable, "-m"]
    argv += ["jaxmesh.cli", "eval", str(config), "--no-progress"]
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return proc, out, cwd, tmp


def test_no_empty_or_cut_file_is_left_when_no_file_can_be_written(tmp_path):
    # Every file this process writes stops at 3,000 bytes: the log takes a
    # few episodes, the result JSON (and its copies in the working and the
    # temporary folders) cannot be written at all.
    proc, out, cwd, tmp = _run_with_files_limited(tmp_path, 3000, 40)

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    log = out / "r.episodes.jsonl"
    held = [x["episode"] for x in _log_lines(log) if "episode" in x]
    assert 1 <= len(held) < 40
    assert _returns_lengths(held) == tilt_episodes(ep["seed"] for ep in held)
    last = [x for x in proc.stderr.splitlines() if x.startswith("jaxmesh eval:")][-1]
    assert last.startswith(f"jaxmesh eval: error: cannot write {str(out / 'r.json')!r}")
    assert f"the episode log {log} holds {len(held)} of the 40 episodes" in last
    assert f"--resume {log}" in last
    # Nothing else: no empty, cut or temporary file anywhere it tried.
    assert sorted(p.name for p in out.iterdir()) == ["r.episodes.jsonl", "run.yaml"]
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_a_log_that_takes_no_line_is_not_left_empty(tmp_path):
    # 100 bytes: not even the log's run line fits.
    proc, out, cwd, tmp = _run_with_files_limited(tmp_path, 100, 4)

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    log = out / "r.episodes.jsonl"
    # jaxmesh's lines (JAX may warn that its compilation cache cannot grow).
    lines = [x for x in proc.stderr.splitlines() if x.startswith("jaxmesh eval:")]
    assert lines[0] == (
        f"jaxmesh eval: warning: the episode log {log} cannot be written (File "
        "too large); nothing was written to it, so it was removed, and the run "
        "goes on without it (its result holds every episode)"
    )
    assert lines[-1].endswith("the result of its 4 episodes is lost")
    assert sorted(p.name for p in out.iterdir()) == ["run.yaml"]
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []
