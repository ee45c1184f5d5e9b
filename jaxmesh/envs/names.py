"""Messages for a name that is not there: the closest ones, else every one.

Kept apart from ``jaxmesh.envs`` so that its env families (``gymnax.py``,
``brax.py``, ``gymnasium/``) and ``jaxmesh.run.checks`` can name an unknown id
without importing the family table (``jaxmesh.envs.FAMILIES``) that imports
them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


def did_you_mean(
    given: str,
    choices: Iterable[str],
    n: int = 3,
    key: Callable[[str], str] = lambda c: c,
) -> str:
    """A hint naming the choices closest to ``given`` ('' when none is close).

    Args:
      given: what the user typed.
      choices: what exists.
      n: at most this many suggestions.
      key: the part of a choice that ``given`` is compared with.

    Matching ignores case, so ``'cartpole-v1'`` suggests ``'CartPole-v1'``.
    """
    by_lower: dict[str, str] = {}
    for c in choices:
        by_lower.setdefault(key(c).lower(), c)
    close = difflib.get_close_matches(given.lower(), list(by_lower), n=n)
    if not close:
        return ""
    names = " or ".join(repr(by_lower[c]) for c in close)
    return f"did you mean {names}?"


def unknown_id(kind: str, given: str, registered: Iterable[str], how: str) -> str:
    """One paragraph for an unknown id: the closest ones, else every id.

    Args:
      kind: what was looked up, e.g. ``'gymnax env'``.
      given: the id the user gave.
      registered: the ids that exist.
      how: how the user lists or registers ids, for the message's end.
    """
    registered = sorted(registered)
    hint = did_you_mean(given, registered)
    if not hint:
        hint = f"registered: {', '.join(registered)}."
    return f"unknown {kind} {given!r}; {hint} ({how})"


__all__ = ["did_you_mean", "unknown_id"]
