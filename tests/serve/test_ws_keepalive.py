"""A ``RemotePolicy("ws://")`` connection left idle between plans stays
usable: its client answers the server's keepalive pings while no plan runs,
and a connection the server closed meanwhile is replaced, not used. The
server here is websockets' own, pinging every 0.2 s."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from openpi_client import msgpack_numpy
from websockets.asyncio.server import serve
from ws_servers import ThreadedServer

from jaxmesh.serve import ws_client
from jaxmesh.serve.ws_client import WebsocketPolicy


class PingingServer(ThreadedServer):
    """openpi's protocol: ``{"actions": 2 * state}`` per request; pings
    every 0.2 s, closing a connection whose pong is 0.3 s late;
    ``close_idle()`` closes every open connection."""

    def __init__(self):
        super().__init__()
        self.connections: list = []
        self.opened = 0
        self._closing: set = set()

    def close_idle(self) -> None:
        """Sends each open connection a close frame (its handshake then ends
        when the client answers)."""

        async def close_all():
            for ws in self.connections:
                self._closing.add(asyncio.ensure_future(ws.close()))

        asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(10)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve(
            self._handle,
            "127.0.0.1",
            0,
            compression=None,
            ping_interval=0.2,
            ping_timeout=0.3,
        ) as server:
            self.address = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self._ready.set()
            await self._stop.wait()

    async def _handle(self, ws) -> None:
        self.opened += 1
        self.connections.append(ws)
        try:
            await ws.send(msgpack_numpy.packb({}))
            async for message in ws:
                obs = msgpack_numpy.unpackb(message)
                reply = {"actions": 2 * obs["observation/state"]}
                await ws.send(msgpack_numpy.packb(reply))
        finally:
            self.connections.remove(ws)


def test_idle_connections_answer_pings_and_closed_ones_are_replaced(monkeypatch):
    monkeypatch.setattr(ws_client, "KEEPALIVE_S", 0.05)
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    with PingingServer() as server:
        with WebsocketPolicy(server.address, connections=2) as policy:
            np.testing.assert_array_equal(policy._plan(obs), 2 * obs)
            assert server.opened == 2
            time.sleep(1.5)  # seven pings, each answered while idle
            np.testing.assert_array_equal(policy._plan(obs), 2 * obs)
            assert server.opened == 2  # the same two connections
            server.close_idle()
            time.sleep(0.5)  # the keepalive drops them
            np.testing.assert_array_equal(policy._plan(obs), 2 * obs)
            assert server.opened == 4  # two new ones


def test_a_connection_closed_between_plans_is_replaced_by_the_next(monkeypatch):
    monkeypatch.setattr(ws_client, "KEEPALIVE_S", 1000.0)  # no keepalive read
    obs = np.arange(3, dtype=np.float32).reshape(1, 3)
    with PingingServer() as server:
        with WebsocketPolicy(server.address, connections=1) as policy:
            np.testing.assert_array_equal(policy._plan(obs), 2 * obs)
            server.close_idle()
            time.sleep(0.2)
            np.testing.assert_array_equal(policy._plan(obs), 2 * obs)
            assert server.opened == 2
