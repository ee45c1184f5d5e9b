"""Serve gymnasium envs over gRPC: ``EnvServer`` and ``ServeOptions``.

The server speaks the ``jaxmesh.env.v1`` protocol (``proto/jaxmesh_env.proto``):

- ``Handshake`` declares the spaces, the lane count, the reset options the env
  declares and the capabilities; it opens nothing and may be called any time.
- ``Step`` is the session: one open stream at a time (a second is refused with
  RESOURCE_EXHAUSTED, "busy"). Each request resets lanes and replays chunks of
  actions, stopping a lane at its episode's end; once a lane has ended, further
  actions execute nothing (``steps=0``) until the client resets it. The session
  ends when the client closes or drops the stream, after
  ``idle_timeout_seconds`` without a request or with a reply the client does
  not take (DEADLINE_EXCEEDED), on an error or on shutdown; then every lane is
  "not reset" again.
- ``Shutdown`` stops the server when ``allow_remote_shutdown`` is set.

A malformed request is refused with INVALID_ARGUMENT before anything is
stepped, and the server serves on. An env that raises ends the session with
INTERNAL, the env's message and its traceback in the trailing metadata
(``jaxmesh-env-error``, ``jaxmesh-traceback-bin``); the server serves the next
session. The standard gRPC health service answers SERVING for ``""`` and
``jaxmesh.env.v1.EnvService`` while the server serves.

The envs are stepped by the JAX-free lanes the in-process host loop uses too
(``jaxmesh.envs.gymnasium.lanes``); this module adds what serving needs around
them: the wire's leaves and request checks, the lockstep check of a VectorEnv,
a worker pool, the encoding, sessions and their idle watchdog. It imports no
JAX: gymnasium, numpy, grpc, the codec and those lanes only.

Example:
    >>> server = EnvServer("gymnasium:CartPole-v1", lanes=4).start()
    >>> server.address  # doctest: +SKIP
    '127.0.0.1:40123'
    >>> server.shutdown()
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hmac
import ipaddress
import json
import math
import os
import secrets
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import grpc
import gymnasium
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from jaxmesh._version import __version__
from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.envs.gymnasium.shm import Segment, Slots
from jaxmesh.remote import codec
from jaxmesh.remote import shm as same_host
from jaxmesh.remote import spaces as wire_spaces
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import (
    CAPABILITIES,
    ENV_ERROR_KEY,
    ENV_LANE_KEY,
    LOCKSTEP,
    MAX_COUNT,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSIONS,
    SHARED_MEMORY,
    TOKEN_ENV,
    TRACEBACK_KEY,
    TRIAL_INDEX,
    ResultBatch,
)

__all__ = ["SERVICE_NAME", "EnvServer", "ServeOptions"]

#: The full name of the gRPC service (also a health-check service name).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvService"].full_name

_LOOPBACK_NAMES = ("localhost",)


# Options ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How an :class:`EnvServer` serves.

    Attributes:
        idle_timeout_seconds: a session with no request for this long, or
            whose client takes no reply for this long (it sends but does not
            read), is ended (DEADLINE_EXCEEDED) and the server is free for the
            next client; it also bounds how long a vanished client holds the
            session.
        drain_timeout_seconds: at shutdown, how long the call in progress may
            take to finish and reply before its stream is cancelled.
        close_timeout_seconds: at shutdown, how long to wait for the session to
            let go of the envs, and then for closing the envs the server made.
        allow_remote_shutdown: whether the ``Shutdown`` RPC may stop the server
            (else it is refused with PERMISSION_DENIED).
        token: when set, every call must carry the metadata ``authorization:
            Bearer <token>`` (clients: ``token=`` or ``JAXMESH_TOKEN``).
        workers: for ``"gymnasium:<id>"``, worker processes that build and
            step the lanes, each a contiguous group (a Python sim's step holds
            the GIL, so threads would share one core); for envs given as
            objects, threads (None: 1, i.e. in the serving thread; see
            docs/remote.md).
        max_message_bytes: the largest message either way; a reply over it is
            refused with RESOURCE_EXHAUSTED naming its size.
        max_request_bytes: the largest request the server receives (gRPC's
            receive limit, for every call, authenticated or not); None: a
            step request replaying ``REQUEST_STEPS`` actions on every lane, at
            least ``codec.MAX_HANDSHAKE_BYTES``, at most ``max_message_bytes``
            (``request_limit``). Requests carry actions, replies observations,
            so this stays small while replies of images are large.
        shared_memory: offer clients on this host, running as this user, the
            same-host data path (capability ``shared_memory``: a Unix socket
            and shared memory instead of the gRPC stream; docs/remote.md).
    """

    idle_timeout_seconds: float = 300.0
    drain_timeout_seconds: float = 5.0
    close_timeout_seconds: float = 10.0
    allow_remote_shutdown: bool = False
    token: str | None = None
    workers: int | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_request_bytes: int | None = None
    shared_memory: bool = True

    def __post_init__(self):
        for name, low, strict in (
            ("idle_timeout_seconds", 0.0, True),
            ("drain_timeout_seconds", 0.0, False),
            ("close_timeout_seconds", 0.0, False),
        ):
            value = getattr(self, name)
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and not math.isnan(value)
                and (value > low if strict else value >= low)
            )
            if not ok:
                bound = "> 0" if strict else ">= 0"
                raise ValueError(
                    f"ServeOptions({name}={value!r}): expected a number of seconds "
                    f"{bound} (math.inf for no limit)"
                )
        if not isinstance(self.shared_memory, bool):
            raise TypeError(
                f"ServeOptions(shared_memory={self.shared_memory!r}): expected True "
                "or False"
            )
        if not isinstance(self.allow_remote_shutdown, bool):
            raise TypeError(
                f"ServeOptions(allow_remote_shutdown={self.allow_remote_shutdown!r}):"
                " expected True or False"
            )
        if self.token is not None and not (
            isinstance(self.token, str)
            and self.token
            and self.token.isascii()
            and self.token.isprintable()
            and self.token.strip() == self.token
        ):
            raise ValueError(
                "ServeOptions(token=...): expected None or a non-empty string of "
                "printable ASCII without surrounding spaces (it travels as gRPC "
                "metadata); e.g. secrets.token_urlsafe(32)"
            )
        if self.workers is not None and not (
            isinstance(self.workers, int)
            and not isinstance(self.workers, bool)
            and self.workers >= 1
        ):
            raise ValueError(
                f"ServeOptions(workers={self.workers!r}): expected None or an int "
                ">= 1 (threads stepping groups of lanes)"
            )
        for name, default in (
            ("max_message_bytes", f"the default is {MAX_MESSAGE_BYTES}"),
            ("max_request_bytes", "None: sized from the lanes and the action"),
        ):
            value = getattr(self, name)
            if name == "max_request_bytes" and value is None:
                continue
            if not (
                isinstance(value, int)
                and not isinstance(value, bool)
                and 1024 <= value <= 2**31 - 1
            ):
                raise ValueError(
                    f"ServeOptions({name}={value!r}): expected an int in "
                    f"[1024, {2**31 - 1}] (gRPC's own ceiling); {default}"
                )


