"""Losing and rejoining a server of a served run: ``ServerLoss``."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from jaxmesh.errors import RemoteConnectionError
from jaxmesh.run import backend, stream

#: A lost server is tried again after these pauses (seconds), for at most
#: ``REJOIN_SECONDS`` after the loss, each try waiting ``REJOIN_CONNECT_SECONDS``
#: for the handshake.
REJOIN_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0)
REJOIN_SECONDS = 60.0
REJOIN_CONNECT_SECONDS = 2.0


class ServerLoss:
    """Drops a server that failed or hung past the automatic limit (its
    episodes run again on the others), tries it again in the background and
    gives it its lanes back when it returns."""

    def __init__(self, run: Any):
        self.run = run
        self.lost: set[int] = set()
        self.t_start = time.perf_counter()
        # A lost server is tried again in the background (``_reconnect``); a
        # new session waits in ``rejoins`` until the loop takes it.
        self.rejoins: queue.SimpleQueue = queue.SimpleQueue()
        self.stop_rejoining = threading.Event()
        self.rejoin_threads: list[threading.Thread] = []

    def hung_limit(self) -> float | None:
        """Seconds a server may owe a reply and send nothing (or None)."""
        slowest = self.run.inbox.slowest
        if not slowest:
            return None
        return max(backend.AUTO_FLOOR_SECONDS, backend.AUTO_FACTOR * slowest)

    def hung_wait(self) -> float | None:
        """How long the next wait may last (None: no limit yet)."""
        limit = self.hung_limit()
        if limit is None:
            return None
        times = [
            since
            for s, c in enumerate(self.run.lanes.sessions)
            if s not in self.lost and (since := c.owed_since()) is not None
        ]
        if not times:
            return limit
        return max(min(times) + limit - time.monotonic(), 0.0) + 0.01

    def drop_hung(self) -> None:
        """Drops a server past ``hung_limit`` while another one is left."""
        limit = self.hung_limit()
        if limit is None:
            return
        sessions = self.run.lanes.sessions
        now = time.monotonic()
        for s, session in enumerate(sessions):
            since = None if s in self.lost else session.owed_since()
            if since is None or now - since <= limit:
                continue
            error = RemoteConnectionError(
                f"the jaxmesh env server at {session.address} sent nothing for "
                f"{now - since:.1f} s while owing a reply: past the default reply "
                f"timeout of {limit:.1f} s ({backend.AUTO_FACTOR:g}x the slowest "
                f"reply of this run, {self.run.inbox.slowest:.3f} s, and at least "
                f"{backend.AUTO_FLOOR_SECONDS:g} s); pass served=jaxmesh.Served("
                "reply_timeout=...) to set it, or reply_timeout=None to wait",
                address=session.address,
                code="DEADLINE_EXCEEDED",
            )
            self.lose(s, error)  # False: the last server; it may answer

    def oldest_in_flight(self) -> int:
        """The server whose oldest call in flight was sent first."""
        waiting = [(q[0][1], s) for s, q in enumerate(self.run.outbox.inflight) if q]
        return min(waiting)[1]

    def lose(self, s: int, exc: BaseException) -> bool:
        """Drops server ``s`` after ``exc`` when the run may go on; False (the
        caller raises) under ``on_server_loss="raise"`` or with none left."""
        run = self.run
        sessions = run.lanes.sessions
        left = [t for t in range(len(sessions)) if t != s and t not in self.lost]
        if run.lanes.on_server_loss != "rerun" or not left:
            return False
        self.lost.add(s)
        js = np.flatnonzero(run.server == s)
        run.epoch[js] += 1  # whatever is queued or in flight for them is void
        run.ready[js] = run.waiting[js] = False
        run.outbox.drop(s)
        sessions[s].close()
        episodes = run.lose_lanes(js)
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        loss = {
            "event": "lost",
            "server": sessions[s].address,
            "at_seconds": self._now(),
            "error": first_line,
            "lanes": int(js.size),
            "episodes_rerun": len(episodes),
            "rejoined_at_seconds": None,
        }
        run.episodes_out.run_fields.setdefault("server_losses", []).append(loss)
        run.tel.add("server_lost", 1)
        stream.call(run.episodes_out.hooks, "on_fault", dict(loss))
        thread = threading.Thread(target=self._reconnect, args=(s,), daemon=True)
        self.rejoin_threads.append(thread)
        thread.start()
        return True

    def _now(self) -> float:
        return round(time.perf_counter() - self.t_start, 6)

    def _reconnect(self, s: int) -> None:
        """Tries server ``s`` again with backoff, into ``rejoins``."""
        end = time.monotonic() + REJOIN_SECONDS
        for delay in REJOIN_DELAYS:
            if self.stop_rejoining.wait(delay) or time.monotonic() > end:
                return
            try:
                session = self.run.lanes.reconnect(s, REJOIN_CONNECT_SECONDS)
            except Exception:  # not back yet, or something else now
                continue
            if self.stop_rejoining.is_set():
                session.close()
                return
            self.rejoins.put((s, session))
            return

    def take_rejoins(self) -> None:
        """Servers that came back take their lanes again."""
        run = self.run
        while not self.rejoins.empty():  # the loop is its one consumer
            s, session = self.rejoins.get()
            run.lanes.sessions[s] = session
            keys = run.obs_keys
            session.open(
                replies=run.inbox.replies, tag=s, reader=True, observation_keys=keys
            )
            run.lockstep[s] = session.lockstep
            run.tel.add("transport_shm", session.transport == "shm")
            self.lost.discard(s)
            js = np.flatnonzero(run.server == s)
            run.dead[js] = run.capped[js] = False
            run.epoch[js] += 1
            at = self._now()
            for loss in reversed(run.episodes_out.run_fields["server_losses"]):
                if loss["server"] == session.address:
                    loss["rejoined_at_seconds"] = at
                    break
            run.tel.add("server_rejoined", 1)
            event = {"event": "rejoined", "server": session.address, "at_seconds": at}
            stream.call(run.episodes_out.hooks, "on_fault", event)
            run.take_next(run.server == s)

    def stop(self) -> None:
        """Ends the reconnect attempts; closes sessions never taken."""
        self.stop_rejoining.set()
        for thread in self.rejoin_threads:
            thread.join(REJOIN_CONNECT_SECONDS + 1.0)
        while not self.rejoins.empty():
            self.rejoins.get()[1].close()
