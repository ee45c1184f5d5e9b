"""The command line keeps what a run finished and refuses bad input in one line:
output paths checked before the run, a result that cannot be written where asked
kept elsewhere, a sweep's cells streamed and resumed, suites' refusals, numbers
out of range, duplicate YAML keys, and Ctrl-C saying how to resume.

References are plain gymnasium loops (``gym_reference.tilt_episodes`` and the
chunk loop below), never the code under test."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from gym_reference import tilt_episodes

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.cli import sweep as cli_sweep
from jaxmesh.cli.cache import CACHE_SWITCH_ENV
from jaxmesh.cli.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path, name="run.yaml", **keys):
    config = {
        "env": "gymnasium:CartPole-v1",
        "policy": "cli_policies:tilt",
        "episodes": 4,
        "num_envs": 2,
        "workers": 0,
        "output": str(tmp_path / "out" / "r.json"),
        **keys,
    }
    config = {k: v for k, v in config.items() if v is not None}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def error_line(err: str, command: str = "eval") -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxmesh {command}: error: "), lines[0]
    return lines[0]


def returns_lengths(episodes: list[dict]) -> list[tuple[float, int]]:
    return [(float(e["return"]), int(e["length"])) for e in episodes]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fails the test if a run or a sweep starts."""

    def never(*args, **kwargs):
        raise AssertionError("the run started: the refusal came too late")

    monkeypatch.setattr(jaxmesh, "evaluate", never)
    monkeypatch.setattr(jaxmesh, "sweep", never)


