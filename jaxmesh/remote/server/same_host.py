"""The same-host data path (``jaxmesh.remote.shm``) of an ``EnvServer``: a
Unix socket whose clients, on this host and running as this user, get their
replies' observation rows through a shared-memory ring instead of the gRPC
stream.

``_SameHostPath`` is a mixin of ``EnvServer`` (``service.py``), not a
collaborator: its sessions share the server's one-session lock, its
``_session``, ``_stopping``, ``_lanes``, options and token check with the gRPC
path, so it keeps them as the server's own attributes (set in
``EnvServer.__init__``) rather than copies. Its calls are answered as the
gRPC path answers them (``requests.py`` parses, ``lanes.py`` executes).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import threading
import time
from typing import Any

import grpc
import numpy as np

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.envs.gymnasium.shm import Segment, Slots
from jaxmesh.remote import codec
from jaxmesh.remote import shm as same_host
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import ENV_ERROR_KEY, ENV_LANE_KEY, TRACEBACK_KEY
from jaxmesh.remote.server.lanes import ServerLanes
from jaxmesh.remote.server.requests import _parse_request, _parse_step
from jaxmesh.remote.server.sessions import _ascii, _ShmSession


class _SameHostPath:
    """The same-host data path's listener, its connections and their calls
    (a mixin of ``EnvServer``: see the module docstring)."""

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
        lanes: ServerLanes,
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
        lanes: ServerLanes,
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
            slot = call % same_host.RING
            # A per-step batch's rows are stacked straight into this reply's
            # ring slot (``obs_into``), not copied there after. The client
            # reads the slot until it has read this reply, and sends the
            # request that reuses the slot only after that (``ShmStream``
            # holds at most RING requests unread), so the env writes here no
            # earlier than the copy below did.
            core = lanes.lanes
            core.obs_into = {key: slots[f"{slot}:{key}"] for key in keys}
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
            finally:
                core.obs_into = None
            seconds = time.perf_counter() - start
            call += 1
            shared_bytes = 0  # the observation bytes the ring carries
            if _fits(batch.observation, keys, slots, slot, n):
                rows = int(batch.rows.sum())
                for key in keys:
                    x, dst = batch.observation[key], slots[f"{slot}:{key}"][:rows]
                    if not _same(x, dst):  # not stacked in place
                        dst[...] = x
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


def _same(x: np.ndarray, dst: np.ndarray) -> bool:
    """Whether ``x`` is the array ``dst`` (the same memory, shape and strides)."""
    return (
        x.shape == dst.shape
        and x.strides == dst.strides
        and x.__array_interface__["data"][0] == dst.__array_interface__["data"][0]
    )


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
