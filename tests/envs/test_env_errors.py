"""An env that raises names the episode: its index, seed, lane and step.

Real envs that raise on one seed (tests/worker_envs.py), run in process, in
worker processes and behind a real gRPC server on 127.0.0.1. The expected
episode, seed and step are worked out from the envs' own rules: ``RaisesOnSeed``
raises at the episode's second step (0-based step 1) of seed ``bad``,
``ResetRaisesOnSeed`` at its reset.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import pytest
from worker_envs import RaisesOnSeed, ResetRaisesOnSeed

import jaxmesh
from jaxmesh.remote.server import EnvServer

SEEDS = [11, 12, 13, 14, 15, 16]
BAD = 14  # episode 3


def still(obs):
    """A chunk of 2 actions that reads the state leaf."""
    return jnp.zeros((2, 2), jnp.float32) + 0.0 * obs["state"][0]


def _run(env_cls, where: str):
    factory = functools.partial(env_cls, bad=BAD)
    if where == "served":
        server = EnvServer([factory() for _ in range(2)], "127.0.0.1:0").start()
        try:
            jaxmesh.evaluate(still, f"grpc://{server.address}", num_envs=2, seeds=SEEDS)
        finally:
            server.shutdown()
        return
    workers = 2 if where == "workers" else 0
    jaxmesh.evaluate(still, factory, num_envs=2, seeds=SEEDS, workers=workers)


@pytest.mark.parametrize("where", ["in process", "workers", "served"])
@pytest.mark.parametrize(
    "env_cls, step, cause, words",
    [
        (RaisesOnSeed, 1, RuntimeError, "simulator broke"),
        (ResetRaisesOnSeed, None, ValueError, "no scene for seed 14"),
    ],
)
def test_an_env_error_names_the_episode_seed_lane_and_step(
    where, env_cls, step, cause, words
):
    with pytest.raises(jaxmesh.EnvError) as e:
        _run(env_cls, where)
    err = e.value
    assert (err.episode, err.seed, err.step) == (3, BAD, step)
    assert err.lane in (0, 1)
    text = str(err)
    assert f"episode 3 (seed {BAD})" in text and words in text
    assert ("resetting" in text) == (step is None)
    if step is not None:
        assert f"step {step} of episode 3" in text
    if where == "served":
        assert isinstance(err, jaxmesh.RemoteEnvError)
        assert err.server == err.address and err.address in text
    else:
        assert err.server is None
        # The env's own exception is the cause, with its own traceback.
        assert isinstance(err.__cause__, cause) and words in str(err.__cause__)
    # Every episode finished before is kept; the failed one is not among them.
    partial = err.partial_result
    assert partial is not None and 3 not in partial.indices.tolist()
    assert partial.num_episodes >= 1
