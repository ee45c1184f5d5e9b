"""The ``jaxmesh`` command line, run in-process (and in subprocesses for the
compilation cache and served envs), against a plain Python loop over gymnax's own
functions or a plain gymnasium loop."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import gymnax
import jax
import numpy as np
import pytest
import yaml
from cli_policies import tilt_fn
from gym_reference import tilt_episodes

import jaxmesh
from jaxmesh.cache import CACHE_DIR_ENV, default_cache_dir
from jaxmesh.cli import main
from jaxmesh.cli.build import run_config
from jaxmesh.cli.cache import CACHE_SWITCH_ENV, compile_cache_wanted
from jaxmesh.cli.checks import check_run_config
from jaxmesh.zoo import cartpole

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole.yaml"
SERVED_CONFIG = ROOT / "configs" / "cartpole_served.yaml"
EPISODE_KEYS = {
    "index",
    "seed",
    "return",
    "length",
    "terminated",
    "truncated",
    "predict_calls",
    "lane",
    "check",  # the record's checksum (docs/evaluation.md)
}


def reference_returns(params, seeds):
    """Returns and lengths of the MLP with ``params``, one episode at a time."""
    return reference_episodes(lambda obs: cartpole.apply(params, obs), seeds)


def reference_episodes(act, seeds):
    """Returns and lengths from gymnax's own reset_env / step_env, one by one."""
    env, env_params = gymnax.make("CartPole-v1")

    @jax.jit
    def one_step(key, t, state, obs):
        step_key = jax.random.fold_in(jax.random.fold_in(key, 0), t)
        action = act(obs)
        obs, state, reward, done, _ = env.step_env(step_key, state, action, env_params)
        return obs, state, reward, done, env.is_truncated(state, env_params)

    out = []
    for seed in seeds:
        key = jax.random.PRNGKey(seed)
        obs, state = env.reset_env(key, env_params)
        total, t, done, truncated = 0.0, 0, False, False
        while not (done or truncated):
            obs, state, reward, done, truncated = one_step(key, t, state, obs)
            done, truncated = bool(done), bool(truncated)
            total += float(reward)
            t += 1
        out.append((total, t))
    return out


def run_eval(tmp_path, *extra):
    out = tmp_path / "r.json"
    argv = ["eval", str(CONFIG), "--set", "episodes=20", "--set", "num_envs=8"]
    argv += ["--set", f"output={out}", *extra]
    return main(argv), out


def test_eval_shipped_config(tmp_path, capsys):
    code, out = run_eval(tmp_path)
    captured = capsys.readouterr()
    assert code == 0
    assert str(out) in captured.out
    assert "mean return" in captured.out
    assert "20/20" in captured.err  # the progress bar reached the budget
    data = json.loads(out.read_text())
    assert {"policy", "env", "settings", "totals", "episodes"} <= set(data)
    assert data["env"] == "gymnax:CartPole-v1"
    assert data["settings"]["num_envs"] == 8
    assert data["totals"]["episodes"] == 20
    assert len(data["episodes"]) == 20
    assert all(set(ep) == EPISODE_KEYS for ep in data["episodes"])
    assert [ep["seed"] for ep in data["episodes"]] == list(range(20))
    assert data["totals"]["mean_return"] >= 495.0

    params = jaxmesh.load_params(cartpole.DEFAULT_PATH)
    for seed, (ret, length) in zip(
        (0, 7), reference_returns(params, (0, 7)), strict=True
    ):
        assert data["episodes"][seed]["return"] == ret
        assert data["episodes"][seed]["length"] == length


