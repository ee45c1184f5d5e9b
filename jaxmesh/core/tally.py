"""The engine's results (``Results``): per episode what CONTRACT 8 asks, the
run totals, the first bad value (``Fault``), metrics and success flags;
docs/evaluation.md ("The engine").
"""

from __future__ import annotations

from typing import Any

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

#: How an info leaf is reduced over an episode's steps (``mean``: sum / steps;
#: ``any``: a step had a non-zero value).
REDUCTIONS = ("last", "sum", "max", "mean", "any")


def metric_dtype(reduction: str) -> Any:
    """The per-episode dtype of a reduction: bool for ``any``, else float32."""
    return bool if reduction == "any" else np.float32


def metric_start(reduction: str) -> Any:
    """The accumulator's value before an episode's first step."""
    return {"any": False, "max": -np.inf, "last": np.nan}.get(reduction, 0.0)


def info_leaves(info: Any, prefix: str = "") -> dict[str, Any]:
    """An env's info as flat ``name -> leaf`` (nested names joined by ``/``)."""
    out: dict[str, Any] = {}
    for k, v in info.items() if hasattr(info, "items") else ():
        if hasattr(v, "items"):
            out.update(info_leaves(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


#: Fault kinds (``Fault.kind``); 0 means no fault.
NO_FAULT, ACTION_OUT_OF_RANGE, ACTION_NOT_FINITE, REWARD_NOT_FINITE = 0, 1, 2, 3
FAULT_NAMES = {
    ACTION_OUT_OF_RANGE: "a discrete action out of range",
    ACTION_NOT_FINITE: "a non-finite (NaN or inf) action",
    REWARD_NOT_FINITE: "a non-finite (NaN or inf) reward from the env",
}


@struct.dataclass
class Fault:
    """Per lane, the first bad value (an action component or reward) met, at
    ``step`` of ``episode`` (``kind == NO_FAULT``: none)."""

    kind: jax.Array  # [N]
    episode: jax.Array  # [N]
    step: jax.Array  # [N]
    value: jax.Array  # [N]

    def update(self, kinds, values, episode, t) -> Fault:
        """Keeps each lane's first fault."""
        new = (self.kind == NO_FAULT) & (kinds != NO_FAULT)
        pick = lambda old, v: jnp.where(new, v.astype(old.dtype), old)
        return jax.tree.map(pick, self, Fault(kinds, episode, t, values))

    def first(self) -> dict | None:
        """On the host: the fault of the lowest episode index, or None."""
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
class Recording:
    """Step-by-step buffers of the recorded episodes (``jaxmesh.Record``):
    slot r holds episode ``episodes[r]``, step t at ``[r, t]``, the observation
    after it at ``[r, t + 1]``; steps past ``T`` (``max_steps``) are dropped.
    """

    episodes: Any  # [R] int32 episode index of each slot
    observations: Any  # pytree of [R, T + 1, ...]
    actions: Any  # [R, T, *action_shape]
    rewards: Any  # [R, T] float32
    terminated: Any  # [R, T] bool
    truncated: Any  # [R, T] bool
    #: Host-stepped gymnasium runs: per slot, ``env.render()`` frames.
    frames: Any = None
    #: The env's render state (``Record.states``), kept as the observations.
    states: Any = None


def empty_recording(
    episodes: Any,
    max_steps: int,
    obs: Any,
    action_shape: tuple,
    action_dtype: Any,
    xp=jnp,
    states: Any = None,
) -> Recording:
    """Zeroed recording buffers for ``episodes`` ([R]), ``max_steps`` steps
    each, shaped after one observation, render state (None: none) and action."""
    r = len(episodes)
    z = lambda shape, dtype: xp.zeros((r,) + tuple(shape), dtype)
    steps = lambda x: z((max_steps + 1,) + tuple(x.shape), x.dtype)
    return Recording(
        episodes=xp.asarray(np.asarray(episodes, np.int32)),
        observations=jax.tree.map(steps, obs),
        actions=z((max_steps,) + tuple(action_shape), action_dtype),
        rewards=z((max_steps,), np.float32),
        terminated=z((max_steps,), bool),
        truncated=z((max_steps,), bool),
        states=None if states is None else jax.tree.map(steps, states),
    )


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
    #: name -> [capacity] per-episode metric.
    metrics: dict = struct.field(default_factory=dict)
    #: [capacity] bool each (None: not tracked): the success key's last value
    #: was non-zero; the episode had the signal (None: every episode has it);
    #: it was non-zero at any step; in the reset's info; the reset had it.
    success: Any = None
    has_success: Any = None
    success_once: Any = None
    success_at_reset: Any = None
    has_success_at_reset: Any = None
    #: The recorded episodes' steps (``jaxmesh.Record``; None: none recorded).
    recording: Any = None
    #: A segment's log: the episode each row holds, and the rows written.
    #: None: entry i is episode i.
    index: Any = None
    rows: Any = None


#: The ``Results`` fields of the success signal (None when none is tracked).
SUCCESS_FIELDS = (
    "success",
    "has_success",
    "success_once",
    "success_at_reset",
    "has_success_at_reset",
)


#: The smallest result-buffer capacity: every budget up to it shares one program.
MIN_CAPACITY = 4096


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def capacity_for(episodes: int) -> int:
    """Result-buffer capacity for a budget (4096 episodes cost about 100 KB)."""
    return max(MIN_CAPACITY, pow2_at_least(episodes))


#: A segment's log holds this many rows per lane, and at least
#: ``MIN_LOG_ROWS``: a segment stops early only when its lanes end episodes of
#: under ``segment_steps / 32`` steps on average.
LOG_ROWS_PER_LANE = 32
MIN_LOG_ROWS = 1024


def log_capacity(lanes: int) -> int:
    """Rows of a segment's log (never sized by the budget)."""
    return max(MIN_LOG_ROWS, pow2_at_least(LOG_ROWS_PER_LANE * lanes))


#: Device bytes one episode holds in ``Results`` (its seed included).
BYTES_PER_EPISODE = 4 + 4 + 1 + 1 + 4 + 4 + 1 + 4


def empty(
    capacity: int,
    num_envs: int,
    xp=jnp,
    metrics: tuple[tuple[str, str], ...] = (),
    success: bool = False,
    has_success: bool = True,
    at_reset: bool = False,
    log: bool = False,
) -> Results:
    """Zeroed results for ``capacity`` episodes and ``num_envs`` lanes, with
    the metric and success buffers asked for, or as a segment's ``log``."""
    f = lambda dtype: xp.zeros((capacity,), dtype)
    i32 = lambda v: xp.asarray(v, xp.int32)
    dtypes = (xp.float32, xp.int32, bool, bool, xp.int32, xp.int32)
    return Results(
        index=f(xp.int32) if log else None,
        rows=i32(0) if log else None,
        **{k: f(d) for k, d in zip(EPISODE_FIELDS, dtypes, strict=True)},
        done=f(bool),
        env_steps=i32(0),
        policy_rows=i32(0),
        fault=Fault(*(xp.zeros((num_envs,), d) for d in [xp.int32] * 3 + [xp.float32])),
        metrics={name: f(metric_dtype(red)) for name, red in metrics},
        success=f(bool) if success else None,
        has_success=f(bool) if success and has_success else None,
        success_once=f(bool) if success else None,
        success_at_reset=f(bool) if success and at_reset else None,
        has_success_at_reset=f(bool) if success and at_reset and has_success else None,
    )


def record(results: Results, at: jax.Array, **values: jax.Array) -> Results:
    """Writes per-lane ``values`` at entry ``at`` (out of range: dropped)."""
    put = lambda arr, v: arr.at[at].set(v.astype(arr.dtype), mode="drop")
    updates = {}
    for name, v in values.items():
        if name == "metrics":
            updates[name] = {k: put(results.metrics[k], v[k]) for k in results.metrics}
        else:
            updates[name] = put(getattr(results, name), v)
    return results.replace(**updates)


def per_episode(res: Results) -> dict[str, Any]:
    """The per-episode buffers by name (a metric as ``metrics/<name>``)."""
    out = {f: getattr(res, f) for f in EPISODE_FIELDS + ("done",)}
    out.update({f"metrics/{k}": v for k, v in res.metrics.items()})
    out.update({f: getattr(res, f) for f in SUCCESS_FIELDS})
    return {k: v for k, v in out.items() if v is not None}


def book(log: Results, episodes: int) -> Results:
    """Zero host results for ``episodes``, shaped after a segment's ``log``."""
    zero = {
        k: np.zeros((episodes,), np.asarray(v).dtype)
        for k, v in per_episode(log).items()
    }
    return replace_per_episode(log, zero).replace(index=None, rows=None)


def replace_per_episode(res: Results, fields: dict[str, Any]) -> Results:
    """``res`` with the ``per_episode`` buffers named in ``fields`` replaced."""
    metrics = {k: fields.get(f"metrics/{k}", v) for k, v in res.metrics.items()}
    plain = {k: v for k, v in fields.items() if not k.startswith("metrics/")}
    return res.replace(metrics=metrics, **plain)


def write(host: Results, log: Results) -> Results:
    """Copies a segment's host ``log`` and totals into ``host`` (``book``)."""
    n = int(log.rows)
    at = np.asarray(log.index)[:n]
    into = per_episode(host)
    for k, v in per_episode(log).items():
        into[k][at] = np.asarray(v)[:n]
    return host.replace(
        env_steps=log.env_steps,
        policy_rows=log.policy_rows,
        fault=log.fault,
        recording=log.recording,
    )
