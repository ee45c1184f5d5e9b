"""``jaxmesh serve-policy``: a real server process that openpi-client drives,
and the refusals of bad input (exit status 2, one line)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_models import linear_reference

from jaxmesh.cli import main
from jaxmesh.cli.build import load_policy
from jaxmesh.cli.errors import ConfigError

from .conftest import serve_policy_process


def test_serve_policy_in_a_real_process_answers_openpi_client():
    with serve_policy_process("serve_models:LINEAR", "--max-batch", "4") as address:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"  # loopback by default
        policy = WebsocketClientPolicy(host, int(port))
        try:
            state = np.array([1.0, 2.0, -3.0], np.float32)
            reply = policy.infer({"observation/state": state})
        finally:
            policy._ws.close()
        np.testing.assert_allclose(reply["actions"], linear_reference(state), rtol=1e-6)


def test_a_non_loopback_address_without_a_token_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("JAXMESH_TOKEN", raising=False)
    argv = ["serve-policy", "serve_models:LINEAR", "--address", "0.0.0.0:0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no token and no TLS" in err and len(err.strip().splitlines()) == 1


def test_the_policy_is_read_from_a_run_config_or_module_attr(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        "env: gymnax:CartPole-v1\npolicy: jaxmesh.zoo.cartpole:CartPoleMLP\n"
        "policy_config:\n  checkpoint: null\n"
    )
    assert type(load_policy(str(config))).__name__ == "CartPoleMLP"
    assert load_policy("serve_models:LINEAR").name == "chunk"
    for bad, why in (
        ("nothing_here", "neither a run config"),
        (str(tmp_path / "missing.yaml"), "not found"),
    ):
        assert main(["serve-policy", bad]) == 2
        assert why in capsys.readouterr().err
    (tmp_path / "empty.yaml").write_text("env: gymnax:CartPole-v1\n")
    with pytest.raises(ConfigError, match="names no policy"):
        load_policy(str(tmp_path / "empty.yaml"))


def test_describe_says_what_a_model_without_a_spec_reads(capsys):
    assert main(["describe", "configs/cartpole.yaml"]) == 0
    out = json.loads(capsys.readouterr().out)
    # The config's env (gymnax CartPole) gives the one array's shape.
    assert out["inputs"] == {"observation/state": {"shape": [4], "dtype": "float32"}}
    # The docstring's whole first sentence, not its first line.
    assert out["doc"].startswith("The trained CartPole MLP") and out["doc"].endswith(
        "others)."
    )
    assert main(["describe", "jaxmesh.zoo.cartpole:CartPoleMLP"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "--input observation/state=float32[N]" in out["inputs"]
