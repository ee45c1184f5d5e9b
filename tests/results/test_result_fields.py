"""``RunResult`` and ``SuiteResult`` hold declared fields only.

A result read from a file keeps what ``resume=`` needs (its ``recorded``
index, its record issues, its file and each episode entry's line) in declared
fields, set when it is built; setting any other attribute raises. The values
checked here are written out by hand or come from the plain gymnasium loop of
``gym_reference`` (written from the contract), never from the code under test.
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
from gym_reference import ID, lean, per_step, plain_loop

import jaxmesh
from jaxmesh.results.result import RunResult
from jaxmesh.run.resume import checked_records, load_results
from jaxmesh.suite import SuiteResult

SEEDS = [3, 1, 4, 15, 9, 2, 6]


def small_result() -> RunResult:
    """Two episodes, written out by hand."""
    return RunResult(
        indices=np.array([0, 1]),
        seeds=np.array([5, 6]),
        returns=np.array([1.0, 2.0], np.float32),
        lengths=np.array([1, 2]),
        terminated=np.array([True, True]),
        truncated=np.array([False, False]),
        predict_calls=np.array([1, 2]),
        lanes=np.array([0, 0]),
        env_steps=3,
        policy_rows=3,
        wall_time=1.0,
        compile_time=0.5,
        run_time=0.5,
        num_envs=1,
        horizon=1,
        effective_horizon=1,
        prefetch_lead=0,
    )


def test_setting_an_undeclared_attribute_raises():
    r = small_result()
    for name in ("_recorded_meta", "_source", "_record_lines", "_record_issues"):
        assert name in RunResult.__dataclass_fields__
    with pytest.raises(AttributeError):
        r.recorded_meta = [{"episode": 0}]
    with pytest.raises(AttributeError):
        r._made_up = 1
    assert not hasattr(r, "__dict__")
    # Declared fields are frozen: a changed result is a new one.
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.fingerprint = {"env": "x"}
    r = dataclasses.replace(r, fingerprint={"env": "x"})
    assert r.fingerprint == {"env": "x"}
    suite = SuiteResult(tasks={"a": r})
    with pytest.raises(AttributeError):
        suite.table_text = "x"


def test_a_recorded_resumed_run_round_trips_what_its_file_held(tmp_path):
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    kw = dict(num_envs=2, seeds=SEEDS)  # resume= takes no record=
    record = jaxmesh.Record(episodes=[1])
    whole = jaxmesh.evaluate(lean, f"gymnasium:{ID}", record=record, **kw)
    lengths = [r.length for r in refs]
    assert whole.lengths.tolist() == lengths
    # The record's index, as the plain loop gives it: episode 1, seed 1,
    # played to its end (nothing cut).
    recorded = [
        {
            "episode": 1,
            "seed": 1,
            "length": lengths[1],
            "steps": lengths[1],
            "cut": False,
        }
    ]
    d = whole.to_dict()
    assert d["recorded"] == recorded
    # A results file with episode 4's entry written twice, the same.
    d["episodes"].insert(5, dict(d["episodes"][4]))
    path = tmp_path / "results.json"
    path.write_text(json.dumps(d, indent=1))
    # Each entry's line in that file: where its "index" key is.
    text = path.read_text().splitlines()
    lines = [k + 1 for k, t in enumerate(text) if t.strip().startswith('"index"')]
    assert len(lines) == 8

    loaded = load_results(path)
    assert loaded.trajectories is None
    assert loaded._source == str(path)
    assert loaded._record_lines == lines
    assert loaded.record_issues == [(5, 4, "same")]
    assert loaded._recorded_meta == recorded
    back = RunResult.from_dict(json.loads(json.dumps(loaded.to_dict())))
    assert back.to_dict()["recorded"] == recorded
    assert back.to_dict()["episodes"] == d["episodes"]

    # The repeat dropped: the file and the record's index stay, the issues
    # and lines (of the entries before) go.
    kept = checked_records(loaded)
    assert kept.indices.tolist() == list(range(len(SEEDS)))
    assert kept._source == str(path)
    assert kept._recorded_meta == recorded
    assert kept.record_issues == [] and kept._record_lines is None
    assert kept.to_dict()["recorded"] == recorded
    assert kept.to_dict()["episodes"] == whole.to_dict()["episodes"]

    # Resuming from it runs nothing and gives the plain loop's episodes.
    again = jaxmesh.evaluate(lean, f"gymnasium:{ID}", resume=loaded, **kw)
    assert again.lengths.tolist() == lengths
    assert again.returns.tolist() == [float(r.ret) for r in refs]

    # An entry edited by hand is named by its file line.
    d["episodes"][2]["return"] += 1.0
    path.write_text(json.dumps(d, indent=1))
    with pytest.raises(ValueError, match=f"{path}:{lines[2]}: the record of episode 2"):
        jaxmesh.evaluate(lean, f"gymnasium:{ID}", resume=load_results(path), **kw)
