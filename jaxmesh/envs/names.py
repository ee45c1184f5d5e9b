"""Messages for a name that is not there (the closest ones, else every one) or a
package that is not installed (the pip extra), apart from ``jaxmesh.envs``,
whose family table imports the families using them.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from typing import Any


def did_you_mean(
    given: str,
    choices: Iterable[str],
    n: int = 3,
    key: Callable[[str], str] = lambda c: c,
) -> str:
    """A hint naming at most ``n`` choices closest to ``given`` ('' when none
    is close), compared by ``key(choice)`` ignoring case."""
    by_lower: dict[str, str] = {}
    for c in choices:
        by_lower.setdefault(key(c).lower(), c)
    close = difflib.get_close_matches(given.lower(), list(by_lower), n=n)
    if not close:
        return ""
    names = " or ".join(repr(by_lower[c]) for c in close)
    return f"did you mean {names}?"


def check_id(kind: str, given: str, registered: Iterable[str], how: str) -> None:
    """ValueError unless ``given`` is in ``registered``, naming the closest ids
    (else every one) and ``how`` to list or register them."""
    if given not in registered:
        registered = sorted(registered)
        hint = (
            did_you_mean(given, registered) or f"registered: {', '.join(registered)}."
        )
        raise ValueError(f"unknown {kind} {given!r}; {hint} ({how})")


def need(module: str, env_id: str, extra: str, what: str = "") -> Any:
    """``module`` imported, or ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            f"env {env_id!r} needs {what or extra}: pip install 'jaxmesh[{extra}]'"
        ) from e
