"""Chunk replay on the host: replayed steps run without an agent step.

On a host-stepped env (in process or served), a step on which no lane plans,
prefetches or starts an episode takes every lane's action from its chunk on the
host; the next agent step is told how many actions it skipped. These tests check
the results against the plain gymnasium loop (``gym_reference.plain_loop``), for
inputs that read the previous action and the current observation (one-frame
windows, the configs that skip), with and without a prefetch lead, and that the
replayed steps really run no agent step (the telemetry's ``predict`` count).
"""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import pytest
from gym_reference import ID, SEEDS, check, plain_loop

import jaxmesh
from jaxmesh.adapt import Previous, State
from jaxmesh.remote.server import EnvServer

SPEC = {"obs": State(), "prev": Previous()}


def leaning(inp, key):
    """Stochastic chunks of 4 over the observation and the previous action."""
    obs, prev = inp["obs"], inp["prev"]
    logit = 10 * obs[2] + 2 * (prev - 0.5)
    return jax.random.bernoulli(key, jax.nn.sigmoid(logit), (4,)).astype(jnp.int32)


def inputs(obs_h, act_h, t):
    """What SPEC shows at step t: the observation and the last action."""
    return {"obs": obs_h[t], "prev": act_h[t - 1] if t > 0 else jnp.int32(0)}


def refs(lead: int):
    return plain_loop(
        gym.make(ID), jax.jit(leaning), SEEDS, horizon=4, lead=lead, inputs=inputs
    )


@pytest.mark.parametrize("lead", [0, 1, 3])
@pytest.mark.parametrize("n", [1, 3])
def test_in_process_replay_matches_plain_loop(n, lead):
    model = jaxmesh.Model(leaning, spec=SPEC)
    envs = [gym.make(ID) for _ in range(n)]
    got = jaxmesh.evaluate(
        model,
        envs,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=lead),
        seeds=SEEDS,
    )
    expected = refs(lead)
    assert len({r.length for r in expected}) > 3
    check(got, expected, n)


@pytest.mark.parametrize("lead", [0, 2])
def test_served_replay_matches_plain_loop(lead):
    model = jaxmesh.Model(leaning, spec=SPEC)
    with EnvServer([gym.make(ID) for _ in range(3)], "127.0.0.1:0") as server:
        got = jaxmesh.evaluate(
            model,
            f"grpc://{server.address}",
            num_envs=3,
            horizon=4,
            chunking=jaxmesh.Chunking(prefetch_lead=lead),
            seeds=SEEDS,
        )
    expected = refs(lead)
    jaxmesh_lanes = got.lanes.tolist()
    assert jaxmesh_lanes[:3] == [0, 1, 2]
    from reference_loop import assert_matches

    assert_matches(got, expected)


def test_replayed_steps_run_no_agent_step():
    """One lane, no lead: an agent step per plan, none for the replayed steps."""
    model = jaxmesh.Model(leaning, spec=SPEC)
    got = jaxmesh.evaluate(model, [gym.make(ID)], horizon=4, seeds=SEEDS)
    plans = int(got.predict_calls.sum())
    assert plans < int(got.env_steps)  # chunks were replayed
    assert got.telemetry["predict"]["count"] == plans


def test_deep_windows_still_step_the_agent_every_step():
    """A 3-frame window reads every frame: no step is skipped."""
    spec = {"obs": State(stack=3), "prev": Previous()}

    def policy(inp, key):
        return leaning({"obs": inp["obs"][-1], "prev": inp["prev"]}, key)

    got = jaxmesh.evaluate(
        jaxmesh.Model(policy, spec=spec), [gym.make(ID)], horizon=4, seeds=SEEDS
    )
    assert got.telemetry["predict"]["count"] == int(got.env_steps)
