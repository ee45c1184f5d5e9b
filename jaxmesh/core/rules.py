"""The rules of an episode, written once for the scan engine and the host loops
(docs/evaluation.md, "The engine"). Every function is pure and takes the array
namespace first (``xp``: numpy or jax.numpy); none branches on an array's
value but for a numpy shortcut for the usual step. Dtypes come from the
arguments.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from jaxmesh.core import tally


def next_episodes(
    xp: Any, ended: Any, next_episode: Any, budget: Any, rank: Any = None
) -> tuple:
    """Hands the next unstarted episodes to the lanes that ended (CONTRACT 3):
    the k-th ended lane takes episode ``next_episode + k`` if below ``budget``.

    ``rank``: ``cumsum(ended)`` when the caller has it. Returns ``(start,
    episode, next_episode)``: the lanes that start, the episode each starts,
    the new next unstarted episode index.
    """
    ended = xp.asarray(ended, bool)
    if rank is None:
        rank = xp.cumsum(ended, dtype=xp.int32)  # 1 for the first ended lane
    episode = next_episode + rank - 1
    start = ended & (episode < budget)
    taken = rank[-1] if ended.shape[0] else 0  # how many lanes ended
    return start, episode, xp.minimum(next_episode + taken, budget)


def at_cap(xp: Any, length: Any, max_steps: int) -> Any:
    """Whether an episode of ``length`` steps ends truncated (CONTRACT 7)."""
    return xp.asarray(length) >= max_steps


def bad_components(xp: Any, actions: Any, num_actions: int | None) -> tuple[Any, int]:
    """``(bad, kind)``: which components of ``[k, *A]`` actions fail the
    run's checks ([k, prod(A)]), and the fault kind (``num_actions``: the
    discrete action count, None for continuous actions)."""
    flat = xp.reshape(actions, (actions.shape[0], -1))
    if num_actions is not None:
        return (flat < 0) | (flat >= num_actions), tally.ACTION_OUT_OF_RANGE
    return ~xp.isfinite(flat), tally.ACTION_NOT_FINITE


def failing_actions(xp: Any, actions: Any, num_actions: int | None) -> Any:
    """[k] whether each of ``[k, *A]`` actions fails the run's checks."""
    return xp.any(bad_components(xp, actions, num_actions)[0], axis=1)


def action_faults(
    xp: Any, actions: Any, active: Any, num_actions: int | None
) -> tuple[Any, Any]:
    """Per active lane, the fault of its ``[N, *A]`` action: ``(kinds,
    values)``, the fault kind and the first bad component (0: none)."""
    n = actions.shape[0]
    flat = xp.reshape(actions, (n, -1))
    bad, kind = bad_components(xp, flat, num_actions)
    if xp is np and not bad.any():
        return np.zeros(n, np.int32), np.zeros(n, np.float32)
    lane_bad = xp.asarray(active, bool) & xp.any(bad, axis=1)
    first = xp.take_along_axis(flat, xp.argmax(bad, axis=1)[:, None], axis=1)[:, 0]
    kinds = xp.where(lane_bad, kind, tally.NO_FAULT).astype(xp.int32)
    values = xp.where(lane_bad, first.astype(xp.float32), xp.float32(0))
    return kinds, values


def reward_faults(
    xp: Any, rewards: Any, active: Any, kinds: Any = None, values: Any = None
) -> tuple[Any, Any]:
    """Adds the active lanes' non-finite rewards to the step's faults so far
    (``kinds, values``; None: none), a lane's action fault first."""
    n = rewards.shape[0]
    if kinds is None:
        kinds, values = xp.zeros(n, xp.int32), xp.zeros(n, xp.float32)
    finite = xp.isfinite(rewards)
    if xp is np and finite.all():
        return kinds, values
    bad = xp.asarray(active, bool) & (kinds == tally.NO_FAULT) & ~finite
    kinds = xp.where(bad, tally.REWARD_NOT_FINITE, kinds).astype(xp.int32)
    values = xp.where(bad, rewards, values).astype(xp.float32)
    return kinds, values


# Episode metrics, per lane and info key: ``acc`` (a ``tally.REDUCTIONS``
# accumulator) and ``count`` (steps that had the key; None: every step has it).


def begin_metric(
    xp: Any, reduction: str, acc: Any, count: Any, starting: Any
) -> tuple[Any, Any]:
    """``(acc, count)`` where the ``starting`` lanes begin an episode."""
    start = xp.asarray(tally.metric_start(reduction), acc.dtype)
    acc = xp.where(starting, start, acc)
    if count is not None:
        count = xp.where(starting, 0, count).astype(count.dtype)
    return acc, count


def accumulate_metric(
    xp: Any, reduction: str, acc: Any, count: Any, value: Any, present: Any
) -> tuple[Any, Any]:
    """``(acc, count)`` after one step's ``value``, where ``present``."""
    value = xp.asarray(value)
    if reduction == "any":
        new = acc | (value != 0)
    elif reduction == "last":
        new = value.astype(acc.dtype)
    elif reduction == "max":
        new = xp.maximum(acc, value.astype(acc.dtype))
    else:  # sum, mean (divided by the count at the end)
        new = acc + value.astype(acc.dtype)
    acc = xp.where(present, new, acc)
    if count is not None:
        count = (count + present).astype(count.dtype)
    return acc, count


def finalize_metric(xp: Any, reduction: str, acc: Any, count: Any) -> Any:
    """[N] an episode's metric at its end (NaN where no step had the key)."""
    if reduction == "any":
        return acc
    count = xp.asarray(count)
    if reduction == "mean":
        acc = acc / xp.maximum(count, 1).astype(acc.dtype)
    return xp.where(count > 0, acc, xp.asarray(xp.nan, acc.dtype))


def success(xp: Any, last: Any) -> Any:
    """An episode's success from the last value of its success key."""
    return xp.asarray(last) != 0


#: Seeds on which jax's own keys are checked (``checks.MAX_SEED`` last).
_PROBE_SEEDS = (0, 1, 65_539, 2**31 - 1)


@functools.cache
def _keys_are_seed_pairs(impl: str, x64: bool) -> bool:
    """Whether ``jax.random.PRNGKey(s)`` is ``uint32 [0, s]`` here."""
    del impl, x64  # the cache key: a run under another setting checks again
    keys = {s: np.asarray(jax.random.PRNGKey(s)) for s in _PROBE_SEEDS}
    return all(k.dtype == np.uint32 and k.tolist() == [0, s] for s, k in keys.items())


def episode_keys(xp: Any, seeds: Any) -> Any:
    """[k, 2] ``jax.random.PRNGKey(seed)`` for each seed (CONTRACT 5). With
    numpy, built in numpy where they are ``[0, seed]`` pairs (a jax call per
    episode costs about 0.2 ms, more than a CartPole step of 64 lanes)."""
    if xp is not np:
        return jax.vmap(jax.random.PRNGKey)(seeds)
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    config = jax.config
    if _keys_are_seed_pairs(config.jax_default_prng_impl, config.jax_enable_x64):
        out = np.zeros((seeds.size, 2), np.uint32)
        out[:, 1] = seeds
        return out
    return np.stack([np.asarray(jax.random.PRNGKey(int(s))) for s in seeds])
