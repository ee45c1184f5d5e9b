"""The same-host data path: a Unix socket and shared memory (docs/remote.md,
"Same-host transport"). Each frame is a ``HEADER`` and a payload. The client
sends ``HELLO`` (JSON: token, observation leaves, ``"frames"``); the server
answers ``REFUSE`` (JSON status) or ``ATTACH`` carrying a memfd of ``RING``
slots, and the client says ``ATTACHED``. Each call is a ``REQUEST``
(``StepRequest``) or ``STEP`` frame, answered in order by a ``REPLY`` or
``RESULT`` frame naming the ring slot of its rows, or by an ``ERROR`` that
ends the session; the client ends it by shutting down its side.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import grpc
import numpy as np

from jaxmesh.envs.gymnasium.lanes import closing_on_error
from jaxmesh.envs.gymnasium.shm import Segment, Slots
from jaxmesh.errors import RemoteError
from jaxmesh.remote import codec
from jaxmesh.remote.client import (
    CLOSE_GRACE_SECONDS,
    CLOSE_TIMEOUT_SECONDS,
    Stream,
    status_error,
)

#: Ring slots: calls a client may have in flight before it awaits the oldest.
RING = 4
HELLO, ATTACH, ATTACHED, REFUSE, REQUEST, REPLY, ERROR, STEP, RESULT = range(1, 10)
#: The binary frames (``STEP``, ``RESULT``), used only when both sides list them.
BINARY = "step-v1"
#: A STEP frame: call id, lanes m, flags, info key bytes; then the info keys
#: (NUL-separated), lanes and counts (uint32 [m] each), the actions' raw bytes.
_STEP_HEAD = struct.Struct("<QIII")
ALL_OBSERVATIONS, INFO_EVERY_STEP = 1, 2  # STEP flags
#: A RESULT frame: call id, env seconds, lanes m, steps in all; then lanes,
#: steps, rows (uint32 [m] each), rewards (float64), terminated, truncated.
_RESULT_HEAD = struct.Struct("<QdII")
_U32 = np.dtype("<u4")
_F64 = np.dtype("<f8")
#: A frame's header: payload bytes, kind, ring slot (``NO_SLOT``: inline).
HEADER = struct.Struct("<IBBxx")
NO_SLOT = 255
_CONTROL_BYTES = 1 << 20  # the largest ATTACH, REFUSE or ERROR a client reads


def ring_fields(specs: Mapping[str, codec.LeafSpec], keys: Sequence[str]) -> dict:
    """The ring's arrays: ``"<slot>:<key>"`` -> (shape per lane, dtype)."""
    return {
        f"{slot}:{key}": (tuple(specs[key].shape), np.dtype(specs[key].dtype))
        for slot in range(RING)
        for key in keys
    }


def send_frame(sock: socket.socket, kind: int, payload: bytes, slot=NO_SLOT):
    sock.sendall(HEADER.pack(len(payload), kind, slot) + payload)


def send_attach(sock: socket.socket, payload: bytes, fd: int) -> None:
    """An ATTACH frame with the ring's descriptor ``fd`` on its first byte."""
    data = HEADER.pack(len(payload), ATTACH, NO_SLOT) + payload
    sock.sendall(data[socket.send_fds(sock, [data[:1]], [fd]) :])


def recv_attach(sock: socket.socket) -> tuple[tuple[int, int, bytes] | None, int]:
    """The answer to HELLO and the descriptor an ATTACH carries (else -1)."""
    msg, fds, _, _ = socket.recv_fds(sock, 1, 4)
    try:
        if not msg:
            return None, -1
        rest = _recv_exact(sock, HEADER.size - 1, mid_frame=True)
        kind, slot, payload = recv_frame(sock, _CONTROL_BYTES, msg + rest)
        keep = fds.pop(0) if kind == ATTACH and fds else -1
    finally:
        for fd in fds:  # those not kept
            os.close(fd)
    return (kind, slot, payload), keep


def _recv_exact(sock: socket.socket, n: int, mid_frame: bool = False) -> Any:
    """``n`` bytes; None at the peer's end before the first (unless ``mid_frame``)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0 and not mid_frame:
                return None
            raise ConnectionResetError("the peer closed the socket mid-frame")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int, head: bytes | None = None) -> Any:
    """The next frame ``(kind, slot, payload)`` (or the one whose header is
    ``head``); None at the peer's end; ProtocolError: over ``limit``."""
    head = head or _recv_exact(sock, HEADER.size)
    if head is None:
        return None
    size, kind, slot = HEADER.unpack(head)
    if size > limit:
        raise codec.ProtocolError(
            f"a frame of {size} bytes is over the {limit} byte limit"
        )
    payload = _recv_exact(sock, size, mid_frame=True) if size else b""
    return kind, slot, payload


