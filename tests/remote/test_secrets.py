"""No secret in an artifact: a served run's session token and its TLS material
never reach the trace, the result (its text, its JSON), the HTML report,
stdout, stderr or the logs, whichever way the run was started (``jaxmesh eval``
or ``jaxmesh.evaluate``); where a setting is shown it reads ``***``.

The servers are real (``jaxmesh.EnvServer`` on 127.0.0.1, over TLS with a
token), started and stopped here; the certificate is self-signed and made here.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import grpc
import gymnasium as gym
import pytest
import yaml
from cli_policies import tilt

import jaxmesh
from jaxmesh import cli
from jaxmesh.cli.cache import CACHE_SWITCH_ENV
from jaxmesh.remote.server import ServeOptions
from jaxmesh.results.report import report_html

pytestmark = pytest.mark.timeout(300)

#: A token no artifact may hold (distinctive, so a hit is never a coincidence).
TOKEN = "tok-9f3a61c2e8d4-do-not-leak"


def secrets_of(pems: dict[str, Path]) -> dict[str, str]:
    """What no artifact may hold: the token, and the private key's lines."""
    key_lines = [
        line
        for line in pems["key"].read_text().splitlines()
        if line and not line.startswith("-----")
    ]
    return {"token": TOKEN, **{f"key line {i}": x for i, x in enumerate(key_lines)}}


def assert_no_secret(artifacts: dict[str, str], secrets: dict[str, str]) -> None:
    for what, text in artifacts.items():
        for name, secret in secrets.items():
            assert secret not in text, f"{what} holds the {name}"


def tls_token_server(pems: dict[str, Path], lanes: int = 2) -> jaxmesh.EnvServer:
    credentials = grpc.ssl_server_credentials(
        [(pems["key"].read_bytes(), pems["cert"].read_bytes())]
    )
    return jaxmesh.EnvServer(
        [gym.make("CartPole-v1") for _ in range(lanes)],
        "127.0.0.1:0",
        options=ServeOptions(token=TOKEN),
        credentials=credentials,
    )


def port_of(server: jaxmesh.EnvServer) -> int:
    return int(server.address.rpartition(":")[2])


def test_a_served_run_with_a_token_leaves_it_in_no_artifact(
    pems, tmp_path, capfd, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(CACHE_SWITCH_ENV, "0")
    out, report = tmp_path / "r.json", tmp_path / "r.html"
    cli_trace, api_trace = tmp_path / "cli.trace.json", tmp_path / "api.trace.json"
    with tls_token_server(pems) as server:
        address = f"grpcs://localhost:{port_of(server)}"
        config = tmp_path / "run.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "env": address,
                    "tls_ca": str(pems["cert"]),
                    "token": TOKEN,
                    "policy": "cli_policies:tilt",
                    "episodes": 4,
                    "num_envs": 2,
                    "output": str(out),
                }
            )
        )
        argv = ["eval", str(config), "--telemetry", "--trace", str(cli_trace)]
        assert cli.main([*argv, "--report", str(report)]) == 0
        result = jaxmesh.evaluate(
            tilt,
            address,
            episodes=3,
            num_envs=2,
            served=jaxmesh.Served(
                token=TOKEN,
                credentials=grpc.ssl_channel_credentials(
                    root_certificates=pems["cert"].read_bytes()
                ),
            ),
            trace=api_trace,
        )
    captured = capfd.readouterr()
    saved = jaxmesh.RunResult.from_dict(json.loads(out.read_text()))
    artifacts = {
        "the eval trace": cli_trace.read_text(),
        "the evaluate trace": api_trace.read_text(),
        "the results JSON": out.read_text(),
        "the HTML report": report.read_text(),
        "the report of the evaluate result": report_html(result),
        "the result's repr": repr(result),
        "the result's summary": result.summary(),
        "the result's JSON": json.dumps(result.to_dict()),
        "the saved result's repr": repr(saved),
        "stdout": captured.out,
        "stderr": captured.err,
        "the logs": caplog.text,
    }
    assert_no_secret(artifacts, secrets_of(pems))
    # The traces say a token (and credentials) were given, not what they are.
    for path in (cli_trace, api_trace):
        settings = json.loads(path.read_text())["otherData"]["settings"]
        assert settings["token"] == "***", path.name
        assert settings["credentials"] == "***", path.name
        assert settings["episodes"] in (3, 4)


def test_a_refused_token_is_not_echoed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "0")
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {"env": "gymnax:CartPole-v1", "policy": "cli_policies:tilt", "episodes": 2}
        )
    )
    # A token given to an env that is not served is refused by name, not value.
    assert cli.main(["eval", str(config), "--set", f"token={TOKEN}"]) == 2
    err = capsys.readouterr().err
    assert "a token is for served envs" in err and "token=***" in err
    assert TOKEN not in err
    # A token of the wrong type: the same.
    assert cli.main(["eval", str(config), "--set", "token=918273645"]) == 2
    err = capsys.readouterr().err
    assert "expected a non-empty string" in err and "918273645" not in err


def test_a_token_given_for_an_env_in_this_process_is_not_echoed():
    import gymnasium as gym

    with pytest.raises(ValueError, match="drop token=") as e:
        jaxmesh.evaluate(
            lambda obs: 0,
            [gym.make("CartPole-v1")],
            served=jaxmesh.Served(token="hunter2-secret"),
        )
    assert "hunter2" not in str(e.value)


def test_serve_env_takes_its_token_from_the_environment_not_the_command_line(
    monkeypatch,
):
    # What the docs recommend over --token: the token reaches the server, and
    # its command line (what `ps` shows every user) does not hold it.
    from gym_reference import start_serve_envs

    from jaxmesh.remote.protocol import TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    ((proc, address),) = start_serve_envs(["gymnasium:CartPole-v1"])
    try:
        monkeypatch.delenv(TOKEN_ENV)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert TOKEN.encode() not in f.read()
        ps = subprocess.run(
            ["ps", "-ww", "-o", "args=", "-p", str(proc.pid)],
            capture_output=True,
            text=True,
        )
        assert TOKEN not in ps.stdout
        with pytest.raises(jaxmesh.RemoteConnectionError, match="token"):
            jaxmesh.RemoteEnv(address)
        with jaxmesh.RemoteEnv(address, token=TOKEN) as env:
            env.reset(seed=0)
    finally:
        proc.terminate()
        proc.wait(30)
