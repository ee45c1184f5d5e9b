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


def lanes_of(rec: Any, mask: jax.Array, episode: jax.Array) -> tuple:
    """Per slot: whether a lane in ``mask`` runs its episode, and which."""
    match = (rec.episodes[:, None] == episode[None, :]) & mask[None, :]
    return jnp.any(match, axis=1), jnp.argmax(match, axis=1)


def render_states(env: Any, rec: Any, env_state: Any) -> Any:
    """The lanes' render states (None: not recorded)."""
    if rec.states is None:
        return None
    return jax.vmap(env.render_state)(env_state)


def _put(slots: jax.Array, at: jax.Array, lane: jax.Array):
    """Writes lane ``lane``'s value at step ``at`` of each slot."""
    return lambda b, x: b.at[slots, at].set(x[lane].astype(b.dtype), mode="drop")


def reset(env: Any, config: EngineConfig, rec: Any, lanes: LaneState, begins, obs):
    """Writes the reset of recorded episodes that begin now."""
    has, lane = lanes_of(rec, begins, lanes.episode)
    slots = jnp.arange(has.shape[0])
    put = _put(slots, jnp.where(has, 0, config.record_steps + 1), lane)
    return rec.replace(
        observations=jax.tree.map(put, rec.observations, kept_obs(config, obs)),
        states=jax.tree.map(put, rec.states, render_states(env, rec, lanes.env_state)),
    )


def step(env: Any, config: EngineConfig, rec: Any, lanes: LaneState, **values):
    """Writes step ``lanes.t`` of the recorded episodes running now
    (``values``: per lane ``obs``, ``states``, ``actions``, ``rewards``,
    ``terminated``, ``truncated``)."""
    has, lane = lanes_of(rec, lanes.active, lanes.episode)
    slots = jnp.arange(has.shape[0])
    at = jnp.where(has, lanes.t[lane], config.record_steps + 1)
    obs = kept_obs(config, values.pop("obs"))
    states = render_states(env, rec, values.pop("states"))
    after = _put(slots, at + 1, lane)
    return rec.replace(
        observations=jax.tree.map(after, rec.observations, obs),
        states=jax.tree.map(after, rec.states, states),
        **{k: _put(slots, at, lane)(getattr(rec, k), v) for k, v in values.items()},
    )
