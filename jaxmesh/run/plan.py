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

from jaxmesh.core.results import pow2_at_least

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
    """

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

    Returns:
      The ``RunPlan``.
    """
    h = effective_horizon(settings.horizon, chunk)
    n = settings.num_envs
    tile = settings.plan_tile or default_plan_tile(
        h, n if tile_lanes is None else tile_lanes
    )
    return RunPlan(
        horizon=settings.horizon,
        chunk=chunk,
        h=h,
        lead=min(settings.prefetch_lead, h),
        tile=tile,
        lanes=min(n if lanes is None else lanes, capacity),
        capacity=capacity,
    )


__all__ = ["RunPlan", "plan_run", "default_plan_tile", "effective_horizon"]
