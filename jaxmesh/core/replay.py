"""The chunk replay rules, written once (CONTRACT 10-12, 23).

A lane replays a chunk of h actions; its cursor c is the index of the next
action to play (c = h: the chunk is exhausted). A plan is due when the chunk
is exhausted; under a prefetch lead L (a delay d is planned as a lead of d)
the next chunk is also planned when c = h - L, and takes over once the
playing one is exhausted. The jitted agent step (``jaxmesh.core.agent``), the
host loop's replays without an agent step (``jaxmesh.run.host.loop``) and a served
env's segments of known actions (``jaxmesh.run.host.served``) all ask these
functions, so the three cannot drift apart.

Each function takes numpy or ``jax.numpy`` arrays (or ints) and builds its
result with the operators of its arguments, as ``jaxmesh.core.rules`` does:
``xp`` is passed where a function must build an array of its own. ``h`` and
``lead`` are ints, or [N] arrays (each lane's setting under a sweep).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "due",
    "exhausted",
    "known_until",
    "play_index",
    "prefetch_due",
    "segment_offsets",
]


def exhausted(cursor: Any, h: Any) -> Any:
    """[N] lanes whose chunk has no action left to play."""
    return cursor >= h


def prefetch_due(cursor: Any, h: Any, lead: Any) -> Any:
    """[N] lanes whose next chunk is planned now, ahead of time: the playing
    chunk has ``lead`` actions left (lanes with ``lead = 0`` never)."""
    return (lead > 0) & (cursor == h - lead)


def due(cursor: Any, h: Any, lead: Any) -> Any:
    """[N] lanes whose next action needs a plan: the chunk is exhausted (a
    plan, or the prefetched chunk taking over) or the prefetch is due. The
    other lanes' next action is a replay of the chunk they hold."""
    if isinstance(lead, int) and lead == 0:
        return exhausted(cursor, h)
    return exhausted(cursor, h) | prefetch_due(cursor, h, lead)


def play_index(cursor: Any, h: Any, xp: Any) -> Any:
    """[N] the chunk index each lane plays now (an exhausted lane's last,
    which a lane plays only if it is masked and so executes nothing)."""
    return xp.minimum(cursor, h - 1)


def known_until(played: Any, t: Any, h: Any, lead: Any, xp: Any) -> Any:
    """[N] the step before which every action of each lane is known, once the
    action at chunk index ``played`` has been played at episode step ``t``.

    The chunk that index ``played`` belongs to started at step ``t - played``:
    when it starts (``played == 0``) its h actions are known; under a lead the
    prefetched chunk is known once it is planned (``played == h - lead``), so
    the next h actions are known too. Other indices add nothing: -1.
    """
    start = t - played
    out = xp.where(played == 0, start + h, -1)
    return xp.where((lead > 0) & (played == h - lead), start + 2 * h, out)


def segment_offsets(h: int, lead: int) -> list[int]:
    """The offsets from a chunk's first step at which a run of its known
    actions (and its prefetched successor's) is cut into segments: each
    chunk's end, and under a lead each prefetch point, where the agent must
    see the observation before the actions that follow."""
    cuts = [h, 2 * h]
    if 0 < h - lead < h:
        cuts += [h - lead, 2 * h - lead]
    return sorted(cuts)