#: Actions per lane one step request may carry under the default receive limit
#: (a chunk of up to this many steps on every lane).
REQUEST_STEPS = 1024


def request_limit(options: ServeOptions, num_lanes: int, action_size: int) -> int:
    """The largest request the server accepts, in bytes: ``max_request_bytes``,
    else room for ``REQUEST_STEPS`` actions of ``action_size`` elements (at 8
    bytes each, with 64 bytes of framing a step) on each of ``num_lanes``
    lanes, at least a handshake's cap, never above ``max_message_bytes``."""
    if options.max_request_bytes is not None:
        return min(options.max_request_bytes, options.max_message_bytes)
    per_lane = REQUEST_STEPS * (8 * max(action_size, 1) + 64)
    wanted = max(codec.MAX_HANDSHAKE_BYTES, num_lanes * per_lane)
    return min(wanted, options.max_message_bytes)


class _Authenticate(grpc.ServerInterceptor):
    """Refuses an EnvService call whose metadata carries no token or another
    one before any byte of its message is read: the refusal is a handler that
    never asks for the request, so an unauthenticated client holds no more of
    the server's memory than gRPC's flow-control window. The health service
    needs no token."""

    def __init__(self, server: EnvServer):
        self.server = server
        self.prefix = f"/{SERVICE_NAME}/"

    def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith(self.prefix):
            return continuation(handler_call_details)
        why = self.server._token_error(handler_call_details.invocation_metadata)
        if why is None:
            return continuation(handler_call_details)

        def refuse(requests: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        if handler_call_details.method.endswith("/Step"):
            return grpc.stream_stream_rpc_method_handler(refuse)
        # Unary methods are answered as client-streaming ones: the request
        # iterator is never advanced, so the message is never received.
        return grpc.stream_unary_rpc_method_handler(refuse)


# Addresses ----------------------------------------------------------------------
def _split_address(address: Any) -> tuple[str, int]:
    """(host, port) of ``"host:port"`` / ``"[v6]:port"``; ValueError otherwise."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if sep and host and port.isdigit() and int(port) <= 65535:
            if not (host.startswith("[") ^ host.endswith("]")):
                return host, int(port)
    raise ValueError(
        f"address {address!r} is not HOST:PORT; expected e.g. '127.0.0.1:5555', "
        "'[::1]:5555' or '0.0.0.0:0' (port 0 picks a free port)"
    )


def _is_loopback(host: str) -> bool:
    bare = host[1:-1] if host.startswith("[") else host
    if bare.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


# Lanes ---------------------------------------------------------------------------
class _Request:
    """A checked call: its ops (``Reset`` | ``Replay``, ascending lane) and
    what the reply carries.

    A call that steps lanes by one action each and does nothing else (h = 1,
    most calls) keeps its lanes and actions as two arrays (``single``); its
    ops are built only if something asks for them.
    """

    __slots__ = (
        "_ops",
        "want_obs",
        "obs_keys",
        "info_keys",
        "all_observations",
        "info_every_step",
        "call_id",
        "release",
        "single",
    )

    def __init__(
        self,
        ops: list | None,
        want_obs: bool,
        info_keys: tuple[str, ...],
        all_observations: bool,
        call_id: int,
        release: tuple[int, ...] = (),  # lanes whose episode the client abandons
        single: tuple[np.ndarray, np.ndarray] | None = None,
        info_every_step: bool = False,  # every step's info, the last observation
        obs_keys: tuple[str, ...] | None = None,  # leaves asked (None: every one)
    ):
        self._ops = ops
        self.want_obs = want_obs
        self.obs_keys = obs_keys
        self.info_keys = info_keys
        self.all_observations = all_observations
        self.info_every_step = info_every_step
        self.call_id = call_id
        self.release = release
        self.single = single

    @property
    def ops(self) -> list:
        if self._ops is None:
            lanes, actions = self.single
            self._ops = [
                shared.Replay(j, actions[i : i + 1])
                for i, j in enumerate(lanes.tolist())
            ]
        return self._ops


def _wire_leaf(space: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    leaf = wire_spaces.space_leaf(space, where=where)
    return tuple(leaf.shape), np.dtype(leaf.dtype)


def _wire_layout(where: str):
    """The lanes' observation layout: the wire leaf's (the space's own dtype);
    picklable, for lanes in worker processes."""
    return functools.partial(_wire_leaf, where=where)


class _ServedLanes:
    """The shared lanes (``jaxmesh.envs.gymnasium.lanes``) and what serving adds:
    the wire's leaves, the lockstep check of a VectorEnv, and a worker pool
    that steps contiguous groups of a list of envs' lanes at once.

    Args:
        lanes: the shared lanes, observations in the wire leaf's layout.
        workers: threads for a list of envs (1: the serving thread).
    """

    def __init__(self, lanes: shared.Lanes, workers: int):
        self.lanes = lanes
        self.num_lanes = n = lanes.num_lanes
        self.name = lanes.name
        self.lockstep = isinstance(lanes, shared.VectorLanes)
        # One message per observation leaf (one, "", for a single array).
        self.obs_leaves = wire_spaces.space_leaves(
            lanes.observation_space, where=f"{self.name} observation_space"
        )
        if len(self.obs_leaves) > codec.MAX_KEYS:
            raise TypeError(
                f"{self.name} observation_space has {len(self.obs_leaves)} leaves, "
                f"more than the {codec.MAX_KEYS} a request may ask for; flatten "
                "some of them with a gymnasium ObservationWrapper"
            )
        self.obs_names = tuple(m.key for m in self.obs_leaves)
        # The lanes' layout of every leaf, and of the leaves a client reads
        # (``layout_for``): only those are converted, checked and sent.
        self.full_layout = lanes.layout
        self._layouts: dict[tuple[str, ...], Any] = {}
        self.act_leaf = wire_spaces.space_leaf(
            lanes.action_space, where=f"{self.name} action_space"
        )
        self.act_spec = codec.LeafSpec(
            "", self.act_leaf.dtype, tuple(self.act_leaf.shape)
        )
        self.discrete = lanes.discrete
        self.reset_options = (TRIAL_INDEX,) if lanes.declares_trial_index else ()
        self.workers = 1 if self.lockstep else max(1, min(workers, n))
        self.pool = (
            concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix="jaxmesh-lanes"
            )
            if self.workers > 1
            else None
        )
        # Lane j belongs to group j * workers // num_lanes (contiguous groups).
        self.group_of = [j * self.workers // n for j in range(n)]

    @property
    def owned(self) -> bool:
        return self.lanes.owned

    @owned.setter
    def owned(self, value: bool) -> None:
        self.lanes.owned = value

    def end_session(self) -> None:
        self.lanes.forget()
        self.lanes.layout = self.full_layout

    def layout_for(self, keys: tuple[str, ...] | None) -> Any:
        """The lanes' observation layout of the leaves ``keys`` (None: every
        leaf): the layout pruned to them when they are whole top-level Dict
        entries (what a policy reads), else every leaf's (the reply then
        leaves the others out)."""
        full = self.full_layout
        if not keys:  # every leaf, or none asked (every leaf is still checked)
            return full
        layout = self._layouts.get(keys)
        if layout is None:
            top = list(dict.fromkeys(full.paths[k][0] for k in keys))
            layout = full.select(top)
            if set(layout.names) != set(keys):
                layout = full
            self._layouts[keys] = layout
        return layout

    def check(self, request: _Request) -> None:
        """Refuses (ProtocolError) a request these lanes cannot serve exactly.

        Lockstep: a VectorEnv steps every lane at once, so every lane in the
        middle of an episode is stepped in every call, all by the same count (a
        lane left out would be stepped with the idle action, silently). A lane
        reset in this call is not left out: it may be stepped with the idle
        action before its reset (resets run last), which its reset discards; a
        client abandons an episode that way (e.g. at max_episode_steps), or by
        naming the lane in ``release`` when it starts no other."""
        if not self.lockstep:
            return
        if not any(isinstance(op, shared.Replay) for op in request.ops):
            return  # resets only: nothing is stepped
        lanes = self.lanes
        replays = {
            op.lane: op.actions.shape[0]
            for op in request.ops
            if isinstance(op, shared.Replay)
        }
        named = (
            replays.keys()
            | {op.lane for op in request.ops if isinstance(op, shared.Reset)}
            | set(request.release)
        )
        live = np.flatnonzero(lanes.started & ~lanes.ended)
        missing = [int(j) for j in live if int(j) not in named]
        if missing:
            raise _bad(
                f"lanes {missing[:16]} are in the middle of an episode but have no "
                "actions and no reset in this call; this server steps a VectorEnv "
                "as a whole (capability 'lockstep'), so every lane mid-episode is "
                "stepped (or reset, to abandon its episode) in every call. Serve a "
                "list of Envs for lanes that move on their own"
            )
        counts = {c for j, c in replays.items() if not lanes.ended[j]}
        if len(counts) > 1:
            raise _bad(
                f"the lanes stepped in this call have counts {sorted(counts)}; this "
                "server steps a VectorEnv as a whole (capability 'lockstep'), so "
                "every lane mid-episode replays the same number of actions"
            )

    def execute(self, request: _Request) -> pb.ResultBatch:
        """Runs a checked request; its reply's batch.

        Raises:
            LaneError: an env raised (the session ends with INTERNAL).
        """
        return codec.encode_result_batch(*self.execute_batch(request))

    def execute_batch(self, request: _Request) -> ResultBatch:
        """Runs a checked request; its reply's batch as numpy (``execute``)."""
        lanes = self.lanes
        lanes.release(request.release)
        keys = request.obs_keys
        lanes.layout = self.layout_for(keys)
        if request.single is not None and self.pool is None:
            # The per-step case (h = 1), built without per-lane objects when
            # the lanes allow it (live, no wall-clock cap, observation asked).
            stepped, actions = request.single
            batch = lanes.step_each(
                stepped, actions, request.want_obs, request.info_keys
            )
            if batch is not None:
                return _only(batch, keys)
        results = self._run(request)
        batch = lanes.collect(
            results,
            want_obs=request.want_obs,
            info_keys=request.info_keys,
            keep_all_obs=request.all_observations,
            keep_all_info=request.info_every_step,
        )
        return _only(batch, keys)

    def _run_ops(self, ops: list, request: _Request) -> list[shared.LaneResult]:
        return self.lanes.run(
            ops,
            want_obs=request.want_obs,
            info_keys=request.info_keys,
            keep_all_obs=request.all_observations,
            keep_all_info=request.info_every_step,
        )

    def _run(self, request: _Request) -> list[shared.LaneResult]:
        ops = request.ops
        if self.pool is None or len(ops) < 2:
            return self._run_ops(ops, request)
        groups: dict[int, list] = {}
        for op in ops:
            groups.setdefault(self.group_of[op.lane], []).append(op)
        if len(groups) == 1:
            return self._run_ops(ops, request)
        futures = [
            self.pool.submit(self._run_ops, group, request) for group in groups.values()
        ]
        out: list[shared.LaneResult] = []
        errors: list[shared.LaneError] = []
        for future in futures:  # in lane order: groups are contiguous
            try:
                out.extend(future.result())
            except shared.LaneError as exc:
                errors.append(exc)
        if errors:
            raise min(errors, key=lambda e: e.lane)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.lanes.close()


