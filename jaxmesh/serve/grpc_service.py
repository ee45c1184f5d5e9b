"""jaxmesh's native policy protocol over gRPC: one bidirectional ``Session``
stream per client run. The wire, tokens and limits: docs/serving.md, "jaxmesh's
own protocol: RemotePolicy". A request the server cannot run ends that stream
only (``INVALID_ARGUMENT``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hmac
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import grpc

from jaxmesh.remote.server.options import bind
from jaxmesh.remote.server.sessions import _cancel
from jaxmesh.serve import codec
from jaxmesh.serve.batcher import Batcher, ServerClosed
from jaxmesh.serve.forward import RequestError

if TYPE_CHECKING:
    from jaxmesh.serve.server import Options

SERVICE = "jaxmesh.policy.v1.PolicyService"
METHOD = f"/{SERVICE}/Session"


class _IdleWatch:
    """One thread that ends streams which sent nothing for ``seconds``."""

    def __init__(self, seconds: float, address: str):
        self.seconds, self.address = seconds, address
        self.cond = threading.Condition()
        #: a stream's context -> since when it waits for a message
        self.waiting: dict[Any, float] = {}
        self.done = False
        self.thread = threading.Thread(
            target=self._watch, name="jaxmesh-policy-idle", daemon=True
        )
        if not math.isinf(seconds):
            self.thread.start()

    def waits(self, context: Any) -> None:
        """The stream of ``context`` waits for its client from now (or earlier)."""
        with self.cond:
            self.waiting.setdefault(context, time.monotonic())
            self.cond.notify()

    def heard(self, context: Any) -> None:
        with self.cond:
            self.waiting.pop(context, None)

    def _watch(self) -> None:
        with self.cond:
            while not self.done:
                now = time.monotonic()
                for context, since in list(self.waiting.items()):
                    if now - since >= self.seconds:
                        del self.waiting[context]
                        _cancel(
                            context,
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"the policy server at {self.address} heard nothing "
                            f"from this session for {self.seconds:g} s "
                            "(idle_timeout) and ended it; open a new session, or "
                            "start the server with a longer --idle-timeout",
                        )
                first = min(self.waiting.values(), default=None)
                wait = None if first is None else first + self.seconds - now
                self.cond.wait(wait)

    def stop(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join()


class _PolicyTokenInterceptor(grpc.ServerInterceptor):
    """Refuses a call without the token before its first message is read."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(given).encode(), self.expected):
            return continuation(details)

        def refuse(requests: Any, context: grpc.ServicerContext) -> Any:
            why = "no token" if not given else "a wrong token"
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the policy server wants a token and the call carried {why}: pass "
                "RemotePolicy(address, token=...) (or set JAXMESH_TOKEN)",
            )

        return grpc.stream_stream_rpc_method_handler(refuse)


class GrpcService:
    """The gRPC server of a ``PolicyServer(protocol="grpc")``: ``batcher``'s
    model (``agents.Pools``) stepped through it; ``opts``: the server's
    ``Options``."""

    def __init__(self, batcher: Batcher, opts: Options):
        self.pools, self.batcher, self.opts = batcher.model, batcher, opts
        self._inflight, self._inflight_lock = 0, threading.Lock()
        self._idle: _IdleWatch | None = None
        self._server: grpc.Server | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> int:
        """Binds and serves; returns the bound port (OSError: cannot bind)."""
        opts, most = self.opts, min(self.opts.max_connections, 256)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            most, thread_name_prefix="jaxmesh-policy-grpc"
        )
        server = grpc.server(
            self._executor,
            interceptors=(_PolicyTokenInterceptor(opts.token),) if opts.token else (),
            maximum_concurrent_rpcs=most,
            options=[
                ("grpc.max_send_message_length", opts.max_message_bytes),
                ("grpc.max_receive_message_length", opts.max_message_bytes),
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
                ("grpc.http2.max_ping_strikes", 0),
            ],
        )
        handler = grpc.stream_stream_rpc_method_handler(self._session)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Session": handler}),)
        )
        try:
            port = bind(server, f"{opts.host}:{opts.port}", opts.tls)
        except OSError:
            self._executor.shutdown(wait=False)
            raise
        server.start()
        self._server = server
        self._idle = _IdleWatch(opts.idle_timeout, f"{opts.host}:{port}")
        return port

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ends every stream and joins the handler threads."""
        if self._server is not None:
            self._server.stop(0).wait(timeout)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._idle is not None:
            self._idle.stop()

    def _session(self, requests: Any, context: grpc.ServicerContext) -> Any:
        session = None
        idle = self._idle
        held = 0  # the bytes of this stream's latest message
        refuse = functools.partial(context.abort, grpc.StatusCode.INVALID_ARGUMENT)
        try:
            while True:
                # A client that takes no reply is idle too (waits from then).
                idle.waits(context)
                try:
                    data = next(requests)
                except (StopIteration, grpc.RpcError):
                    return
                idle.heard(context)
                held = self._hold(held, len(data), context)
                try:
                    msg = codec.unpackb(data, max_bytes=self.opts.max_message_bytes)
                except codec.CodecError as e:
                    refuse(str(e))
                if not isinstance(msg, dict) or len(msg) != 1:
                    refuse("a message is a map with one key, 'open' or 'step'")
                ((kind, body),) = msg.items()
                if session is None:
                    if kind != "open":
                        refuse(f"the first message is 'open', not {kind!r}")
                    try:
                        session, info = self.pools.open(body)
                    except RequestError as e:
                        refuse(str(e))
                    group = id(session.pool)  # its steps' signature
                    self.batcher.connect(group)
                    idle.waits(context)  # a reply it does not take, too
                    yield codec.packb({"opened": info})
                    continue
                if kind != "step":
                    refuse(f"expected a 'step' message, not {kind!r}")
                try:
                    prepared = self.pools.check(session, body)
                    reply = self.batcher.run_alone(prepared)
                    if reply is None:
                        reply = self.batcher.submit(prepared).result()
                except RequestError as e:
                    refuse(str(e))
                except ServerClosed as e:
                    context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
                idle.waits(context)
                yield codec.packb({"step": reply.output, "timing": reply.timing()})
        finally:
            self._hold(held, 0, context)
            idle.heard(context)
            if session is not None:
                self.pools.close(session)
                self.batcher.disconnect(group)

    def _hold(self, held: int, size: int, context: Any) -> int:
        """A stream's held bytes go from ``held`` to ``size`` (its new
        message); ends the stream when all streams' would pass the cap."""
        with self._inflight_lock:
            total = self._inflight - held
            over = size > 0 and total + size > self.opts.max_inflight_bytes
            if not over:  # (refused: ``held`` stays, the stream's end frees it)
                self._inflight = total + size
        if over:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a message of {size} bytes while the server's streams hold "
                f"{total} bytes (at most {self.opts.max_inflight_bytes} at once); "
                "retry later",
            )
        return size


__all__ = ["GrpcService", "METHOD", "SERVICE"]
