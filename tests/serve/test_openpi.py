"""PolicyServer driven by openpi-client's own WebsocketClientPolicy and
ActionChunkBroker: the actions equal the model's computed here, several
clients are batched, the token is required, and a bad request fails only its
own client."""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
import time

import msgpack
import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_models import (
    ImageModel,
    image_reference,
    libero_obs,
    linear_model,
    linear_reference,
)
from websockets.exceptions import ConnectionClosedError, InvalidStatus

import jaxmesh
from jaxmesh.serve.openpi import ERROR_REASON


@contextlib.contextmanager
def client(server: jaxmesh.PolicyServer, api_key: str | None = None):
    host, port = server.address.rsplit(":", 1)
    policy = WebsocketClientPolicy(host, int(port), api_key=api_key)
    try:
        yield policy
    finally:
        policy._ws.close()  # openpi-client 0.1.2 has no close()


def test_actions_equal_the_models_own_and_the_broker_replays_them():
    obs = libero_obs(3)
    with jaxmesh.PolicyServer(ImageModel(), max_batch=4, example=obs) as server:
        with client(server) as policy:
            meta = policy.get_server_metadata()
            assert meta["action_chunk"] == 5 and meta["policy"] == "ImageModel"
            for i in (3, 7):
                reply = policy.infer(libero_obs(i))
                assert reply["actions"].shape == (5, 3)
                np.testing.assert_allclose(
                    reply["actions"], image_reference(libero_obs(i)), rtol=1e-6
                )
                timing = reply["server_timing"]
                assert timing["batch_size"] == 1 and timing["padded_batch"] == 1
                assert {"infer_ms", "queue_ms", "forward_ms"} <= set(timing)
            assert "prev_total_ms" in reply["server_timing"]  # the second reply
            broker = ActionChunkBroker(policy, action_horizon=5)
            played = [broker.infer(libero_obs(2))["actions"] for _ in range(5)]
            np.testing.assert_allclose(
                np.stack(played), image_reference(libero_obs(2)), rtol=1e-6
            )
        # Compiled at start for every batch size; nothing since.
        assert server.compiled == 3


