"""A resumed run's identity and its records: ``resume=`` / ``--resume`` merge
only episodes that the same policy (code, closed-over constants, params) scored
on the same env, read from records that were not edited.

References: an uninterrupted run of the same config (the claim under test is
"the same as without the interruption"), the files' own lines (which line holds
which episode, read from the text), and an exception's ``partial_result``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.cli.cache import CACHE_SWITCH_ENV

from .test_resume import Stop, StopAt

pytestmark = pytest.mark.usefixtures("no_compile_cache")

ENV = "gymnax:CartPole-v1"
POL_A = """import jax.numpy as jnp


def act(obs):
    return (obs[2] > {t}).astype(jnp.int32)
"""
POL_B = "import jax.numpy as jnp\n\n\ndef act(obs):\n    return jnp.int32(0)\n"


def single_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxmesh eval: error: "), lines[0]
    return lines[0]


def without_lane(path: Path) -> list[dict]:
    eps = json.loads(path.read_text())["episodes"]
    return [{k: v for k, v in e.items() if k not in ("lane", "check")} for e in eps]


@pytest.fixture
def policies(tmp_path, monkeypatch):
    """Modules ``pol_a`` (``act``: obs[2] > 0) and ``pol_b`` (``act``: always 0)
    in ``tmp_path``; ``edit(t)`` rewrites ``pol_a.act``'s threshold."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def write(name: str, text: str) -> None:
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)

    write("pol_a", POL_A.format(t="0"))
    write("pol_b", POL_B)
    return lambda t: write("pol_a", POL_A.format(t=t))


