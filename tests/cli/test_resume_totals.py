"""A resumed run's totals are an uninterrupted run's: its env steps count the
budget's episodes once (not the steps the stopped run spent on episodes it
never finished), and its rate is the resumed part's own steps over its own
run time. Checked as a user meets it: a run stopped mid-way (Ctrl-C, with its
episode log), then ``jaxmesh eval --resume`` of that log."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml
from cli_policies import tilt

import jaxmesh
from jaxmesh.cli import main

ENV = "gymnasium:CartPole-v1"
EPISODES = 24


class _CtrlC:
    """Ctrl-C after ``n`` episodes finished (the others in flight)."""

    def __init__(self, n: int):
        self.n = n

    def on_episode_end(self, ep) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


def _eval(*argv: str) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["eval", *argv, "--no-progress"]) == 0
    return out.getvalue()


def test_a_resumed_runs_totals_are_an_uninterrupted_runs(tmp_path):
    config = tmp_path / "run.yaml"
    keys = {"env": ENV, "policy": "cli_policies:tilt", "episodes": EPISODES}
    keys.update(num_envs=4, output=str(tmp_path / "whole.json"))
    config.write_text(yaml.safe_dump(keys))
    _eval(str(config), "--no-episode-log")
    whole = json.loads((tmp_path / "whole.json").read_text())
    lengths = {ep["index"]: ep["length"] for ep in whole["episodes"]}
    assert whole["totals"]["env_steps"] == sum(lengths.values())

    # The stopped run: its log's totals count the steps of the episodes in
    # flight when it stopped, which the resumed run runs again from the start.
    log = tmp_path / "stopped.episodes.jsonl"
    with pytest.raises(KeyboardInterrupt):
        jaxmesh.evaluate(
            tilt,
            ENV,
            episodes=EPISODES,
            num_envs=4,
            hooks=[_CtrlC(9), jaxmesh.EpisodeLog(log)],
        )
    records = [json.loads(line) for line in log.read_text().splitlines()]
    done = [r["episode"]["index"] for r in records if "episode" in r]
    (stopped,) = [r["totals"] for r in records if "totals" in r]
    assert 9 <= len(done) < EPISODES
    assert stopped["env_steps"] > sum(lengths[i] for i in done)

    out = tmp_path / "resumed.json"
    text = _eval(str(config), "--set", f"output={out}", "--resume", str(log))

    totals = json.loads(out.read_text())["totals"]
    assert totals["env_steps"] == whole["totals"]["env_steps"]
    assert f"env steps                   {totals['env_steps']:,}\n" in text
    missing = sorted(set(range(EPISODES)) - set(done))
    part = totals["resumed_part"]
    assert part["episodes"] == len(missing)
    assert part["env_steps"] == sum(lengths[i] for i in missing)
    assert part["run_time"] > 0
    rate = part["env_steps"] / part["run_time"]
    assert totals["steps_per_second"] == pytest.approx(rate)
    # Read back, the result keeps the part and its rate.
    again = jaxmesh.RunResult.from_dict(json.loads(out.read_text()))
    assert again.resumed_part == part
    assert again.steps_per_second == pytest.approx(rate)
