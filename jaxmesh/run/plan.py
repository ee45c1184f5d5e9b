"""A run's plan: the sizes its program is built with, computed once.

The effective horizon ``h = min(H, K)`` (CONTRACT 10), the prefetch lead the
engine uses (``min(L, h)``, CONTRACT 12), the plan tile (rows per policy call)
and the result buffers' capacity all follow from the settings, the policy's
chunk length K (``build.probe_chunk``) and where the lanes run. ``plan_run``
computes them in one place; the scan (one device or a mesh), the host loop
(in process or served) and ``make_evaluator`` / ``make_agent`` read them from
the ``RunPlan`` it returns, so no two of them can disagree on a size.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxmesh.core.tally import pow2_at_least

#: Rows per policy call at h = 1 when plan_tile is left to jaxmesh.
AUTO_TILE_ROWS = 128
#: The smallest default tile.
MIN_TILE_ROWS = 8


def default_plan_tile(h: int, num_envs: int) -> int:
    """The default tile: ``128 // h`` rows, shrunk to fit few lanes.

    ``min(128 // h, next power of two >= num_envs)``, kept within [8, 128]. Many
    lanes (N >= 128 // h) all get the same tile, so their results are
    bit-identical whatever N is. Fewer lanes get a smaller tile, so a heavy
    policy on 4 lanes computes 8 rows a plan, not 128; their rows match the
    large tile's only where the backend rounds a row the same at both batch
    sizes (docs/evaluation.md has the measurements). Pass ``plan_tile`` to pin
    the tile when runs at different N must agree bit for bit.

    Args:
      h: the effective horizon (``RunPlan.h``), not the asked H: a chunk of K
        actions replays ``min(H, K)`` of them per plan.
      num_envs: the lanes that plan together (all N lanes, also when they are
        split over devices; one group's lanes for served lane groups).
    """
    auto = max(MIN_TILE_ROWS, min(AUTO_TILE_ROWS, AUTO_TILE_ROWS // h))
    return max(MIN_TILE_ROWS, min(auto, pow2_at_least(num_envs)))


def effective_horizon(horizon: int, chunk: int | None) -> int:
    """``h = min(H, K)``; 1 for a policy of single actions (CONTRACT 10-11)."""
    return 1 if chunk is None else min(horizon, chunk)


class RunPlan(NamedTuple):
    """The sizes one run's program is built with (``plan_run``).

    Attributes:
      horizon: H, as asked.
      chunk: K, the policy's chunk length (None: single actions).
      h: the effective horizon ``min(H, K)`` (1 for single actions).
      lead: the prefetch lead the engine uses, ``min(L, h)``.
      tile: rows per policy call.
      lanes: lanes one program steps (per device when split over devices; at
        most ``capacity``: a lane never waits for an episode that cannot exist).
      capacity: result-buffer entries of one program (per device).
      delay: the inference delay d (0: none). A delayed chunk is planned as a
        lead of d would plan it (so ``lead`` is d) and plays from its action d.
      ensemble: a ``jaxmesh.Ensemble`` (h is then 1: a plan every step), or
        None.
      grid: a sweep's cells, each ``(h, d)`` (``jaxmesh.sweep``): a lane
        takes its episode's cell, ``cell_episodes`` episodes to a cell; ``h``
        and ``lead`` are then the largest of them. None: one setting.
    """

    horizon: int
    chunk: int | None
    h: int
    lead: int
    tile: int
    lanes: int
    capacity: int
    delay: int = 0
    ensemble: Any = None
    grid: tuple[tuple[int, int], ...] | None = None
    cell_episodes: int = 0


def plan_run(
    settings: Any,
    chunk: int | None,
    *,
    capacity: int,
    lanes: int | None = None,
    tile_lanes: int | None = None,
) -> RunPlan:
    """The plan of a run with checked ``settings`` and a probed ``chunk``.

    Args:
      settings: ``checks.Settings`` (``num_envs``, ``horizon``,
        ``prefetch_lead``, ``plan_tile``).
      chunk: the policy's chunk length K (``build.probe_chunk``), None for
        single actions.
      capacity: result-buffer entries of one program (a placement's
        ``capacity``).
      lanes: lanes one program steps; None: ``settings.num_envs``.
      tile_lanes: the lanes the default tile is sized for; None:
        ``settings.num_envs`` (a sharded run sizes it for all N lanes, so that
        its episodes match the one-device run's; served lane groups for one
        group).

    Under a sweep's ``settings.grid`` (its cells' effective ``(h, d)``, each
    checked by the sweep), ``h`` and ``lead`` are the largest of them (the
    buffers' sizes) and the default tile is that of the smallest h (one tile
    serves every cell).

    Returns:
      The ``RunPlan``.

    Raises:
      ValueError, TypeError: a delay or an ensemble the policy's chunks do not
        allow (``check_execution``).
    """
    h = effective_horizon(settings.horizon, chunk)
    delay, ensemble = settings.delay, settings.execution
    check_execution(settings, chunk, h)
    if ensemble is not None:
        h = 1  # a plan every step
    grid = settings.grid
    lead = delay or min(settings.prefetch_lead, h)
    tile_h = h
    if grid is not None:
        h, lead = max(c[0] for c in grid), max(c[1] for c in grid)
        tile_h = min(c[0] for c in grid)
    n = settings.num_envs
    tile = settings.plan_tile or default_plan_tile(
        tile_h, n if tile_lanes is None else tile_lanes
    )
    return RunPlan(
        horizon=settings.horizon,
        chunk=chunk,
        h=h,
        lead=lead,
        tile=tile,
        lanes=min(n if lanes is None else lanes, capacity),
        capacity=capacity,
        delay=delay,
        ensemble=ensemble,
        grid=grid,
        cell_episodes=settings.cell_episodes,
    )


class UnfitDelay(ValueError):
    """A delay the run's horizon and chunks cannot serve (``0 < d < h``,
    ``K >= h + d``); a sweep skips such a cell and says why."""


def check_execution(settings: Any, chunk: int | None, h: int) -> None:
    """Refuses a delay or an ensemble that the policy's chunks cannot serve.

    Args:
      settings: the checked settings (``delay``, ``execution``).
      chunk: the policy's chunk length K (None: single actions).
      h: the effective horizon ``min(H, K)``.

    Raises:
      ValueError: a delay d without ``0 < d < h`` or ``K >= h + d``; an
        ensemble of single actions or of the wrong number of weights.
    """
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


__all__ = [
    "RunPlan",
    "plan_run",
    "default_plan_tile",
    "effective_horizon",
    "check_execution",
    "UnfitDelay",
]