def config(tmp_path, **keys) -> Path:
    cfg = {
        "env": ENV,
        "policy": "pol_a:act",
        "episodes": 12,
        "num_envs": 4,
        "output": str(tmp_path / "r.json"),
        **keys,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def killed_log(tmp_path, capsys, done: int = 5) -> tuple[Path, str, list[dict]]:
    """A whole run of ``config``; its log then cut to its run line and ``done``
    episode lines (a run killed there). Returns the log, the whole log's text
    and the whole run's episodes."""
    cfg = config(tmp_path)
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    capsys.readouterr()
    log = tmp_path / "r.episodes.jsonl"
    text = log.read_text()
    log.write_text("\n".join(text.splitlines()[: 1 + done]) + "\n")
    return log, text, without_lane(tmp_path / "r.json")


def resume(cfg: Path, path: Path, *sets: str) -> list[str]:
    argv = ["eval", str(cfg), "--no-progress", "--resume", str(path)]
    for item in sets:
        argv += ["--set", item]
    return argv


# Identity: another policy of the same name, edited code, constants, env ---------
def test_another_function_of_the_same_name_and_edited_code_are_refused(
    tmp_path, capsys, policies
):
    log, _, whole = killed_log(tmp_path, capsys)
    cfg = config(tmp_path)
    before = log.read_text()
    # pol_b.act: the same name, another function.
    assert main(resume(cfg, log, "policy=pol_b:act")) == 2
    line = single_error_line(capsys.readouterr().err)
    assert f"--resume {log}: the earlier run's policy 'act' is not this call's" in line
    assert "another function or model of the same name" in line
    assert "start a new run" in line
    assert log.read_text() == before
    # pol_a.act edited between the interrupted run and its resume.
    policies("0.01")
    assert main(resume(cfg, log)) == 2
    assert "the earlier run's policy 'act'" in capsys.readouterr().err
    assert log.read_text() == before
    # The code as it was: the resume equals the uninterrupted run.
    policies("0")
    assert main(resume(cfg, log)) == 0
    assert without_lane(tmp_path / "r.json") == whole
    capsys.readouterr()


def closure_policy(w):
    def act(obs):
        return (obs @ w > 0).astype(jnp.int32)

    return act


def test_a_closed_over_constant_or_an_env_with_other_params_is_refused():
    w = jnp.array([0.0, 0.1, 1.0, 0.5])
    seeds = list(range(10))
    partial = None
    with pytest.raises(Stop) as e:
        jaxmesh.evaluate(
            closure_policy(w), ENV, num_envs=2, seeds=seeds, hooks=StopAt(2)
        )
    partial = e.value.partial_result
    # Same name, same shapes, another constant.
    other = closure_policy(w.at[0].set(0.5))
    with pytest.raises(ValueError, match="the earlier run's policy 'act' is not"):
        jaxmesh.evaluate(other, ENV, num_envs=2, seeds=seeds, resume=partial)
    # The same env id built with other params (its name is the same).
    short = jaxmesh.make_env(ENV, max_steps_in_episode=50)
    assert short.name == ENV
    with pytest.raises(ValueError, match="the earlier run's env 'gymnax:CartPole-v1'"):
        jaxmesh.evaluate(
            closure_policy(w), short, num_envs=2, seeds=seeds, resume=partial
        )
    # The same policy and env: resumes to the uninterrupted run.
    whole = jaxmesh.evaluate(closure_policy(w), ENV, num_envs=2, seeds=seeds)
    got = jaxmesh.evaluate(
        closure_policy(w), ENV, num_envs=3, seeds=seeds, resume=partial
    )
    np.testing.assert_array_equal(got.returns, whole.returns)
    np.testing.assert_array_equal(got.lengths, whole.lengths)


def test_a_complete_result_of_another_policy_of_the_same_name_is_refused():
    def act(obs):
        return (obs[2] > 0).astype(jnp.int32)

    whole = jaxmesh.evaluate(act, ENV, num_envs=2, episodes=4)
    done = jaxmesh.RunResult.from_dict(json.loads(json.dumps(whole.to_dict())))
    same = jaxmesh.evaluate(act, ENV, num_envs=2, episodes=4, resume=done)
    np.testing.assert_array_equal(same.returns, whole.returns)

    def act(obs):  # noqa: F811 - another function called act
        return jnp.int32(0)

    with pytest.raises(ValueError, match="the earlier run's policy 'act' is not"):
        jaxmesh.evaluate(act, ENV, num_envs=2, episodes=4, resume=done)


def test_a_result_without_an_identity_is_refused(tmp_path, capsys, policies):
    log, _, _ = killed_log(tmp_path, capsys)
    lines = log.read_text().splitlines()
    head = json.loads(lines[0])
    head["fingerprint"] = {"max_episode_steps": None, "params": None}
    old = [json.dumps(head)] + [
        json.dumps({"episode": {k: v for k, v in json.loads(x)["episode"].items()
                                if k != "check"}})
        for x in lines[1:]
    ]  # fmt: skip
    log.write_text("\n".join(old) + "\n")
    assert main(resume(config(tmp_path), log)) == 2
    line = single_error_line(capsys.readouterr().err)
    assert "records no identity of its policy and env" in line
    assert "start a new run" in line


def test_the_identity_costs_no_trace_of_the_policy_on_a_second_call():
    traces = []

    def act(obs):
        traces.append(1)
        return (obs[2] > 0).astype(jnp.int32)

    first = jaxmesh.evaluate(act, ENV, num_envs=2, episodes=2)
    n = len(traces)
    second = jaxmesh.evaluate(act, ENV, num_envs=2, episodes=3)
    assert len(traces) == n
    assert first.fingerprint["policy"] == second.fingerprint["policy"]


# Records: edited, duplicated ----------------------------------------------------
@pytest.mark.parametrize("field, value", [("return", 999.0), ("length", 3)])
def test_an_edited_record_in_the_log_is_refused_naming_episode_and_line(
    tmp_path, capsys, policies, field, value
):
    log, _, _ = killed_log(tmp_path, capsys)
    lines = log.read_text().splitlines()
    rec = json.loads(lines[3])  # line 4 of the file: episode 2
    assert rec["episode"]["index"] == 2
    rec["episode"][field] = value
    lines[3] = json.dumps(rec)
    log.write_text("\n".join(lines) + "\n")
    assert main(resume(config(tmp_path), log)) == 2
    line = single_error_line(capsys.readouterr().err)
    assert f"{log}:4: the record of episode 2 fails its checksum" in line


def test_an_edited_record_in_the_results_json_is_refused_naming_episode_and_line(
    tmp_path, capsys, policies
):
    cfg = config(tmp_path)
    assert main(["eval", str(cfg), "--no-progress", "--no-episode-log"]) == 0
    capsys.readouterr()
    whole = json.loads((tmp_path / "r.json").read_text())
    partial = json.loads(json.dumps(dict(whole, episodes=whole["episodes"][:5])))
    partial["episodes"][1]["return"] = 999.0
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(partial, indent=2))
    text = earlier.read_text().splitlines()
    at = 1 + next(
        n for n, x in enumerate(text) if x.strip() == '"index": 1,'
    )  # the line of the entry's "index"
    assert main(resume(cfg, earlier, "output=" + str(tmp_path / "r2.json"))) == 2
    line = single_error_line(capsys.readouterr().err)
    assert f"{earlier}:{at}: the record of episode 1 fails its checksum" in line
    # The same file unedited resumes to the whole run.
    partial["episodes"][1] = whole["episodes"][1]
    earlier.write_text(json.dumps(partial, indent=2))
    assert main(resume(cfg, earlier, "output=" + str(tmp_path / "r2.json"))) == 0
    assert without_lane(tmp_path / "r2.json") == without_lane(tmp_path / "r.json")
    capsys.readouterr()


