"""``jaxmesh.RemotePolicy`` against a real ``jaxmesh serve-policy --protocol
grpc`` process: what the server refuses reaches the client as the promised
error, at the run's start."""

from __future__ import annotations

import pytest

import jaxmesh

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
