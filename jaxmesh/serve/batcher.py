"""One queue for the requests of every connection, and the thread that runs
them in batches (the rules: docs/serving.md, "Batching"). A request that fails
fails alone; a failed forward fails its batch only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, NamedTuple

from jaxmesh.serve.forward import Prepared, RequestError, ServedModel

#: The most requests waiting at once; more are refused.
MAX_QUEUE = 4096


class Options(NamedTuple):
    """``PolicyServer``'s arguments, as its protocol's service reads them."""

    host: str
    port: int
    token: str | None
    #: ``tls`` as an ``ssl.SSLContext`` (openpi) or ``grpc.ServerCredentials``.
    tls: Any
    max_message_bytes: int
    max_connections: int
    max_inflight_bytes: int
    idle_timeout: float
    #: The map a client receives first (openpi).
    metadata: dict


class ServerClosed(RuntimeError):
    """The server shut down before the request ran."""


class BatchReply(NamedTuple):
    """A request's output (``[K, *A]``) and its forward's batch size, padded
    size, wait in the queue and time (docs/serving.md, "Batching")."""

    output: Any
    batch_size: int
    padded: int
    queue_ms: float
    forward_ms: float

    def timing(self) -> dict[str, float | int]:
        keys = ("batch_size", "padded_batch", "queue_ms", "forward_ms")
        return dict(zip(keys, self[1:], strict=True))


@dataclasses.dataclass(eq=False)
class _Item:
    prepared: Prepared
    future: concurrent.futures.Future
    arrived: float


@dataclasses.dataclass
class BatchStats:
    """What the batcher has done since it started.

    Attributes:
      forwards: forwards run.
      requests: requests answered (with an output).
      failed: requests failed (refused by the model, or their forward failed).
      dropped: requests whose client had gone before they ran.
      batch_sizes: batch size -> forwards of that size.
    """

    forwards: int = 0
    requests: int = 0
    failed: int = 0
    dropped: int = 0
    batch_sizes: dict[int, int] = dataclasses.field(default_factory=dict)


class Batcher:
    """Runs the requests of every connection through ``model`` in batches;
    ``max_wait_ms``: how long a forward may wait, after its oldest request
    arrived, for more (ValueError: negative or not finite)."""

    def __init__(self, model: ServedModel, *, max_wait_ms: float):
        ok = (
            isinstance(max_wait_ms, int | float)
            and not isinstance(max_wait_ms, bool)
            and 0 <= max_wait_ms < float("inf")
        )
        if not ok:
            raise ValueError(
                f"max_wait_ms={max_wait_ms!r}: expected milliseconds >= 0 (how "
                "long a forward waits for more requests; 0: never)"
            )
        self.model = model
        self.max_batch = model.max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.stats = BatchStats()
        self._queue: list[_Item] = []
        #: signature -> its requests in the queue.
        self._counts: collections.Counter = collections.Counter()
        self._cond = threading.Condition()
        self._clients = 0
        #: group (a request signature) -> its connected clients.
        self._groups: collections.Counter = collections.Counter()
        self._closed = False
        #: A forward is running (in the forward thread or a caller's).
        self._busy = False
        self._thread: threading.Thread | None = None

    def connect(self, group: Any = None) -> None:
        """A client connected; ``group``: the ``signature`` of all its
        requests, when known (a forward of another never waits for it)."""
        with self._cond:
            self._clients += 1
            if group is not None:
                self._groups[group] += 1

    def disconnect(self, group: Any = None) -> None:
        """A client (of ``group``, as it connected) left."""
        with self._cond:
            self._clients -= 1
            if group is not None:
                self._groups -= collections.Counter([group])  # drops a 0
            self._cond.notify()

    def _could_join(self, signature: Any) -> int:
        """How many connected clients could send a request of ``signature``."""
        if signature in self._groups:
            return self._groups[signature]
        return self._clients - sum(self._groups.values())

    def _complete(self, signature: Any) -> bool:
        """Whether a forward of ``signature`` has a full batch, or a request
        from every client that could join it."""
        counts = self._counts
        same = counts[signature]
        if same >= self.max_batch:
            return True
        if signature in self._groups:
            queued = same
        else:  # every client of no group may join it: its requests count
            queued = sum(n for sig, n in counts.items() if sig not in self._groups)
        return queued >= self._could_join(signature)

    def poke(self) -> None:
        """Wakes the forward thread if requests wait (for ``submit(lazy=True)``)."""
        with self._cond:
            if self._queue and not self._busy:
                self._cond.notify()

    def run_alone(self, prepared: Prepared) -> BatchReply | None:
        """The request's ``BatchReply``, run in the calling thread when no other
        client could join its forward and none runs or waits; else None."""
        with self._cond:
            alone = self._could_join(prepared.signature) <= 1
            if self._closed or not alone or self._queue or self._busy:
                return None
            self._busy = True
        item = _Item(prepared, concurrent.futures.Future(), time.perf_counter())
        item.future.set_running_or_notify_cancel()
        self._run([item])
        return item.future.result()

    def submit(
        self, prepared: Prepared, *, inline: bool = False, lazy: bool = False
    ) -> concurrent.futures.Future:
        """Queues a request; its future's result is a ``BatchReply``.
        ``inline``: a batch this request completes while no forward runs runs
        here, in the calling thread; ``lazy``: a first request does not wake
        the forward thread (the caller ``poke``s it within ``max_wait_ms``).

        Raises:
          ServerClosed: the batcher is closed.
          RequestError: the queue is full.
        """
        sig = prepared.signature
        with self._cond:
            if self._closed:
                raise ServerClosed("the policy server is shutting down")
            if len(self._queue) >= MAX_QUEUE:
                raise RequestError(
                    f"the server has {MAX_QUEUE} requests waiting; retry later"
                )
            item = _Item(prepared, concurrent.futures.Future(), time.perf_counter())
            self._queue.append(item)
            self._counts[sig] += 1
            batch = None
            if (
                inline
                and not self._busy
                and self._queue[0].prepared.signature == sig
                and self._counts[sig] >= self._could_join(sig)
            ):
                batch = self._pop(sig)
                self._busy = bool(batch)
            if not batch:
                # The forward thread wakes for a first request (unless lazy)
                # or a batch now complete.
                first = len(self._queue) == 1 and not lazy
                if first or self._complete(self._queue[0].prepared.signature):
                    self._cond.notify()
                return item.future
        self._run(batch)
        return item.future

    def run_ready(
        self, prepared: Prepared, *, lazy: bool = False
    ) -> concurrent.futures.Future:
        """``submit(prepared, inline=True, lazy=lazy)``."""
        return self.submit(prepared, inline=True, lazy=lazy)

    def _pop(self, signature: Any) -> list[_Item]:
        """Takes the next batch of ``signature``: those of its oldest requests
        whose client is still there."""
        if self._counts[signature] == len(self._queue) <= self.max_batch:
            batch, self._queue = self._queue, []
        else:
            same = [i for i in self._queue if i.prepared.signature == signature]
            batch = same[: self.max_batch]
            taken = set(map(id, batch))
            self._queue = [i for i in self._queue if id(i) not in taken]
        self._counts -= collections.Counter({signature: len(batch)})  # drops a 0
        live = [i for i in batch if i.future.set_running_or_notify_cancel()]
        self.stats.dropped += len(batch) - len(live)
        return live

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the batcher has already started")
        self._thread = threading.Thread(
            target=self._loop, name="jaxmesh-policy-batcher", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float | None = 10.0) -> None:
        """Fails the waiting requests, lets a running forward end, joins."""
        with self._cond:
            self._closed = True
            waiting, self._queue = self._queue, []
            self._counts.clear()
            self._cond.notify_all()
        for item in waiting:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(ServerClosed("the policy server shut down"))
        if self._thread is not None:
            self._thread.join(timeout)

    def _take(self) -> list[_Item] | None:
        """The next batch (its futures running), or None once closed."""
        with self._cond:
            while True:
                self._cond.wait_for(
                    lambda: (self._queue and not self._busy) or self._closed
                )
                if self._closed:
                    return None
                head = self._queue[0]
                deadline = head.arrived + self.max_wait
                sig = head.prepared.signature

                def gone(head: _Item = head) -> bool:  # an inline submit ran it
                    return self._busy or not self._queue or self._queue[0] is not head

                while not (self._closed or self._complete(sig) or gone()):
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed:
                    return None
                if gone():
                    continue
                live = self._pop(sig)
                if live:
                    self._busy = True
                    return live

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            self._run(batch)

    def _run(self, batch: list[_Item]) -> None:
        """Runs a batch (``_busy`` set by the caller, cleared here)."""
        start = time.perf_counter()
        try:
            done = self.model.run([i.prepared for i in batch])
        except Exception as e:  # noqa: BLE001 - it fails these requests only
            self.stats.failed += len(batch)
            for item in batch:
                item.future.set_exception(e)
        else:
            stats, n = self.stats, len(batch)
            stats.forwards += 1
            stats.requests += n
            stats.batch_sizes[n] = stats.batch_sizes.get(n, 0) + 1
            ms = done.seconds * 1000.0
            for item, out in zip(batch, done.outputs, strict=True):
                queued = (start - item.arrived) * 1000.0
                item.future.set_result(BatchReply(out, n, done.padded, queued, ms))
        finally:
            with self._cond:
                self._busy = False
                if self._queue or self._closed:
                    self._cond.notify_all()


__all__ = ["BatchStats", "Batcher", "BatchReply", "ServerClosed"]