def test_several_clients_are_batched_into_one_forward():
    n, steps = 4, 3
    server = jaxmesh.PolicyServer(
        linear_model(),
        max_batch=n,
        max_wait_ms=60_000,  # a forward waits until every client has asked
        example={"observation/state": np.zeros(3, np.float32)},
    ).start()
    replies: dict[int, list] = {}
    errors: list = []

    def run(i: int, policy: WebsocketClientPolicy) -> None:
        try:
            replies[i] = [
                policy.infer({"observation/state": np.full(3, 10.0 * i + t, "f4")})
                for t in range(steps)
            ]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with server, contextlib.ExitStack() as stack:
        # Every client is connected (it has the metadata) before any asks.
        policies = [stack.enter_context(client(server)) for _ in range(n)]
        threads = [
            threading.Thread(target=run, args=(i, p)) for i, p in enumerate(policies)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    for i in range(n):
        for t, reply in enumerate(replies[i]):
            ref = linear_reference(np.full(3, 10.0 * i + t, np.float32))
            np.testing.assert_allclose(reply["actions"], ref, rtol=1e-6, atol=1e-6)
            assert reply["server_timing"]["batch_size"] == n
    assert server.stats.batch_sizes == {n: steps}


def test_the_token_is_required_and_health_needs_none():
    with jaxmesh.PolicyServer(linear_model(), token="s3cret") as server:
        host, port = server.address.rsplit(":", 1)
        with pytest.raises(InvalidStatus, match="401"):
            WebsocketClientPolicy(host, int(port))
        with pytest.raises(InvalidStatus, match="401"):
            WebsocketClientPolicy(host, int(port), api_key="wrong")
        with client(server, api_key="s3cret") as policy:
            state = np.ones(3, np.float32)
            reply = policy.infer({"observation/state": state})
            np.testing.assert_allclose(reply["actions"], linear_reference(state))
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("GET", "/healthz")
            got = conn.getresponse()
            assert (got.status, got.read()) == (200, b"OK\n")
        finally:
            conn.close()


def test_a_bad_request_fails_only_its_own_client():
    state = np.ones(3, np.float32)
    with jaxmesh.PolicyServer(linear_model(), max_wait_ms=0) as server:
        with client(server) as good, client(server) as bad:
            with pytest.raises(RuntimeError, match="observation/state.*lacks"):
                bad.infer({"state": state})
            # openpi's server closes the connection after the error's text.
            with pytest.raises(ConnectionClosedError) as closed:
                bad._ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1011
            assert closed.value.rcvd.reason == ERROR_REASON
            reply = good.infer({"observation/state": state})
            np.testing.assert_allclose(reply["actions"], linear_reference(state))
        # Bytes that are not msgpack, and a pickle-bearing dtype: refused.
        url = server.url
        for frame in (b"\xc1not msgpack", _object_array_frame()):
            with websockets.sync.client.connect(url) as ws:
                ws.recv(timeout=10)  # the metadata
                ws.send(frame)
                text = ws.recv(timeout=10)
                assert isinstance(text, str) and "CodecError" in text
        assert server.stats.failed == 0  # refused before the queue


def _object_array_frame() -> bytes:
    return msgpack.packb(
        {
            "observation/state": {
                b"__ndarray__": True,
                b"data": b"\x80\x04N.",
                b"dtype": "|O",
                b"shape": [1],
            }
        }
    )


def test_tls_serves_wss(pems):
    tls = (pems["cert"], pems["key"])
    state = np.full(3, 2.0, np.float32)
    with jaxmesh.PolicyServer(linear_model(), tls=tls) as server:
        assert server.url.startswith("wss://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(pems["cert"]))
        with websockets.sync.client.connect(server.url, ssl=context) as ws:
            assert msgpack.unpackb(ws.recv(timeout=10))["policy"] == "chunk"
            ws.send(msgpack_numpy.packb({"observation/state": state}))
            reply = msgpack_numpy.unpackb(ws.recv(timeout=30))
            np.testing.assert_allclose(reply["actions"], linear_reference(state))


def test_a_non_loopback_address_needs_a_token_or_tls():
    with pytest.raises(ValueError, match="no token and no TLS"):
        jaxmesh.PolicyServer(linear_model(), "0.0.0.0:0")
    jaxmesh.PolicyServer(linear_model(), "0.0.0.0:0", token="t")  # not started
    with pytest.raises(ValueError, match="protocol='zmq'"):
        jaxmesh.PolicyServer(linear_model(), protocol="zmq")
    with pytest.raises(ValueError, match="max_wait_ms"):
        jaxmesh.PolicyServer(linear_model(), max_wait_ms=-1)


def test_shutdown_closes_connected_clients():
    server = jaxmesh.PolicyServer(linear_model()).start()
    with client(server) as policy:
        assert not server.wait(0)
        server.shutdown()
        assert server.wait(0)
        with pytest.raises(Exception):  # noqa: B017 - closed by the server
            policy.infer({"observation/state": np.ones(3, np.float32)})
    server.shutdown()  # twice is fine


def test_a_port_in_use_is_an_os_error_and_leaves_nothing_running():
    with jaxmesh.PolicyServer(linear_model()) as server:
        second = jaxmesh.PolicyServer(linear_model(), server.address)
        with pytest.raises(OSError):
            second.start()


def test_request_bytes_held_at_once_are_capped_across_connections():
    pad = np.zeros(150_000, np.float32)  # 600 kB the spec does not read
    state = np.ones(3, np.float32)
    big = {"observation/state": state, "observation/pad": pad}
    server = jaxmesh.PolicyServer(
        linear_model(), max_wait_ms=60_000, max_inflight_bytes=1_000_000
    ).start()
    replies: list = []
    with server, client(server) as a, client(server) as b, client(server) as c:
        waiting = threading.Thread(target=lambda: replies.append(a.infer(big)))
        waiting.start()  # waits in the queue for the other two clients
        deadline = time.monotonic() + 30
        while server._service._inflight < 600_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(RuntimeError, match="holds 6.* bytes of requests"):
            b.infer(big)  # 1.2 MB held at once: over the cap, refused
        b._ws.close()
        reply = c.infer({"observation/state": state})  # joins a's forward
        waiting.join(30)
        np.testing.assert_allclose(reply["actions"], linear_reference(state))
        np.testing.assert_allclose(replies[0]["actions"], linear_reference(state))
        assert server._service._inflight == 0
