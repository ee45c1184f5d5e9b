"""``jaxmesh serve-policy`` in a real process, driven as openpi's clients
drive openpi's own server: its ``WebsocketClientPolicy`` and
``ActionChunkBroker``, the observation dicts they send, and what the server
says it expects."""

from __future__ import annotations

import argparse
import http.client

import numpy as np
import pytest
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_models import (
    ImageModel,
    image_reference,
    libero_obs,
    linear_model,
    linear_reference,
)

import jaxmesh
from jaxmesh.cli.errors import ConfigError
from jaxmesh.cli.serve_policy import declared_inputs
from jaxmesh.serve.forward import MAX_LAYOUTS, MAX_REFUSED, STATE_KEYS, batch_sizes
from jaxmesh.zoo import cartpole, libero

from .conftest import memory_bytes, serve_policy_child, serve_policy_process


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


def _cartpole_numpy(obs: np.ndarray) -> int:
    """The shipped CartPole MLP's greedy action, its layers in numpy."""
    p = jaxmesh.load_params(cartpole.DEFAULT_PATH)["params"]
    x = np.asarray(obs, np.float32)
    for layer in ("Dense_0", "Dense_1"):
        x = np.tanh(x @ np.asarray(p[layer]["kernel"]) + np.asarray(p[layer]["bias"]))
    logits = x @ np.asarray(p["Dense_2"]["kernel"]) + np.asarray(p["Dense_2"]["bias"])
    return int(np.argmax(logits))


def _startup_line(proc) -> str:
    """The server's start-up line on stderr (written before it is ready)."""
    for raw in proc.stderr:
        line = raw.decode()
        if line.startswith("jaxmesh serve-policy:"):
            return line
    raise AssertionError("no start-up line")


def test_a_run_configs_array_policy_takes_openpis_dict_observations():
    # configs/cartpole.yaml: a model without a spec that takes one array;
    # the config's env says its shape, and the server says what it expects.
    with serve_policy_child("configs/cartpole.yaml") as (address, proc):
        line = _startup_line(proc)
        assert "'observation/state' float32[4]" in line
        assert "'state'" in line and "'obs'" in line
        host, port = address.rsplit(":", 1)
        states = np.array(
            [[0.0, 0.0, 0.05, 0.0], [0.0, 0.0, -0.05, 0.0], [0.1, 0.3, -0.02, 0.4]]
        )
        for key, state in zip(STATE_KEYS, states, strict=True):
            client = WebsocketClientPolicy(host, int(port))
            try:
                # As openpi's clients send it: float64, with a prompt beside.
                reply = client.infer({key: state, "prompt": "balance"})
            finally:
                client._ws.close()
            assert reply["actions"].shape == (1,)
            assert int(reply["actions"][0]) == _cartpole_numpy(state)
        for obs, why in (
            (
                {"observation/state": np.ones(3, np.float32)},
                r"observation\['observation/state'\] has shape \(3,\); policy "
                r"'CartPoleMLP' expects float32\[4\]",
            ),
            ({"prompt": "balance"}, "holds none of the keys"),
            (
                {"state": np.ones(4), "obs": np.ones(4)},
                r"holds \['state', 'obs'\], several of",
            ),
        ):
            client = WebsocketClientPolicy(host, int(port))
            try:
                with pytest.raises(RuntimeError, match=why):
                    client.infer(obs)
            finally:
                client._ws.close()


def test_declared_inputs_refuse_another_dtype_naming_the_key():
    model = linear_model("observation/image")  # reads one key, as a State
    with pytest.raises(ValueError, match=r"reads observation keys \['observation/"):
        jaxmesh.PolicyServer(model, inputs={"observation/state": "float32[3]"})
    inputs = {"observation/image": ((3,), "uint8")}
    with jaxmesh.PolicyServer(model, inputs=inputs) as server:
        assert server.compiled == len(batch_sizes(16))  # at start
        assert server.expects == "'observation/image' uint8[3]"
        host, port = server.address.rsplit(":", 1)
        client = WebsocketClientPolicy(host, int(port))
        try:
            pixels = np.array([1, 2, 3], np.uint8)
            reply = client.infer({"observation/image": pixels})
            np.testing.assert_allclose(
                reply["actions"],
                linear_reference(pixels.astype(np.float32)),
                rtol=1e-6,
            )
        finally:
            client._ws.close()
        client = WebsocketClientPolicy(host, int(port))
        try:
            with pytest.raises(
                RuntimeError,
                match=r"observation\['observation/image'\] has dtype float32; "
                r"policy 'chunk' expects uint8\[3\]",
            ):
                client.infer({"observation/image": np.ones(3, np.float32)})
        finally:
            client._ws.close()
        assert server.compiled == len(batch_sizes(16))  # nothing more compiled


