"""Checks before anything is traced: budgets and seeds (CONTRACT 1), settings,
and whether a budget's per-episode buffers fit in memory."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmesh.core.carry import DEFAULT_MAX_STEPS
from jaxmesh.core.tally import BYTES_PER_EPISODE, REDUCTIONS, capacity_for
from jaxmesh.envs.names import did_you_mean
from jaxmesh.execution import checked_execution

#: Seeds, episode lengths, step indices and a segment's steps are int32.
MAX_SEED = MAX_STEPS = 2**31 - 1
#: Env steps per scan segment between two host visits.
DEFAULT_SEGMENT_STEPS = 256
#: Host bytes per episode of a ``RunResult`` (returns, lengths, seeds as int64,
#: terminated, truncated, predict_calls, lanes) plus the copy read off the device.
HOST_BYTES_PER_EPISODE = 4 + 4 + 8 + 1 + 1 + 4 + 4 + BYTES_PER_EPISODE
#: Share of free memory a budget's per-episode buffers may take.
MEMORY_SHARE = 0.5


def changed(obj: Any) -> list[str]:
    """The fields of a dataclass not at their defaults (objects by identity)."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        plain = isinstance(value, bool | int | float | str)
        if not (value is f.default or (plain and value == f.default)):
            out.append(f.name)
    return out


def check_int(
    name: str, value: Any, low: int, hint: str, high: int | None = None
) -> int:
    """``value`` as an int in [``low``, ``high``], else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={value!r}: expected an int >= {low}; {hint}")
    if value < low:
        raise ValueError(f"{name}={value!r}: expected an int >= {low}; {hint}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value!r}: expected at most {high:,}; {hint}")
    return int(value)


def check_trial_index_base(value: Any) -> int:
    return check_int(
        "trial_index_base",
        value,
        0,
        "episode i is trial trial_index_base + i (a host-stepped env's trial_index "
        "reset option; a JAX env's initial_states= entry or reset_fn= trial)",
    )


#: The most rows one policy call may plan (a tile beyond the lanes is padding).
MAX_PLAN_TILE = 2**20


def free_memory(device: Any = None) -> tuple[int | None, int | None]:
    """(device bytes free, host bytes free); None where unknown (a CPU device)."""
    dev = host = None
    with contextlib.suppress(ValueError, OSError, AttributeError):  # not POSIX
        host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(Exception):  # a backend without memory stats
        stats = (device or jax.local_devices()[0]).memory_stats() or {}
        if "bytes_limit" in stats:
            dev = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return dev, host


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, and exactly."""
    units = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
    for unit, size in units:
        if n >= size:
            return f"{n / size:.2f} {unit} ({int(n):,} B)"
    return f"{int(n):,} B"


def check_budget_fits(episodes: int, capacity: int, device: Any = None) -> None:
    """Refuses a budget whose buffers (``capacity``: the device's) cannot fit."""
    dev_free, host_free = free_memory(device)
    dev_need = capacity * BYTES_PER_EPISODE
    host_need = episodes * HOST_BYTES_PER_EPISODE
    if dev_free is None:  # a CPU device: its buffers are host memory too
        host_need += dev_need
    for where, need, free in (
        ("device", dev_need, dev_free),
        ("host", host_need, host_free),
    ):
        if free is not None and need > MEMORY_SHARE * free:
            fits = int(MEMORY_SHARE * free / max(need / max(episodes, 1), 1))
            raise ValueError(
                f"episodes={episodes:,}: the per-episode results would need "
                f"{human_bytes(need)} of {where} memory, more than half of the "
                f"{human_bytes(free)} free. Use a smaller budget (at most about "
                f"{fits:,} episodes here), or split it into runs "
                "(seeds=range(a, b)) and stream each run's episodes to an "
                "on_episode_end hook or a file"
            )


def resolve_budget(
    episodes: Any, seeds: Any, device: Any = None, device_buffers: bool = False
) -> np.ndarray:
    """The run's seeds (CONTRACT 1), int32, once they (and ``device_buffers``)
    fit in memory."""
    if episodes is not None:
        episodes = check_int("episodes", episodes, 0, "the number of episodes to score")
    if seeds is not None and (
        isinstance(seeds, str | bytes)
        or not isinstance(seeds, Sequence | np.ndarray | jax.Array | range)
    ):
        raise TypeError(
            f"seeds={seeds!r}: expected a sequence of ints, one per episode"
        )
    n = len(seeds) if seeds is not None else 1 if episodes is None else episodes
    check_budget_fits(n, capacity_for(n) if device_buffers else 0, device)
    if seeds is None:
        return np.arange(n, dtype=np.int32)
    arr = np.asarray(seeds)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(
            f"seeds must be a 1-D sequence of ints, got dtype {arr.dtype} shape "
            f"{arr.shape}; pass e.g. seeds=range(100)"
        )
    if arr.size and (arr.min() < 0 or arr.max() > MAX_SEED):
        raise ValueError(
            f"seeds must lie in [0, {MAX_SEED}] (jax.random.PRNGKey on int32), got "
            f"min {arr.min()} max {arr.max()}"
        )
    if episodes is not None and episodes != arr.size:
        raise ValueError(
            f"episodes={episodes} disagrees with len(seeds)={arr.size}; give one of "
            "them, or make them agree"
        )
    return arr.astype(np.int32)


