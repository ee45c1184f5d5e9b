"""The engine's results: one pytree from the device to ``RunResult``.

``Results`` holds, indexed by episode, everything CONTRACT 8 asks of an episode
(``EPISODE_FIELDS``), a ``done`` mask, the run totals, and the first bad value
the run met (``Fault``). The scan engine writes it inside jit, ``make_evaluator``
returns it as it is, and the host builds ``RunResult`` / ``EpisodeResult`` from
it (``jaxmesh/run/results.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

#: The per-episode fields, in the order every report lists them.
EPISODE_FIELDS = (
    "returns",
    "lengths",
    "terminated",
    "truncated",
    "predict_calls",
    "lanes",
)

#: Fault kinds (``Fault.kind``); 0 means no fault.
NO_FAULT, ACTION_OUT_OF_RANGE, ACTION_NOT_FINITE, REWARD_NOT_FINITE = 0, 1, 2, 3
FAULT_NAMES = {
    ACTION_OUT_OF_RANGE: "a discrete action out of range",
    ACTION_NOT_FINITE: "a non-finite (NaN or inf) action",
    REWARD_NOT_FINITE: "a non-finite (NaN or inf) reward from the env",
}


@struct.dataclass
class Fault:
    """Per lane, the first bad value it met (``kind == NO_FAULT``: none).

    ``episode`` and ``step`` locate it (step = 0-based env step of the episode);
    ``value`` is the offending action component or reward. Kept per lane with
    element-wise selects (cheap to compile); ``first`` picks the run's first.
    """

    kind: jax.Array  # [N]
    episode: jax.Array  # [N]
    step: jax.Array  # [N]
    value: jax.Array  # [N]

    def update(self, kinds, values, episode, t) -> Fault:
        """Keeps each lane's first fault; takes the new ones where there is none."""
        new = (self.kind == NO_FAULT) & (kinds != NO_FAULT)
        pick = lambda old, v: jnp.where(new, v.astype(old.dtype), old)
        return Fault(
            pick(self.kind, kinds),
            pick(self.episode, episode),
            pick(self.step, t),
            pick(self.value, values),
        )

    def first(self) -> dict | None:
        """On the host: the fault of the lowest episode index, or None.

        ``evaluate`` stops at the first step with a fault, so every fault it
        reports happened on that step; the lowest episode among them is the
        same whatever the lane count.
        """
        kind = np.asarray(self.kind)
        lanes = np.flatnonzero(kind != NO_FAULT)
        if lanes.size == 0:
            return None
        lane = min(lanes, key=lambda j: (int(self.episode[j]), j))
        return {
            "kind": int(kind[lane]),
            "episode": int(self.episode[lane]),
            "step": int(self.step[lane]),
            "lane": int(lane),
            "value": float(self.value[lane]),
        }


@struct.dataclass
class Results:
    """Per-episode outputs (length = the buffer's capacity) and run totals."""

    returns: jax.Array
    lengths: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    predict_calls: jax.Array
    lanes: jax.Array
    done: jax.Array
    env_steps: jax.Array  # () executed env steps of active lanes
    policy_rows: jax.Array  # () rows the policy computed, padding included
    fault: Fault


#: The smallest result-buffer capacity: every budget up to it shares one program.
MIN_CAPACITY = 4096


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def capacity_for(episodes: int) -> int:
    """Result-buffer capacity for a budget: ``max(4096, next power of two)``.

    Budgets in the same bucket run on the same compiled program (the budget is
    data); 4096 episodes of buffers cost about 100 KB.
    """
    return max(MIN_CAPACITY, pow2_at_least(episodes))


#: Device bytes one episode holds in ``Results`` (its seed included).
BYTES_PER_EPISODE = 4 + 4 + 1 + 1 + 4 + 4 + 1 + 4


def empty(capacity: int, num_envs: int, xp=jnp) -> Results:
    """Zeroed results for ``capacity`` episodes and ``num_envs`` lanes
    (``xp``: jax.numpy or numpy)."""
    f = lambda dtype: xp.zeros((capacity,), dtype)
    i32 = lambda v: xp.asarray(v, xp.int32)
    return Results(
        returns=f(xp.float32),
        lengths=f(xp.int32),
        terminated=f(bool),
        truncated=f(bool),
        predict_calls=f(xp.int32),
        lanes=f(xp.int32),
        done=f(bool),
        env_steps=i32(0),
        policy_rows=i32(0),
        fault=Fault(
            xp.zeros((num_envs,), xp.int32),
            xp.zeros((num_envs,), xp.int32),
            xp.zeros((num_envs,), xp.int32),
            xp.zeros((num_envs,), xp.float32),
        ),
    )


def record(results: Results, index: jax.Array, **values: jax.Array) -> Results:
    """Writes per-lane ``values`` at episode ``index`` (out of range: dropped)."""
    put = lambda arr, v: arr.at[index].set(v.astype(arr.dtype), mode="drop")
    updates = {name: put(getattr(results, name), values[name]) for name in values}
    return results.replace(**updates)


__all__ = [
    "EPISODE_FIELDS",
    "Fault",
    "Results",
    "empty",
    "capacity_for",
    "record",
    "FAULT_NAMES",
]
