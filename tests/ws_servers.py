"""The frame of a websocket server written in a test: its own event loop in a
thread, ``with Server() as server:`` starting it and stopping it."""

from __future__ import annotations

import asyncio
import threading


class ThreadedServer:
    """Runs ``self._main()`` (a coroutine the subclass writes) in a thread.

    ``_main`` sets ``self._loop`` and ``self._stop`` (an ``asyncio.Event``
    whose set ends it) and then ``self._ready`` once it listens; entering
    waits for that, leaving sets ``_stop`` and joins the thread.
    """

    def __init__(self):
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()))

    async def _main(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
