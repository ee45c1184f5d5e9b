"""The scan engine: lane bookkeeping around the agent step and a JAX env.

One jitted ``step`` covers, for all N lanes at once: plan (compacted tiles) and
chunk replay (``agent.act``), the env step, frame windows (``agent.observe``),
episode accounting (returns, lengths, ends, results written at the episode's
index), handing the next unstarted episode to lanes that finished (ascending
lane order) and resetting them, and masking lanes with nothing left to start.

``Engine.run_segment`` advances up to S steps (a ``while_loop`` that stops as soon
as the budget is done); ``Engine.run`` runs to the end and is the pure function
behind ``make_evaluator``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxmesh.core import agent, tiles
from jaxmesh.core.policy import Policy

#: Built-in bound on an episode's length when no cap is given (CONTRACT 7).
DEFAULT_MAX_STEPS = 100_000


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    episodes: int
    max_steps: int
    agent: agent.AgentConfig


@struct.dataclass
class Results:
    """Per-episode outputs, indexed by episode (length E)."""

    returns: jax.Array
    lengths: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    predict_calls: jax.Array
    lane: jax.Array
    done: jax.Array


@struct.dataclass
class Lanes:
    episode: jax.Array  # [N] episode index run by each lane (E when masked)
    active: jax.Array  # [N] lane runs an episode
    t: jax.Array  # [N] steps done in the current episode
    ret: jax.Array  # [N] return so far
    key: jax.Array  # [N, 2] PRNGKey(seed) of the current episode
    env_key: jax.Array  # [N, 2] fold_in(key, STREAM_ENV), cached per episode
    env_state: Any
    seeds: jax.Array  # [E]
    next_episode: jax.Array  # () next unstarted episode index
    n_done: jax.Array  # () episodes ended
    env_steps: jax.Array  # () executed env steps of active lanes
    results: Results


@struct.dataclass
class Carry:
    lanes: Lanes
    agent: agent.AgentState


def _where(mask, a, b):
    return agent._where(mask, a, b)


def episode_keys(seeds: jax.Array) -> jax.Array:
    """``jax.random.PRNGKey(seed)`` for each seed (CONTRACT 5)."""
    return jax.vmap(jax.random.PRNGKey)(seeds)


def env_stream(keys: jax.Array) -> jax.Array:
    """The per-episode base of env-step keys: ``fold_in(key, STREAM_ENV)``."""
    return jax.vmap(lambda k: jax.random.fold_in(k, agent.STREAM_ENV))(keys)


#: Lanes reset per call of the env's reset: only lanes that start an episode
#: are reset, gathered in tiles of this many (a size independent of N).
RESET_TILE = 32


class Engine:
    """The jitted engine for one (policy, env, configuration).

    Args:
      policy: the resolved policy.
      env: a jaxmesh single-lane env.
      config: static configuration.
    """

    def __init__(self, policy: Policy, env: Any, config: EngineConfig):
        self.policy = policy
        self.env = env
        self.config = config
        self.init = jax.jit(self._init)
        self.run_segment = jax.jit(
            self._run_segment, static_argnums=(2,), donate_argnums=(1,)
        )

    # Pure functions -----------------------------------------------------------
    def _init(self, params: Any, seeds: jax.Array) -> Carry:
        cfg = self.config
        n, e = cfg.agent.num_envs, cfg.episodes
        lane_ids = jnp.arange(n, dtype=jnp.int32)
        active = lane_ids < e
        keys = episode_keys(seeds[jnp.minimum(lane_ids, e - 1)])
        obs, env_state = jax.vmap(self.env.reset)(keys)
        zf = jnp.zeros((e,), jnp.float32)
        zi = jnp.zeros((e,), jnp.int32)
        zb = jnp.zeros((e,), bool)
        lanes = Lanes(
            episode=jnp.where(active, lane_ids, e),
            active=active,
            t=jnp.zeros((n,), jnp.int32),
            ret=jnp.zeros((n,), jnp.float32),
            key=keys,
            env_key=env_stream(keys),
            env_state=env_state,
            seeds=seeds,
            next_episode=jnp.int32(min(n, e)),
            n_done=jnp.int32(0),
            env_steps=jnp.int32(0),
            results=Results(zf, zi, zb, zb, zi, zi, zb),
        )
        ag = agent.init(cfg.agent, self.policy, obs, active)
        return Carry(lanes, ag)

    def step(self, params: Any, carry: Carry) -> Carry:
        """One env step for every active lane, with all the bookkeeping."""
        cfg = self.config
        e = cfg.episodes
        lanes, ag = carry.lanes, carry.agent
        active = lanes.active
        ag, action = agent.act(
            cfg.agent, self.policy, params, ag, active, lanes.key, lanes.t
        )
        env_keys = jax.vmap(jax.random.fold_in)(lanes.env_key, lanes.t)
        obs, env_state, reward, term, trunc = jax.vmap(self.env.step)(
            env_keys, lanes.env_state, action
        )
        ag = agent.observe(cfg.agent, ag, obs)
        t = lanes.t + 1
        ret = lanes.ret + jnp.asarray(reward, jnp.float32)
        trunc = trunc | (t >= cfg.max_steps)
        ended = active & (term | trunc)

        # Results are written at the episode's own index; others drop.
        idx = jnp.where(ended, lanes.episode, e)
        r = lanes.results
        put = lambda arr, v: arr.at[idx].set(v, mode="drop")
        results = Results(
            returns=put(r.returns, ret),
            lengths=put(r.lengths, t),
            terminated=put(r.terminated, term),
            truncated=put(r.truncated, trunc),
            predict_calls=put(r.predict_calls, ag.calls),
            lane=put(r.lane, jnp.arange(cfg.agent.num_envs, dtype=jnp.int32)),
            done=put(r.done, True),
        )

        # Finished lanes take the next unstarted episodes in ascending lane order.
        n_ended = jnp.sum(ended, dtype=jnp.int32)
        new_ep = lanes.next_episode + jnp.cumsum(ended, dtype=jnp.int32) - 1
        start = ended & (new_ep < e)
        episode = jnp.where(ended, jnp.where(start, new_ep, e), lanes.episode)

        def reset(args):
            key, env_key, env_state, obs, ag = args

            def body(idx, c):
                key, env_key, env_state, obs = c
                seeds = lanes.seeds[jnp.clip(tiles.take(new_ep, idx), 0, e - 1)]
                k = episode_keys(seeds)
                obs0, state0 = jax.vmap(self.env.reset)(k)
                at = lambda x, v: tiles.put(x, idx, v)
                return (
                    at(key, k),
                    at(env_key, env_stream(k)),
                    jax.tree.map(at, env_state, state0),
                    jax.tree.map(at, obs, obs0),
                )

            (key, env_key, env_state, obs), _ = tiles.for_each_tile(
                start, RESET_TILE, body, (key, env_key, env_state, obs)
            )
            ag = agent.begin(cfg.agent, self.policy, ag, start, obs)
            return key, env_key, env_state, obs, ag

        key, env_key, env_state, obs, ag = jax.lax.cond(
            jnp.any(start),
            reset,
            lambda args: args,
            (lanes.key, lanes.env_key, env_state, obs, ag),
        )
        lanes = lanes.replace(
            episode=episode,
            active=jnp.where(ended, start, active),
            t=jnp.where(ended, 0, t),
            ret=jnp.where(ended, 0.0, ret),
            key=key,
            env_key=env_key,
            env_state=env_state,
            next_episode=jnp.minimum(lanes.next_episode + n_ended, e),
            n_done=lanes.n_done + n_ended,
            env_steps=lanes.env_steps + jnp.sum(active, dtype=jnp.int32),
            results=results,
        )
        return Carry(lanes, ag)

    def _run_segment(self, params: Any, carry: Carry, max_steps: int) -> Carry:
        e = self.config.episodes

        def cond(c):
            i, carry = c
            return (i < max_steps) & (carry.lanes.n_done < e)

        def body(c):
            i, carry = c
            return i + 1, self.step(params, carry)

        _, carry = jax.lax.while_loop(cond, body, (jnp.int32(0), carry))
        return carry

    def run(self, params: Any, seeds: jax.Array) -> Carry:
        """Runs the whole budget (pure; jit or vmap it)."""
        e = self.config.episodes
        carry = self._init(params, seeds)
        return jax.lax.while_loop(
            lambda c: c.lanes.n_done < e, lambda c: self.step(params, c), carry
        )