def test_eval_checkpoint_override_matches_reference(tmp_path):
    # A fresh (untrained) MLP: short episodes (tens of steps) of varied length,
    # so that returns differ from seed to seed. Short, because in long failing
    # episodes the jitted and the vmapped CartPole physics round differently and
    # the trajectories drift apart, an honest float difference, not a bug.
    params = cartpole.init(jax.random.PRNGKey(3))
    jaxmesh.save_params(tmp_path / "fresh", params)
    code, out = run_eval(
        tmp_path,
        "--set",
        f"policy_config.checkpoint={tmp_path / 'fresh'}",
        "--no-progress",
    )
    assert code == 0
    episodes = json.loads(out.read_text())["episodes"]
    reference = reference_returns(params, range(20))
    assert len({length for _, length in reference}) > 5  # varied episodes
    got = [(ep["return"], ep["length"]) for ep in episodes]
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize(
    "override, message",
    [
        ("bogus=1", "unknown config key(s) ['bogus']"),
        ("episodes=-3", "episodes=-3"),
        ("episodes", "expected KEY=VALUE"),
        ("episodes.x=1", "not a mapping"),
    ],
)
def test_bad_set_exits_2(tmp_path, capsys, override, message):
    assert main(["eval", str(CONFIG), "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err
    if override == "bogus=1":
        assert "policy_config" in err and "num_envs" in err  # the allowed keys


def test_missing_config_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["eval", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and "not found" in err


@pytest.mark.parametrize("command", ["eval", "explain"])
def test_a_config_that_is_not_utf8_exits_2(tmp_path, capsys, command):
    config = tmp_path / "latin1.yaml"
    config.write_bytes(
        "env: gymnax:CartPole-v1\npolicy: caf\u00e9:x\n".encode("latin-1")
    )
    assert main([command, str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"jaxmesh {command}: error: config file ")
    assert "latin1.yaml" in err and "is not UTF-8" in err and "byte 0xe9" in err


def test_missing_checkpoint_exits_2(tmp_path, capsys):
    bad = tmp_path / "no_ckpt"
    code = main(["eval", str(CONFIG), "--set", f"policy_config.checkpoint={bad}"])
    assert code == 2
    assert "no_ckpt" in capsys.readouterr().err


def test_describe_prints_the_models_envelope(capsys):
    assert main(["describe", "jaxmesh.zoo.cartpole:CartPoleMLP"]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["schema_version"] == 1
    assert envelope["name"] == "CartPoleMLP"
    assert envelope["corners"] == ["predict"]
    assert envelope["native_chunk"] is None
    assert "checkpoint" in envelope["params"]


def test_describe_bad_target_exits_2(capsys):
    assert main(["describe", "jaxmesh.zoo.cartpole:NoSuchModel"]) == 2
    assert "NoSuchModel" in capsys.readouterr().err


# Helpers for the tests below --------------------------------------------------
def write_config(tmp_path, **keys):
    """A run config with a small CartPole budget, ``keys`` replacing defaults."""
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


def single_error_line(err: str) -> str:
    """The one line of a refusal on stderr (fails on anything more)."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxmesh eval: error: "), lines[0]
    return lines[0]


# A module-level Model instance as policy ---------------------------------------
def test_eval_model_instance_matches_reference(earlier_run):
    # write_config's run (12 episodes, --telemetry): the resume tests' too.
    _, episodes, out = earlier_run()
    assert "tilt" in out
    # A JAX env's run happens inside one compiled program: no per-call timings.
    lines = out.splitlines()
    end = next(i for i, x in enumerate(lines) if x.startswith("run time"))
    after_summary = lines[1 + end]  # the summary's last row is the run time
    assert after_summary == "no telemetry (recorded for host-stepped envs only)"
    reference = reference_episodes(tilt_fn, range(12))
    assert len({length for _, length in reference}) > 2  # varied episodes
    got = [(ep["return"], ep["length"]) for ep in episodes]
    np.testing.assert_array_equal(got, reference)


def test_model_instance_takes_no_policy_config(tmp_path, capsys):
    config = write_config(tmp_path, policy_config={"checkpoint": "x"})
    assert main(["eval", str(config)]) == 2
    line = single_error_line(capsys.readouterr().err)
    assert "cli_policies:tilt" in line and "takes no policy_config" in line


def test_a_function_given_policy_config_builds_the_policy(tmp_path, capsys):
    config = write_config(
        tmp_path, policy="cli_policies:make_lean", policy_config={"index": 2}
    )
    assert main(["eval", str(config), "--no-progress"]) == 0
    episodes = json.loads((tmp_path / "r.json").read_text())["episodes"]
    got = [(ep["return"], ep["length"]) for ep in episodes]
    np.testing.assert_array_equal(got, reference_episodes(tilt_fn, range(6)))
    capsys.readouterr()
    for target, cfg, words in (
        ("cli_policies:make_nothing", {"index": 2}, "returned a int, not a policy"),
        ("cli_policies:tilt_fn", {"index": 2}, "cannot build policy"),
    ):
        config = write_config(tmp_path, policy=target, policy_config=cfg)
        assert main(["eval", str(config)]) == 2
        line = single_error_line(capsys.readouterr().err)
        assert target in line and words in line


def test_a_served_policy_that_cannot_be_reached_is_one_line(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_config(
        tmp_path,
        policy="jaxmesh:RemotePolicy",
        policy_config={"address": f"ws://127.0.0.1:{port}", "connect_timeout": 2},
    )
    assert main(["eval", str(config)]) == 2
    line = single_error_line(capsys.readouterr().err)
    assert f"ws://127.0.0.1:{port} cannot be reached" in line


# Bad input: one line, status 2, nothing compiled --------------------------------
@pytest.mark.parametrize(
    "base, overrides, env, message",
    [
        # seeds against the shipped config's episodes: 1000
        (CONFIG, ["seeds=[1, 2]"], {}, "episodes=1000 disagrees with len(seeds)=2"),
        (None, ["seeds=[3, -1]", "episodes=null"], {}, "seeds must lie in [0,"),
        (
            None,
            ["policy=cli_policies:chunked", "horizon=8"],
            {},
            "horizon=8 exceeds policy 'chunked''s native_chunk=4",
        ),
        (
            None,
            ["policy=cli_policies:stacked", "num_envs=8"],
            {"JAXMESH_FRAME_HISTORY_LIMIT_BYTES": "100"},
            "over the limit of 100 B",
        ),
        (None, ["policy=cli_policies:three_args"], {}, "'three_args' takes 3"),
        (None, ["env=gymnax:CartPol-v1"], {}, "unknown gymnax env 'CartPol-v1'"),
        (None, ["env_config.bogus=1"], {}, "env_config {'bogus': 1}"),
        (None, ["env_config=5"], {}, "env_config=5: expected a mapping"),
        (None, ["policy=cli_policies:nope"], {}, "has no attribute 'nope'"),
        # Served and host-stepped envs: refused before anything connects.
        (
            None,
            ["env=grpc://127.0.0.1"],
            {},
            "env='grpc://127.0.0.1': address 'grpc://127.0.0.1' is not "
            "'grpc://host:port'",
        ),
        (None, ["env=grpc://:5555"], {}, "is not 'grpc://host:port'"),
        (None, ["env=grpc://127.0.0.1:70000"], {}, "port in 1..65535"),
        (None, ["env=grpc:127.0.0.1:5555"], {}, "address is 'grpc://host:port'"),
        (
            None,
            ["env=[grpc://127.0.0.1:5555, grpc://127.0.0.1:x]"],
            {},
            "'grpc://127.0.0.1:x' is not 'grpc://host:port'",
        ),
        (
            None,
            ["env=[grpc://127.0.0.1:5555, gymnasium:CartPole-v1]"],
            {},
            "['gymnasium:CartPole-v1'] are not",
        ),
        (
            None,
            ["env=[grpc://127.0.0.1:5555, grpc://127.0.0.1:5555]"],
            {},
            "more than once",
        ),
        (None, ["env=[]"], {}, "env=[]: expected an env id"),
        (
            None,
            ["env=gymnasium:CartPol-v1"],
            {},
            "unknown gymnasium env 'CartPol-v1'",
        ),
        (
            None,
            ["env=gymnasium:gymnax:CartPole-v1"],
            {},
            "'gymnax' is not a module that registers gymnasium envs",
        ),
        (
            None,
            ["env=gymnasium:CartPole-v1", "env_config.render_mode=human"],
            {},
            "env_config only applies to gymnax: and brax: ids",
        ),
        (None, ["max_episode_seconds=0"], {}, "max_episode_seconds=0: expected"),
        (None, ["max_episode_seconds=2"], {}, "cap them with max_episode_steps"),
        (
            None,
            ["token=1234"],
            {},
            "token: expected a non-empty string, got a value of type int",
        ),
        (None, ["token=abc"], {}, "a token is for served envs"),
    ],
    ids=[
        "seeds-vs-episodes",
        "negative-seed",
        "horizon-over-native-chunk",
        "frame-limit",
        "policy-arity",
        "unknown-env",
        "bad-env-config-key",
        "env-config-not-mapping",
        "unknown-policy",
        "address-without-port",
        "address-without-host",
        "address-port-out-of-range",
        "address-without-slashes",
        "address-list-one-malformed",
        "address-list-with-an-id",
        "address-list-twice",
        "address-list-empty",
        "unknown-gymnasium-env",
        "gymnasium-id-with-a-jaxmesh-prefix",
        "gymnasium-env-config",
        "seconds-not-positive",
        "seconds-on-a-jax-env",
        "token-not-a-string",
        "token-on-a-jax-env",
    ],
)
def test_bad_input_is_one_line_exit_2(
    no_compile, tmp_path, capsys, monkeypatch, base, overrides, env, message
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = base or write_config(tmp_path)
    argv = ["eval", str(config), "--no-progress"]
    for item in overrides:
        argv += ["--set", item]
    code = main(argv)  # the no_compile fixture: refused before anything compiled
    assert code == 2
    line = single_error_line(capsys.readouterr().err)
    assert message in line


def test_bad_input_in_a_real_process_prints_one_line():
    env = {**os.environ, CACHE_SWITCH_ENV: "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "jaxmesh.cli", "eval", str(CONFIG)]
        + ["--set", "seeds=[1, 2]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "disagrees with len(seeds)=2" in single_error_line(proc.stderr)


def test_error_while_running_keeps_its_traceback(tmp_path):
    # The policy passes every check; the ValueError comes after episodes ran,
    # so it is a failure of the run, not bad input: main must not swallow it.
    config = write_config(tmp_path, policy="cli_policies:FailsAtRunTime")
    with pytest.raises(ValueError, match="failure while running, after episode 0"):
        main(["eval", str(config), "--no-progress"])


def test_bad_compile_cache_switch_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "maybe")
    assert main(["eval", str(write_config(tmp_path))]) == 2
    line = single_error_line(capsys.readouterr().err)
    assert "JAXMESH_COMPILE_CACHE='maybe'" in line


# Episode logs and --resume ------------------------------------------------------
def episodes_of(path: Path) -> list[dict]:
    """A result JSON's episodes, less the lane each ran on (a resumed run deals
    its episodes to lanes of its own; nothing else may differ) and the checksum
    (which covers the lane)."""
    eps = json.loads(path.read_text())["episodes"]
    return [{k: v for k, v in ep.items() if k not in ("lane", "check")} for ep in eps]


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    """``earlier_run(env)``: the episode log (its text), the episodes and the
    stdout of one uninterrupted run of ``write_config(env=env, episodes=12)``
    with ``--telemetry``.

    Run once per env: the resume tests copy its log into folders of their own
    (a log's lines name the run: policy, env, seeds, caps; not its folder), and
    test_eval_model_instance_matches_reference reads its episodes and output.
    """
    runs = {}

    def run(env="gymnax:CartPole-v1"):
        if env not in runs:
            folder = tmp_path_factory.mktemp("earlier")
            with pytest.MonkeyPatch.context() as mp:  # as ``_no_compile_cache``
                mp.setenv(CACHE_SWITCH_ENV, "0")
                config = write_config(folder, env=env, episodes=12)
                argv = ["eval", str(config), "--no-progress", "--telemetry"]
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    assert main(argv) == 0
            log = folder / "r.episodes.jsonl"  # next to the output JSON by default
            runs[env] = log.read_text(), episodes_of(folder / "r.json"), out.getvalue()
        return runs[env]

    return run


@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "gymnasium:CartPole-v1"])
def test_a_killed_run_resumed_from_its_episode_log_equals_an_uninterrupted_one(
    tmp_path, capsys, earlier_run, env
):
    text, whole, _ = earlier_run(env)
    config = write_config(tmp_path, env=env, episodes=12)
    log = tmp_path / "r.episodes.jsonl"
    lines = text.splitlines()
    # The run line, 12 episode lines, the totals line.
    assert len(lines) == 1 + 12 + 1 and '"jaxmesh_episode_log"' in lines[0]
    # A run killed after 4 episodes, while writing the fifth line.
    log.write_text("\n".join(lines[:5]) + '\n{"episode": {"index": 4, "se')
    argv = ["eval", str(config), "--no-progress", "--resume", str(log)]
    assert main(argv) == 0
    assert episodes_of(tmp_path / "r.json") == whole
    # The log was appended to: it holds the whole budget again.
    full = jaxmesh.load_episode_log(log)
    assert full.indices.tolist() == list(range(12))
    capsys.readouterr()


def test_resume_from_a_result_json_and_no_episode_log(tmp_path, capsys):
    config = write_config(tmp_path, episodes=8)
    assert main(["eval", str(config), "--no-progress", "--no-episode-log"]) == 0
    assert not (tmp_path / "r.episodes.jsonl").exists()
    whole = json.loads((tmp_path / "r.json").read_text())
    assert whole["fingerprint"]["max_episode_steps"] is None
    partial = dict(whole, episodes=whole["episodes"][:3])
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(partial))
    log = tmp_path / "resumed.jsonl"
    argv = ["eval", str(config), "--no-progress", "--resume", str(earlier)]
    assert main(argv + ["--episode-log", str(log)]) == 0
    skip = ("lane", "check")  # as episodes_of
    want = [{k: v for k, v in ep.items() if k not in skip} for ep in whole["episodes"]]
    assert episodes_of(tmp_path / "r.json") == want
    # The log holds the episodes run now: those the earlier result lacked.
    assert jaxmesh.load_episode_log(log).indices.tolist() == list(range(3, 8))
    capsys.readouterr()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env=gymnasium:CartPole-v1"], "the earlier run had env 'gymnax:CartPole-v1'"),
        (["max_episode_steps=30"], "the earlier run had max_episode_steps None"),
        (
            ["seeds=[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]", "episodes=null"],
            "seed for episode 0",
        ),
        (["policy=cli_policies:chunked"], "the earlier run had policy"),
    ],
    ids=["env", "max-episode-steps", "seeds", "policy"],
)
@pytest.mark.parametrize("complete", [False, True], ids=["partial", "complete"])
def test_a_resume_file_of_another_run_is_one_line_exit_2(
    tmp_path, capsys, earlier_run, overrides, message, complete
):
    text = earlier_run()[0]
    config = write_config(tmp_path, episodes=12)  # the earlier run's config
    log = tmp_path / "r.episodes.jsonl"
    if complete:
        log.write_text(text)
    else:
        log.write_text("\n".join(text.splitlines()[:3]) + "\n")
    before = log.read_text()
    capsys.readouterr()
    argv = ["eval", str(config), "--no-progress", "--resume", str(log)]
    for item in overrides:
        argv += ["--set", item]
    assert main(argv) == 2
    line = single_error_line(capsys.readouterr().err)
    assert f"--resume {log}: " in line and message in line
    assert log.read_text() == before  # a refused run leaves the log as it was


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json at all\n", "neither an episode log"),
        ('{"episodes": []}\n', "the result dict lacks"),
    ],
)
def test_a_resume_file_that_is_no_run_is_one_line_exit_2(
    tmp_path, capsys, content, message
):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    config = write_config(tmp_path)
    assert main(["eval", str(config), "--resume", str(bad)]) == 2
    assert message in single_error_line(capsys.readouterr().err)
    assert main(["eval", str(config), "--resume", str(tmp_path / "none")]) == 2
    assert "not found" in single_error_line(capsys.readouterr().err)


def test_a_new_run_starts_its_episode_log_afresh(tmp_path, capsys, earlier_run):
    # The log of an earlier run of this very config, then the same run again.
    config = write_config(tmp_path, episodes=12)
    (tmp_path / "r.episodes.jsonl").write_text(earlier_run()[0])
    capsys.readouterr()
    assert main(["eval", str(config), "--no-progress"]) == 0
    assert "starting the episode log" in capsys.readouterr().err
    log = (tmp_path / "r.episodes.jsonl").read_text().splitlines()
    assert len(log) == 1 + 12 + 1  # the run line, the episodes, the totals


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["on_server_loss=retry"], "on_server_loss='retry': expected 'rerun'"),
        (["on_server_loss=raise"], "on_server_loss='raise': on_server_loss is for"),
        (["check_seeds=3"], "check_seeds=3: expected true or false"),
    ],
)
def test_on_server_loss_and_check_seeds_keys(tmp_path, capsys, overrides, message):
    argv = ["eval", str(write_config(tmp_path)), "--no-progress"]
    for item in overrides:
        argv += ["--set", item]
    assert main(argv) == 2
    assert message in single_error_line(capsys.readouterr().err)


def test_on_server_loss_reaches_evaluate():
    config = check_run_config(
        {"env": "grpc://127.0.0.1:5555", "policy": "a:b", "on_server_loss": "raise"}
    )
    assert run_config(config).served.on_server_loss == "raise"


def test_check_seeds_key_refuses_a_seedless_env(tmp_path, capsys):
    config = write_config(
        tmp_path, env="gymnasium:jaxmesh-test/IgnoresSeed-v0", check_seeds=True
    )
    from run import test_check_env  # noqa: F401  (registers the env)

    assert main(["eval", str(config), "--no-progress"]) == 2
    line = single_error_line(capsys.readouterr().err)
    assert "check_seeds=True: env gymnasium:jaxmesh-test/IgnoresSeed-v0 is not" in line


# explain ------------------------------------------------------------------------
def test_explain_prints_reads_and_bytes_and_compiles_nothing(
    tmp_path, capsys, no_compile
):
    config = write_config(tmp_path, policy="cli_policies:stacked")
    code = main(["explain", str(config), "--set", "num_envs=8"])
    assert code == 0
    out = capsys.readouterr().out
    # By hand: a CartPole observation is 4 float32 (16 B); stack=4 holds 64 B
    # per lane, 512 B for 8 lanes.
    assert "stacked on gymnax:CartPole-v1, 8 lane(s)" in out
    assert "64 B per lane; 512 B for 8 lane(s)" in out
    assert not (tmp_path / "r.json").exists()  # explain runs nothing


def test_explain_bad_env_exits_2(tmp_path, capsys):
    config = write_config(tmp_path, env="brax:no_such_env")
    assert main(["explain", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxmesh explain: error: ") and "no_such_env" in err
    assert "Traceback" not in err


def test_explain_reads_a_gymnasium_envs_spaces(tmp_path, capsys, no_compile):
    config = write_config(
        tmp_path, env="gymnasium:CartPole-v1", policy="cli_policies:stacked"
    )
    assert main(["explain", str(config), "--set", "num_envs=8"]) == 0
    out = capsys.readouterr().out
    # By hand: gymnasium's CartPole observation is 4 float32 too.
    assert "stacked on gymnasium:CartPole-v1, 8 lane(s)" in out
    assert "64 B per lane; 512 B for 8 lane(s)" in out


# Served envs ----------------------------------------------------------------------
@contextlib.contextmanager
def serve_env_process(env_id: str, lanes: int):
    """A real ``jaxmesh serve-env`` child; yields its address once it serves.

    Readiness: the child writes its address to the pipe given as ``--ready-fd``
    once it accepts calls (no sleep, no polling). The child is stopped at the
    end (SIGTERM, then killed if it lingers).
    """
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmesh.cli", "serve-env", env_id]
        + ["--lanes", str(lanes), "--ready-fd", str(write)],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    os.close(write)
    try:
        with os.fdopen(read, "rb") as ready:
            line = ready.readline().decode()
        if not line.endswith("\n"):  # the child ended before serving
            proc.kill()
            raise AssertionError(f"serve-env never served: {proc.communicate()[1]}")
        yield line.strip()
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def cli_env() -> dict[str, str]:
    """The environment of a ``jaxmesh`` subprocess: cli_policies importable."""
    path = os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p
    )
    return {**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONPATH": path}


def returns_and_lengths(path: Path) -> list[tuple[float, int]]:
    return [
        (ep["return"], ep["length"]) for ep in json.loads(path.read_text())["episodes"]
    ]


def test_eval_served_env_in_a_real_process(tmp_path, capsys):
    seeds = [3, 1, 4, 15, 9, 2, 6, 5]
    reference = tilt_episodes(seeds)
    assert len({length for _, length in reference}) > 3  # varied episodes
    served_json, here_json = tmp_path / "served.json", tmp_path / "here.json"
    with serve_env_process("gymnasium:CartPole-v1", lanes=3) as address:
        config = write_config(
            tmp_path,
            env=f"grpc://{address}",
            seeds=seeds,
            episodes=None,
            num_envs=4,  # the server has 3 lanes: the run uses 3
            output=str(served_json),
        )
        # The served env is the real process here; eval runs in this one (as
        # ``python -m jaxmesh.cli eval`` does in test_second_process_...).
        capsys.readouterr()
        assert main(["eval", str(config), "--no-progress", "--telemetry"]) == 0
        evaluated = capsys.readouterr().out
        # explain asks the server for its spaces (a handshake, no session).
        explain = ["explain", str(config), "--set", "policy=cli_policies:stacked"]
        assert main(explain) == 0
        explained = capsys.readouterr().out
        # The shipped served config, pointed at this server (64 lanes asked).
        shipped = ["explain", str(SERVED_CONFIG), "--set", f"env=grpc://{address}"]
        assert main(shipped) == 0
        shipped = capsys.readouterr().out
    assert "CartPoleMLP on gymnasium:CartPole-v1, 3 lane(s)" in shipped
    # By hand: 3 lanes served (num_envs=4 asks for more), 4 float32 x stack 4.
    assert "stacked on gymnasium:CartPole-v1, 3 lane(s)" in explained
    assert "64 B per lane; 192 B for 3 lane(s)" in explained
    lines = evaluated.splitlines()
    assert ["env", "gymnasium:CartPole-v1"] in [line.split() for line in lines]
    # The telemetry table follows the summary: a header, then one row per series.
    end = next(i for i, line in enumerate(lines) if line.startswith("run time"))
    assert lines[end + 1].split() == ["series", "count", "mean", "p50", "p95", "p99"]
    rows = {line.split()[0] for line in lines[end + 2 :]}
    assert {"predict", "env_step", "encode", "decode", "wire"} <= rows
    served = json.loads(served_json.read_text())
    assert served["settings"]["num_envs"] == 3
    assert served["telemetry"]["request_bytes"]["count"] > 0

    # The same config, stepped in this process, on the 3 lanes the server gave.
    here = ["eval", str(config), "--set", "env=gymnasium:CartPole-v1"]
    here += ["--set", "num_envs=3"]
    assert main([*here, "--set", f"output={here_json}", "--no-progress"]) == 0
    capsys.readouterr()
    assert (
        served["totals"]["mean_return"]
        == json.loads(here_json.read_text())["totals"]["mean_return"]
    )
    assert returns_and_lengths(served_json) == reference
    assert returns_and_lengths(here_json) == reference


def serve_env_error(*args: str) -> tuple[int, str]:
    """``jaxmesh serve-env ARGS`` in a child that should refuse; its status and
    stderr (everything written to fd 2, gRPC's own log included)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxmesh.cli", "serve-env", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert not proc.stdout, proc.stdout
    return proc.returncode, proc.stderr


def test_serve_env_on_a_port_in_use_prints_one_line():
    # A listening socket holds the port for the whole test: the bind must fail.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, err = serve_env_error("CartPole-v1", "--address", f"127.0.0.1:{port}")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err  # jaxmesh's line only, no gRPC log before it
    assert lines[0].startswith("jaxmesh serve-env: error: cannot serve ")
    assert f"127.0.0.1:{port}" in lines[0] and "is the port in use?" in lines[0]


@pytest.mark.parametrize(
    "env, message",
    [
        # gymnasium would read "gymnax:" as a module to import and serve its own
        # CartPole-v1: refused, not served.
        ("gymnax:CartPole-v1", "gymnax: envs are JAX envs"),
        ("brax:fast", "brax: envs are JAX envs"),
        ("grpc://127.0.0.1:5555", "is a served env's address"),
        ("my_pkg:MyEnv-v0", "gymnasium:my_pkg:MyEnv-v0"),
        ("gymnasium:gymnax:CartPole-v1", "'gymnax' is not a module"),
        ("gymnasium:", "expected gymnasium:<id>"),
    ],
    ids=["gymnax", "brax", "address", "module-without-prefix", "inner-gymnax", "empty"],
)
def test_serve_env_refuses_what_is_not_a_gymnasium_id(
    capsys, monkeypatch, env, message
):
    from jaxmesh.remote import server

    class NoServer:
        def __init__(self, env, *args, **kwargs):
            raise AssertionError(f"serve-env went on to serve {env!r}")

    monkeypatch.setattr(server, "EnvServer", NoServer)
    assert main(["serve-env", env]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("jaxmesh serve-env: error: ")
    assert message in err
    assert "gymnasium:<id>" in err  # says what it accepts


def test_eval_over_two_servers_matches_a_plain_loop(tmp_path, capsys):
    seeds = [3, 1, 4, 15, 9, 2, 6]
    first = jaxmesh.EnvServer("gymnasium:CartPole-v1", "127.0.0.1:0", lanes=2)
    second = jaxmesh.EnvServer("gymnasium:CartPole-v1", "127.0.0.1:0", lanes=1)
    with first.start(), second.start():
        addresses = [f"grpc://{first.address}", f"grpc://{second.address}"]
        config = write_config(tmp_path, env=addresses, seeds=seeds, episodes=None)
        assert main(["eval", str(config), "--no-progress"]) == 0
    assert "gymnasium:CartPole-v1" in capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["settings"]["num_envs"] == 3  # 2 + 1 lanes of num_envs=4
    assert returns_and_lengths(tmp_path / "r.json") == tilt_episodes(seeds)


def test_unreachable_server_is_a_run_failure(tmp_path):
    # A socket bound to a port but not listening: connecting there is refused,
    # and nothing else can take the port while the test holds it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        config = write_config(tmp_path, env=f"grpc://{address}")
        with pytest.raises(jaxmesh.RemoteConnectionError, match=address):
            main(["eval", str(config), "--no-progress"])
    assert not (tmp_path / "r.json").exists()


# env_config ---------------------------------------------------------------------
def test_env_config_sets_brax_episode_length(tmp_path):
    # brax's fast env never terminates under this policy, so every episode is
    # truncated at exactly episode_length: the override's 30, not the config's
    # 50 nor brax's default 1000.
    config = write_config(
        tmp_path,
        env="brax:fast",
        policy="cli_policies:push",
        env_config={"episode_length": 50},
        episodes=3,
        num_envs=2,
    )
    argv = ["eval", str(config), "--no-progress"]
    assert main([*argv, "--set", "env_config.episode_length=30"]) == 0
    episodes = json.loads((tmp_path / "r.json").read_text())["episodes"]
    assert [ep["length"] for ep in episodes] == [30, 30, 30]
    assert all(ep["truncated"] and not ep["terminated"] for ep in episodes)


# The persistent compilation cache -------------------------------------------------
def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "jaxmesh" / "xla"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "jaxmesh" / "xla"
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


@pytest.mark.parametrize(
    "switch, flag, wanted",
    [(None, False, True), ("1", False, True), ("0", False, False)]
    + [("off", False, False), (None, True, False), ("1", True, False)],
)
def test_compile_cache_switch(monkeypatch, switch, flag, wanted):
    if switch is None:
        monkeypatch.delenv(CACHE_SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(CACHE_SWITCH_ENV, switch)
    assert compile_cache_wanted(flag) is wanted


def cache_files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


@pytest.mark.slow  # three eval processes; make test: the cache's switches
def test_second_process_reuses_the_compiled_executables(tmp_path):
    cache = tmp_path / "xla"
    env = {k: v for k, v in os.environ.items() if k != CACHE_SWITCH_ENV}
    env[CACHE_DIR_ENV] = str(cache)
    argv = [sys.executable, "-m", "jaxmesh.cli", "eval", str(CONFIG)]
    argv += ["--set", "episodes=4", "--set", "num_envs=2", "--set", "output=null"]
    argv += ["--no-progress"]

    def run():
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        return cache_files(cache)

    first = run()
    assert first  # the first process wrote its executables
    second = run()
    assert second == first  # the second compiled nothing new: all were reused

    # Off with the flag: a fresh directory stays empty. (A run that compiles, on
    # the host-stepped CartPole: its agent step compiles faster than the scan.)
    env[CACHE_DIR_ENV] = str(tmp_path / "unused")
    proc = subprocess.run(
        [*argv, "--set", "env=gymnasium:CartPole-v1", "--no-compile-cache"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "unused").exists()


def test_console_script_imports_a_policy_module_from_the_working_directory(tmp_path):
    """``policy: mypol:act`` names ./mypol.py, as under ``python -m``, with no
    PYTHONPATH; ``--version`` prints the package's version."""
    script = Path(sys.executable).with_name("jaxmesh")
    (tmp_path / "mypol.py").write_text(
        "import jax.numpy as jnp\n\n\ndef act(obs):\n"
        "    return (obs[2] > 0).astype(jnp.int32)\n"
    )
    (tmp_path / "c.yaml").write_text(
        "env: gymnax:CartPole-v1\npolicy: mypol:act\nepisodes: 4\nnum_envs: 2\n"
        "output: out.json\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[CACHE_SWITCH_ENV] = "0"
    run = lambda *a: subprocess.run(
        [str(script), *a],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    version = run("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"jaxmesh {jaxmesh.__version__}"
    proc = run("eval", "c.yaml")
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["episodes"]) == 4
