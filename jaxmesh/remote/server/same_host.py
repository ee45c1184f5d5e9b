"""The server side of the same-host data path (``jaxmesh.remote.shm``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import secrets
import selectors
import socket
import threading
import time
from typing import Any

import grpc

from jaxmesh.envs.gymnasium.shm import Segment, Slots
from jaxmesh.remote import codec
from jaxmesh.remote import shm as same_host
from jaxmesh.remote.server.requests import _parse_request, _parse_step
from jaxmesh.remote.server.sessions import (
    CallError,
    _Session,
    check_reply,
    idle_message,
    run_call,
    step_reply,
)

_log = logging.getLogger(__name__)

#: Connections still sending their HELLO, at most (one more closes the oldest).
MAX_PENDING = 64
#: Bytes read per ``recv`` of a HELLO: what is held grows with what arrived.
_CHUNK = 4096


def peer_refusal(peer: int, own: int) -> str | None:
    """Why a peer of user id ``peer`` may not use a server running as ``own``."""
    if peer == own:
        return None
    return (
        f"the same-host data path is for clients running as the server's user "
        f"(uid {own}); this client runs as uid {peer}: run it as that user, or "
        "use the gRPC stream (transport='grpc')"
    )


def parse_hello(payload: bytes) -> tuple[str, list, bool]:
    """A HELLO's ``(token, keys, binary)`` (ValueError: malformed)."""
    try:
        hello = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"a HELLO that is not UTF-8 JSON ({exc})") from None
    if not isinstance(hello, dict):
        raise ValueError(f"a HELLO that is a {type(hello).__name__}, not a map")
    token, keys = hello.get("token") or "", hello.get("keys")
    frames = hello.get("frames") or []
    if not isinstance(token, str):
        raise ValueError(f"a HELLO whose token is a {type(token).__name__}")
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise ValueError("a HELLO whose keys are not a list of strings")
    if not isinstance(frames, list):
        raise ValueError(f"a HELLO whose frames are a {type(frames).__name__}")
    return token, keys, same_host.BINARY in frames