def _only(batch: Any, keys: tuple[str, ...] | None) -> Any:
    """A lanes' ``ResultBatch`` with only the observation leaves ``keys``
    (None: as it is)."""
    if keys is None or batch.observation.keys() == set(keys):
        return batch
    obs = batch.observation
    return batch._replace(observation={k: obs[k] for k in keys})


def _make_lanes(env: Any, lanes: int | None, workers: int) -> _ServedLanes:
    """Server lanes for what the caller passed (an id, an Env, a list, a vector).

    The checks and their wording are those of ``jaxmesh.envs.gymnasium.lanes``.
    """
    if lanes is not None and not isinstance(env, str):
        raise ValueError(
            f"lanes={lanes} is only for an env id ('gymnasium:<id>'); a "
            f"{type(env).__name__} brings its own lanes (pass a list of Envs or a "
            "VectorEnv with the lanes you want)"
        )
    if isinstance(env, str):
        if not env.startswith(shared.PREFIX + ":"):
            raise ValueError(
                f"env {env!r}: expected 'gymnasium:<id>' (e.g. "
                "'gymnasium:CartPole-v1'), a gymnasium Env, a list of them, a "
                "VectorEnv in AutoresetMode.DISABLED, or a factory of one"
            )
        count = 1 if lanes is None else lanes
        if workers > 1 and count > 1:
            # A Python sim's step holds the GIL: the lanes step in processes.
            from jaxmesh.envs.gymnasium.workers import ProcessLanes

            where = f"{env} observation_space"
            procs = ProcessLanes(env, count, workers, layout=_wire_layout(where))
            try:
                return _ServedLanes(procs, 1)
            except BaseException:
                procs.close()
                raise
        envs = shared.make_envs(env, count)
        try:
            return _served(shared.ListLanes, envs, workers, owned=True)
        except BaseException:
            for e in envs:
                e.close()
            raise
    if isinstance(env, gymnasium.vector.VectorEnv):
        return _served(shared.VectorLanes, env, workers)  # DISABLED mode only
    if isinstance(env, gymnasium.Env):
        return _served(shared.ListLanes, [env], workers)
    if isinstance(env, list):
        # ListLanes refuses an empty list, repeated objects, unequal spaces.
        return _served(shared.ListLanes, env, workers)
    raise TypeError(
        f"env {type(env).__name__} is not a gymnasium env; pass a gymnasium Env, a "
        "list of them, a VectorEnv in AutoresetMode.DISABLED, 'gymnasium:<id>', or "
        "a zero-argument factory returning one"
    )


def _served(kind: type, env: Any, workers: int, owned: bool = False) -> _ServedLanes:
    first = env[0] if isinstance(env, list) and env else env
    where = f"{shared.env_name(first)} observation_space"
    return _ServedLanes(kind(env, owned=owned, layout=_wire_layout(where)), workers)


