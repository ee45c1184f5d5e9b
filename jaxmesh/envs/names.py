"""Messages for a name that is not there: the closest ones, else every one;
and the table of every env id prefix jaxmesh knows, for the hint of an id
without one.

Kept apart from ``jaxmesh.envs`` so that its env families (``gymnax.py``,
``brax.py``, ``gymnasium/``) and ``jaxmesh.run.checks`` can name an unknown id
without importing the family table that imports them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

#: Every env id prefix jaxmesh knows and what it names, with an example: the
#: one table an id's hints list (``jaxmesh.envs.PREFIXES`` are the JAX families
#: ``make_env`` makes; gymnasium ids and served addresses run on the host).
ENV_PREFIXES = {
    "gymnax": "gymnax:<id>, a gymnax env run in JAX (gymnax:CartPole-v1)",
    "brax": "brax:<name>, a brax env run in JAX (brax:ant)",
    "playground": "playground:<name>, a MuJoCo Playground env run in JAX "
    "(playground:CartpoleBalance)",
    "libero": "libero:<suite>/<i>, a LIBERO task (libero:libero_spatial/0)",
    "envpool": "envpool:<id>, an EnvPool task stepped inside the jitted loop "
    "(envpool:HalfCheetah-v5)",
    "gymnasium": "gymnasium:<id>, a gymnasium env stepped in this process "
    "(gymnasium:CartPole-v1)",
    "grpc": "grpc://host:port, an env served by jaxmesh serve-env "
    "(grpcs://host:port over TLS)",
}


def no_prefix(env_id: str, hint: str = "") -> str:
    """The message for an env id given without a prefix: every prefix of
    ``ENV_PREFIXES``, each with an example.

    Args:
      env_id: the id as given, e.g. ``'CartPole-v1'``.
      hint: a ``did_you_mean`` hint ('' for none).
    """
    hint = f" {hint}" if hint else ""
    forms = "; ".join(ENV_PREFIXES.values())
    return (
        f"env id {env_id!r} has no prefix;{hint} an env id names its kind first: "
        f"{forms}"
    )


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


__all__ = ["ENV_PREFIXES", "did_you_mean", "no_prefix", "unknown_id"]
