"""Which backend runs an env, told once; the backend table; the options only
served envs take.

Three kinds of env run ``jaxmesh.evaluate``: a JAX env (the scan,
``jaxmesh.run.scan``), gymnasium envs stepped by the host loop in this
process or in worker processes, and served envs (``"grpc://host:port"``,
``jaxmesh.run.host.served``). ``backend_of`` tells them apart; ``target``
makes an env id with its options and records the answer beside the env
(``Target``). ``route`` is the backend table: the one place that says what
runs a target, down to the lanes and the loop class. The checks of the options
only served envs take (``reply_timeout``, ``lane_groups``, ``on_server_loss``)
live here too; ``jaxmesh.Served`` runs them when it is built.

The backends import this module (through ``jaxmesh.run.config``), so ``route``
imports them when it is called; gymnasium and gRPC are imported on use.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from jaxmesh import envs
from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.envs.gymnasium import is_host_stepped
from jaxmesh.remote.address import is_address, require_grpc

#: A JAX env, run by the scan engine.
SCAN = "scan"
#: Gymnasium envs stepped in this process by the host loop.
HOST = "host"
#: Served envs: the host loop, its env steps sent to env servers.
SERVED = "served"


def backend_of(env: Any) -> str:
    """``SERVED`` for ``"grpc://host:port"`` (or a list of addresses), ``HOST``
    for a gymnasium env (``"gymnasium:<id>"``, an ``Env``, a list of them, a
    ``VectorEnv``), else ``SCAN`` (``jaxmesh.make_env`` says whether it is one)."""
    if is_address(env):
        return SERVED
    if is_host_stepped(env):
        return HOST
    return SCAN


class Target(NamedTuple):
    """An env and the backend that runs it (``SCAN``, ``HOST`` or ``SERVED``),
    told once by ``target``."""

    env: Any
    kind: str

    @property
    def label(self) -> str:
        """The env for a message: an id or address as given, an object's
        ``name`` or type, a list by its first items' types."""
        env = self.env
        if isinstance(env, str):
            return env
        if isinstance(env, list | tuple):
            names = [type(e).__name__ for e in env[:2]] + ["..."] * (len(env) > 2)
            return f"[{', '.join(names)}]"
        return getattr(env, "name", None) or type(env).__name__

    @property
    def name(self) -> str | None:
        """The env's name as results record it: an id or address as given, an
        object's ``name`` (None when it has none)."""
        if isinstance(self.env, str):
            return self.env
        return getattr(self.env, "name", None)


def target(env: Any, env_config: Any = None) -> Target:
    """``env`` (an id made with ``env_config``'s options) and its backend.

    ``jaxmesh.evaluate(env=id, env_config={...})`` runs
    ``jaxmesh.make_env(id, **env_config)``; a ``libero:`` id is made even
    without options, since it names a factory of host-stepped envs.

    Raises:
      TypeError: ``env_config`` not a mapping, or given with an env that is
        not an id.
    """
    if env_config is not None and not isinstance(env_config, Mapping):
        raise TypeError(
            f"env_config={env_config!r}: expected a mapping of the env's options "
            "(passed as jaxmesh.make_env(env, **env_config))"
        )
    is_id = isinstance(env, str) and env.partition(":")[0] in envs.PREFIXES
    if env_config and not is_id:
        raise TypeError(
            f"env_config={dict(env_config)!r} with env {env!r}: env_config only "
            f"applies to env ids with a prefix of {list(envs.PREFIXES)}; build the "
            "env with its options yourself, or give an id"
        )
    if is_address(env):
        return Target(env, SERVED)
    if is_id and (env_config or env.startswith("libero:")):
        env = envs.make_env(env, **dict(env_config or {}))
    return Target(env, HOST if is_host_stepped(env) else SCAN)


# The backend table ---------------------------------------------------------------
#: The host rows besides ``SERVED``: gymnasium envs in worker processes, made
#: in this process to render a recording's frames, and in this process.
WORKERS = "workers"
RECORDING = "recording"
LOCAL = "local"


class Route(NamedTuple):
    """A row of the backend table (``route``).

    Attributes:
      name: ``SCAN``, ``SERVED``, ``WORKERS``, ``RECORDING`` or ``LOCAL``.
      evaluate: what ``jaxmesh.evaluate`` calls: the scan's ``run`` or the
        host driver's ``evaluate`` (``jaxmesh.run.host.driver``).
      lanes: a host row's lanes, ``lanes(env, num_envs, episodes, workers,
        served)`` (None for ``SCAN``).
      loop: a host row's loop class, ``loop(HostRun, res, episodes_out, tel)``.
      fast: a faster loop class, taken instead when its ``applies(program,
        lanes, recorder)`` holds (None: none).
    """

    name: str
    evaluate: Callable[..., Any]
    lanes: Callable[..., Any] | None = None
    loop: Any = None
    fast: Any = None

    def loop_for(self, program: Any, lanes: Any, recorder: Any) -> Any:
        """The loop class for these lanes and the run's agent program."""
        if self.fast is not None and self.fast.applies(program, lanes, recorder):
            return self.fast
        return self.loop