def _is_env(env: Any) -> bool:
    return isinstance(env, str | list | gymnasium.Env | gymnasium.vector.VectorEnv)


# Requests and replies ------------------------------------------------------------
def _bad(message: str) -> codec.ProtocolError:
    return codec.ProtocolError(message)


def _parse_request(msg: pb.StepRequest, lanes: _ServedLanes) -> _Request:
    """A checked request; ProtocolError naming what is wrong (nothing stepped)."""
    n = lanes.num_lanes
    if len(msg.lane_mask) != n:
        raise _bad(
            f"lane_mask has {len(msg.lane_mask)} entries, expected {n} (one per "
            "server lane, as the handshake's num_lanes says)"
        )
    mask = msg.lane_mask
    _check_bounds(msg, n)

    def check_lane(lane: int, what: str) -> None:
        if lane >= n:
            raise _bad(
                f"{what} names lane {lane}, but the server has {n} lanes (0..{n - 1})"
            )
        if not mask[lane]:
            raise _bad(f"{what} names lane {lane}, which is not set in lane_mask")

    ops: dict[int, Any] = {}
    single = None
    for r in msg.resets:
        lane = int(r.lane)
        check_lane(lane, "resets")
        if lane in ops:
            raise _bad(f"resets names lane {lane} more than once")
        if r.seed < 0:
            raise _bad(f"resets: lane {lane} has seed {r.seed}; expected a seed >= 0")
        mes = r.max_episode_seconds
        if not (math.isfinite(mes) and mes >= 0):
            raise _bad(
                f"resets: lane {lane} has max_episode_seconds {mes}; expected a "
                "finite number >= 0 (0: no wall-clock cap)"
            )
        options: dict[str, Any] = {}
        for name, value in r.options.items():
            if name not in lanes.reset_options:
                raise _bad(
                    f"resets: lane {lane} has reset option {name[:64]!r}, but the "
                    f"env declares {list(lanes.reset_options)} (see the handshake's "
                    "reset_options)"
                )
            if value.WhichOneof("kind") != "int_value":
                raise _bad(
                    f"resets: lane {lane} has reset option {name!r} of kind "
                    f"{value.WhichOneof('kind')}; expected int_value"
                )
            options[name] = int(value.int_value)
        ops[lane] = shared.Reset(lane, int(r.seed), options or None, float(mes))
    replays: dict[int, shared.Replay] = {}
    if msg.HasField("batch"):
        batch = codec.decode_action_batch(
            msg.batch, {"": lanes.act_spec}, num_lanes=n, max_count=MAX_COUNT
        )
        arr, stepped = _check_actions(batch, lanes, mask, ops, check_lane)
        if not ops and not msg.release and np.all(batch.counts == 1):
            single = (stepped, arr)  # one action per lane, nothing else
        else:
            for lane, start, count in zip(
                stepped.tolist(),
                batch.offsets.tolist(),
                batch.counts.tolist(),
                strict=True,
            ):
                replays[lane] = shared.Replay(lane, arr[start : start + count])
    keys = set(msg.observation_keys)
    names = lanes.obs_names
    if not keys <= set(names):
        unknown = sorted(keys - set(names))
        has = (
            "the observation has the single leaf ''"
            if names == ("",)
            else f"the observation has the leaves {codec.few(names)}"
        )
        raise _bad(
            f"observation_keys {codec.few(unknown)} are not all declared: {has} "
            "(see the handshake)"
        )
    ops.update(replays)
    release = tuple(dict.fromkeys(int(j) for j in msg.release))
    for lane in release:
        check_lane(lane, "release")
        if lane in ops:
            raise _bad(
                f"lane {lane} is both released and reset or stepped in one call; "
                "release a lane only when it takes no other part in the call"
            )
    request = _Request(
        ops=None if single is not None else [ops[j] for j in sorted(ops)],
        want_obs=bool(keys),
        info_keys=tuple(dict.fromkeys(msg.info_keys)),
        all_observations=bool(msg.all_observations),
        call_id=int(msg.call_id),
        release=release,
        single=single,
        info_every_step=bool(msg.info_every_step),
        # Only the leaves asked for are converted and sent (in declared order).
        obs_keys=None
        if len(keys) == len(names)
        else tuple(n for n in names if n in keys),
    )
    lanes.check(request)
    return request


def _check_actions(
    batch: codec.ActionBatch, lanes: _ServedLanes, mask, ops, check_lane
):
    """A decoded action batch's actions (a writable copy) and lanes, after the
    checks nothing stepped may fail: discrete actions in range, each lane set
    in ``mask``, reset before and not also reset in this call (``ops``)."""
    arr = np.array(batch.actions[""])
    if lanes.discrete and arr.size:
        low = lanes.act_leaf.start
        high = low + lanes.act_leaf.n
        if arr.min() < low or arr.max() >= high:
            bad = arr[(arr < low) | (arr >= high)][0]
            raise _bad(
                f"the action batch has action {int(bad)}, outside the env's "
                f"Discrete({lanes.act_leaf.n}, start={low}) [{low}, {high - 1}]"
            )
    stepped = batch.lanes  # ascending and < n (decode_action_batch)
    bad = ~np.asarray(mask, bool)[stepped] | ~lanes.lanes.started[stepped]
    if ops:
        bad |= np.isin(stepped, list(ops))
    for lane in stepped[bad].tolist()[:1]:  # the first lane at fault, named
        check_lane(lane, "the action batch")
        if lane in ops:
            raise _bad(
                f"lane {lane} is both reset and stepped in one call; reset it "
                "in one call and step it in the next"
            )
        raise _bad(
            f"the action batch steps lane {lane}, which was never reset in "
            f"this session; reset lane {lane} first"
        )
    return arr, stepped


def _parse_step(payload: bytes, lanes: _ServedLanes, keys: tuple[str, ...]) -> _Request:
    """A checked same-host STEP frame (only steps, the session's observation
    leaves ``keys``, no info) as ``_parse_request`` checks a ``StepRequest``."""
    n = lanes.num_lanes
    call_id, flags, info, batch = same_host.unpack_step(
        payload, lanes.act_spec, num_lanes=n, max_count=MAX_COUNT
    )
    mask = np.zeros(n, bool)
    mask[batch.lanes] = True

    def check_lane(lane: int, what: str) -> None:
        pass  # every lane named is in range and in the mask

    arr, stepped = _check_actions(batch, lanes, mask, {}, check_lane)
    single = None
    ops = None
    if np.all(batch.counts == 1):
        single = (stepped, arr)
    else:
        ops = [
            shared.Replay(lane, arr[start : start + count])
            for lane, start, count in zip(
                stepped.tolist(),
                batch.offsets.tolist(),
                batch.counts.tolist(),
                strict=True,
            )
        ]
    names = lanes.obs_names
    request = _Request(
        ops=ops,
        want_obs=bool(keys),
        info_keys=_info_keys(info),
        all_observations=bool(flags & same_host.ALL_OBSERVATIONS),
        call_id=call_id,
        single=single,
        info_every_step=bool(flags & same_host.INFO_EVERY_STEP),
        obs_keys=None
        if len(keys) == len(names)
        else tuple(n for n in names if n in keys),
    )
    lanes.check(request)
    return request


