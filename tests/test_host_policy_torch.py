"""A PyTorch module as a jaxmesh.HostPolicy, against plain loops that call the
same module on the env's own functions.

Marked ``torch``: ``make test`` and ``make test-slow`` leave these out (PyPI's
torch wheel brings gigabytes of CUDA libraries), ``make test-torch`` installs
torch and runs them. torch is imported by the tests' fixture, so collecting
this file without torch skips nothing (a plain ``pytest`` run skips them).
"""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import plain_loop
from reference_loop import assert_matches, gymnax_fns, run_episode

import jaxmesh

pytestmark = pytest.mark.torch

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
SEEDS = [0, 7, 123, 5, 42, 9, 31]

_rng = np.random.default_rng(0)
W1 = (0.3 * _rng.normal(size=(4, 16))).astype(np.float32)
W2 = (0.02 * _rng.normal(size=(16, 1))).astype(np.float32)
LEAN = np.float32([0.0, 0.0, 1.0, 0.0])


@pytest.fixture(scope="module")
def torch():
    try:
        import torch
    except ImportError:  # a plain pytest run without torch
        pytest.skip("torch is not installed: make test-torch installs it")
    torch.set_num_threads(1)
    return torch


@pytest.fixture(scope="module")
def net(torch):
    """A 4-16-1 tanh MLP in torch (weights from numpy) plus a lean term."""
    mlp = torch.nn.Sequential(
        torch.nn.Linear(4, 16, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 1, bias=False),
    )
    with torch.no_grad():
        mlp[0].weight.copy_(torch.from_numpy(W1.T.copy()))
        mlp[2].weight.copy_(torch.from_numpy(W2.T.copy()))
    lean = torch.from_numpy(LEAN)

    @torch.inference_mode()
    def logits(obs: np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(obs, np.float32))
        return mlp(x)[:, 0] + x @ lean

    return logits


def test_a_torch_module_equals_the_plain_loop(net):
    def act(obs):  # [B, 4] numpy -> [B] actions
        return (net(obs) > 0).int().numpy()

    def ref(obs, key):
        return act(np.array(obs, np.float32)[None])

    refs = [run_episode(*REF, ref, s) for s in SEEDS]
    assert len({r.length for r in refs}) > 3  # the lanes' schedules differ
    for n in (1, 3):
        result = jaxmesh.evaluate(
            jaxmesh.HostPolicy(act), CARTPOLE, num_envs=n, seeds=SEEDS
        )
        assert_matches(result, refs)
    gym_refs = plain_loop(gym.make("CartPole-v1"), ref, SEEDS)
    for workers in (0, 2):
        result = jaxmesh.evaluate(
            jaxmesh.HostPolicy(act),
            "gymnasium:CartPole-v1",
            num_envs=3,
            seeds=SEEDS,
            workers=workers,
        )
        assert_matches(result, gym_refs)


def test_a_seeded_torch_sampler_follows_the_episode(torch, net):
    """Each row draws from a ``torch.Generator`` seeded with the row's seed."""

    def sample(obs, seeds):
        p = torch.sigmoid(net(obs))
        u = torch.stack(
            [
                torch.rand((), generator=torch.Generator().manual_seed(int(s)))
                for s in seeds
            ]
        )
        return (u < p).int().numpy()

    def ref(obs, key):
        seed = np.asarray(jax.random.bits(key, dtype=jnp.uint32))[None]
        return sample(np.array(obs, np.float32)[None], seed)

    refs = [run_episode(*REF, ref, s) for s in SEEDS]
    pol = jaxmesh.HostPolicy(sample, stochastic=True)
    for n in (1, 4):
        assert_matches(jaxmesh.evaluate(pol, CARTPOLE, num_envs=n, seeds=SEEDS), refs)