class Settings(NamedTuple):
    """A run's checked settings (everything but the budget and the policy)."""

    num_envs: int
    horizon: int
    prefetch_lead: int
    max_steps: int
    plan_tile: int | None
    segment_steps: int
    delay: int = 0
    execution: Any = None
    #: None: the delay was given in steps (``resolve_delay_ms`` sets ``delay``).
    delay_ms: float | None = None
    #: A sweep's cells, each ``(h, d)``. None: one setting.
    grid: tuple[tuple[int, int], ...] | None = None
    cell_episodes: int = 0


def check_settings(
    num_envs: Any,
    horizon: Any,
    prefetch_lead: Any,
    max_episode_steps: Any,
    plan_tile: Any,
    delay: Any = 0,
) -> Settings:
    """Checks an agent's settings (``RunConfig`` runs the same checks in parts)."""
    n, h, cap = check_flat(num_envs, horizon, max_episode_steps)
    lead, *chunking = check_chunking(prefetch_lead, delay, None, None)
    layout = check_layout(plan_tile, DEFAULT_SEGMENT_STEPS)
    return settings_of(n, h, lead, cap, *layout, *chunking)


def check_flat(num_envs: Any, horizon: Any, max_episode_steps: Any) -> tuple:
    """``RunConfig``'s own knobs: ``(num_envs, horizon, step cap)``."""
    num_envs = check_int("num_envs", num_envs, 1, "the number of parallel lanes")
    horizon = check_int(
        "horizon", horizon, 1, "actions of a chunk executed before the next plan"
    )
    cap = DEFAULT_MAX_STEPS
    if max_episode_steps is not None:
        cap = check_int(
            "max_episode_steps",
            max_episode_steps,
            1,
            "episode lengths are int32 on the device; or None for the built-in "
            f"limit of {DEFAULT_MAX_STEPS:,} steps",
            MAX_STEPS,
        )
    return num_envs, horizon, cap


def check_chunking(
    prefetch_lead: Any, delay: Any, execution: Any, delay_ms: Any
) -> tuple:
    """``Chunking``'s ``(lead, delay, execution, delay_ms)``, checked together."""
    lead = check_int(
        "prefetch_lead", prefetch_lead, 0, "0 is synchronous; L > 0 plans L steps early"
    )
    delay = check_int(
        "delay", delay, 0, "steps between a plan's observation and its chunk's start"
    )
    execution = checked_execution(execution)
    delay_ms = check_delay_ms(delay_ms, delay)
    if delay_ms is not None and (lead or execution is not None):
        raise ValueError(
            f"delay_ms={delay_ms:g} with prefetch_lead={lead}, execution="
            f"{execution!r}: a delay replays chunks planned before they play; "
            "drop prefetch_lead= and execution=, or delay_ms="
        )
    if delay and lead:
        raise ValueError(
            f"delay={delay} with prefetch_lead={lead}: both say when the next chunk "
            "is planned (a lead plays it from its first action, a delay skips the "
            "delay's stale actions); give one of them"
        )
    _check_ensemble(execution, 1, delay, lead)
    return lead, delay, execution, delay_ms


def check_layout(plan_tile: Any, segment_steps: Any) -> tuple:
    """``Layout``'s ``(plan_tile, segment_steps)``."""
    tile = None
    if plan_tile is not None:
        tile = check_int(
            "plan_tile",
            plan_tile,
            1,
            "rows per policy call (rows beyond the lanes that plan are padding), "
            "or None for the engine's choice",
            MAX_PLAN_TILE,
        )
    segment_steps = check_int(
        "segment_steps",
        segment_steps,
        1,
        "env steps per scan segment, counted in int32 on the device; the default "
        f"{DEFAULT_SEGMENT_STEPS} serves (a segment also ends early when its "
        "episode log fills, so larger values gain little)",
        MAX_STEPS,
    )
    return tile, segment_steps


def _check_ensemble(execution: Any, horizon: int, delay: int, lead: int) -> None:
    if execution is not None and (delay or lead or horizon != 1):
        raise ValueError(
            f"execution={execution!r} with horizon={horizon}, delay={delay}, "
            f"prefetch_lead={lead}: ensembling plans a chunk every step and "
            "averages the chunks that cover it; drop horizon=, delay= and "
            "prefetch_lead="
        )


def settings_of(*values: Any) -> Settings:
    """``Settings(*values)`` of values each checked, checked together."""
    s = Settings(*values)
    _check_ensemble(s.execution, s.horizon, s.delay, s.prefetch_lead)
    return s


