"""The open session as shutdown and the idle timeout see it: ``_Session``
(the gRPC Step stream's watchdog thread), ``_ShmSession`` (a same-host
session: ``end`` wakes its waiting read) and ``_cancel``, which ends a gRPC
call from another thread with a status.

``service.py`` opens a ``_Session`` per Step stream, ``same_host.py`` a
``_ShmSession`` per same-host client; ``EnvServer.shutdown`` ends either.
"""

from __future__ import annotations

import math
import select
import socket
import threading
import time

import grpc

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.remote.protocol import ENV_ERROR_KEY, ENV_LANE_KEY, TRACEBACK_KEY


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii").replace("\n", " ")


def env_error(exc: shared.LaneError) -> tuple:
    """The trailing metadata that tells a client which env raised what."""
    return (
        (ENV_ERROR_KEY, _ascii(exc.summary())),
        (ENV_LANE_KEY, f"{exc.lane} {exc.phase} {exc.steps}"),
        (TRACEBACK_KEY, exc.text.encode("utf-8", "replace")),
    )


def idle_message(address: str, what: str, idle: float) -> str:
    """Why a session that ``what`` for ``idle`` seconds was ended."""
    return (
        f"the session on the server at {address} {what} for {idle:g} s "
        "(idle_timeout_seconds) and was ended; open a new session, or start the "
        "server with a longer idle timeout"
    )


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
                    idle_message(self.address, what, self.idle),
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

    def abandon(self, give_up) -> None:
        """Calls ``give_up()`` if the session is still open (the call ended
        under it: its client went away while the server worked). Under the
        lock ``stop`` takes, so a next session's call is never given up."""
        with self.cond:
            if not self.done:
                give_up()

    def stop(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()


class _ShmSession:
    """A same-host session as ``shutdown`` ends it (``_Session``'s ``end``):
    now when it waits for a request, else after the reply in progress.

    ``watch(give_up)`` starts a thread that calls ``give_up()`` if the client
    hangs up while the session is open (a client that gave up on a call that
    hangs: the serving thread, in the call, reads nothing); ``stop`` ends it.
    """

    #: Seconds between the watcher's checks that the session is still open.
    POLL_SECONDS = 0.5

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.receiving = False
        self.pending: tuple[grpc.StatusCode, str] | None = None
        self.cond = threading.Condition()
        self.done = False

    def watch(self, give_up) -> None:
        if not hasattr(select, "POLLRDHUP"):  # not Linux: no watcher
            return
        poller = select.poll()
        poller.register(self.conn.fileno(), select.POLLRDHUP | select.POLLHUP)

        def run() -> None:
            while not self.done:
                if poller.poll(self.POLL_SECONDS * 1000):  # the client hung up
                    self.abandon(give_up)
                    return

        threading.Thread(target=run, name="jaxmesh-shm-hangup", daemon=True).start()

    abandon = _Session.abandon  # give_up() under the lock, if still open

    def stop(self) -> None:
        with self.cond:
            self.done = True

    def end(self, code: grpc.StatusCode, details: str) -> None:
        self.pending = (code, details)
        if self.receiving:
            try:
                self.conn.shutdown(socket.SHUT_RD)  # wakes the waiting recv
            except OSError:
                pass