def pack_step(
    call_id: int,
    lanes: np.ndarray,
    counts: np.ndarray,
    actions: np.ndarray,
    flags: int = 0,
    info: bytes = b"",
) -> bytes:
    """A STEP payload (``actions`` in the declared dtype and shape; ``info``:
    the info keys, NUL-separated)."""
    return b"".join(
        (
            _STEP_HEAD.pack(call_id, len(lanes), flags, len(info)),
            info,
            np.asarray([lanes, counts], _U32).tobytes(),  # lanes, then counts
            np.ascontiguousarray(actions).tobytes(),
        )
    )


def unpack_step(
    payload: bytes, spec: codec.LeafSpec, *, num_lanes: int, max_count: int
) -> tuple[int, int, bytes, codec.ActionBatch]:
    """A STEP payload as ``(call_id, flags, info key bytes, ActionBatch)``,
    checked as ``codec.decode_action_batch`` checks one."""
    size = len(payload)
    if size < _STEP_HEAD.size:
        raise codec.ProtocolError(f"a step frame of {size} bytes is too short")
    call_id, m, flags, info_bytes = _STEP_HEAD.unpack_from(payload)
    if m > num_lanes:
        raise codec.ProtocolError(
            f"the action batch names {m} lanes, but the session has {num_lanes} "
            "lanes; each lane appears once"
        )
    at = _STEP_HEAD.size + info_bytes
    if size < at + 8 * m:
        raise codec.ProtocolError(
            f"a step frame of {size} bytes does not hold {m} lanes and "
            f"{info_bytes} bytes of info keys"
        )
    info = payload[_STEP_HEAD.size : at]
    head = np.frombuffer(payload, _U32, 2 * m, at) if m else np.zeros(0, _U32)
    lanes, counts = head[:m].astype(np.int64), head[m:].astype(np.int64)
    codec.check_action_vectors(lanes, counts, num_lanes=num_lanes, max_count=max_count)
    dtype = codec.DTYPES[spec.dtype]
    shape = (int(counts.sum()), *spec.shape)
    at += 8 * m
    need = math.prod(shape) * dtype.itemsize
    if size - at != need:
        raise codec.ProtocolError(
            f"the action batch ({spec.dtype}, shape {list(shape)}) needs {need} "
            f"bytes, but the step frame holds {size - at}"
        )
    actions = np.frombuffer(payload, dtype, math.prod(shape), at).reshape(shape)
    if dtype.kind == "b" and actions.size and actions.view(np.uint8).max() > 1:
        raise codec.ProtocolError(
            "the action batch is bool, but its bytes hold values other than 0 and 1"
        )
    return call_id, flags, info, codec.ActionBatch(lanes, counts, {"": actions})


def pack_result(call_id: int, seconds: float, batch: Any) -> bytes:
    """A RESULT payload of a batch without info or inline observation."""
    total = len(batch.rewards)
    return b"".join(
        (
            _RESULT_HEAD.pack(call_id, seconds, len(batch.lanes), total),
            np.asarray([batch.lanes, batch.steps, batch.rows], _U32).tobytes(),
            np.asarray(batch.rewards, _F64).tobytes(),
            np.asarray([batch.terminated, batch.truncated], bool).tobytes(),
        )
    )


class Result(NamedTuple):
    """What ``Session.reply`` reads of a ``StepReply``, from a RESULT frame."""

    call_id: int
    server_step_seconds: float
    nbytes: int

    def ByteSize(self) -> int:  # noqa: N802 - protobuf's name
        return self.nbytes