def check_number(
    name: str,
    value: Any,
    hint: str,
    *,
    zero: bool = False,
    optional: bool = True,
    keep_int: bool = False,
) -> Any:
    """``value`` as a finite float > 0 (>= 0 with ``zero``, an int ``keep_int``)."""
    if value is None and optional:
        return None
    bound = ">= 0" if zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r}: expected a number {bound}; {hint}")
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise ValueError(f"{name}={value!r}: expected a finite number {bound}; {hint}")
    return value if keep_int and isinstance(value, int) else float(value)


def check_delay_ms(delay_ms: Any, delay: int = 0) -> float | None:
    """``delay_ms`` as a float >= 0, or None; not with ``delay``."""
    value = check_number(
        "delay_ms",
        delay_ms,
        "milliseconds of inference time, turned into steps by the env's dt (0: "
        "no delay), or None",
        zero=True,
    )
    if value is not None and delay:
        raise ValueError(
            f"delay={delay} with delay_ms={delay_ms!r}: give the delay once, in "
            "steps (delay=) or in milliseconds (delay_ms=)"
        )
    return value


def delay_steps(delay_ms: float, dt: float | None, env: str) -> int:
    """``ceil(delay_ms / (1000 * dt))``; a ValueError without a ``dt``."""
    if dt is None:
        raise ValueError(
            f"delay_ms={delay_ms:g}: env {env!r} has no step time jaxmesh can "
            "read (a dt or tau; an AsyncVectorEnv's is not read), so "
            "milliseconds cannot be turned into steps; give the delay in "
            "steps, delay=d"
        )
    # Rounded first, so 100 ms at dt 0.05 s is 2 steps, not 3 by a float's ulp.
    return math.ceil(round(delay_ms / (1000.0 * dt), 9))


def resolve_delay_ms(settings: Settings, dt: float | None, env: str) -> Settings:
    """``settings`` with a ``delay_ms`` turned into ``delay`` steps."""
    if settings.delay_ms is None:
        return settings
    return settings._replace(delay=delay_steps(settings.delay_ms, dt, env))


#: Info keys read as an episode's success without being asked, in this order.
SUCCESS_KEYS = ("success", "is_success")

#: What ``success_mode=`` may name: true at any executed step, or at the last.
SUCCESS_MODES = ("once", "end")
#: The default headline (docs/evaluation.md, "Success", says why).
DEFAULT_SUCCESS_MODE = "once"


def check_success_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode not in SUCCESS_MODES:
        raise ValueError(
            f"success_mode={mode!r}: expected one of {list(SUCCESS_MODES)}: "
            "'once' counts an episode a success when its success signal was true "
            "at any step, 'end' when it was true at its last step (both are in "
            "result.success_once and result.success_at_end)"
        )
    return mode


class Metrics(NamedTuple):
    """``metrics=`` as ``(info key, reduction)`` pairs and ``success=`` (None:
    the first of ``SUCCESS_KEYS`` the info has; False: none), checked for form."""

    named: tuple[tuple[str, str], ...] = ()
    success: str | bool | None = None


def check_metrics(metrics: Any, success: Any = None) -> Metrics:
    """Checks ``Scoring``'s ``metrics=`` and ``success=`` for form."""
    how = (
        "pass an info key, a list of keys, or a dict key -> reduction, e.g. "
        "metrics={'success': 'any', 'x_velocity': 'mean'}"
    )
    if isinstance(metrics, dict):
        pairs = list(metrics.items())
    elif metrics is None or isinstance(metrics, str | list | tuple):
        keys = [metrics] if isinstance(metrics, str) else metrics or []
        pairs = [(m, "last") for m in keys]
    else:
        raise TypeError(f"metrics={metrics!r}: expected None or {how}")
    seen = set()
    for name, red in pairs:
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"metrics: key {name!r} is not a non-empty string (an info key); " + how
            )
        if name in seen:
            raise ValueError(f"metrics: key {name!r} is given twice; give it once")
        seen.add(name)
        if not isinstance(red, str) or red not in REDUCTIONS:
            raise ValueError(
                f"metrics: reduction {red!r} for {name!r} is not one of "
                f"{list(REDUCTIONS)} (how the key's values are reduced over an "
                "episode's steps)"
            )
    if success is not None and success is not False:
        if not isinstance(success, str) or not success:
            raise TypeError(
                f"success={success!r}: expected None (use an info key 'success' "
                "or 'is_success' when the env has one), an info key whose last "
                "value is the episode's success, or False (no success flag)"
            )
    return Metrics(tuple(pairs), success)


def resolve_metrics(
    asked: Metrics, available: Any, env_name: str
) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``(named, success key or None)`` of ``asked`` for info keys ``available``."""
    available = list(available)
    key = asked.success if isinstance(asked.success, str) else None
    if asked.success is None:
        key = next((k for k in SUCCESS_KEYS if k in available), None)
    for name in [n for n, _ in asked.named] + ([key] if key else []):
        if name not in available:
            hint = did_you_mean(name, available)
            has = ", ".join(repr(k) for k in available) or "no keys"
            raise ValueError(
                f"metric {name!r} is not in the info of env {env_name!r}"
                f"{'; ' + hint if hint else ''} (its info has {has}); name one "
                "of its info keys, or drop it from metrics= / success="
            )
    return asked.named, key
