"""Served envs over TLS: a server with a certificate, clients at ``grpcs://``.

The certificate is self-signed and made here (``cryptography``) for
``localhost`` and ``127.0.0.1``; clients trust it through
``grpc.ssl_channel_credentials(root_certificates=...)``. Every run compares
with a plain gymnasium CartPole loop on the same seeds and actions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh
from jaxmesh.errors import RemoteConnectionError

pytestmark = pytest.mark.timeout(120)

ENV_ID = "CartPole-v1"


def server_credentials(pems: dict[str, Path]) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(pems["key"].read_bytes(), pems["cert"].read_bytes())]
    )


def tls_server(
    pems: dict[str, Path], lanes: int = 1, address: str = "127.0.0.1:0"
) -> jaxmesh.EnvServer:
    """A TLS EnvServer over ``lanes`` CartPoles, started (a context manager)."""
    return jaxmesh.EnvServer(
        [gym.make(ENV_ID) for _ in range(lanes)],
        address,
        credentials=server_credentials(pems),
    )


def client_credentials(pems: dict[str, Path]) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=pems["cert"].read_bytes())


def port_of(server: jaxmesh.EnvServer) -> int:
    return int(server.address.rpartition(":")[2])


def reference(seed: int, actions: list[int]) -> list[tuple]:
    """A plain gymnasium loop: reset with ``seed``, then ``actions``."""
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=seed)
    out = [(obs,)]
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append((obs, r, term, trunc))
        if term or trunc:
            break
    env.close()
    return out


def test_remote_env_over_tls_equals_a_plain_loop(pems):
    actions = [0, 1, 1, 0, 1, 0, 0, 1] * 4
    want = reference(7, actions)
    with tls_server(pems) as server:
        env = jaxmesh.RemoteEnv(
            f"grpcs://localhost:{port_of(server)}",
            credentials=client_credentials(pems),
        )
        try:
            obs, _ = env.reset(seed=7)
            got = [(obs,)]
            for a in actions[: len(want) - 1]:
                got.append(env.step(a)[:4])
        finally:
            env.close()
    assert len(got) == len(want)
    np.testing.assert_array_equal(got[0][0], want[0][0])
    for g, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_array_equal(g[0], w[0])
        assert g[1:] == w[1:]


@pytest.mark.parametrize(
    "scheme, host, match",
    [
        # A plain client at a TLS server: the hint names grpcs://.
        ("grpc", "127.0.0.1", "grpcs://host:port"),
        # gRPC's default roots do not hold this self-signed certificate.
        ("grpcs", "localhost", "TLS handshake failed"),
    ],
)
def test_a_client_that_cannot_trust_the_server_is_refused(pems, scheme, host, match):
    with tls_server(pems) as server:
        address = f"{scheme}://{host}:{port_of(server)}"
        with pytest.raises(RemoteConnectionError, match=match) as err:
            jaxmesh.RemoteEnv(address, connect_timeout=5.0)
    assert f"{host}:{port_of(server)}" in str(err.value)


def test_credentials_with_a_plain_address_are_refused_before_connecting(pems):
    # Nothing listens on port 1: the ValueError must come before any connection.
    with pytest.raises(ValueError, match="grpcs://host:port"):
        jaxmesh.RemoteEnv("grpc://127.0.0.1:1", credentials=client_credentials(pems))
    with pytest.raises(TypeError, match="grpc.ChannelCredentials"):
        jaxmesh.RemoteVectorEnv("grpcs://127.0.0.1:1", credentials="cert.pem")


def test_a_tls_server_may_bind_any_address_without_a_token(pems):
    # TLS is one of the three ways past the loopback-only rule (token, TLS,
    # insecure=True); a plain server on 0.0.0.0 with none of them is refused.
    with pytest.raises(ValueError, match="no token and no TLS"):
        jaxmesh.EnvServer([gym.make(ENV_ID)], "0.0.0.0:0")
    with tls_server(pems, address="0.0.0.0:0") as server:
        vec = jaxmesh.RemoteVectorEnv(
            f"grpcs://127.0.0.1:{port_of(server)}",
            credentials=client_credentials(pems),
        )
        try:
            obs, _ = vec.reset(seed=[11])
        finally:
            vec.close()
    np.testing.assert_array_equal(obs[0], reference(11, [])[0][0])


def test_serve_env_cli_serves_tls(pems, tmp_path):
    read_fd, write_fd = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "jaxmesh.cli",
        "serve-env",
        f"gymnasium:{ENV_ID}",
        "--lanes",
        "2",
        "--tls-cert",
        str(pems["cert"]),
        "--tls-key",
        str(pems["key"]),
        "--ready-fd",
        str(write_fd),
    ]
    proc = subprocess.Popen(
        cmd, pass_fds=(write_fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as ready:
            address = ready.readline().strip()
        assert address, proc.stderr.read().decode() if proc.poll() is not None else ""
        port = address.rpartition(":")[2]
        vec = jaxmesh.RemoteVectorEnv(
            f"grpcs://localhost:{port}", credentials=client_credentials(pems)
        )
        try:
            obs, _ = vec.reset(seed=[3, 4])
            obs2, rew, term, trunc, _ = vec.step(np.array([1, 0]))
        finally:
            vec.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    for lane, (seed, action) in enumerate(((3, 1), (4, 0))):
        want = reference(seed, [action])
        np.testing.assert_array_equal(obs[lane], want[0][0])
        np.testing.assert_array_equal(obs2[lane], want[1][0])
        assert rew[lane] == want[1][1]


def test_serve_env_cli_needs_both_tls_files(pems):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxmesh.cli",
            "serve-env",
            f"gymnasium:{ENV_ID}",
            "--tls-cert",
            str(pems["cert"]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "--tls-key" in out.stderr and "give both" in out.stderr


def test_evaluate_over_tls_equals_the_run_in_process(pems):
    def policy(obs):
        return (obs[2] > 0).astype(jnp.int32)

    here = jaxmesh.evaluate(policy, [gym.make(ENV_ID) for _ in range(2)], episodes=5)
    with tls_server(pems, lanes=2) as server:
        address = f"grpcs://localhost:{port_of(server)}"
        there = jaxmesh.evaluate(
            policy,
            address,
            episodes=5,
            served=jaxmesh.Served(credentials=client_credentials(pems)),
        )
        with pytest.raises(ValueError, match="grpcs://host:port"):
            jaxmesh.evaluate(
                policy,
                f"grpc://127.0.0.1:{port_of(server)}",
                episodes=5,
                served=jaxmesh.Served(credentials=client_credentials(pems)),
            )
    np.testing.assert_array_equal(there.returns, here.returns)
    np.testing.assert_array_equal(there.lengths, here.lengths)


def test_cli_eval_reaches_a_tls_server_with_tls_ca(pems, tmp_path):
    from jaxmesh.cli import main

    out = tmp_path / "served.json"
    with tls_server(pems, lanes=2) as server:
        config = tmp_path / "tls.yaml"
        config.write_text(
            f"env: grpcs://localhost:{port_of(server)}\n"
            f"tls_ca: {pems['cert']}\n"
            "reply_timeout: 30\n"
            "policy: jaxmesh.zoo.cartpole:CartPoleMLP\n"
            "episodes: 3\n"
            "num_envs: 2\n"
            f"output: {out}\n"
        )
        assert main(["eval", str(config), "--no-progress"]) == 0
        missing = tmp_path / "missing.yaml"
        missing.write_text(config.read_text().replace(str(pems["cert"]), "no.pem"))
        assert main(["eval", str(missing), "--no-progress"]) == 2
    assert json.loads(out.read_text())["totals"]["episodes"] == 3
