"""openpi's websocket policy protocol, as ``openpi-client`` speaks it, served
by one asyncio loop in its own thread (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import http
import threading
import time
import traceback
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from jaxmesh.serve import codec
from jaxmesh.serve.batcher import Batcher, Options, ServerClosed
from jaxmesh.serve.forward import RequestError

HEALTH_PATH = "/healthz"
#: Frames a connection's reader buffers beyond the one being answered.
MAX_QUEUED_FRAMES = 1
#: The close reason after an error's text frame (openpi's own words).
ERROR_REASON = "Internal server error. Traceback included in previous frame."


class OpenpiService:
    """The websocket server of ``PolicyServer(protocol="openpi")``: requests
    go to ``batcher``; ``opts``: the server's ``Options``."""

    def __init__(self, batcher: Batcher, opts: Options):
        self.batcher, self.opts, self.port = batcher, opts, opts.port
        self.metadata = codec.packb(opts.metadata)
        self._auth = None if opts.token is None else f"Api-Key {opts.token}".encode()
        #: Open connections, and the request bytes they hold now.
        self._connections = self._inflight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A ``Batcher.poke`` is scheduled on the loop.
        self._poke_pending = False
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Binds and serves in a thread; returns the bound port (OSError:
        cannot bind, or what else kept the server from listening)."""
        bound: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main(bound)),
            name="jaxmesh-policy-websocket",
            daemon=True,
        )
        self._thread.start()
        if bound.exception() is not None:
            self._thread.join()
        return bound.result()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Closes every connection and the listening socket; joins the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    async def _main(self, bound: concurrent.futures.Future) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            server: Server = await serve(
                self._handle,
                self.opts.host,
                self.port,
                process_request=self._process_request,
                compression=None,
                max_size=self.opts.max_message_bytes,
                max_queue=MAX_QUEUED_FRAMES,
                ssl=self.opts.tls,
            )
        except Exception as e:  # noqa: BLE001 - raised again by start()
            bound.set_exception(e)
            return
        self.port = server.sockets[0].getsockname()[1]
        bound.set_result(self.port)
        await self._stop.wait()
        server.close()  # closes the connections too (1001, going away)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 10.0)

    def _process_request(self, connection: ServerConnection, request: Any) -> Any:
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self._auth is not None:
            # One header exactly: ``get`` raises on two (HTTP 500).
            given = request.headers.get_all("Authorization")
            got = given[0].encode() if len(given) == 1 else b""
            if not hmac.compare_digest(got, self._auth):
                return connection.respond(
                    http.HTTPStatus.UNAUTHORIZED,
                    "this policy server needs one header 'Authorization: Api-Key "
                    "<token>' (openpi-client: WebsocketClientPolicy(api_key=...)); "
                    + (
                        "its token is not the server's"
                        if len(given) == 1
                        else f"the request carried {len(given)}"
                    )
                    + "\n",
                )
        if self._connections >= self.opts.max_connections:
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"this policy server serves {self.opts.max_connections} connections at "
                "once; retry later\n",
            )
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        self._connections += 1
        self.batcher.connect()
        closed = asyncio.ensure_future(ws.wait_closed())
        prev_total: float | None = None
        try:
            await ws.send(self.metadata)
            while True:
                message = await ws.recv()
                start = time.perf_counter()
                size, cap = len(message), self.opts.max_inflight_bytes
                if self._inflight + size > cap:
                    await self._fail(
                        ws,
                        f"RequestError: a request of {size} bytes while the server "
                        f"holds {self._inflight} bytes of requests (at most "
                        f"{cap} at once); retry later",
                    )
                    return
                self._inflight += size
                try:
                    out = await self._answer(ws, closed, message, start, prev_total)
                finally:
                    self._inflight -= size
                    del message
                if out is None:
                    return
                await ws.send(out)
                prev_total = time.perf_counter() - start
        except ConnectionClosed:
            pass
        finally:
            closed.cancel()
            self.batcher.disconnect()
            self._connections -= 1

    async def _answer(
        self,
        ws: ServerConnection,
        closed: asyncio.Future,
        message: Any,
        start: float,
        prev: float | None,
    ) -> bytes | None:
        """The reply frame to ``message``; None when the connection is over
        (its client went, or it was failed with the reason)."""
        try:
            obs = codec.unpackb(message)
            prepared = self.batcher.model.prepare(obs)
            # A batch this request completes runs here, on the loop (no
            # other connection's request waits on it meanwhile).
            future = self.batcher.submit(prepared, inline=True, lazy=True)
            if not future.done():
                if not self._poke_pending:
                    assert self._loop is not None
                    self._poke_pending = True
                    self._loop.call_later(self.batcher.max_wait, self._poke)
                waiting = asyncio.wrap_future(future)
                await asyncio.wait(
                    (waiting, closed), return_when=asyncio.FIRST_COMPLETED
                )
                if not waiting.done():  # the client went: dropped unless it runs
                    waiting.cancel()  # cancels ``future``
                    return None
            reply = future.result()
            timing = {"infer_ms": (time.perf_counter() - start) * 1000.0}
            if prev is not None:
                timing["prev_total_ms"] = prev * 1000.0
            timing.update(reply.timing())
            return codec.packb({"actions": reply.output, "server_timing": timing})
        except (codec.CodecError, RequestError, ServerClosed) as e:
            await self._fail(ws, f"{type(e).__name__}: {e}")
        except Exception:  # noqa: BLE001 - reported to this client only
            await self._fail(ws, traceback.format_exc())
        return None

    def _poke(self) -> None:
        self._poke_pending = False
        self.batcher.poke()

    async def _fail(self, ws: ServerConnection, text: str) -> None:
        await ws.send(f"jaxmesh policy server: {text}")
        await ws.close(code=CloseCode.INTERNAL_ERROR, reason=ERROR_REASON)


__all__ = ["ERROR_REASON", "HEALTH_PATH", "OpenpiService"]
