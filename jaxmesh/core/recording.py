"""The engine's recording steps into ``tally.Recording``'s buffers; each write
touches the R slots, never the N lanes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.core import tally
from jaxmesh.core.carry import EngineConfig, LaneState


def kept_obs(config: EngineConfig, obs: Any) -> Any:
    """The observation leaves a recording keeps (``record_keys``)."""
    if config.record_keys is None:
        return obs
    leaves = tally.info_leaves(obs)
    return {k: leaves[k] for k in config.record_keys}


def done(rec: Any, lanes: LaneState) -> jax.Array:
    """[R] bool: each recorded episode has ended (no step writes to it)."""
    held = (lanes.active | lanes.start)[None, :]
    running = jnp.any((rec.episodes[:, None] == lanes.episode[None, :]) & held, 1)
    return (rec.episodes < lanes.next_episode) & ~running


def _writer(rec: Any, mask: jax.Array, episode: jax.Array) -> tuple:
    """Per slot: whether a lane in ``mask`` runs its episode, which, and
    ``put(at)`` writing that lane's value at step ``at`` of each slot."""
    match = (rec.episodes[:, None] == episode[None, :]) & mask[None, :]
    has, lane = jnp.any(match, axis=1), jnp.argmax(match, axis=1)
    slots = jnp.arange(has.shape[0])

    def put(at):
        return lambda b, x: b.at[slots, at].set(x[lane].astype(b.dtype), mode="drop")

    return has, lane, put


def reset(env: Any, config: EngineConfig, rec: Any, lanes: LaneState, begins, obs):
    """Writes the reset of recorded episodes that begin now."""
    has, _, put = _writer(rec, begins, lanes.episode)
    put = put(jnp.where(has, 0, config.record_steps + 1))
    states = None if rec.states is None else jax.vmap(env.render_state)(lanes.env_state)
    return rec.replace(
        observations=jax.tree.map(put, rec.observations, kept_obs(config, obs)),
        states=jax.tree.map(put, rec.states, states),
    )


def step(
    env: Any, config: EngineConfig, rec: Any, lanes: LaneState, obs, states, **values
):
    """Writes step ``lanes.t`` of the recorded episodes running now: per lane
    the observation and env state after it, and ``actions``, ``rewards``,
    ``terminated``, ``truncated``."""
    has, lane, put = _writer(rec, lanes.active, lanes.episode)
    at = jnp.where(has, lanes.t[lane], config.record_steps + 1)
    obs = kept_obs(config, obs)
    states = None if rec.states is None else jax.vmap(env.render_state)(states)
    after = put(at + 1)
    return rec.replace(
        observations=jax.tree.map(after, rec.observations, obs),
        states=jax.tree.map(after, rec.states, states),
        **{k: put(at)(getattr(rec, k), v) for k, v in values.items()},
    )