# Output paths, checked before the run -----------------------------------------
@pytest.mark.parametrize("command", ["eval", "sweep"])
@pytest.mark.parametrize(
    "where, why",
    [
        ("/proc/nope/x.json", "cannot be written"),
        ("{tmp}/a_folder", "is a directory, not a file"),
        ("{tmp}/a_file/x.json", "cannot be written"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_run(
    tmp_path, capsys, nothing_runs, command, where, why
):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("a file where a folder should be\n")
    output = where.format(tmp=tmp_path)
    config = write_config(tmp_path)
    argv = [command, str(config), "--set", f"output={output}"]
    if command == "eval":
        argv.append("--no-episode-log")
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err, command)
    assert f"output {output!r} {why}" in line


@pytest.mark.parametrize(
    "flag", [["--trace"], ["--episode-log"], ["--report"], ["--video"]]
)
def test_every_other_output_path_is_checked_before_the_run(
    tmp_path, capsys, nothing_runs, flag
):
    pytest.importorskip("matplotlib")
    pytest.importorskip("imageio")
    pytest.importorskip("imageio_ffmpeg")
    bad = "/proc/nope/x.mp4" if flag == ["--video"] else "/proc/nope/x.json"
    assert main(["eval", str(write_config(tmp_path)), *flag, bad]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"{flag[0]} {bad!r} cannot be written" in line


def test_a_result_that_cannot_be_written_at_the_end_is_kept_elsewhere(
    tmp_path, capsys, monkeypatch
):
    # The output's folder passes the check, then is replaced by a file during
    # the run (a lost disk): the result goes to a file in the working folder.
    out_folder = tmp_path / "out"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("JAXMESH_TEST_REMOVE", str(out_folder))
    config = write_config(tmp_path, policy="cli_policies:RemovesFolder")
    assert main(["eval", str(config), "--no-progress", "--no-episode-log"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {str(out_folder / 'r.json')!r}" in err
    kept = [p for p in cwd.iterdir() if p.name.startswith("r.")]
    assert len(kept) == 1 and f"the result is in {kept[0]} instead" in err
    episodes = json.loads(kept[0].read_text())["episodes"]
    assert returns_lengths(episodes) == tilt_episodes(range(4))


# Sweeps: cells streamed as they finish, and resumed ----------------------------
def chunk_episodes(seeds, h: int, d: int) -> list[tuple[float, int]]:
    """``cli_policies:chunked`` (chunks of 4 copies of the tilt action) on
    gymnasium's CartPole, horizon h and delay d, from the contract's rules:
    the first chunk is planned at reset and plays steps 0..h-1; without a
    delay, a plan every h steps from that step's observation; with a delay d,
    the chunk that plays steps kh .. kh+h-1 (k >= 1) was planned from the
    observation of step kh - d."""
    env = gym.make("CartPole-v1")
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        seen = [obs]
        total, t, done = 0.0, 0, False
        while not done:
            k = t // h
            planned = 0 if k == 0 else k * h - d
            action = int(seen[planned][2] > 0)
            obs, reward, terminated, truncated, _ = env.step(action)
            seen.append(obs)
            total += float(reward)
            t += 1
            done = terminated or truncated
        out.append((total, t))
    env.close()
    return out


def sweep_config(tmp_path, **keys):
    return write_config(
        tmp_path,
        "sweep.yaml",
        policy="cli_policies:chunked",
        horizon=2,
        workers=None,  # a sweep's host run keeps its lanes in this process
        **keys,
    )


def test_a_stopped_sweep_keeps_its_finished_cells_and_resumes(
    tmp_path, capsys, monkeypatch
):
    config = sweep_config(tmp_path, delay=[0, 1])
    output = tmp_path / "out" / "r.sweep.json"  # the sweep's own, not eval's r.json
    cells_file = tmp_path / "out" / "r.sweep.cells.jsonl"
    want = {d: chunk_episodes(range(4), 2, d) for d in (0, 1)}
    assert want[0] != want[1]  # the delay changes the episodes
    # Ctrl-C as the first cell is written (the second still running).
    write = cli_sweep.SweepCells.write

    def write_then_interrupt(self, delay, horizon, result):
        write(self, delay, horizon, result)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_sweep.SweepCells, "write", write_then_interrupt)
    assert main(["sweep", str(config), "--set", "num_envs=1"]) == 130
    err = capsys.readouterr().err
    assert "jaxmesh sweep: interrupted. 1 finished cell(s) are in" in err
    lines = [json.loads(x) for x in cells_file.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["config"]["delay"] == [0, 1]
    first = lines[1]["cell"]
    assert (first["delay"], first["horizon"]) == (0, 2)
    assert returns_lengths(first["result"]["episodes"]) == want[0]
    assert not output.exists()
    monkeypatch.setattr(cli_sweep.SweepCells, "write", write)
    # The printed command runs only the other cell.
    command = err.split("to run only the rest: ")[1].strip()
    want_command = f"jaxmesh sweep {config} --set num_envs=1 --resume {cells_file}"
    assert command == want_command
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    cells = json.loads(output.read_text())["cells"]
    assert [(c["delay"], c["horizon"]) for c in cells] == [(0, 2), (1, 2)]
    for c in cells:
        assert returns_lengths(c["result"]["episodes"]) == want[c["delay"]]
    # Cell (0, 2) came from the file: written once, not run again.
    lines = [json.loads(x) for x in cells_file.read_text().splitlines()]
    assert [(x["cell"]["delay"]) for x in lines[1:]] == [0, 1]


def test_a_sweep_resumed_with_another_config_is_refused(tmp_path, capsys):
    config = sweep_config(tmp_path, delay=[0, 1])
    cells_file = tmp_path / "out" / "r.sweep.cells.jsonl"
    # The config's output is jaxmesh eval's result (what jaxmesh report reads):
    # the sweep writes its own file next to it and leaves the output as it is.
    eval_result = tmp_path / "out" / "r.json"
    eval_result.parent.mkdir()
    eval_result.write_text("the eval's result\n")
    assert main(["sweep", str(config)]) == 0
    assert f"wrote {tmp_path / 'out' / 'r.sweep.json'}" in capsys.readouterr().out
    assert eval_result.read_text() == "the eval's result\n"
    cells = json.loads((tmp_path / "out" / "r.sweep.json").read_text())["cells"]
    assert [(c["delay"], c["horizon"]) for c in cells] == [(0, 2), (1, 2)]
    argv = ["sweep", str(config), "--set", "episodes=5", "--resume", str(cells_file)]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err, "sweep")
    assert "the earlier sweep had episodes=4, this call 5" in line
    argv = ["sweep", str(config), "--resume", str(config)]  # not a cells file
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err, "sweep")
    assert "expected the cells file of jaxmesh sweep" in line


@pytest.mark.parametrize("axes", [["horizon=[1,4]"], ["horizon=4"], ["delay=[0,1]"]])
def test_a_sweep_of_a_single_action_policy_is_refused_before_it_runs(
    tmp_path, capsys, axes
):
    """``cli_policies:tilt`` returns one action per call: every "horizon 4" or
    "delay 1" cell would run horizon 1 with no delay under that label."""
    config = write_config(tmp_path, "sweep.yaml", workers=None)  # policy: tilt
    argv = ["sweep", str(config)]
    for axis in axes:
        argv += ["--set", axis]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err, "sweep")
    assert "returns one action per call" in line
    assert "the horizon h and the delay d do not apply" in line
    assert not list((tmp_path / "out").iterdir())  # nothing ran, nothing written


def test_the_api_sweep_refuses_a_single_action_policy_too():
    from cli_policies import tilt_fn

    for axes in ({"horizon": [1, 2]}, {"delay": [0, 1], "horizon": [1]}):
        with pytest.raises(ValueError, match="returns one action per call"):
            jaxmesh.sweep(tilt_fn, "gymnax:CartPole-v1", episodes=2, **axes)


# A video that fails -------------------------------------------------------------
def test_a_failed_video_keeps_the_results_and_names_what_to_set(
    tmp_path, capsys, monkeypatch
):
    """Headless with no OpenGL: the renderer raises. The JSON, the recorded
    episodes and the report are written first; the error says which variable
    to set; the exit status is 1."""
    from jaxmesh.results import video

    def no_gl(*args, **kwargs):
        raise RuntimeError("an OpenGL context could not be created")

    monkeypatch.setattr(video, "render", no_gl)
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    out = tmp_path / "r.json"
    argv = ["eval", str(ROOT / "configs" / "cartpole.yaml"), "--no-progress"]
    for key in ("episodes=3", "num_envs=4", "max_episode_steps=20", f"output={out}"):
        argv += ["--set", key]
    assert main([*argv, "--video", "--report"]) == 1
    captured = capsys.readouterr()
    for path in (out, out.with_suffix(".npz"), out.with_suffix(".html")):
        assert path.is_file() and f"wrote {path}" in captured.out, path
    data = json.loads(out.read_text())
    assert [ep["length"] for ep in data["episodes"]] == [20, 20, 20]
    assert "videos" not in data
    assert not list(tmp_path.glob("*.mp4"))
    line = error_line(captured.err)
    assert "an OpenGL context could not be created" in line
    assert "MUJOCO_GL=egl" in line and "MUJOCO_GL=osmesa" in line
    assert str(out) in line  # where the results are


# Suites -------------------------------------------------------------------------
def suite_config(tmp_path, tasks, **keys):
    return write_config(tmp_path, "suite.yaml", env=None, tasks=tasks, **keys)


def test_a_suites_first_task_refusal_is_one_line(tmp_path, capsys):
    config = suite_config(
        tmp_path, {"good": "gymnax:CartPole-v1"}, episodes=3, seeds=[1, 2]
    )
    assert main(["eval", str(config)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "episodes=3 disagrees with len(seeds)=2" in line
    assert "'good'" in line


def test_a_tasks_own_budget_that_disagrees_is_one_line(tmp_path, capsys):
    task = {"env": "gymnax:CartPole-v1", "episodes": 3, "seeds": [1, 2]}
    config = suite_config(tmp_path, {"good": task})
    assert main(["eval", str(config)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "tasks.good: episodes=3 disagrees with len(seeds)=2" in line


def test_a_later_tasks_refusal_is_one_line_and_keeps_the_tasks_before(tmp_path, capsys):
    tasks = {"a": "gymnasium:CartPole-v1", "b": "gymnasium:NoSuchEnv-v0"}
    config = suite_config(tmp_path, tasks, episodes=3)
    assert main(["eval", str(config), "--no-progress"]) == 2
    line = error_line(capsys.readouterr().err)
    output = tmp_path / "out" / "r.json"
    assert "task 'b' (env 'gymnasium:NoSuchEnv-v0')" in line
    assert f"['a'], are in {output}" in line and f"--resume {output}" in line
    saved = json.loads(output.read_text())
    a = saved["tasks"]["a"]
    assert returns_lengths(a["episodes"]) == tilt_episodes(range(3))


def test_a_suite_resumed_with_another_env_is_one_line(tmp_path, capsys):
    tasks = {"a": "gymnasium:CartPole-v1"}
    config = suite_config(tmp_path, tasks, episodes=3)
    assert main(["eval", str(config), "--no-progress"]) == 0
    capsys.readouterr()
    output = tmp_path / "out" / "r.json"
    argv = ["eval", str(config), "--no-progress", "--resume", str(output)]
    argv += ["--set", "tasks.a=gymnax:CartPole-v1"]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert "task 'a' (env 'gymnax:CartPole-v1')" in line
    assert "the earlier run had env 'gymnasium:CartPole-v1'" in line


# Numbers out of range, duplicate keys --------------------------------------------
@pytest.mark.parametrize("command", ["eval", "sweep"])
@pytest.mark.parametrize(
    "override, message",
    [
        (
            "max_episode_steps=2147483648",
            "max_episode_steps=2147483648: expected at most 2,147,483,647",
        ),
        (
            "plan_tile=1099511627776",
            "plan_tile=1099511627776: expected at most 1,048,576",
        ),
        (
            "max_episode_seconds=1.0e+300",
            "max_episode_seconds=1e+300: expected a "
            "number of seconds > 0 and at most 1000000000",
        ),
        (
            "episodes=1000000000000000000000000000000",
            "episodes=1,000,000,000,000,"
            "000,000,000,000,000,000: the per-episode results would need",
        ),
    ],
)
def test_huge_numbers_are_one_line(tmp_path, capsys, command, override, message):
    # A JAX env (where the step cap and the tile reach the device) for eval, a
    # host-stepped one for sweep.
    env = "gymnax:CartPole-v1" if command == "eval" else "gymnasium:CartPole-v1"
    config = write_config(tmp_path, env=env, workers=None)
    assert main([command, str(config), "--set", override]) == 2
    assert message in error_line(capsys.readouterr().err, command)


def test_a_duplicate_yaml_key_is_refused_naming_it_and_its_lines(
    tmp_path, capsys, nothing_runs
):
    path = tmp_path / "dup.yaml"
    path.write_text(
        "env: gymnax:CartPole-v1\n"
        "policy: cli_policies:tilt\n"
        "episodes: 3\n"
        "num_envs: 2\n"
        "episodes: 4\n"
    )
    assert main(["eval", str(path)]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"config file {str(path)!r}, line 5: key 'episodes' is given twice " in line
    assert "(first on line 3)" in line
    path.write_text(
        "env: gymnax:CartPole-v1\n"
        "policy: jaxmesh.zoo.cartpole:CartPoleMLP\n"
        "policy_config:\n"
        "  checkpoint: null\n"
        "  checkpoint: other\n"
    )
    assert main(["eval", str(path)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "line 5: key 'checkpoint' is given twice (first on line 4)" in line
    argv = ["eval", str(write_config(tmp_path)), "--set", "env_config={a: 1, a: 2}"]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert "--set env_config=...: line 1: key 'a' is given twice" in line


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text(
        "base: &b {episodes: 3, num_envs: 2}\npolicy_config:\n  <<: *b\n  episodes: 4\n"
    )
    assert load_config(path)["policy_config"] == {"episodes": 4, "num_envs": 2}


# Ctrl-C --------------------------------------------------------------------------
SLOW_ENV = '''
import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class SlowCartPole(CartPoleEnv):
    """CartPole whose steps take SLOWCART_SECONDS (default 20 ms): a run long
    enough to interrupt, and a resumed run in the test's process at full speed."""

    def step(self, action):
        time.sleep(float(os.environ.get("SLOWCART_SECONDS", "0.02")))
        return super().step(action)


gym.register("SlowCartPole-v1", entry_point=SlowCartPole, max_episode_steps=500)
'''


def interrupted(tmp_path, argv, written, marker, count):
    """``jaxmesh ARGV`` in a child process on the slow CartPole, sent SIGINT
    once ``written`` holds ``count`` lines with ``marker``; its exit status and
    stderr."""
    env = {
        **os.environ,
        CACHE_SWITCH_ENV: "0",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests")]),
        # Slow enough that the run cannot end before the signal, however busy
        # the machine; the resumed run, in the test's process, is not slowed.
        "SLOWCART_SECONDS": "0.05",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmesh.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if written.is_file() and written.read_text().count(marker) >= count:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


@pytest.mark.slow  # make test: a stopped run resumes in process (tests/run)
def test_ctrl_c_says_how_to_resume_and_that_command_finishes_the_run(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "slowcart.py").write_text(SLOW_ENV)
    config = write_config(
        tmp_path, env="gymnasium:slowcart:SlowCartPole-v1", episodes=24
    )
    log = tmp_path / "out" / "r.episodes.jsonl"
    argv = ["eval", str(config), "--no-progress", "--set", "num_envs=1"]
    returncode, err = interrupted(tmp_path, argv, log, '"episode"', 2)
    assert returncode == 130, err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("jaxmesh eval: interrupted. ")
    assert f"finished episodes are in {log}; to run only the rest: " in lines[0]
    command = lines[0].split("to run only the rest: ")[1]
    want = f"jaxmesh eval {config} --set num_envs=1 --resume {log}"
    assert command == want
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SLOWCART_SECONDS", "0")
    assert main(shlex.split(command)[1:] + ["--no-progress"]) == 0
    capsys.readouterr()
    episodes = json.loads((tmp_path / "out" / "r.json").read_text())["episodes"]
    assert returns_lengths(episodes) == tilt_episodes(range(24))


@pytest.mark.slow  # make test: a stopped sweep resumes in process (above)
def test_ctrl_c_on_a_sweep_keeps_its_finished_cells_in_a_real_process(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "slowcart.py").write_text(SLOW_ENV)
    config = sweep_config(
        tmp_path, env="gymnasium:slowcart:SlowCartPole-v1", delay=[0, 1]
    )
    cells_file = tmp_path / "out" / "r.sweep.cells.jsonl"
    argv = ["sweep", str(config), "--set", "num_envs=1"]
    returncode, err = interrupted(tmp_path, argv, cells_file, '"cell"', 1)
    assert returncode == 130, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("jaxmesh sweep: interrupted. ")
    command = lines[0].split("to run only the rest: ")[1]
    assert command == f"jaxmesh sweep {config} --set num_envs=1 --resume {cells_file}"
    kept = [json.loads(x)["cell"] for x in cells_file.read_text().splitlines()[1:]]
    assert [c["delay"] for c in kept] == [0]
    assert returns_lengths(kept[0]["result"]["episodes"]) == chunk_episodes(
        range(4), 2, 0
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SLOWCART_SECONDS", "0")
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    cells = json.loads((tmp_path / "out" / "r.sweep.json").read_text())["cells"]
    for c in cells:
        want = chunk_episodes(range(4), 2, c["delay"])
        assert returns_lengths(c["result"]["episodes"]) == want
