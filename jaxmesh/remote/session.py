"""One session with one env server in numpy (requests built, calls numbered,
replies decoded and checked) over the ``client.Stream`` chosen at ``open``.
"""

from __future__ import annotations

import collections
import logging
import queue
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxmesh.envs.gymnasium.batch import TRIAL_INDEX
from jaxmesh.errors import RemoteConnectionError, RemoteError
from jaxmesh.remote import codec, shm
from jaxmesh.remote.client import Connection, Stream
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import (
    INFO_EVERY_STEP,
    LOCKSTEP,
    OBS_KEY,
    SHARED_MEMORY,
    check_transport,
)

_log = logging.getLogger(__name__)


class Call(NamedTuple):
    """One call, numbered: the keyword arguments of ``Session.send``."""

    call_id: int
    reset_lanes: Sequence[int] | np.ndarray = ()  # ascending, each with a seed
    seeds: Sequence[int] | np.ndarray = ()
    trials: Sequence[int] | np.ndarray | None = None  # one per reset, if given
    options: Mapping[str, pb.Value] | None = None  # the same for every reset
    max_episode_seconds: float | None = None  # wall-clock cap of those episodes
    lanes: np.ndarray | None = None  # ascending, lane i replaying counts[i] rows
    counts: np.ndarray | None = None
    actions: np.ndarray | None = None
    release: Sequence[int] | np.ndarray = ()  # lanes a lockstep server lets go
    all_observations: bool = False  # every replayed step's (else each run's last)
    info_keys: Sequence[str] = ()  # sent for the rows that have them
    info_every_step: bool = False  # only to a server that declares it


class Reply(NamedTuple):
    """A decoded reply and what the telemetry reads (perf_counter times)."""

    batch: codec.ResultBatch
    arrived: float
    decoded_at: float
    server_seconds: float
    nbytes: int


