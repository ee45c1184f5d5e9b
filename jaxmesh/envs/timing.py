"""Simulated seconds per env step (``dt``, or CartPole's ``tau``), for delays
given in milliseconds (refused on an env with neither).
"""

from __future__ import annotations

import math
from typing import Any

#: Attribute names of a step's simulated seconds, in the order looked up.
NAMES = ("dt", "tau")


def seconds(value: Any) -> float | None:
    """``value`` as a positive finite float of seconds; None if it is not one."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def step_seconds(obj: Any) -> float | None:
    """``obj.dt`` (else ``obj.tau``) as a positive float; None without one."""
    for name in NAMES:
        try:
            value = getattr(obj, name, None)
        except Exception:  # a property that fails: no step time
            value = None
        if seconds(value) is not None:
            return seconds(value)
    return None
