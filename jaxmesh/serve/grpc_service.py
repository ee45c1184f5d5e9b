"""jaxmesh's native policy protocol over gRPC: one bidirectional ``Session``
stream per client run. The wire, tokens and limits: docs/serving.md, "jaxmesh's
own protocol: RemotePolicy". A request the server cannot run ends that stream
only (``INVALID_ARGUMENT``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hmac
import threading
from typing import Any

import grpc

from jaxmesh.remote.server.options import grpc_server
from jaxmesh.remote.server.sessions import _cancel, _Session
from jaxmesh.serve import codec
from jaxmesh.serve.batcher import Batcher, Options, ServerClosed
from jaxmesh.serve.forward import RequestError

SERVICE = "jaxmesh.policy.v1.PolicyService"
METHOD = f"/{SERVICE}/Session"


class GrpcService:
    """The gRPC server of a ``PolicyServer(protocol="grpc")``: ``batcher``'s
    model (``agents.Pools``) stepped through it; ``opts``: the server's
    ``Options``."""

    def __init__(self, batcher: Batcher, opts: Options):
        self.pools, self.batcher, self.opts = batcher.model, batcher, opts
        self._inflight, self._inflight_lock = 0, threading.Lock()
        self._expected = f"Bearer {opts.token}".encode()
        self._server: grpc.Server | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> int:
        """Binds and serves; returns the bound port (OSError: cannot bind)."""
        opts, most = self.opts, min(self.opts.max_connections, 256)
        handler = grpc.stream_stream_rpc_method_handler(self._session)
        self._server, self._executor, port = grpc_server(
            f"{opts.host}:{opts.port}",
            opts.tls,
            SERVICE,
            {"Session": handler},
            workers=most,
            name="jaxmesh-policy-grpc",
            why=self._token_error if opts.token else None,
            send=opts.max_message_bytes,
            receive=opts.max_message_bytes,
            maximum_concurrent_rpcs=most,
        )
        self._server.start()
        self.address = f"{opts.host}:{port}"
        return port

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ends every stream and joins the handler threads."""
        if self._server is not None:
            self._server.stop(0).wait(timeout)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _token_error(self, metadata: Any) -> str | None:
        """Why a call with this metadata is refused (None: it is not)."""
        given = dict(metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(given).encode(), self._expected):
            return None
        why = "no token" if not given else "a wrong token"
        return (
            f"the policy server wants a token and the call carried {why}: pass "
            "RemotePolicy(address, token=...) (or set JAXMESH_TOKEN)"
        )

    def _quiet(self, what: str) -> str:
        return (
            f"the policy server at {self.address} heard nothing from this session "
            f"for {self.opts.idle_timeout:g} s (idle_timeout) and ended it; open a "
            "new session, or start the server with a longer --idle-timeout"
        )

    def _session(self, requests: Any, context: grpc.ServicerContext) -> Any:
        watch = _Session(functools.partial(_cancel, context))
        watch.watch_idle(self.opts.idle_timeout, self._quiet)
        session = group = None
        held = 0  # the bytes of this stream's latest message
        refuse = functools.partial(context.abort, grpc.StatusCode.INVALID_ARGUMENT)

        def receive() -> bytes | None:
            try:
                return next(requests)
            except (StopIteration, grpc.RpcError):
                return None

        def answer(data: bytes) -> bytes:
            nonlocal session, group, held
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
                return codec.packb({"opened": info})
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
            return codec.packb({"step": reply.output, "timing": reply.timing()})

        try:
            yield from watch.serve(receive, answer)
        finally:
            watch.stop()
            self._hold(held, 0, context)
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
