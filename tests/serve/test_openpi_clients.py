"""``jaxmesh serve-policy`` in a real process, driven as openpi's clients
drive openpi's own server: its ``WebsocketClientPolicy`` and
``ActionChunkBroker``, the observation dicts they send, and what the server
says it expects."""

from __future__ import annotations

import http.client

import numpy as np
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from jaxmesh.zoo import libero

from .conftest import serve_policy_process


def _libero_state(i: int) -> dict:
    """LIBERO's four state leaves as its env gives them (float64), a bowl
    beside the gripper: ``scripted`` moves towards it."""
    rng = np.random.default_rng(i)
    return {
        "robot0_eef_pos": rng.uniform(-0.2, 0.2, 3),
        "robot0_gripper_qpos": np.array([0.04, -0.04]),
        "akita_black_bowl_1_pos": rng.uniform(-0.2, 0.2, 3),
        "plate_1_pos": rng.uniform(-0.2, 0.2, 3),
        "prompt": "pick up the black bowl and place it on the plate",
    }


def _reference(obs: dict) -> np.ndarray:
    """The policy's chunk, its function called directly on float32 leaves."""
    leaves = {k: v.astype(np.float32) for k, v in obs.items() if k != "prompt"}
    return np.asarray(libero.chunk(leaves))


def test_openpis_action_chunk_broker_plays_the_shipped_libero_policy():
    with serve_policy_process("jaxmesh.zoo.libero:scripted") as address:
        host, port = address.rsplit(":", 1)
        client = WebsocketClientPolicy(host, int(port))
        try:
            meta = client.get_server_metadata()
            # openpi's name for the chunk length, and jaxmesh's.
            assert meta["action_horizon"] == meta["action_chunk"] == libero.CHUNK
            obs = _libero_state(1)
            want = _reference(obs)
            assert want.shape == (libero.CHUNK, 7)
            reply = client.infer(obs)
            assert reply["actions"].shape == (libero.CHUNK, 7)
            np.testing.assert_allclose(reply["actions"], want, rtol=1e-6, atol=1e-6)
            broker = ActionChunkBroker(client, action_horizon=meta["action_horizon"])
            played = [broker.infer(obs)["actions"] for _ in range(libero.CHUNK)]
            np.testing.assert_allclose(np.stack(played), want, rtol=1e-6, atol=1e-6)
            # The broker asks again after the chunk: another state, its chunk.
            other = _libero_state(2)
            want2 = _reference(other)
            np.testing.assert_allclose(
                broker.infer(other)["actions"], want2[0], rtol=1e-6, atol=1e-6
            )
        finally:
            client._ws.close()  # openpi-client 0.1.2 has no close()


def _upgrade(host: str, port: int, headers: list[tuple[str, str]]) -> int:
    """The HTTP status of a websocket upgrade request carrying ``headers``."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.putrequest("GET", "/")
        for name, value in [
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
            *headers,
        ]:
            conn.putheader(name, value)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def test_two_authorization_headers_are_refused_as_unauthorized():
    with serve_policy_process("serve_models:LINEAR", "--token", "s3cret") as address:
        host, port = address.rsplit(":", 1)
        good = ("Authorization", "Api-Key s3cret")
        assert _upgrade(host, int(port), [good]) == 101
        for twice in ([good, good], [good, ("Authorization", "Api-Key wrong")]):
            assert _upgrade(host, int(port), twice) == 401
        assert _upgrade(host, int(port), []) == 401
