"""The chunk replay rules, written once (CONTRACT 10-12, 23).

A lane replays a chunk of h actions; its cursor c is the index of the next
action to play (c = h: exhausted, a plan is due). Under a prefetch lead L (a
delay d is planned as a lead of d) the next chunk is also planned at c = h - L.
The jitted agent step, the host loop and served segments all ask these.

Each function takes numpy or ``jax.numpy`` arrays (or ints; ``xp`` where it
must build an array); ``h`` and ``lead`` are ints, or [N] arrays under a sweep.
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
    """[N] lanes whose next action needs a plan: the chunk is exhausted or
    the prefetch is due (the others replay the chunk they hold)."""
    if isinstance(lead, int) and lead == 0:
        return exhausted(cursor, h)
    return exhausted(cursor, h) | prefetch_due(cursor, h, lead)


def play_index(cursor: Any, h: Any, xp: Any) -> Any:
    """[N] the chunk index each lane plays now (an exhausted lane's last,
    which a lane plays only if it is masked and so executes nothing)."""
    return xp.minimum(cursor, h - 1)


def known_until(played: Any, t: Any, h: Any, lead: Any, xp: Any) -> Any:
    """[N] the step before which every action of each lane is known, once the
    action at chunk index ``played`` has been played at episode step ``t``: a
    chunk's start makes its h actions known, a prefetch the next h too; other
    indices add nothing (-1)."""
    start = t - played
    out = xp.where(played == 0, start + h, -1)
    return xp.where((lead > 0) & (played == h - lead), start + 2 * h, out)


def segment_offsets(h: int, lead: int) -> list[int]:
    """The offsets from a chunk's first step at which its known actions (and
    its prefetched successor's) are cut into segments: each chunk's end and
    each prefetch point."""
    cuts = [h, 2 * h]
    if 0 < h - lead < h:
        cuts += [h - lead, 2 * h - lead]
    return sorted(cuts)
