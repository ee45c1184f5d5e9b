"""A run's plan: the sizes its program is built with, computed once by
``plan_run`` for every backend, so no two can disagree on a size."""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxmesh.core.tally import pow2_at_least


def default_plan_tile(h: int, num_envs: int) -> int:
    """``min(128 // h, next power of two >= num_envs)`` within [8, 128]
    (docs/evaluation.md, "The default tile"), for the lanes that plan together."""
    return max(8, min(128 // h, pow2_at_least(num_envs)))


def effective_horizon(horizon: int, chunk: int | None) -> int:
    """``h = min(H, K)``; 1 for a policy of single actions (CONTRACT 10-11)."""
    return 1 if chunk is None else min(horizon, chunk)


class RunPlan(NamedTuple):
    """The sizes one run's program is built with (``plan_run``): ``h`` is
    ``min(H, K)`` (1 for single actions or an ensemble), ``lead`` ``min(L, h)``
    or the delay d; ``lanes`` and ``capacity`` are one program's (per device),
    ``lanes <= capacity``; a sweep's ``grid`` of ``(h, d)`` cells (in the
    settings) makes ``h`` and ``lead`` the largest of them."""

    horizon: int
    chunk: int | None
    h: int
    lead: int
    tile: int
    lanes: int
    capacity: int


def plan_run(
    settings: Any,
    chunk: int | None,
    *,
    capacity: int,
    lanes: int | None = None,
    tile_lanes: int | None = None,
) -> RunPlan:
    """The plan of a run with checked ``settings`` and a probed ``chunk`` (K);
    ``lanes`` and ``tile_lanes`` (the default tile's) default to ``num_envs``."""
    h = effective_horizon(settings.horizon, chunk)
    check_execution(settings, chunk, h)
    if settings.execution is not None:
        h = 1  # a plan every step
    grid = settings.grid
    lead = settings.delay or min(settings.prefetch_lead, h)
    tile_h = h
    if grid is not None:
        h, lead = max(c[0] for c in grid), max(c[1] for c in grid)
        tile_h = min(c[0] for c in grid)
    n = settings.num_envs
    tile = settings.plan_tile or default_plan_tile(tile_h, tile_lanes or n)
    return RunPlan(
        horizon=settings.horizon,
        chunk=chunk,
        h=h,
        lead=lead,
        tile=tile,
        lanes=min(lanes or n, capacity),
        capacity=capacity,
    )


class UnfitDelay(ValueError):
    """A delay the horizon and chunks cannot serve (a sweep skips the cell)."""


def check_execution(settings: Any, chunk: int | None, h: int) -> None:
    """Refuses a delay or an ensemble chunks of K cannot serve at horizon ``h``."""
    delay, ensemble = settings.delay, settings.execution
    if delay:
        k = 1 if chunk is None else chunk
        if delay >= h or k < h + delay:
            given = getattr(settings, "delay_ms", None)
            ms = "" if given is None else f" (delay_ms={given:g} at the env's dt)"
            fix = (
                f"use {delay} < horizon <= {k - delay}"
                if k - delay > delay
                else f"no horizon serves d={delay} with K={k}: use a shorter delay"
            )
            raise UnfitDelay(
                f"delay={delay}{ms} with horizon={settings.horizon} and chunks of "
                f"K={k} actions (h = min(H, K) = {h}): a delayed chunk plays "
                f"actions d .. d+h-1, so it needs 0 < d < h and K >= h + d; {fix}, "
                "or a policy with longer chunks"
            )
    if ensemble is not None:
        if chunk is None:
            raise ValueError(
                f"execution={ensemble!r}: the policy returns single actions; "
                "ensembling averages chunks of K actions, so give it a chunk "
                "policy (obs -> (K,) + action shape)"
            )
        ensemble.check_chunk(chunk)