def route(target: Target, *, workers: int = 0, frames: bool = False) -> Route:
    """The backend table: the row that runs ``target``, the first that applies.

    ============  ===========================  =========================================
    row           when                         lanes -> loop class
    ============  ===========================  =========================================
    ``SCAN``      a JAX env (EnvPool's too)    the env itself -> ``scan.run`` (one
                                               device or a mesh: ``placement_for`` in
                                               run/scan/placement.py)
    ``SERVED``    served addresses             ``ServedLanes`` -> ``ServedStepRun`` when
                                               its ``applies`` holds (h = 1, no lead, no
                                               recording, no lockstep server), else
                                               ``ServedRun`` (segments)
    ``WORKERS``   ``workers`` > 0 (the host    ``WorkerEnvLanes`` -> ``GroupedRun`` when
                  driver's ``worker_count``)   its ``applies`` holds (h = 1, no lead, no
                                               sweep, no recording, a core to spare),
                                               else ``LocalRun``
    ``RECORDING`` ``frames``: a recording of   ``recording_lanes`` -> ``LocalRun``
                  ``"gymnasium:<id>"`` frames
                  (``records_frames``)
    ``LOCAL``     gymnasium in this process    ``make_lanes`` -> ``LocalRun``
    ============  ===========================  =========================================

    ``jaxmesh.evaluate`` calls a row's ``evaluate``; the host driver asks again
    with the run's ``workers`` and ``frames`` for the lanes and the loop class.
    """
    # The backends import this module (through run.config): imported on use.
    from jaxmesh.run import host, scan
    from jaxmesh.run.host.loop import GroupedRun, LocalRun

    if target.kind == SCAN:
        return Route(SCAN, scan.run)
    if target.kind == SERVED:
        require_grpc()
        from jaxmesh.run.host.served import (  # the [remote] extra: gRPC
            ServedLanes,
            ServedRun,
            ServedStepRun,
        )

        return Route(SERVED, host.evaluate, ServedLanes.of, ServedRun, ServedStepRun)
    if workers:
        lanes = lambda env, n, e, w, served: gym_lanes.WorkerEnvLanes(
            env, max(1, min(n, e)), w
        )
        return Route(WORKERS, host.evaluate, lanes, LocalRun, GroupedRun)
    if frames:
        return Route(RECORDING, host.evaluate, recording_lanes, LocalRun)
    lanes = lambda env, n, e, w, served: gym_lanes.make_lanes(env, n, e)
    return Route(LOCAL, host.evaluate, lanes, LocalRun)


def records_frames(env: Any, record: Any) -> bool:
    """Whether a recording wants frames of ``"gymnasium:<id>"`` envs this
    process makes (an unknown id is left to ``make_lanes``, which names it)."""
    if record is None or record.frames is False or not isinstance(env, str):
        return False
    name = env.partition(":")[2]
    return ":" in name or name in gym_lanes.import_gymnasium().registry


def recording_lanes(env: str, num_envs: int, episodes: int, *_: Any) -> Any:
    """``"gymnasium:<id>"`` lanes made with ``render_mode="rgb_array"``."""
    gym = gym_lanes.import_gymnasium()
    made: list = []
    try:
        for _ in range(max(1, min(num_envs, episodes))):
            made.append(gym.make(env.partition(":")[2], render_mode="rgb_array"))
        return gym_lanes.EnvLanes(made, owned=True)
    except BaseException:
        for e in made:
            e.close()
        raise


def positive_seconds(value: Any, name: str, hint: str) -> float | None:
    """``value`` as a float > 0, or None; the errors name ``name`` and ``hint``.

    Raises:
      TypeError: not a number; ValueError: not finite and above 0.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r}: expected a number > 0; {hint}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r}: expected a number > 0; {hint}")
    return float(value)


#: ``reply_timeout``'s default: over several servers, a server that owes a
#: reply and sends none for ``AUTO_FACTOR`` times the slowest reply of the run
#: (at least ``AUTO_FLOOR_SECONDS``) is dropped (``jaxmesh.run.host.served``); with
#: one server, no limit.
AUTO = "auto"
AUTO_FACTOR = 10.0
AUTO_FLOOR_SECONDS = 10.0


def check_reply_timeout(value: Any) -> float | str | None:
    """``reply_timeout`` as a float > 0, ``AUTO``, or None (no limit; also for
    ``math.inf``)."""
    if value == AUTO and isinstance(value, str):
        return AUTO
    if isinstance(value, float) and value == math.inf:
        return None
    return positive_seconds(
        value,
        "reply_timeout",
        "seconds a served env's reply may take, 'auto' (the default: a hung "
        "server among several is dropped) or None for no limit",
    )


def check_lane_groups(value: Any) -> int | None:
    """``lane_groups`` as an int >= 1, or None (the default).

    Raises:
      TypeError, ValueError: not an int >= 1.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"lane_groups={value!r}: expected an int >= 1 (groups of lanes whose "
            "calls to the servers overlap), or None for the default"
        )
    if value < 1:
        raise ValueError(
            f"lane_groups={value!r}: expected an int >= 1 (1: no pipelining), or "
            "None for the default"
        )
    return int(value)


#: What a served run may do when it loses a server.
SERVER_LOSS = ("rerun", "raise")


def check_server_loss(value: Any) -> str:
    """``on_server_loss`` as ``"rerun"`` or ``"raise"`` (None: ``"rerun"``).

    Raises:
      ValueError: any other value.
    """
    if value is None:
        return "rerun"
    if not isinstance(value, str) or value not in SERVER_LOSS:
        raise ValueError(
            f"on_server_loss={value!r}: expected 'rerun' (run a lost server's "
            "unfinished episodes again on the other servers) or 'raise' (end the "
            "run with the finished episodes kept)"
        )
    return value


__all__ = [
    "SCAN",
    "HOST",
    "SERVED",
    "backend_of",
    "Target",
    "target",
    "Route",
    "route",
    "WORKERS",
    "RECORDING",
    "LOCAL",
    "records_frames",
    "recording_lanes",
    "check_reply_timeout",
    "AUTO",
    "check_lane_groups",
    "check_server_loss",
    "positive_seconds",
]