@functools.lru_cache(maxsize=64)
def _info_keys(data: bytes) -> tuple[str, ...]:
    """A STEP frame's info keys, checked as ``_check_bounds`` checks a
    ``StepRequest``'s (the same few bytes come in every call: cached)."""
    try:
        keys = data.decode("utf-8").split("\0") if data else []
    except UnicodeDecodeError:
        raise _bad("the step frame's info keys are not UTF-8") from None
    _check_keys("info keys", keys)
    return tuple(dict.fromkeys(keys))


def _check_keys(what: str, field: Any) -> None:
    if len(field) > codec.MAX_KEYS:
        raise _bad(
            f"the request asks for {len(field)} {what}, more than the "
            f"{codec.MAX_KEYS} a request may name (the first: "
            f"{codec.few(field[: codec.FEW + 1], len(field))})"
        )
    for key in field:
        if len(key) > codec.MAX_KEY_CHARS:
            raise _bad(
                f"the request names the {what[:-1]} {codec.short(key)}, longer "
                f"than the {codec.MAX_KEY_CHARS} characters a key may have"
            )


def _check_bounds(msg: pb.StepRequest, n: int) -> None:
    """Refuses repeated fields longer than any request needs, before anything
    is made of them (their lengths only are read)."""
    for what, field in (
        ("observation keys", msg.observation_keys),
        ("info keys", msg.info_keys),
    ):
        _check_keys(what, field)
    if len(msg.release) > n:
        raise _bad(
            f"release names {len(msg.release)} lanes, but the server has {n} lanes; "
            "name each lane at most once"
        )
    if len(msg.resets) > n:
        raise _bad(
            f"resets has {len(msg.resets)} entries, but the server has {n} lanes; "
            "reset each lane at most once"
        )


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii").replace("\n", " ")


