"""``jaxmesh decide A.yaml B.yaml``: exit status, progress lines, outputs
against ``jaxmesh.evaluate`` on the same seeds, the plot, resume, Ctrl-C, a
suite config, bad input."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from cli_policies import tilt_fn

import jaxmesh
from jaxmesh.cli import main

CARTPOLE = "gymnax:CartPole-v1"


def write(tmp_path, name, **keys):
    config = {
        **({} if "tasks" in keys else {"env": CARTPOLE}),
        "policy": "cli_policies:tilt",
        "num_envs": 8,
        "output": str(tmp_path / f"{name}.json"),
        **keys,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def configs(tmp_path, b_policy="cli_policies:make_lean", b_config=None, **keys):
    """A: push the way the cart stands (a weak rule, ``obs[0] > 0``); B: push
    the way the pole leans (``tilt_fn``)."""
    a = write(
        tmp_path,
        "a",
        policy="cli_policies:make_lean",
        policy_config={"index": 0, "name": "cart"},
        **keys,
    )
    b = write(
        tmp_path,
        "b",
        policy=b_policy,
        policy_config={"index": 2} if b_config is None else b_config,
        **keys,
    )
    return a, b


def log_episodes(path):
    """An episode log's episode lines, read as plain JSON lines: index ->
    return (a line of one episode twice counts once)."""
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "episode" in rec:
            out[rec["episode"]["index"]] = rec["episode"]["return"]
    return out


def test_decides_b_writes_both_results_and_the_decision(tmp_path, capsys):
    a, b = configs(tmp_path)
    out = tmp_path / "decision.json"
    png = tmp_path / "interval.png"
    argv = ["decide", a, b, "--bounds", "0", "500", "--output", str(out)]
    page = tmp_path / "report" / "decision.html"
    code = main([*argv, "--plot", str(png), "--report", str(page)])
    captured = capsys.readouterr()
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in captured.out and f"wrote {page}" in captured.out
    progress = [
        line for line in captured.err.splitlines() if line.startswith("jaxmesh decide:")
    ]
    assert progress and "decided: B" in progress[-1]
    assert "episodes per arm" in progress[0] and "interval (" in progress[0]
    assert "B scores more" in captured.out
    decision = json.loads(out.read_text())
    assert decision["winner"] == "b"
    n = decision["episodes"]
    assert len(decision["path"]) == len(progress)
    # the report page: the verdict and the interval of the decision JSON
    text = page.read_text()
    assert "B scores more" in text and "Waudby-Smith" in text
    shown = f"data-key='interval' data-value='{json.dumps(decision['interval'])}'"
    assert shown in text
    # B's result file: what evaluate gives on seeds 0..n-1
    result_b = jaxmesh.RunResult.from_dict(
        json.loads((tmp_path / "b.json").read_text())
    )
    ref = jaxmesh.evaluate(tilt_fn, CARTPOLE, num_envs=8, seeds=range(n))
    np.testing.assert_array_equal(result_b.returns, ref.returns)
    assert result_b.seeds.tolist() == list(range(n))
    result_a = jaxmesh.RunResult.from_dict(decision["a"])
    assert result_a.num_episodes == n
    assert json.loads((tmp_path / "a.json").read_text())["totals"]["episodes"] == n
    # each arm's episode log: one episode line per episode, the result's returns
    for name in ("a", "b"):
        log = tmp_path / f"{name}.episodes.jsonl"
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert sum("episode" in x for x in lines) == n
        episodes = [e["episode"] for e in lines if "episode" in e]
        assert [e["seed"] for e in episodes] == list(range(n))
        result = decision[name]["episodes"]
        assert log_episodes(log) == {e["index"]: e["return"] for e in result}
        loaded = jaxmesh.load_episode_log(log)
        assert loaded.returns.tolist() == [e["return"] for e in result]


def test_undecided_exits_1_and_resume_goes_on(tmp_path, capsys):
    a, b = configs(tmp_path)
    out = tmp_path / "decision.json"
    argv = ["decide", a, b, "--bounds", "0", "500", "--output", str(out)]
    page = tmp_path / "undecided.html"
    more = ["--max-episodes", "16", "--no-progress", "--report", str(page)]
    assert main([*argv, *more]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "no decision after 16 episodes" in captured.out
    text = page.read_text()
    assert "no decision after 16 episodes" in text
    assert "data-key='decided_at' data-value='null'" in text
    first = json.loads(out.read_text())
    assert first["winner"] is None and first["episodes"] == 16
    out2 = tmp_path / "decision2.json"
    code = main(
        [
            "decide",
            a,
            b,
            "--bounds",
            "0",
            "500",
            "--output",
            str(out2),
            "--resume",
            str(out),
        ]
    )
    assert code == 0
    again = json.loads(out2.read_text())
    whole = jaxmesh.decide(
        jaxmesh.Model(lambda o: (o[0] > 0).astype(jnp.int32)),
        tilt_fn,
        CARTPOLE,
        bounds=(0, 500),
        num_envs=8,
    )
    assert again["winner"] == "b" and again["decided_at"] == whole.decided_at
    assert again["a"]["episodes"][:16] == first["a"]["episodes"]


@pytest.mark.parametrize(
    ("extra", "keys", "message"),
    [
        ([], {}, "--metric return needs --bounds LO HI"),
        (["--metric", "success", "--bounds", "0", "1"], {}, "--bounds is for"),
        (["--bounds", "0", "500", "--alpha", "2"], {}, "alpha=2.0"),
        (["--bounds", "0", "500", "--max-episodes", "0"], {}, "max_episodes=0"),
        (["--bounds", "0", "500", "--resume", "missing.json"], {}, "missing.json"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    no_compile, tmp_path, capsys, extra, keys, message
):
    a, b = configs(tmp_path, **keys)
    assert main(["decide", a, b, "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("jaxmesh decide: error: ")
    assert message in lines[0]


def test_another_env_or_settings_in_b_is_refused(no_compile, tmp_path, capsys):
    a, _ = configs(tmp_path)
    b = write(tmp_path, "b", env="gymnax:Acrobot-v1")
    assert main(["decide", a, b, "--bounds", "0", "500"]) == 2
    err = capsys.readouterr().err
    assert "differ in ['env']" in err and "B's config may differ only in" in err
    b = write(tmp_path, "b", horizon=2)
    assert main(["decide", a, b, "--bounds", "0", "500"]) == 2
    assert "differ in ['horizon']" in capsys.readouterr().err
    b = write(tmp_path, "b", output=str(tmp_path / "a.json"))
    assert main(["decide", a, b, "--bounds", "0", "500"]) == 2
    assert "both write" in capsys.readouterr().err


def test_ctrl_c_writes_the_finished_batches_and_exits_130(
    tmp_path, capsys, monkeypatch
):
    import jaxmesh.cli.decide as command

    def interrupt_after_two(d):
        if d.batches == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(command, "_progress", interrupt_after_two)
    a, b = configs(tmp_path)
    out = tmp_path / "decision.json"
    argv = ["decide", a, b, "--bounds", "0", "500", "--output", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and f"--resume {out}" in err
    partial = json.loads(out.read_text())
    assert partial["episodes"] == 16 and partial["winner"] is None
    for name in ("a", "b"):  # the finished batches' episodes are in the logs
        held = log_episodes(tmp_path / f"{name}.episodes.jsonl")
        assert sorted(held) == list(range(16))
        assert held == {e["index"]: e["return"] for e in partial[name]["episodes"]}
    monkeypatch.undo()
    assert main([*argv, "--resume", str(out), "--no-progress"]) == 0
    whole = json.loads(out.read_text())
    assert whole["winner"] == "b"
    for name in ("a", "b"):  # the resumed decide appended the rest
        held = log_episodes(tmp_path / f"{name}.episodes.jsonl")
        assert held == {e["index"]: e["return"] for e in whole[name]["episodes"]}


def test_a_suite_config_is_decided_over_its_tasks(tmp_path, capsys):
    tasks = {
        "short": {"env": CARTPOLE, "env_config": {"max_steps_in_episode": 30}},
        "long": CARTPOLE,
    }
    a, b = configs(tmp_path, tasks=tasks)
    out = tmp_path / "decision.json"
    argv = ["decide", a, b, "--bounds", "0", "500", "--no-progress"]
    assert main([*argv, "--output", str(out)]) == 0
    assert "a suite of 2 tasks (long, short)" in capsys.readouterr().out  # sorted
    decision = json.loads(out.read_text())
    assert decision["winner"] == "b"
    suite_b = jaxmesh.SuiteResult.from_dict(
        json.loads((tmp_path / "b.json").read_text())
    )
    n = decision["episodes"]
    ref = jaxmesh.evaluate(tilt_fn, CARTPOLE, num_envs=8, seeds=range(n))
    np.testing.assert_array_equal(suite_b.tasks["long"].returns, ref.returns)
    # an undecided suite decision goes on from its file
    part, again = tmp_path / "part.json", tmp_path / "again.json"
    assert main([*argv, "--max-episodes", "8", "--output", str(part)]) == 1
    assert main([*argv, "--resume", str(part), "--output", str(again)]) == 0
    capsys.readouterr()
    first, resumed = (json.loads(p.read_text()) for p in (part, again))
    assert (resumed["winner"], resumed["episodes"]) == ("b", n)
    assert resumed["decided_at"] == decision["decided_at"]
    for arm in ("a", "b"):
        for task in ("short", "long"):
            before = first[arm]["tasks"][task]["episodes"]
            assert resumed[arm]["tasks"][task]["episodes"][:8] == before
    # a task with its own budget is refused
    tasks["long"] = {"env": CARTPOLE, "episodes": 4}
    a, b = configs(tmp_path, tasks=tasks)
    assert main(argv) == 2
    assert "set a budget" in capsys.readouterr().err
