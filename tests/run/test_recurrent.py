"""Recurrent models: a GRU policy (flax ``nn.GRUCell``) against a plain Python
loop over gymnax CartPole, with one action per plan and with chunks; the
host-side hooks ``on_episode_end`` (order) and ``close`` (never called)."""

from __future__ import annotations

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import gymnax_fns, run_episode

import jaxmesh

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
HIDDEN = 8


class GRUPolicy(jaxmesh.Model):
    """A GRU over observations; a linear head gives logits of K actions."""

    def __init__(self, chunk=None):
        super().__init__(native_chunk=chunk)
        self.k = chunk or 1
        self.ended: list[int] = []
        self.closed = False

    def load(self):
        self.cell = nn.GRUCell(features=HIDDEN)
        key_cell, key_head = jax.random.split(jax.random.PRNGKey(42))
        cell = self.cell.init(key_cell, jnp.zeros(HIDDEN), jnp.zeros(4))["params"]
        head = jax.random.normal(key_head, (HIDDEN + 4, self.k * 2))
        self.params = {"cell": cell, "head": head}

    def initial_state(self):
        return jnp.zeros((HIDDEN,), jnp.float32)

    def step(self, params, obs, state):
        new, _ = self.cell.apply({"params": params["cell"]}, state, obs)
        logits = jnp.concatenate([new, obs]) @ params["head"]
        actions = jnp.argmax(logits.reshape(self.k, 2), axis=-1).astype(jnp.int32)
        return actions, new

    def predict(self, obs, state):
        actions, new = self.step(self.params, obs, state)
        return actions[0], new

    def predict_chunk(self, obs, state):
        return self.step(self.params, obs, state)

    def on_episode_end(self, episode_id):
        self.ended.append(episode_id)

    def close(self):
        self.closed = True


class Single(GRUPolicy):
    predict_chunk = jaxmesh.Model.predict_chunk  # only the action corner


class Chunked(GRUPolicy):
    predict = jaxmesh.Model.predict  # only the chunk corner


def reference(model, seeds, horizon, tile):
    """Plain loop: the GRU state starts at zeros each episode and advances on
    every plan; rows are padded to the run's plan tile (``result.plan_tile``), as
    the engine computes them."""

    @jax.jit
    def plan(params, obs, state):
        rows = lambda x: jnp.broadcast_to(x, (tile, *x.shape))  # noqa: E731
        actions, new = jax.vmap(model.step, in_axes=(None, 0, 0))(
            params, rows(obs), rows(state)
        )
        return actions[0], new[0]

    episodes = []
    for seed in seeds:
        box = {"state": jnp.zeros((HIDDEN,), jnp.float32)}

        def policy(obs, key, box=box):
            chunk, box["state"] = plan(model.params, obs, box["state"])
            return chunk

        episodes.append(run_episode(*REF, policy, seed, horizon=horizon))
    return episodes


def assert_matches(result, refs):
    np.testing.assert_array_equal(result.returns, [r.ret for r in refs])
    np.testing.assert_array_equal(result.lengths, [r.length for r in refs])
    np.testing.assert_array_equal(result.predict_calls, [r.calls for r in refs])


@pytest.mark.parametrize(
    "cls, chunk, horizon", [(Single, None, 1), (Chunked, 4, 3)], ids=["h1", "chunk"]
)
def test_gru_policy_matches_reference(cls, chunk, horizon):
    model = cls(chunk=chunk)
    assert model.recurrent and model.corners() == (
        ("predict",) if chunk is None else ("predict_chunk",)
    )
    seeds = [0, 1, 2, 3, 4]
    result = jaxmesh.evaluate(
        model,
        CARTPOLE,
        num_envs=2,
        seeds=seeds,
        horizon=horizon,
        layout=jaxmesh.Layout(segment_steps=64),
    )
    refs = reference(model, seeds, horizon, result.plan_tile)
    assert len({r.length for r in refs}) > 1  # the state matters: varied episodes
    assert_matches(result, refs)
    # Host hooks: every ended episode once; close never.
    assert sorted(model.ended) == list(range(len(seeds)))
    assert not model.closed


def test_on_episode_end_is_called_in_episode_order():
    # Episode 1 (seed 1) ends before episode 0 (seed 0) and in an earlier
    # segment: the hook must still see 0 first (issue 3, item 3).
    model = Single()
    result = jaxmesh.evaluate(
        model,
        CARTPOLE,
        num_envs=2,
        seeds=[0, 1, 2, 3, 4],
        layout=jaxmesh.Layout(segment_steps=64),
    )
    assert result.lengths[1] < result.lengths[0]
    assert model.ended == [0, 1, 2, 3, 4]


def test_initial_state_resets_per_episode():
    # Same seed twice in one run, on different lanes and after other episodes:
    # equal results only if the state is reset at each episode start.
    model = Single()
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=[7, 8, 9, 7])
    assert result.lengths[0] == result.lengths[3]
    assert result.returns[0] == result.returns[3]