def unpack_result(payload: bytes, *, num_lanes: int) -> tuple[Result, Any]:
    """A RESULT payload as ``(Result, ResultBatch)`` without observation,
    checked as ``codec.decode_result_batch`` checks one."""
    size = len(payload)
    if size < _RESULT_HEAD.size:
        raise codec.ProtocolError(f"a result frame of {size} bytes is too short")
    call_id, seconds, m, total = _RESULT_HEAD.unpack_from(payload)
    at = _RESULT_HEAD.size
    if m > num_lanes or size - at != 12 * m + 10 * total:
        raise codec.ProtocolError(
            f"a result frame of {size} bytes does not hold {m} lanes and "
            f"{total} steps (a session of {num_lanes} lanes)"
        )
    head = np.frombuffer(payload, _U32, 3 * m, at).astype(np.int64)
    lanes, steps, rows = head[:m], head[m : 2 * m], head[2 * m :]
    codec.check_result_vectors(lanes, steps, rows, num_lanes=num_lanes)
    if int(steps.sum()) != total:
        raise codec.ProtocolError(
            f"a result frame counts {total} steps, its lanes {int(steps.sum())}"
        )
    at += 12 * m
    rewards = np.frombuffer(payload, _F64, total, at).astype(np.float64)
    flags = np.frombuffer(payload, np.uint8, 2 * total, at + 8 * total)
    if flags.size and flags.max() > 1:
        raise codec.ProtocolError(
            "terminated / truncated are bool, but their bytes hold values other "
            "than 0 and 1"
        )
    flags = flags.view(bool)
    batch = codec.ResultBatch(
        lanes, steps, rows, rewards, flags[:total], flags[total:], {}, {}, {}, None
    )
    return Result(call_id, seconds, size), batch


@functools.lru_cache(maxsize=16)
def _info_bytes(keys: tuple[str, ...]) -> bytes | None:
    """Info keys as a STEP frame carries them; None: a key holds a NUL."""
    return None if any("\0" in k for k in keys) else "\0".join(keys).encode()


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return struct.unpack("3i", creds)[1]


def status_payload(code: str, details: str, metadata: Sequence = ()) -> bytes:
    """An ``ERROR`` / ``REFUSE`` payload (binary metadata values as text)."""
    meta = [
        [k, v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)]
        for k, v in metadata
    ]
    return json.dumps({"code": code, "details": details, "metadata": meta}).encode()


def _status_error(payload: bytes, address: str) -> RemoteError:
    try:
        msg = json.loads(payload.decode("utf-8"))
        code = getattr(grpc.StatusCode, str(msg.get("code")), None)
        trailing = dict(msg.get("metadata", []))  # status_error takes text
        return status_error(code, str(msg.get("details", "")), trailing, address)
    except (ValueError, TypeError, AttributeError):
        return RemoteError(
            f"the jaxmesh env server at {address} ended the session with an "
            "unreadable error frame",
            address=address,
        )