def test_two_records_of_one_episode_that_disagree_are_refused(
    tmp_path, capsys, policies
):
    log, _, whole = killed_log(tmp_path, capsys)
    # Episode 3 of a run of the same policy and env on 3 lanes: a valid record
    # of the same run, that ran it on another lane.
    other = tmp_path / "other"
    other.mkdir()
    assert main(["eval", str(config(other, num_envs=3)), "--no-progress"]) == 0
    capsys.readouterr()
    other_lines = (other / "r.episodes.jsonl").read_text().splitlines()
    third = other_lines[4]
    assert json.loads(third)["episode"]["index"] == 3
    lines = log.read_text().splitlines()
    assert (
        json.loads(lines[4])["episode"]["lane"] != json.loads(third)["episode"]["lane"]
    )
    # The same record twice is taken once.
    log.write_text("\n".join(lines + [lines[4]]) + "\n")
    cfg = config(tmp_path)
    assert main(resume(cfg, log)) == 0
    assert without_lane(tmp_path / "r.json") == whole
    capsys.readouterr()
    # A record of the same episode with other fields is refused.
    log.write_text("\n".join(lines + [third]) + "\n")
    assert main(resume(cfg, log)) == 2
    line = single_error_line(capsys.readouterr().err)
    n = len(lines) + 1
    assert f"{log}:{n}: episode 3 is also on line 5 with other fields" in line


# What a failed run's log holds --------------------------------------------------
def test_a_failed_runs_log_holds_its_partial_result_and_its_totals(tmp_path):
    path = tmp_path / "run.jsonl"
    seeds = list(range(24))

    def act(obs):
        return (obs[2] > 0).astype(jnp.int32)

    with pytest.raises(Stop) as e:
        jaxmesh.evaluate(
            act,
            ENV,
            num_envs=8,
            seeds=seeds,
            hooks=[jaxmesh.EpisodeLog(path), StopAt(2)],
            layout=jaxmesh.Layout(segment_steps=32),
        )
    partial = e.value.partial_result
    # Episodes after 2 had finished too when the hook stopped the run.
    assert partial.indices.tolist()[:3] == [0, 1, 2]
    assert 3 < partial.num_episodes < len(seeds)
    loaded = jaxmesh.load_episode_log(path)
    assert loaded.indices.tolist() == partial.indices.tolist()
    np.testing.assert_array_equal(loaded.returns, partial.returns)
    # The log keeps the failed run's work: a resumed run adds to it.
    assert loaded.policy_rows == partial.policy_rows > 0
    assert loaded.env_steps == partial.env_steps
    got = jaxmesh.evaluate(act, ENV, num_envs=8, seeds=seeds, resume=loaded)
    whole = jaxmesh.evaluate(act, ENV, num_envs=8, seeds=seeds)
    np.testing.assert_array_equal(got.returns, whole.returns)
    assert got.policy_rows > partial.policy_rows
    # A log cut short (a run killed before it wrote its totals): the plans of
    # its episodes count, the lower bound of its rows.
    lines = path.read_text().splitlines()
    path.write_text("\n".join(x for x in lines if '"totals"' not in x) + "\n")
    cut = jaxmesh.load_episode_log(path)
    assert cut.policy_rows == int(partial.predict_calls.sum())
    assert cut.env_steps == int(partial.lengths.sum())