def _infer(server: jaxmesh.PolicyServer, obs: dict) -> dict:
    host, port = server.address.rsplit(":", 1)
    client = WebsocketClientPolicy(host, int(port))
    try:
        return client.infer(obs)
    finally:
        client._ws.close()


def test_no_client_locks_the_layouts_out():
    # A model that runs any camera size: each size is a layout. More layouts
    # than are kept compiled evict the least recently used; the first one
    # still runs after them all.
    sizes = list(range(4, 4 + MAX_LAYOUTS + 3))
    with jaxmesh.PolicyServer(ImageModel(), max_batch=1) as server:
        for size in [*sizes, sizes[0]]:
            obs = libero_obs(size, size=size)
            reply = _infer(server, obs)
            np.testing.assert_allclose(
                reply["actions"], image_reference(obs), rtol=1e-6
            )
            assert server.compiled <= MAX_LAYOUTS
    # Layouts the model refuses are remembered up to a bound, and do not
    # keep the layout it runs out.
    with jaxmesh.PolicyServer(linear_model(), max_batch=1) as server:
        for n in range(4, 4 + MAX_REFUSED + 8):
            with pytest.raises(RuntimeError, match=r"observation/state float32\["):
                _infer(server, {"observation/state": np.ones(n, np.float32)})
        state = np.array([1.0, 2.0, 3.0], np.float32)
        reply = _infer(server, {"observation/state": state})
        np.testing.assert_allclose(reply["actions"], linear_reference(state), rtol=1e-6)
        assert server.compiled == 1


def test_the_command_line_declares_the_layout_and_other_layouts_compile_nothing():
    args = ("serve_models:LINEAR", "--input", "observation/state=float32[3]")
    with serve_policy_child(*args) as (address, proc):
        assert "'observation/state' float32[3]" in _startup_line(proc)
        host, port = address.rsplit(":", 1)
        for n in range(4, 4 + MAX_LAYOUTS + 2):
            client = WebsocketClientPolicy(host, int(port))
            try:
                with pytest.raises(RuntimeError, match=rf"has shape \({n},\)"):
                    client.infer({"observation/state": np.ones(n, np.float32)})
            finally:
                client._ws.close()
        client = WebsocketClientPolicy(host, int(port))
        try:
            state = np.array([1.0, -2.0, 0.5], np.float32)
            reply = client.infer({"observation/state": state})
            np.testing.assert_allclose(
                reply["actions"], linear_reference(state), rtol=1e-6
            )
        finally:
            client._ws.close()
    with pytest.raises(ConfigError, match="KEY=DTYPE"):
        declared_inputs(
            argparse.Namespace(
                input=["state:float32"], protocol="openpi", policy="m:a"
            ),
            None,
        )


@pytest.mark.slow  # 120 layouts, each compiled
def test_a_stream_of_new_layouts_keeps_the_servers_memory_bounded():
    # Each state length is a layout the model runs; past the 8 kept, each
    # new one evicts one. JAX's caches kept ~300 kB a layout (+37 MB for
    # these 100) before eviction cleared them.
    with serve_policy_child("serve_models:ANY_SHAPE", "--max-batch", "1") as (
        address,
        proc,
    ):
        host, port = address.rsplit(":", 1)
        client = WebsocketClientPolicy(host, int(port))
        try:
            for n in range(1, 121):
                if n == 21:
                    before = memory_bytes(proc.pid)
                state = np.arange(n, dtype=np.float32)
                reply = client.infer({"observation/state": state})
                want = [state.sum(), -state.sum()]
                np.testing.assert_allclose(reply["actions"], [want], rtol=1e-6)
        finally:
            client._ws.close()
        assert memory_bytes(proc.pid) - before < 16 << 20
