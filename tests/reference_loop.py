"""An independent reference for the evaluation contract: one episode at a time.

A plain Python loop over an env's own functions, written from CONTRACT.md and
not from the engine: chunk m of an episode covers steps [m*h, (m+1)*h); chunk 0
is planned from the reset observation, chunk m >= 1 from the observation of step
``m*h - l`` (l = min(L, h); l = 0 is synchronous). A chunk counts as a plan if
it was planned before the episode ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class Episode:
    ret: float
    length: int
    terminated: bool
    truncated: bool
    calls: int
    actions: list


def fold(key, stream, t):
    return jax.random.fold_in(jax.random.fold_in(key, stream), t)


def run_episode(
    reset: Callable,
    step: Callable,
    policy: Callable[[Any, Any], Any],
    seed: int,
    *,
    horizon: int = 1,
    lead: int = 0,
    cap: int = 100_000,
    inputs: Callable[[list, list, int], Any] | None = None,
) -> Episode:
    """Runs one episode.

    Args:
      reset: ``key -> (obs, state)``.
      step: ``(key, state, action) -> (obs, state, reward, terminated, truncated)``.
      policy: ``(inputs, key) -> chunk`` of shape (K, ...) (wrap single actions).
      inputs: ``(obs_history, action_history, t) -> policy input``; default: the
        current observation.
    """
    key = jax.random.PRNGKey(seed)
    obs, state = reset(key)
    observations = [obs]
    actions: list = []
    see = inputs or (lambda obs_h, act_h, t: obs_h[t])
    chunks: dict[int, Any] = {}
    calls = 0
    ret = 0.0
    t = 0
    k = None
    h = None
    while True:
        m = t // h if h else 0
        if m not in chunks:
            if m == 0:
                plan_t, stream = 0, 1
            else:
                plan_t = m * h - min(lead, h)
                stream = 2 if min(lead, h) > 0 else 1
            chunks[m] = np.asarray(
                policy(see(observations, actions, plan_t), fold(key, stream, plan_t))
            )
            calls += 1
            if h is None:
                k = chunks[0].shape[0]
                h = min(horizon, k)
        # A prefetch plan made at step t for a chunk that would start later counts
        # as a plan even if the episode ends before that chunk plays.
        lead_h = min(lead, h)
        if lead_h > 0:
            nxt = t // h + 1
            if nxt * h - lead_h == t and nxt not in chunks:
                chunks[nxt] = np.asarray(
                    policy(see(observations, actions, t), fold(key, 2, t))
                )
                calls += 1
        action = chunks[t // h][t % h]
        obs, state, reward, term, trunc = step(fold(key, 0, t), state, action)
        actions.append(action)
        observations.append(obs)
        ret += float(reward)
        t += 1
        trunc = bool(trunc) or t >= cap
        if bool(term) or trunc:
            return Episode(ret, t, bool(term), trunc, calls, actions)


def gymnax_fns(env, params):
    """(reset, step) over gymnax's own reset_env / step_env / is_truncated."""
    reset = jax.jit(lambda key: env.reset_env(key, params))

    @jax.jit
    def step(key, state, action):
        obs, state, reward, term, _ = env.step_env(key, state, action, params)
        return obs, state, reward, term, env.is_truncated(state, params)

    return reset, step


def single(fn):
    """A single-action policy as a chunk of one."""
    return lambda x, key: jnp.asarray(fn(x, key))[None]


def assert_matches(result, refs: list[Episode]) -> None:
    """Every per-episode field of a RunResult equals the reference episodes."""
    np.testing.assert_array_equal(result.returns, [r.ret for r in refs])
    np.testing.assert_array_equal(result.lengths, [r.length for r in refs])
    np.testing.assert_array_equal(result.terminated, [r.terminated for r in refs])
    np.testing.assert_array_equal(result.truncated, [r.truncated for r in refs])
    np.testing.assert_array_equal(result.predict_calls, [r.calls for r in refs])
