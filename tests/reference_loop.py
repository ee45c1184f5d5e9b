"""An independent reference for the evaluation contract: one episode at a time.

A plain Python loop over an env's own functions, written from the contract
(docs/contract.md) and not from the engine: chunk m of an episode covers steps
[m*h, (m+1)*h); chunk 0 is planned from the reset observation, chunk m >= 1 from
the observation of step ``m*h - l`` (l = min(L, h); l = 0 is synchronous). A
chunk counts as a plan if it was planned before the episode ended.

Also here: ``schedule``, which lane runs each episode and from which step
(CONTRACT 3, from the episodes' lengths alone), and ``NanRewardAt``, a small
env of jaxmesh's own protocol whose reward turns NaN at a given step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
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
    #: the observation after each step, the reset observation first
    #: (``observations[t]`` is what the policy sees at step t).
    observations: list = dataclasses.field(default_factory=list)


@jax.jit
def _fold(key, stream, t):
    return jax.random.fold_in(jax.random.fold_in(key, stream), t)


def fold(key, stream, t):
    """``fold_in(fold_in(key, stream), t)``: the key of a stream at step t."""
    return _fold(key, jnp.uint32(stream), jnp.uint32(t))


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
            return Episode(ret, t, bool(term), trunc, calls, actions, observations)


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


def assert_matches(result, refs: list[Episode], *, rtol: float = 0.0) -> None:
    """Every per-episode field of a result equals the reference episodes.

    Works for a ``RunResult`` and for ``make_evaluator``'s ``Results``. Returns
    are compared exactly unless ``rtol`` is given (float rewards: the engine sums
    in float32, the reference in float64).
    """
    returns = [r.ret for r in refs]
    if rtol:
        np.testing.assert_allclose(result.returns, returns, rtol=rtol)
    else:
        np.testing.assert_array_equal(result.returns, returns)
    np.testing.assert_array_equal(result.lengths, [r.length for r in refs])
    np.testing.assert_array_equal(result.terminated, [r.terminated for r in refs])
    np.testing.assert_array_equal(result.truncated, [r.truncated for r in refs])
    np.testing.assert_array_equal(result.predict_calls, [r.calls for r in refs])


def schedule(lengths: Sequence[int], num_envs: int) -> tuple[list[int], list[int]]:
    """Which lane runs each episode and at which run step it starts (CONTRACT 3).

    Lane j starts episode j at step 0; a lane whose episode's last step is
    ``s`` starts the next unstarted episode at step ``s + 1`` (ties: ascending
    lane order). Episode i then ends with run step ``start[i] + lengths[i] - 1``.

    Returns:
      (lanes, starts), one entry per episode.
    """
    e = len(lengths)
    lanes, starts = [0] * e, [0] * e
    free_at = {}  # lane -> the run step at which it is free
    for j in range(min(num_envs, e)):
        lanes[j], starts[j], free_at[j] = j, 0, lengths[j]
    nxt = min(num_envs, e)
    while nxt < e:
        t = min(free_at.values())
        for j in sorted(j for j, f in free_at.items() if f == t):
            if nxt < e:
                lanes[nxt], starts[nxt], free_at[j] = j, t, t + lengths[nxt]
                nxt += 1
            else:
                del free_at[j]
    return lanes, starts


def first_hit(refs: list[Episode], cond: Callable[[Any], bool]) -> tuple[int, int]:
    """The first (episode, step), in episode order, whose observation meets ``cond``.

    ``cond`` is tried on the observation the policy sees at each executed step
    (the last observation, after the episode's end, is not seen).
    """
    for i, ep in enumerate(refs):
        for t in range(ep.length):
            if cond(np.asarray(ep.observations[t])):
                return i, t
    raise AssertionError("the condition never holds on these episodes")


@dataclasses.dataclass(eq=False)
class NanRewardAt:
    """A jaxmesh-protocol env whose reward is NaN on episode step ``k``.

    Wraps another jaxmesh env (``jaxmesh.make_env(...)`` of a gymnax env, whose
    state counts steps in ``state.time``); every other value is the wrapped
    env's own.
    """

    base: Any
    k: int

    def __post_init__(self):
        self.name = f"{self.base.name} (NaN reward at step {self.k})"
        self.action_shape = self.base.action_shape
        self.action_dtype = self.base.action_dtype
        self.num_actions = self.base.num_actions

    def reset(self, key):
        return self.base.reset(key)

    def step(self, key, state, action):
        obs, new, reward, term, trunc = self.base.step(key, state, action)
        reward = jnp.where(state.time == self.k, jnp.nan, reward)
        return obs, new, reward, term, trunc
