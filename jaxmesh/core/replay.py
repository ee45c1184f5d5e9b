"""The chunk replay rules, written once (CONTRACT 10-12, 23).

A lane's cursor c is the index of the next action of its h-action chunk to
play (c = h: exhausted, a plan is due); under a prefetch lead L (a delay d is a
lead of d) the next chunk is planned at c = h - L. Arguments are numpy or
``jax.numpy`` arrays or ints; ``h`` and ``lead`` [N] arrays under a sweep.
"""

from __future__ import annotations

from typing import Any


def exhausted(cursor: Any, h: Any) -> Any:
    """[N] lanes whose chunk has no action left to play."""
    return cursor >= h


def prefetch_due(cursor: Any, h: Any, lead: Any) -> Any:
    """[N] lanes whose playing chunk has ``lead`` (> 0) actions left."""
    return (lead > 0) & (cursor == h - lead)


def due(cursor: Any, h: Any, lead: Any) -> Any:
    """[N] lanes whose next action needs a plan (exhausted or prefetch due)."""
    if isinstance(lead, int) and lead == 0:
        return exhausted(cursor, h)
    return exhausted(cursor, h) | prefetch_due(cursor, h, lead)


def play_index(cursor: Any, h: Any, xp: Any) -> Any:
    """[N] the chunk index each lane plays now (exhausted: a masked lane's)."""
    return xp.minimum(cursor, h - 1)


def known_until(played: Any, t: Any, h: Any, lead: Any, xp: Any) -> Any:
    """[N] the step before which each lane's actions are known after playing
    chunk index ``played`` at step ``t``: a chunk's start makes its h actions
    known, a prefetch the next h too; other indices add nothing (-1)."""
    start = t - played
    out = xp.where(played == 0, start + h, -1)
    return xp.where((lead > 0) & (played == h - lead), start + 2 * h, out)


def segment_offsets(h: int, lead: int) -> list[int]:
    """Offsets from a chunk's first step where its known actions are cut."""
    cuts = [h, 2 * h]
    if 0 < h - lead < h:
        cuts += [h - lead, 2 * h - lead]
    return sorted(cuts)