def test_jax_arrays_params_are_part_of_the_identity():
    params = {"w": jnp.array([0.0, 0.0, 1.0, 0.0])}

    def act(p, obs):
        return (obs @ p["w"] > 0).astype(jnp.int32)

    seeds = list(range(6))
    with pytest.raises(Stop) as e:
        jaxmesh.evaluate(
            act, ENV, num_envs=2, seeds=seeds, params=params, hooks=StopAt(1)
        )
    partial = e.value.partial_result
    other = jax.tree.map(lambda x: x + 0.5, params)
    with pytest.raises(ValueError, match="params"):
        jaxmesh.evaluate(
            act, ENV, num_envs=2, seeds=seeds, params=other, resume=partial
        )


def test_a_results_dict_with_one_episode_twice_alike_resumes_once():
    def act(obs):
        return (obs[2] > 0).astype(jnp.int32)

    seeds = list(range(6))
    whole = jaxmesh.evaluate(act, ENV, num_envs=2, seeds=seeds)
    d = json.loads(json.dumps(whole.to_dict()))
    d["episodes"] = d["episodes"][:3] + [d["episodes"][1]]  # episode 1 twice
    got = jaxmesh.evaluate(
        act, ENV, num_envs=2, seeds=seeds, resume=jaxmesh.RunResult.from_dict(d)
    )
    assert got.indices.tolist() == list(range(6))
    np.testing.assert_array_equal(got.returns, whole.returns)
    np.testing.assert_array_equal(got.lengths, whole.lengths)
    d["episodes"][3] = dict(d["episodes"][3], lane=1 - d["episodes"][3]["lane"])
    with pytest.raises(ValueError, match=r"episodes\[3\]: the record of episode 1"):
        jaxmesh.evaluate(
            act, ENV, num_envs=2, seeds=seeds, resume=jaxmesh.RunResult.from_dict(d)
        )


def test_a_gymnasium_run_of_another_policy_of_the_same_name_is_refused():
    env = "gymnasium:CartPole-v1"

    def act(obs):
        return (obs[2] > 0).astype(jnp.int32)

    seeds = list(range(6))
    with pytest.raises(Stop) as e:
        jaxmesh.evaluate(act, env, num_envs=2, seeds=seeds, hooks=StopAt(1))
    partial = e.value.partial_result
    whole = jaxmesh.evaluate(act, env, num_envs=2, seeds=seeds)
    got = jaxmesh.evaluate(act, env, num_envs=3, seeds=seeds, resume=partial)
    np.testing.assert_array_equal(got.returns, whole.returns)

    def act(obs):  # noqa: F811 - another function called act
        return jnp.int32(0)

    with pytest.raises(ValueError, match="the earlier run's policy 'act' is not"):
        jaxmesh.evaluate(act, env, num_envs=2, seeds=seeds, resume=partial)


def test_a_flax_model_resumes_in_another_process(tmp_path, capsys):
    """The digests do not depend on the process (no object address, no hash
    seed): a run killed in one process resumes in another."""
    cfg = config(
        tmp_path,
        policy="jaxmesh.zoo.cartpole:CartPoleMLP",
        policy_config={"checkpoint": None},
        episodes=6,
    )
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    capsys.readouterr()
    whole = without_lane(tmp_path / "r.json")
    log = tmp_path / "r.episodes.jsonl"
    log.write_text("\n".join(log.read_text().splitlines()[:3]) + "\n")
    env = {**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONHASHSEED": "123"}
    proc = subprocess.run(
        [sys.executable, "-m", "jaxmesh.cli", *resume(cfg, log)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert without_lane(tmp_path / "r.json") == whole