class SameHostPath:
    """An ``EnvServer``'s same-host path, sharing its session lock, lanes and
    token check. One thread accepts and reads every HELLO (another user's
    peer refused unread; whole within ``handshake_timeout_seconds``, no longer
    than token and leaf names need, ``MAX_PENDING`` waiting); a session has a
    thread."""

    def __init__(self, server: Any):
        """Listens on a fresh abstract Unix socket (OSError: cannot bind)."""
        self.server = server
        self.options = server.options
        # The abstract socket the handshake declares:
        self.name = f"jaxmesh-{os.getpid()}-{secrets.token_hex(8)}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind("\0" + self.name)
            self.listener.listen(socket.SOMAXCONN)
            self.listener.setblocking(False)
        except OSError:
            self.listener.close()
            raise
        self.wake = socket.socketpair()
        self.uid = os.getuid()  # a client must run as the server's user
        self.hello_seconds = self.options.handshake_timeout_seconds
        name = "jaxmesh-shm-accept"
        self.threads = [threading.Thread(target=self._accept, name=name, daemon=True)]
        self.threads[0].start()

    def stop(self) -> None:
        """Ends the accepting thread and waits for the session's."""
        with contextlib.suppress(OSError):
            self.wake[1].send(b"x")  # wakes the accepting thread
        wait = self.options.drain_timeout_seconds + self.options.close_timeout_seconds
        for thread in list(self.threads):
            thread.join(wait)
        self.listener.close()
        for end in self.wake:
            end.close()

    def _accept(self) -> None:
        """Accepts connections and reads their HELLOs (see the class)."""
        listener = self.listener
        wake = self.wake[0]
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        # Oldest first: each one's deadline and the bytes of its HELLO so far.
        pending: dict[socket.socket, tuple[float, bytearray]] = {}

        def forget(conn: socket.socket) -> None:
            selector.unregister(conn)
            del pending[conn]

        def drop(conn: socket.socket) -> None:
            forget(conn)
            conn.close()

        try:
            while not self.server._stopping:
                now = time.monotonic()
                for conn in [c for c, p in pending.items() if p[0] <= now]:
                    drop(conn)  # no whole HELLO in time
                first = min((p[0] for p in pending.values()), default=None)
                events = selector.select(None if first is None else first - now)
                for key, _ in events:
                    sock = key.fileobj
                    if sock is wake:
                        return
                    if sock is listener:
                        try:
                            taken = self._take(listener)
                        except OSError:  # out of descriptors: free one
                            if pending:
                                drop(next(iter(pending)))
                            else:
                                time.sleep(0.1)  # no busy loop meanwhile
                            continue
                        for conn in taken:
                            if len(pending) >= MAX_PENDING:
                                drop(next(iter(pending)))  # the oldest
                            deadline = time.monotonic() + self.hello_seconds
                            pending[conn] = (deadline, bytearray())
                            selector.register(conn, selectors.EVENT_READ)
                    elif sock in pending:
                        hello = self._read(sock, pending[sock][1])
                        if hello is not None:
                            forget(sock)
                            try:
                                self._answer(sock, hello)
                            except Exception as exc:  # noqa: BLE001 - serve on
                                _log.warning("refused a same-host client: %r", exc)
                                sock.close()
        finally:
            for conn in pending:
                conn.close()
            selector.close()

    def _take(self, listener: socket.socket) -> list[socket.socket]:
        """The connections waiting at ``listener`` of this server's user."""
        taken = []
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as exc:  # none left, or out of descriptors (say)
                if taken or isinstance(exc, BlockingIOError | InterruptedError):
                    return taken
                raise
            try:
                why = peer_refusal(same_host.peer_uid(conn), self.uid)
            except OSError:
                conn.close()
                continue
            if why is not None:
                self._refuse(conn, grpc.StatusCode.PERMISSION_DENIED, why)
                continue
            conn.setblocking(False)
            taken.append(conn)

    def _read(self, conn: socket.socket, data: bytearray) -> Any:
        """``conn``'s HELLO payload, None while not whole, or the ``OSError`` /
        ``ValueError`` that refuses it."""
        head = want = same_host.HEADER.size
        if len(data) >= head:
            want += same_host.HEADER.unpack_from(data)[0]
        try:
            chunk = conn.recv(min(_CHUNK, want - len(data)))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            return exc
        if not chunk:
            return ConnectionResetError("the client closed the socket")
        data += chunk
        if len(data) < head:
            return None
        size, kind, _ = same_host.HEADER.unpack_from(data)
        # The largest HELLO a client needs: token and leaf names (6 bytes a
        # character, JSON-escaped), and 4 KiB of the rest.
        names = sum(len(k) + 4 for k in self.server._lanes.obs_names)
        limit = 4096 + 6 * (len(self.options.token or "") + names)
        if kind != same_host.HELLO:
            return ValueError(f"the first frame is of kind {kind}, not HELLO")
        if size > limit:
            return ValueError(
                f"a HELLO of {size} bytes is over the {limit} bytes this server's "
                "token and observation leaves need"
            )
        return bytes(data[head:]) if len(data) == head + size else None

    def _refuse(self, conn: socket.socket, code: grpc.StatusCode, why: str):
        payload = same_host.status_payload(code.name, why)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            same_host.send_frame(conn, same_host.REFUSE, payload)
        conn.close()

    def _answer(self, conn: socket.socket, hello: Any) -> None:
        if isinstance(hello, OSError):
            return conn.close()
        server, lanes = self.server, self.server._lanes
        try:
            if isinstance(hello, ValueError):
                raise hello
            token, keys, binary = parse_hello(hello)
        except ValueError as exc:
            return self._refuse(conn, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        why = server._token_error(
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        if why is not None:
            return self._refuse(conn, grpc.StatusCode.UNAUTHENTICATED, why)
        if not (
            all(k in lanes.obs_names for k in keys) and len(set(keys)) == len(keys)
        ):
            return self._refuse(
                conn,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"observation leaves {codec.short(keys)} are not leaves the "
                f"server declares ({codec.few(list(lanes.obs_names))})",
            )
        refused = server._admit()
        if refused is not None:
            return self._refuse(conn, *refused)
        self.threads = [t for t in self.threads if t.is_alive()]
        thread = threading.Thread(
            target=self._connection,
            args=(conn, tuple(keys), binary),
            name="jaxmesh-shm-session",
            daemon=True,
        )
        self.threads.append(thread)
        thread.start()

    def _connection(
        self, conn: socket.socket, keys: tuple[str, ...], binary: bool
    ) -> None:
        """One admitted client's session (the session lock is held for it),
        its calls answered as the gRPC ``Step`` does (``binary``: the client
        takes RESULT frames and may send STEP ones)."""
        server = self.server
        lanes = server._lanes
        n, core = lanes.num_lanes, lanes.lanes
        limit = self.options.max_message_bytes
        idle = self.options.idle_timeout_seconds
        calls = itertools.count()

        def shut(*_: Any) -> None:  # ends the session: wakes its waiting read
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD)

        def parse(kind: int, data: bytes) -> Any:
            if kind == same_host.STEP:
                return _parse_step(data, lanes, keys)
            return _parse_request(codec.parse_step_request(data, limit), lanes)

        def receive() -> Any:
            try:
                return same_host.recv_frame(conn, limit)
            except TimeoutError:
                what = idle_message(server.address, idle, "had no request")
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                raise CallError(code, what, ()) from None
            except codec.ProtocolError as exc:
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
                raise CallError(code, str(exc), ()) from None

        def answer(frame: tuple) -> tuple[int, bytes, int]:
            kind, _, data = frame
            if kind != same_host.REQUEST and (kind != same_host.STEP or not binary):
                what = f"unexpected frame kind {kind}"
                raise CallError(grpc.StatusCode.INVALID_ARGUMENT, what, ())
            slot = next(calls) % same_host.RING
            # Rows are stacked straight into this reply's slot: the client
            # sends the call that reuses it only once it has read this reply.
            core.obs_into = {key: slots[f"{slot}:{key}"] for key in keys}
            try:
                request, batch, seconds = run_call(lanes.execute, parse, kind, data)
            finally:
                core.obs_into = None
            shared_bytes = 0  # the observation bytes the ring carries
            if _fits(batch.observation, keys, slots, slot, n):
                rows = int(batch.rows.sum())
                for key in keys:
                    x, dst = batch.observation[key], slots[f"{slot}:{key}"][:rows]
                    # Not stacked in place (the same memory, shape, strides):
                    if x.__array_interface__ != dst.__array_interface__:
                        dst[...] = x
                    shared_bytes += x.nbytes
                batch = batch._replace(observation={})
            else:
                slot = same_host.NO_SLOT
            if (  # a RESULT frame: no info, rows in the ring (or none asked)
                binary
                and not (batch.info or batch.info_present)
                and batch.info_rows is None
                and (slot != same_host.NO_SLOT if keys else not batch.observation)
            ):
                out = same_host.pack_result(request.call_id, seconds, batch)
                kind = same_host.RESULT
            else:
                kind, out = same_host.REPLY, step_reply(request, batch, seconds)
            # The cap of the gRPC reply: rows in the ring count too.
            check_reply(len(out) + shared_bytes, limit)
            return kind, out, slot

        session = server._session = _Session(shut)
        slots = None
        try:
            conn.setblocking(True)
            conn.settimeout(self.hello_seconds)  # to its ATTACHED
            session.watch_hangup(
                conn, lambda: core.abandon(respawn=not server._stopping)
            )
            specs = {m.key: codec.leaf_spec_from_proto(m) for m in lanes.obs_leaves}
            fields = same_host.ring_fields(specs, keys)
            # An anonymous file: nothing in /dev/shm, even if this process is
            # killed while the client attaches.
            fd = os.memfd_create("jaxmesh-ring", os.MFD_CLOEXEC)
            try:
                ring = Segment(size=Slots.size(n, fields), fd=os.dup(fd))
                slots = Slots(ring, n, fields)
                attach = {"frames": [same_host.BINARY] if binary else []}
                same_host.send_attach(conn, json.dumps(attach).encode(), fd)
            finally:
                os.close(fd)
            frame = same_host.recv_frame(conn, 1 << 10)
            if frame is None or frame[0] != same_host.ATTACHED:
                return
            conn.settimeout(None if math.isinf(idle) else idle)
            for kind, out, slot in session.serve(receive, answer):
                same_host.send_frame(conn, kind, out, slot)
        except CallError as exc:
            payload = same_host.status_payload(exc.args[0].name, *exc.args[1:])
            with contextlib.suppress(OSError):
                same_host.send_frame(conn, same_host.ERROR, payload)
        except (OSError, ValueError, codec.ProtocolError):
            # The client went away, took no reply for idle_timeout_seconds (a
            # send timed out) or broke the protocol: it is gone.
            pass
        finally:
            server._end_session(session)
            conn.close()
            if slots is not None:
                slots.release()


def _fits(obs: dict, keys: tuple, slots: Slots, slot: int, n: int) -> bool:
    """Whether a reply's observation rows fit ring slot ``slot``."""
    if not keys or obs.keys() != set(keys):
        return False
    for key in keys:
        x, dst = obs[key], slots[f"{slot}:{key}"]
        if x.shape[0] > n or x.dtype != dst.dtype or x.shape[1:] != dst.shape[1:]:
            return False
    return True