def _cancel(context: grpc.ServicerContext, code: grpc.StatusCode, details: str):
    """Ends an RPC from another thread with ``code`` and ``details``.

    ``ServicerContext.cancel()`` can only say CANCELLED; the call object under
    it takes a status, so the client learns why. Falls back to ``cancel()``.
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)
    except Exception:  # noqa: BLE001 - a grpc without it: a plain cancel
        context.cancel()


class _Session:
    """The open Step stream's watchdog: idle timeout and shutdown.

    The serving thread marks when it waits for a request, when it works and
    when it hands a reply to gRPC (which blocks while the client reads no
    replies); a thread ends the stream once it has waited, for a request or
    for the client to take a reply, ``idle`` seconds. ``end`` ends it now when
    it waits for a request, else after the reply in progress.
    """

    def __init__(self, context: grpc.ServicerContext, idle: float, address: str):
        self.context = context
        self.idle = idle
        self.address = address
        self.waiting_since: float | None = None
        self.receiving = False  # waiting for a request (not sending a reply)
        self.pending: tuple[grpc.StatusCode, str] | None = None
        self.cond = threading.Condition()
        self.done = False
        self.thread = threading.Thread(
            target=self._watch, name="jaxmesh-session-watchdog", daemon=True
        )
        self.thread.start()

    def _watch(self) -> None:
        with self.cond:
            while not self.done:
                since = self.waiting_since
                if since is None or math.isinf(self.idle):
                    self.cond.wait(None if math.isinf(self.idle) else self.idle)
                    continue
                left = since + self.idle - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                what = (
                    "had no request"
                    if self.receiving
                    else "took no reply (the client read none)"
                )
                _cancel(
                    self.context,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the session on the server at {self.address} {what} for "
                    f"{self.idle:g} s (idle_timeout_seconds) and was ended; "
                    "open a new session, or start the server with a longer "
                    "idle timeout",
                )
                self.done = True

    def waiting(self) -> None:
        self.receiving = True
        self.waiting_since = time.monotonic()
        pending = self.pending
        if pending is not None:
            self.context.abort(*pending)

    def working(self) -> None:
        self.waiting_since = None
        self.receiving = False

    def sending(self) -> None:
        self.waiting_since = time.monotonic()

    def end(self, code: grpc.StatusCode, details: str) -> None:
        self.pending = (code, details)
        if self.receiving and self.waiting_since is not None:
            _cancel(self.context, code, details)

    def stop(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()


# The server ---------------------------------------------------------------------
class EnvServer:
    """Serves a gymnasium env's lanes over gRPC (the ``jaxmesh.env.v1`` protocol).

    Args:
        env: a gymnasium ``Env`` (one lane), a list of Envs (one lane each;
            distinct objects with equal spaces), a ``VectorEnv`` in
            ``AutoresetMode.DISABLED``, ``"gymnasium:<id>"`` (the server makes
            ``lanes`` envs and closes them at shutdown), or a zero-argument
            factory returning one of these (called in :meth:`start`; what it
            makes is closed at shutdown).
        address: ``"host:port"`` to bind; port 0 picks a free port. A host
            other than loopback (127.0.0.0/8, ::1, localhost) needs a token,
            TLS ``credentials`` or ``insecure=True``.
        options: :class:`ServeOptions` (default: ``ServeOptions()``).
        lanes: how many envs to make for ``"gymnasium:<id>"`` (default 1).
        insecure: allow binding a non-loopback host with no token and no TLS.
        credentials: ``grpc.ServerCredentials`` (e.g. from
            ``grpc.ssl_server_credentials``) to serve over TLS.

    Raises:
        ValueError: a bad address, a non-loopback address with no token, TLS or
            ``insecure=True``, bad ``lanes``.
        TypeError: bad ``options`` or ``credentials``.

    Example:
        >>> with EnvServer("gymnasium:CartPole-v1", lanes=8) as server:
        ...     print(server.address)  # doctest: +SKIP
        127.0.0.1:40123
    """

    def __init__(
        self,
        env: Any,
        address: str = "127.0.0.1:0",
        *,
        options: ServeOptions | None = None,
        lanes: int | None = None,
        insecure: bool = False,
        credentials: grpc.ServerCredentials | None = None,
    ):
        options = ServeOptions() if options is None else options
        if not isinstance(options, ServeOptions):
            raise TypeError(
                f"options is a {type(options).__name__}; expected "
                "jaxmesh.ServeOptions(...) or None"
            )
        if lanes is not None and not (
            isinstance(lanes, int) and not isinstance(lanes, bool) and lanes >= 1
        ):
            raise ValueError(f"lanes={lanes!r}: expected None or an int >= 1")
        if credentials is not None and not isinstance(
            credentials, grpc.ServerCredentials
        ):
            raise TypeError(
                f"credentials is a {type(credentials).__name__}; expected "
                "grpc.ServerCredentials (e.g. grpc.ssl_server_credentials(...)) or "
                "None"
            )
        host, port = _split_address(address)
        if not (
            _is_loopback(host)
            or options.token is not None
            or credentials is not None
            or insecure
        ):
            raise ValueError(
                f"refusing to serve on {address!r} with no token and no TLS: anyone "
                "who reaches it could drive the env. Bind a loopback address "
                "(127.0.0.1:PORT), set a token (ServeOptions(token=...), "
                "--token or JAXMESH_TOKEN), pass TLS credentials=, or say "
                "insecure=True (--insecure) if the network is trusted"
            )
        self._env = env
        self._host, self._port = host, port
        self._requested = address
        self.options = options
        self._lanes_wanted = lanes
        self._credentials = credentials
        self._lanes: _ServedLanes | None = None
        self._server: grpc.Server | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._health: health.HealthServicer | None = None
        self._address: str | None = None
        self._state_lock = threading.Lock()
        self._session_lock = threading.Lock()
        self._session: _Session | None = None
        self._stopping = False
        self._stopped = threading.Event()
        self._handshake: pb.HandshakeReply | None = None
        # The same-host data path (``_start_shm``): its socket, the thread
        # accepting on it and the threads serving its connections.
        self._shm_name = ""
        self._shm_listener: socket.socket | None = None
        self._shm_threads: list[threading.Thread] = []

    # Lifecycle -----------------------------------------------------------------
    @property
    def address(self) -> str:
        """The bound ``"host:port"`` (the actual port once started)."""
        if self._address is None:
            return self._requested
        return self._address

    @property
    def num_lanes(self) -> int:
        """The number of lanes served (after :meth:`start`)."""
        if self._lanes is None:
            raise RuntimeError("the server has not started; call start() first")
        return self._lanes.num_lanes

    def start(self) -> EnvServer:
        """Builds the lanes, binds, and starts serving in background threads.

        Returns:
            self, serving: health SERVING, ``address`` holds the actual port.

        Raises:
            RuntimeError: started twice.
            OSError: the address cannot be bound (e.g. its port is in use).
            ValueError, TypeError: an env the server cannot serve.
        """
        with self._state_lock:
            if self._server is not None or self._stopping:
                raise RuntimeError(
                    f"EnvServer at {self.address} was already started; make a new "
                    "EnvServer to serve again"
                )
            env = self._env
            if callable(env) and not _is_env(env):
                env = env()
                if not _is_env(env):
                    raise TypeError(
                        f"the env factory returned a {type(env).__name__}; expected "
                        "a gymnasium Env, a list of them, a VectorEnv or "
                        "'gymnasium:<id>'"
                    )
                owned_by_factory = True
            else:
                owned_by_factory = False
            lanes = _make_lanes(env, self._lanes_wanted, self.options.workers or 1)
            if owned_by_factory:
                lanes.owned = True
            try:
                self._start_server(lanes)
            except BaseException:
                lanes.close()
                raise
            self._lanes = lanes
        return self

    def _start_server(self, lanes: _ServedLanes) -> None:
        limit = self.options.max_message_bytes
        action_size = math.prod(lanes.act_leaf.shape)
        receive = request_limit(self.options, lanes.num_lanes, action_size)
        # gRPC's stop() leaves the handler pool's threads idle: shutdown()
        # ends them.
        executor = concurrent.futures.ThreadPoolExecutor(
            16, thread_name_prefix="jaxmesh-serve"
        )
        self._executor = executor
        server = grpc.server(
            executor,
            interceptors=(_Authenticate(self),) if self.options.token else (),
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", receive),
                # Without this, Linux lets a second server bind a port in use.
                ("grpc.so_reuseport", 0),
                # Requests are small (actions): the receive windows stay at
                # their initial 64 KiB, all a refused call's client can make
                # the server hold (replies are paced by the client's windows).
                ("grpc.http2.bdp_probe", 0),
                # Clients ping every KEEPALIVE_SECONDS to find a dead server
                # (jaxmesh.remote.client); by default gRPC answers pings more
                # often than every 5 minutes with GOAWAY "too_many_pings".
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
                ("grpc.http2.max_ping_strikes", 0),
            ],
        )
        handlers = {
            "Handshake": grpc.unary_unary_rpc_method_handler(self._handshake_rpc),
            "Step": grpc.stream_stream_rpc_method_handler(self._step_rpc),
            "Shutdown": grpc.unary_unary_rpc_method_handler(self._shutdown_rpc),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        where = f"{self._host}:{self._port}"
        try:
            if self._credentials is not None:
                port = server.add_secure_port(where, self._credentials)
            else:
                port = server.add_insecure_port(where)
        except RuntimeError as exc:
            raise OSError(
                f"cannot bind {where!r} ({exc}); is the port in use? Pick another "
                "port, or port 0 for a free one"
            ) from exc
        if not port:
            raise OSError(
                f"cannot bind {where!r}; is the port in use? Pick another port, or "
                "port 0 for a free one"
            )
        self._address = f"{self._host}:{port}"
        if self.options.shared_memory and sys.platform.startswith("linux"):
            self._start_shm()
        self._handshake = self._handshake_reply(lanes)
        server.start()
        self._server = server
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def serve(self) -> None:
        """Starts (if needed) and blocks until the server is shut down.

        Ctrl-C (KeyboardInterrupt) shuts it down cleanly.
        """
        if self._server is None:
            self.start()
        try:
            while not self._stopped.wait(1.0):
                pass
        except KeyboardInterrupt:
            self.shutdown()

    def shutdown(self) -> None:
        """Stops serving: health NOT_SERVING, the session drained, envs closed.

        The call in progress may finish and reply within
        ``drain_timeout_seconds``; an open session is then ended (UNAVAILABLE).
        Envs the server made are closed once the session lets go of them
        (at most ``close_timeout_seconds``). Idempotent.
        """
        with self._state_lock:
            if self._stopping or self._server is None:
                self._stopping = True
                if self._server is None:
                    self._stopped.set()
                return
            self._stopping = True
        self._health.enter_graceful_shutdown()
        session = self._session
        if session is not None:
            session.end(
                grpc.StatusCode.UNAVAILABLE,
                f"the server at {self.address} is shutting down; the session ended",
            )
        done = self._server.stop(self.options.drain_timeout_seconds)
        opts = self.options
        done.wait(opts.drain_timeout_seconds + opts.close_timeout_seconds)
        self._stop_shm()
        if self._session_lock.acquire(timeout=opts.close_timeout_seconds):
            try:
                self._close_lanes()
            finally:
                self._session_lock.release()
        else:
            warnings.warn(
                f"EnvServer at {self.address}: the session still held the envs "
                f"after close_timeout_seconds={opts.close_timeout_seconds}; they "
                "were not closed",
                RuntimeWarning,
                stacklevel=2,
            )
        if self._executor is not None:
            # Idle handler threads exit now (a call still running ends first).
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()

    def _close_lanes(self) -> None:
        lanes = self._lanes
        if lanes is None:
            return
        closer = threading.Thread(target=lanes.close, daemon=True)
        closer.start()
        closer.join(self.options.close_timeout_seconds)
        if closer.is_alive():
            warnings.warn(
                f"EnvServer at {self.address}: closing the envs took more than "
                f"close_timeout_seconds={self.options.close_timeout_seconds}; left "
                "them closing",
                RuntimeWarning,
                stacklevel=3,
            )

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until shut down (or ``timeout``); whether it has stopped."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> EnvServer:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = (
            "stopped"
            if self._stopped.is_set()
            else "serving"
            if self._server is not None
            else "not started"
        )
        return f"EnvServer({self.address}, {state})"

    # RPCs ----------------------------------------------------------------------
    def _token_error(self, metadata: Any, given: str | None = None) -> str | None:
        """Why a call with this metadata (and, for a handshake, this token in
        its message) may not proceed (None: it may). The token travels as the
        metadata ``authorization: Bearer <token>`` and is compared exactly."""
        token = self.options.token
        if token is None:
            return None
        sent = None
        for key, value in metadata or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, rest = value.partition(" ")
                if scheme.lower() == "bearer":
                    sent = rest
        if not sent:
            return (
                f"the server at {self.address} needs a session token and the call "
                "carried none as the metadata 'authorization: Bearer <token>'; pass "
                f"token= (RemoteEnv, RemoteVectorEnv, evaluate) or set {TOKEN_ENV}"
            )
        for value in (sent, given):
            if value and not hmac.compare_digest(value.encode(), token.encode()):
                return (
                    f"the session token given is not the one the server at "
                    f"{self.address} was started with (tokens are compared "
                    f"exactly, spaces included); pass the right token= or set "
                    f"{TOKEN_ENV}"
                )
        return None

    def _handshake_reply(self, lanes: _ServedLanes) -> pb.HandshakeReply:
        return pb.HandshakeReply(
            server_protocol_versions=PROTOCOL_VERSIONS,
            server_version=f"jaxmesh {__version__}",
            observation=lanes.obs_leaves,
            action=[lanes.act_leaf],
            num_lanes=lanes.num_lanes,
            reset_options=[
                pb.ResetOption(name=name, value=pb.Value(int_value=0))
                for name in lanes.reset_options
            ],
            capabilities=CAPABILITIES
            + ((LOCKSTEP,) if lanes.lockstep else ())
            + ((SHARED_MEMORY,) if self._shm_name else ()),
            env_name=lanes.name,
            dt=lanes.lanes.dt or 0.0,
            shared_memory=self._shm_name,
        )

    def _handshake_rpc(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        limit = self.options.max_message_bytes
        try:
            request = codec.parse_handshake_request(data, limit)
        except codec.ProtocolError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        why = self._token_error(context.invocation_metadata(), request.token)
        if why is not None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        try:
            version = codec.choose_version(request.protocol_versions)
        except codec.ProtocolError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        reply = pb.HandshakeReply()
        reply.CopyFrom(self._handshake)
        reply.protocol_version = version
        return reply.SerializeToString()

    def _shutdown_rpc(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        why = self._token_error(context.invocation_metadata())
        if why is not None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        if not self.options.allow_remote_shutdown:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the server at {self.address} does not allow remote shutdown; "
                "start it with ServeOptions(allow_remote_shutdown=True) "
                "(--allow-remote-shutdown), or stop it where it runs",
            )
        threading.Thread(
            target=self.shutdown, name="jaxmesh-remote-shutdown", daemon=True
        ).start()
        return pb.ShutdownReply().SerializeToString()

    def _step_rpc(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        why = self._token_error(context.invocation_metadata())
        if why is not None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        if self._stopping:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the server at {self.address} is shutting down",
            )
        if not self._session_lock.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server at {self.address} is busy with another client's "
                "session (one session at a time); wait for it to end, or start "
                "another server for this client",
            )
        lanes = self._lanes
        session = _Session(context, self.options.idle_timeout_seconds, self.address)
        self._session = session
        try:
            yield from self._serve_session(requests, context, session, lanes)
        finally:
            session.stop()
            lanes.end_session()
            self._session = None
            self._session_lock.release()

    def _serve_session(
        self,
        requests: Iterator[bytes],
        context: grpc.ServicerContext,
        session: _Session,
        lanes: _ServedLanes,
    ) -> Iterator[bytes]:
        limit = self.options.max_message_bytes
        abort = context.abort
        while True:
            session.waiting()
            try:
                data = next(requests)
            except StopIteration:
                return
            session.working()
            try:
                request = _parse_request(codec.parse_step_request(data, limit), lanes)
            except codec.ProtocolError as exc:
                abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            start = time.perf_counter()
            try:
                batch = lanes.execute(request)
            except shared.LaneError as exc:
                context.set_trailing_metadata(
                    (
                        (ENV_ERROR_KEY, _ascii(exc.summary())),
                        (ENV_LANE_KEY, f"{exc.lane} {exc.phase} {exc.steps}"),
                        (TRACEBACK_KEY, exc.text.encode("utf-8", "replace")),
                    )
                )
                abort(grpc.StatusCode.INTERNAL, exc.details())
            seconds = time.perf_counter() - start
            reply = pb.StepReply(
                batch=batch,
                server_step_seconds=seconds,
                call_id=request.call_id,
            )
            out = reply.SerializeToString()
            try:
                codec.check_size(len(out), limit, "StepReply")
            except codec.ProtocolError as exc:
                abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            # The yield blocks while the client takes no replies (flow control):
            # the watchdog's clock runs through it as through a wait.
            session.sending()
            yield out

    # The same-host data path (jaxmesh.remote.shm) -----------------------------
    def _start_shm(self) -> None:
        """Listens on a fresh abstract Unix socket; a thread accepts on it."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = same_host.socket_name()
        try:
            listener.bind("\0" + name)
            listener.listen(4)
        except OSError:
            listener.close()
            return  # no same-host path: clients use gRPC
        self._shm_listener = listener
        self._shm_name = name
        thread = threading.Thread(
            target=self._shm_accept, name="jaxmesh-shm-accept", daemon=True
        )
        thread.start()
        self._shm_threads.append(thread)

    def _stop_shm(self) -> None:
        listener = self._shm_listener
        if listener is None:
            return
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        listener.close()
        wait = self.options.drain_timeout_seconds + self.options.close_timeout_seconds
        for thread in list(self._shm_threads):
            thread.join(wait)

    def _shm_accept(self) -> None:
        listener = self._shm_listener
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if self._stopping:
                conn.close()
                return
            self._shm_threads = [t for t in self._shm_threads if t.is_alive()]
            thread = threading.Thread(
                target=self._shm_connection,
                args=(conn,),
                name="jaxmesh-shm-session",
                daemon=True,
            )
            self._shm_threads.append(thread)
            thread.start()

    def _shm_connection(self, conn: socket.socket) -> None:
        """One client on the socket: its checks, then its session."""
        lanes = self._lanes

        def refuse(code: grpc.StatusCode, details: str) -> None:
            payload = same_host.status_payload(code.name, details)
            same_host.send_frame(conn, same_host.REFUSE, payload)

        try:
            conn.settimeout(10.0)
            frame = same_host.recv_frame(conn, 1 << 20)
            if frame is None or frame[0] != same_host.HELLO:
                return
            hello = json.loads(frame[2].decode("utf-8"))
            token, keys = hello.get("token"), hello.get("keys")
            binary = same_host.BINARY in (hello.get("frames") or ())
            if same_host.peer_uid(conn) != os.getuid():
                return refuse(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "the same-host data path is for clients running as the "
                    "server's user",
                )
            why = self._token_error(
                (("authorization", f"Bearer {token}"),) if token else ()
            )
            if why is not None:
                return refuse(grpc.StatusCode.UNAUTHENTICATED, why)
            if not (
                isinstance(keys, list)
                and all(k in lanes.obs_names for k in keys)
                and len(set(keys)) == len(keys)
            ):
                return refuse(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"observation leaves {codec.short(keys)} are not leaves the "
                    f"server declares ({codec.few(list(lanes.obs_names))})",
                )
            if self._stopping:
                return refuse(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the server at {self.address} is shutting down",
                )
            if not self._session_lock.acquire(blocking=False):
                return refuse(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the server at {self.address} is busy with another client's "
                    "session (one session at a time); wait for it to end, or start "
                    "another server for this client",
                )
            session = _ShmSession(conn)
            self._session = session
            try:
                self._shm_session(conn, session, lanes, tuple(keys), binary)
            finally:
                lanes.end_session()
                self._session = None
                self._session_lock.release()
        except (OSError, ValueError, codec.ProtocolError):
            pass  # the client went away or broke the protocol: it is gone
        finally:
            conn.close()

    def _shm_session(
        self,
        conn: socket.socket,
        session: _ShmSession,
        lanes: _ServedLanes,
        keys: tuple[str, ...],
        binary: bool = False,
    ) -> None:
        n = lanes.num_lanes
        specs = {m.key: codec.leaf_spec_from_proto(m) for m in lanes.obs_leaves}
        fields = same_host.ring_fields(specs, keys)
        name = f"jaxmesh_{os.getpid()}_{secrets.token_hex(4)}"
        segment = Segment(name, Slots.size(n, fields))
        slots = Slots(segment, n, fields)
        try:
            attach = {"segment": name, "frames": [same_host.BINARY] if binary else []}
            payload = json.dumps(attach).encode()
            same_host.send_frame(conn, same_host.ATTACH, payload)
            frame = same_host.recv_frame(conn, 1 << 10)
        except BaseException:
            slots.release()
            raise
        finally:
            segment.unlink()  # both sides have it mapped (or never will)
        try:
            if frame is not None and frame[0] == same_host.ATTACHED:
                self._shm_calls(conn, session, lanes, keys, slots, binary)
        finally:
            slots.release()

    def _shm_calls(
        self,
        conn: socket.socket,
        session: _ShmSession,
        lanes: _ServedLanes,
        keys: tuple[str, ...],
        slots: Slots,
        binary: bool = False,
    ) -> None:
        """Answers the session's calls as ``_serve_session`` does on gRPC
        (``binary``: the client takes RESULT frames and may send STEP ones)."""
        limit = self.options.max_message_bytes
        idle = self.options.idle_timeout_seconds
        conn.settimeout(None if math.isinf(idle) else idle)
        n = lanes.num_lanes

        def fail(code: grpc.StatusCode, details: str, metadata=()) -> None:
            payload = same_host.status_payload(code.name, details, metadata)
            try:
                same_host.send_frame(conn, same_host.ERROR, payload)
            except OSError:
                pass

        call = 0
        while True:
            session.receiving = True
            if session.pending is not None:
                return fail(*session.pending)
            try:
                frame = same_host.recv_frame(conn, limit)
            except TimeoutError:
                return fail(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the session on the server at {self.address} had no request "
                    f"for {idle:g} s (idle_timeout_seconds) and was ended; open a "
                    "new session, or start the server with a longer idle timeout",
                )
            except codec.ProtocolError as exc:
                return fail(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            session.receiving = False
            if frame is None:
                if session.pending is not None:
                    fail(*session.pending)
                return
            kind, _, data = frame
            if kind != same_host.REQUEST and not (binary and kind == same_host.STEP):
                return fail(
                    grpc.StatusCode.INVALID_ARGUMENT, f"unexpected frame kind {kind}"
                )
            try:
                if kind == same_host.STEP:
                    request = _parse_step(data, lanes, keys)
                else:
                    msg = codec.parse_step_request(data, limit)
                    request = _parse_request(msg, lanes)
            except codec.ProtocolError as exc:
                return fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            start = time.perf_counter()
            try:
                batch = lanes.execute_batch(request)
            except shared.LaneError as exc:
                return fail(
                    grpc.StatusCode.INTERNAL,
                    exc.details(),
                    (
                        (ENV_ERROR_KEY, _ascii(exc.summary())),
                        (ENV_LANE_KEY, f"{exc.lane} {exc.phase} {exc.steps}"),
                        (TRACEBACK_KEY, exc.text),
                    ),
                )
            seconds = time.perf_counter() - start
            slot = call % same_host.RING
            call += 1
            shared_bytes = 0  # the observation bytes the ring carries
            if _fits(batch.observation, keys, slots, slot, n):
                rows = int(batch.rows.sum())
                for key in keys:
                    x = batch.observation[key]
                    slots[f"{slot}:{key}"][:rows] = x
                    shared_bytes += x.nbytes
                batch = batch._replace(observation={})
            else:
                slot = same_host.NO_SLOT
            kind = same_host.REPLY
            if binary and _plain(batch, keys, slot):
                kind = same_host.RESULT
                out = same_host.pack_result(request.call_id, seconds, batch)
            else:
                out = pb.StepReply(
                    batch=codec.encode_result_batch(*batch),
                    server_step_seconds=seconds,
                    call_id=request.call_id,
                ).SerializeToString()
            try:  # the cap of the gRPC reply: rows in the ring count too
                codec.check_size(len(out) + shared_bytes, limit, "StepReply")
            except codec.ProtocolError as exc:
                return fail(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            try:
                same_host.send_frame(conn, kind, out, slot)
            except TimeoutError:
                return  # the client took no reply for idle_timeout_seconds


def _plain(batch: Any, keys: tuple, slot: int) -> bool:
    """Whether a reply goes as a RESULT frame: no info, and its observation
    rows in the ring (or none asked)."""
    if batch.info or batch.info_present or batch.info_rows is not None:
        return False
    return slot != same_host.NO_SLOT if keys else not batch.observation


def _fits(obs: dict, keys: tuple, slots: Slots, slot: int, n: int) -> bool:
    """Whether a reply's observation rows go in ring slot ``slot``: every leaf
    asked for, at most one row per lane, each in its slot's dtype and shape."""
    if not keys or obs.keys() != set(keys):
        return False
    for key in keys:
        x, dst = obs[key], slots[f"{slot}:{key}"]
        if x.shape[0] > n or x.dtype != dst.dtype or x.shape[1:] != dst.shape[1:]:
            return False
    return True


class _ShmSession:
    """A same-host session as ``shutdown`` ends it (``_Session``'s ``end``):
    now when it waits for a request, else after the reply in progress."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.receiving = False
        self.pending: tuple[grpc.StatusCode, str] | None = None

    def end(self, code: grpc.StatusCode, details: str) -> None:
        self.pending = (code, details)
        if self.receiving:
            try:
                self.conn.shutdown(socket.SHUT_RD)  # wakes the waiting recv
            except OSError:
                pass
