"""``jaxmesh.RemotePolicy`` against a real ``jaxmesh serve-policy --protocol
grpc`` process: what the server refuses reaches the client as the promised
error, at the run's start."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh
from jaxmesh.errors import RemoteConnectionError
from jaxmesh.serve.remote import _Stream

from .conftest import serve_policy_process


def test_a_model_whose_params_do_not_fit_the_env_is_a_value_error_at_start():
    # The shipped CartPole MLP (4 inputs) on Pendulum (3): flax refuses the
    # params' shapes while the server probes the model for the session.
    target = "jaxmesh.zoo.cartpole:CartPoleMLP"
    with serve_policy_process(target, "--protocol", "grpc") as address:
        policy = jaxmesh.RemotePolicy(address)
        with pytest.raises(ValueError) as refused:
            jaxmesh.evaluate(policy, "gymnasium:Pendulum-v1", episodes=1)
        why = str(refused.value)
        assert "went away" not in why
        assert "refused" in why and "(4, 64)" in why and "Pendulum" in why
        # The server serves on: a fitting env runs.
        result = jaxmesh.evaluate(
            policy, "gymnasium:CartPole-v1", episodes=2, max_episode_steps=20
        )
        assert len(result.returns) == 2


def _open_message(pad: int) -> dict:
    """A session's ``open`` for gymnasium CartPole, ``pad`` bytes longer (a
    key the server does not read)."""
    from gymnasium import spaces

    from jaxmesh.envs.gymnasium.spec import spec_for
    from jaxmesh.serve.agents import spec_to_wire

    box = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    spec = spec_for("cartpole", box, spaces.Discrete(2), "the test's env")
    body = {"env": spec_to_wire(spec), "settings": {"num_envs": 1}}
    return {"open": {**body, "pad": b"\0" * pad}}


def test_message_bytes_held_at_once_are_capped_across_grpc_streams():
    model = jaxmesh.Model(lambda obs: (obs[2] > 0).astype(jnp.int32))
    server = jaxmesh.PolicyServer(
        model, protocol="grpc", max_inflight_bytes=1_000_000
    ).start()
    with server:
        first = _Stream(jaxmesh.RemotePolicy(server.url))
        try:
            # Its 600 kB are held until its next message.
            assert first.call(_open_message(600_000))["opened"]["session"] == 1
            second = _Stream(jaxmesh.RemotePolicy(server.url))
            try:
                with pytest.raises(
                    RemoteConnectionError, match=r"RESOURCE_EXHAUSTED.*hold 6\d+ bytes"
                ):
                    second.call(_open_message(600_000))
            finally:
                second.close()
        finally:
            first.close()  # its bytes are freed with its stream
        third = _Stream(jaxmesh.RemotePolicy(server.url))
        try:
            assert "opened" in third.call(_open_message(600_000))
        finally:
            third.close()
