"""Plain-text tables: rows of cells as aligned lines (summaries, telemetry)."""

from __future__ import annotations

from collections.abc import Sequence


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Each row as a line: the first column left-aligned, the rest right."""
    sizes = widths(rows)
    return [
        "  ".join(
            cell.ljust(w) if c == 0 else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(row, sizes, strict=True))
        )
        for row in rows
    ]


def widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """The width of each column of ``rows``."""
    return [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