class ShmStream(Stream):
    """The shared-memory ``client.Stream``: attaches to the socket ``conn``'s
    handshake names at construction (OSError, ValueError or RemoteError), then
    works as ``client.Connection`` (``conn`` is closed with it)."""

    kind = "shm"

    def __init__(
        self, conn: Any, specs: Mapping[str, codec.LeafSpec], keys: Sequence[str]
    ):
        self.conn = conn
        self.address = address = conn.address
        self.reply_timeout = conn.reply_timeout
        self.max_message_bytes = conn.max_message_bytes
        self.keys = tuple(keys)
        self.num_lanes = num_lanes = conn.info.num_lanes
        self.binary = False
        self.slots: Slots | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = sock
        try:
            sock.settimeout(conn.connect_timeout)
            sock.connect("\0" + conn.info.shared_memory)
            hello = {"token": conn.token or "", "keys": self.keys, "frames": [BINARY]}
            send_frame(sock, HELLO, json.dumps(hello).encode())
            frame, fd = recv_attach(sock)
            if frame is None:
                raise ConnectionError("the server closed the socket while attaching")
            kind, _, payload = frame
            if kind == REFUSE:
                raise _status_error(payload, address)
            if kind != ATTACH or fd < 0:
                raise ConnectionError(
                    f"the server answered frame kind {kind} "
                    f"({'with' if fd >= 0 else 'without'} a shared-memory file)"
                )
            shm = Segment(fd=fd)
            with closing_on_error([shm]):
                attach = json.loads(payload.decode())
                self.binary = BINARY in (attach.get("frames") or ())
                fields = ring_fields(specs, self.keys)
                if len(shm.buf) < Slots.size(num_lanes, fields):
                    raise ConnectionError("the shared segment is smaller than agreed")
                self.slots = Slots(shm, num_lanes, fields)
            send_frame(sock, ATTACHED, b"")
            sock.settimeout(None)
        except BaseException:
            self._release()
            raise
        try:  # STEP frames carry actions in the declared dtype and shape
            self._act_spec = codec.leaf_spec_from_proto(conn.info.action)
            self._act_dtype = codec.DTYPES[self._act_spec.dtype]
        except codec.ProtocolError:
            self.binary = False
        self._start_stream()
        self._cond = threading.Condition()
        self._read = 0
        self._ending = False  # close() shut our side: the server's end is due
        self._closing = False

    def _release(self) -> None:
        slots, self.slots = self.slots, None
        if slots is not None:
            with contextlib.suppress(BufferError):  # a view held: unmapped later
                slots.release()
        self.sock.close()

    def _begin(self) -> None:
        self._stream = True

    def _next(self) -> Any:
        try:
            frame = recv_frame(self.sock, self.max_message_bytes)
        except (OSError, codec.ProtocolError) as exc:
            frame = exc
        self._progress = time.monotonic()
        if not isinstance(frame, tuple) and (
            self._closing or (self._ending and frame is None)
        ):
            return None
        if frame is None or isinstance(frame, BaseException):
            return self._fail(self._closed())
        kind, slot, payload = frame
        if kind == ERROR:
            return self._fail(_status_error(payload, self.address))
        if kind not in (REPLY, RESULT):
            return self._fail(
                codec.ProtocolError(
                    f"the jaxmesh env server at {self.address} sent frame kind {kind}"
                )
            )
        if self._owed:
            self._owed.popleft()
        arrived = time.perf_counter()
        try:
            if kind == RESULT:
                reply, decoded = unpack_result(payload, num_lanes=self.num_lanes)
            else:
                reply = codec.parse_step_reply(payload, self.max_message_bytes)
                decoded = self._decode(reply, slot != NO_SLOT)
            decoded = self._ring_rows(decoded, slot, kind)
        except BaseException as exc:  # handed to the caller in order
            decoded = exc
        finally:
            with self._cond:
                self._read += 1
                self._cond.notify_all()
        if isinstance(decoded, BaseException):
            return decoded
        return reply, decoded, arrived, time.perf_counter()

    def _ring_rows(self, batch: Any, slot: int, kind: int) -> Any:
        """The batch with its observation rows copied out of ring ``slot``."""
        if slot == NO_SLOT:
            if kind == RESULT and self.keys:
                raise codec.ProtocolError("a result frame names no ring slot")
            return batch
        if slot >= RING:
            raise codec.ProtocolError(f"a reply names ring slot {slot}")
        rows = int(batch.rows.sum())
        if rows > self.num_lanes:
            raise codec.ProtocolError(
                f"a reply puts {rows} observation rows in shared memory, which "
                f"holds {self.num_lanes}"
            )
        obs = {k: self.slots[f"{slot}:{k}"][:rows].copy() for k in self.keys}
        return batch._replace(observation=obs)

    def _fail(self, exc: BaseException) -> BaseException:
        """The session is over: a sender waiting for ring room wakes."""
        self._broken = True
        with self._cond:
            self._cond.notify_all()
        return exc

    def send(self, call: Any) -> int:
        """Sends a call as a STEP frame where it can be one, else a
        ``StepRequest`` (waits while ``RING`` replies are unread)."""
        info = _info_bytes(tuple(call.info_keys)) if self.binary else None
        actions = call.actions
        if (  # only steps, with actions as declared
            info is not None
            and not len(call.reset_lanes)
            and not len(call.release)
            and call.lanes is not None
            and len(call.lanes) > 0
            and isinstance(actions, np.ndarray)
            and actions.dtype == self._act_dtype
            and actions.shape[1:] == self._act_spec.shape
        ):
            flags = (ALL_OBSERVATIONS if call.all_observations else 0) | (
                INFO_EVERY_STEP if call.info_every_step else 0
            )
            kind = STEP
            data = pack_step(
                call.call_id, call.lanes, call.counts, actions, flags, info
            )
        else:
            kind, data = REQUEST, self._encode(call).SerializeToString()
        codec.check_size(len(data), self.max_message_bytes, "step request")
        if self._reader is None:  # the caller reads: take replies off early
            while self._sent - self._read >= RING and not self._broken:
                self._early.append(self._next())
        else:
            with self._cond:
                while self._sent - self._read >= RING and not self._broken:
                    self._cond.wait()
        self._sending()
        if not self._broken:  # a server gone: the reply side says so
            with contextlib.suppress(OSError):
                send_frame(self.sock, kind, data)
        return len(data)

    def close(
        self,
        timeout: float = CLOSE_TIMEOUT_SECONDS,
        grace: float = CLOSE_GRACE_SECONDS,
    ) -> None:
        """Ends the session as ``Connection.close`` does (idempotent)."""
        if self.slots is None:
            return
        if self._stream and not self._broken:
            self._ending = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
            self._await_end(self._last_send, timeout, grace)
        self._closing = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if self._reader is not None:
            self._reader.join(1.0)
        try:
            self._release()
        finally:
            self.conn.close()
