"""Which backend runs an env (``backend_of``, ``Target``); served envs' options."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from jaxmesh.envs.gymnasium import is_host_stepped
from jaxmesh.remote.address import is_address
from jaxmesh.run import checks

#: A JAX env, run by the scan engine.
SCAN = "scan"
#: Gymnasium envs stepped in this process by the host loop.
HOST = "host"
#: Served envs: the host loop, its env steps sent to env servers.
SERVED = "served"
#: The backend table's other host rows (``jaxmesh.run.dispatch.route``).
WORKERS = "workers"
RECORDING = "recording"
LOCAL = "local"


def backend_of(env: Any) -> str:
    """``SERVED`` for addresses, ``HOST`` for gymnasium envs, else ``SCAN``."""
    return SERVED if is_address(env) else HOST if is_host_stepped(env) else SCAN


class Target(NamedTuple):
    """An env and the backend that runs it (``jaxmesh.run.dispatch.target``)."""

    env: Any
    kind: str

    @property
    def label(self) -> str:
        """The env for a message (a list by its first items' types)."""
        env = self.env
        if isinstance(env, str):
            return env
        if isinstance(env, list | tuple):
            names = [type(e).__name__ for e in env[:2]] + ["..."] * (len(env) > 2)
            return f"[{', '.join(names)}]"
        return getattr(env, "name", None) or type(env).__name__

    @property
    def name(self) -> str | None:
        """The env's name as results record it (None: an object without one)."""
        env = self.env
        return env if isinstance(env, str) else getattr(env, "name", None)


#: ``reply_timeout``'s default: over several servers, one silent for
#: ``AUTO_FACTOR`` times the slowest reply (at least ``AUTO_FLOOR_SECONDS``) is
#: dropped; with one server, no limit.
AUTO = "auto"
AUTO_FACTOR = 10.0
AUTO_FLOOR_SECONDS = 10.0


def check_reply_timeout(value: Any) -> float | str | None:
    """``reply_timeout`` as a float > 0, ``AUTO``, or None (no limit, or inf)."""
    if value == AUTO and isinstance(value, str):
        return AUTO
    if isinstance(value, float) and value == math.inf:
        return None
    return checks.check_number(
        "reply_timeout",
        value,
        "seconds a served env's reply may take, 'auto' (the default: a hung "
        "server among several is dropped) or None for no limit",
    )


def check_lane_groups(value: Any) -> int | None:
    """``lane_groups`` as an int >= 1, or None (the default)."""
    if value is None:
        return None
    return checks.check_int(
        "lane_groups",
        value,
        1,
        "groups of lanes whose calls to the servers overlap (1: no pipelining), "
        "or None for the default",
    )


#: What a served run may do when it loses a server.
SERVER_LOSS = ("rerun", "raise")


def check_server_loss(value: Any) -> str | None:
    """``on_server_loss``: ``"rerun"``, ``"raise"`` or None (``"rerun"``)."""
    if value is not None and (not isinstance(value, str) or value not in SERVER_LOSS):
        raise ValueError(
            f"on_server_loss={value!r}: expected 'rerun' (run a lost server's "
            "unfinished episodes again on the other servers) or 'raise' (end the "
            "run with the finished episodes kept)"
        )
    return value