class Session:
    """One session with one env server: the handshake at construction (``info``;
    ``**conn`` as for ``client.Connection``; RemoteConnectionError: unreachable or
    refused, RemoteError: spaces this client cannot read), then ``open`` (over
    ``transport``, one of ``TRANSPORTS``), ``send`` and ``receive``, in order."""

    def __init__(self, address: str, *, transport: str = "auto", **conn: Any):
        self.asked_transport = check_transport(transport)
        self.conn = Connection(address, **conn)
        info = self.info = self.conn.info
        self.address = info.address
        self.num_lanes = info.num_lanes
        self.obs_specs = self.rebuild(self._obs_specs)  # in the declared order
        self.trial_index = TRIAL_INDEX in info.reset_options  # CONTRACT 6
        self.lockstep = LOCKSTEP in info.capabilities  # a VectorEnv
        self.info_every_step = INFO_EVERY_STEP in info.capabilities
        self.observation_keys: tuple[str, ...] = tuple(self.obs_specs)
        self.closed = False
        self._call_id = 0
        self._pending: collections.deque[int] = collections.deque()
        self.stream: Stream = self.conn  # until ``open`` chooses

    def rebuild(self, make: Callable[[], Any]) -> Any:
        """``make()``, the spaces built from the handshake; its ProtocolError
        closes the session and is raised as a RemoteError."""
        try:
            return make()
        except codec.ProtocolError as exc:
            self.conn.close()
            raise RemoteError(
                f"the jaxmesh env server at {self.address} declared spaces this "
                f"client cannot rebuild: {exc}; upgrade the older side",
                address=self.address,
            ) from None

    def _obs_specs(self) -> dict[str, codec.LeafSpec]:
        if self.num_lanes < 1:
            raise codec.ProtocolError(
                f"the handshake declares {self.num_lanes} lanes, expected >= 1"
            )
        specs = {}
        for msg in self.info.observation:
            if msg.key in specs:
                raise codec.ProtocolError(
                    f"observation leaf {codec.short(msg.key)} is declared twice"
                )
            specs[msg.key] = codec.leaf_spec_from_proto(msg)
        return specs

    @property
    def transport(self) -> str:
        """How the calls travel once open: ``"grpc"`` or ``"shm"``."""
        return self.stream.kind

    def open(
        self,
        *,
        replies: queue.SimpleQueue | None = None,
        tag: Any = None,
        reader: bool = True,
        observation_keys: Sequence[str] | None = None,
    ) -> None:
        """Opens the session, its replies decoded as they arrive: a reader thread
        puts ``(tag, item)`` in ``replies`` (shared with other sessions, for the
        caller's ``reply(item)``; None: ``receive`` reads them), none without
        ``reader``. ``observation_keys``: the leaves every call asks for (None:
        all; ValueError: one the server did not declare)."""
        if observation_keys is not None:
            unknown = [k for k in observation_keys if k not in self.obs_specs]
            if unknown:
                raise ValueError(
                    f"observation_keys {codec.few(unknown)} are not leaves of the "
                    f"observation the server at {self.address} declares (it has "
                    f"{codec.few(list(self.obs_specs))})"
                )
            asked = set(observation_keys)
            self.observation_keys = tuple(k for k in self.obs_specs if k in asked)
        spec = {k: self.obs_specs[k] for k in self.observation_keys}
        n = self.num_lanes

        def decode(r: pb.StepReply, in_ring: bool) -> codec.ResultBatch:
            obs = {} if in_ring else spec
            return codec.decode_result_batch(r.batch, obs, None, num_lanes=n)

        self.stream = self._transport()
        self.stream.open(self._request, decode, replies=replies, tag=tag, reader=reader)

    def _transport(self) -> Stream:
        """The same-host stream when allowed and it attaches, else gRPC."""
        asked = self.asked_transport
        if asked == "grpc":
            return self.conn
        if SHARED_MEMORY not in self.info.capabilities or not self.info.shared_memory:
            why = "the server does not offer it (an older server, or one started "
            why += "with ServeOptions(shared_memory=False))"
        else:
            try:
                return shm.ShmStream(self.conn, self.obs_specs, self.observation_keys)
            except Exception as exc:  # noqa: BLE001 - any failure falls back
                if asked == "shm" and isinstance(exc, RemoteError):
                    raise
                why = f"attaching failed ({type(exc).__name__}: {exc})"
        if asked == "shm":
            raise RemoteConnectionError(
                f"transport='shm': the same-host data path to the jaxmesh env "
                f"server at {self.address} is not available: {why}. It needs the "
                "server on this host, running as this user; pass transport='auto' "
                "to fall back to gRPC",
                address=self.address,
            )
        _log.debug("session with %s uses gRPC: same-host path: %s", self.address, why)
        return self.conn

    def send(self, **call: Any) -> int:
        """Queues a ``Call`` of these fields (never waits for the server); its
        size in bytes (ProtocolError: larger than the message cap)."""
        if self.closed:
            raise RemoteError(
                f"the session with the jaxmesh env server at {self.address} is "
                "closed; open a new one",
                address=self.address,
            )
        self._call_id += 1
        size = self.stream.send(Call(self._call_id, **call))
        self._pending.append(self._call_id)
        return size

    def _request(self, call: Call) -> pb.StepRequest:
        req = pb.StepRequest(
            observation_keys=self.observation_keys,
            all_observations=call.all_observations,
            call_id=call.call_id,
            info_keys=list(call.info_keys),
            info_every_step=call.info_every_step,
        )
        mask = np.zeros(self.num_lanes, bool)
        for q, (lane, seed) in enumerate(
            zip(call.reset_lanes, call.seeds, strict=True)
        ):
            lr = req.resets.add(lane=int(lane), seed=int(seed), options=call.options)
            if call.trials is not None:
                lr.options[TRIAL_INDEX].int_value = int(call.trials[q])
            if call.max_episode_seconds is not None:
                lr.max_episode_seconds = call.max_episode_seconds
            mask[int(lane)] = True
        if call.lanes is not None and len(call.lanes):
            req.batch.CopyFrom(
                codec.encode_action_batch(
                    call.lanes, call.counts, {OBS_KEY: call.actions}
                )
            )
            mask[call.lanes] = True
        if len(call.release):
            req.release.extend(int(j) for j in call.release)
            mask[np.asarray(call.release, np.int64)] = True
        req.lane_mask.extend(mask.tolist())
        return req

    def receive(self) -> Reply:
        """The next reply of this session, in order (see ``reply``);
        RemoteError: the call failed, or no reply within ``reply_timeout``."""
        return self.reply(self.stream.receive())

    def reply(self, item: Any) -> Reply:
        """A reply as a reader thread queued it (or the exception it met,
        raised), checked against the next call in flight (ProtocolError)."""
        if isinstance(item, BaseException):
            raise item
        reply, batch, arrived, decoded_at = item
        expected = self._pending.popleft() if self._pending else None
        if reply.call_id != expected:
            raise codec.ProtocolError(
                f"the jaxmesh env server at {self.address} answered call "
                f"{reply.call_id}, expected call {expected}; the server broke "
                "the protocol"
            )
        return Reply(
            batch, arrived, decoded_at, reply.server_step_seconds, reply.ByteSize()
        )

    @property
    def sent_at(self) -> float:
        return self.stream.sent_at

    def owed_since(self) -> float | None:
        return self.stream.owed_since()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
