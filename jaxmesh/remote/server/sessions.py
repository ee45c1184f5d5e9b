"""The open session (either transport's) as shutdown and the idle timeout see
it, and what both transports send when an env raises or a session idles."""

from __future__ import annotations

import math
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import ENV_ERROR_KEY, ENV_LANE_KEY, TRACEBACK_KEY


class CallError(Exception):
    """Ends a session with the status ``(code, details, trailing metadata)``."""


def run_call(execute: Callable, parse: Callable, *data: Any) -> tuple:
    """One call as both transports answer it: ``(request, result, seconds)``
    of ``execute(parse(*data))``, a bad request or an env's error a CallError."""
    try:
        request = parse(*data)
    except codec.ProtocolError as exc:
        raise CallError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), ()) from None
    start = time.perf_counter()
    try:
        result = execute(request)
    except shared.LaneError as exc:
        summary = exc.summary().encode("ascii", "backslashreplace").decode("ascii")
        metadata = (
            (ENV_ERROR_KEY, summary.replace("\n", " ")),
            (ENV_LANE_KEY, f"{exc.lane} {exc.phase} {exc.steps}"),
            (TRACEBACK_KEY, exc.text.encode("utf-8", "replace")),
        )
        code = grpc.StatusCode.INTERNAL
        raise CallError(code, exc.details(), metadata) from None
    return request, result, time.perf_counter() - start


def step_reply(request: Any, batch: Any, seconds: float) -> bytes:
    """The ``StepReply`` bytes answering ``request`` with ``batch``."""
    return pb.StepReply(
        batch=codec.encode_result_batch(*batch),
        server_step_seconds=seconds,
        call_id=request.call_id,
    ).SerializeToString()


def check_reply(size: int, limit: int) -> None:
    """A reply of ``size`` bytes over ``limit``: a CallError."""
    try:
        codec.check_size(size, limit, "StepReply")
    except codec.ProtocolError as exc:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        raise CallError(code, str(exc), ()) from None


def idle_message(address: str, idle: float, what: str) -> str:
    return (
        f"the session on the server at {address} {what} for {idle:g} s "
        "(idle_timeout_seconds) and was ended; open a new session, or start the "
        "server with a longer idle timeout"
    )


def _cancel(context: grpc.ServicerContext, code: grpc.StatusCode, details: str):
    """Ends an RPC from another thread with ``code`` and ``details`` (a
    ``ServicerContext``'s ``cancel()`` only says CANCELLED)."""
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)
    except Exception:  # noqa: BLE001 - a grpc without it: a plain cancel
        context.cancel()


class _Session:
    """An open session: ``cancel(code, details)`` ends it from another thread.
    ``serve`` marks when it waits, works and sends; ``end`` ends it
    now when it waits for a request, else after the reply in progress."""

    POLL_SECONDS = 0.5  # between the hang-up watcher's checks

    def __init__(self, cancel: Callable[[grpc.StatusCode, str], None]):
        self.cancel = cancel
        self.waiting_since: float | None = None
        self.receiving = False  # waiting for a request (not sending a reply)
        self.pending: tuple[grpc.StatusCode, str] | None = None
        self.cond = threading.Condition()
        self.done = False

    def watch_idle(self, idle: float, message: Callable[[str], str]) -> None:
        """Ends the session once it has waited ``idle`` seconds for a request
        or for the client to take a reply (in a thread), saying
        ``message(what it waited for)``."""

        def run() -> None:
            with self.cond:
                while not self.done:
                    since = self.waiting_since
                    if since is None:
                        self.cond.wait(idle)
                    elif (left := since + idle - time.monotonic()) > 0:
                        self.cond.wait(left)
                    else:
                        what = "had no request"
                        if not self.receiving:
                            what = "took no reply (the client read none)"
                        self.cancel(grpc.StatusCode.DEADLINE_EXCEEDED, message(what))
                        self.done = True

        if not math.isinf(idle):
            name = "jaxmesh-session-watchdog"
            threading.Thread(target=run, name=name, daemon=True).start()

    def watch_hangup(self, conn: socket.socket, give_up: Callable[[], Any]) -> None:
        """Calls ``give_up()`` if the client hangs up while the session is open
        (in a thread: the serving thread, in a call, reads nothing)."""
        if not hasattr(select, "POLLRDHUP"):  # not Linux: no watcher
            return
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLRDHUP | select.POLLHUP)

        def run() -> None:
            while not self.done:
                if poller.poll(self.POLL_SECONDS * 1000):  # the client hung up
                    self.abandon(give_up)
                    return

        threading.Thread(target=run, name="jaxmesh-shm-hangup", daemon=True).start()

    def serve(self, receive: Callable, answer: Callable) -> Iterator:
        """Both transports' session loop: yields ``answer(data)`` for each
        request ``receive()`` gives until it gives None or the session is
        ended (then a CallError with the status that ended it)."""
        while True:
            self.receiving = True
            self.waiting_since = time.monotonic()
            if self.pending is not None or (data := receive()) is None:
                break
            self.waiting_since = None
            self.receiving = False
            out = answer(data)
            # Sending blocks while the client takes no replies (flow control):
            # the watchdog's clock runs through it as a wait.
            self.waiting_since = time.monotonic()
            yield out
        if self.pending is not None:
            raise CallError(*self.pending, ())

    def end(self, code: grpc.StatusCode, details: str) -> None:
        self.pending = (code, details)
        if self.receiving:
            self.cancel(code, details)

    def abandon(self, give_up: Callable[[], Any]) -> None:
        """Calls ``give_up()`` if the session is still open (under ``stop``'s
        lock: a next session's call is never given up)."""
        with self.cond:
            if not self.done:
                give_up()

    def stop(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()
