"""The outgoing side of a served run: ``Outbox``."""

from __future__ import annotations

import collections
import time
from typing import Any

import numpy as np

from jaxmesh.envs import gymnasium as gym_lanes


class Outbox:
    """A served run's queued resets and segments, flushed into one call per
    rank per server (one at a time to a lockstep server), and its calls in
    flight, each with its tag."""

    def __init__(self, run: Any):
        self.run = run
        n = run.n
        # Queued: resets (lane -> episode) and segments, each ``(lanes, epochs,
        # ranks, counts, wire actions)``.
        self.resets: dict[int, int] = {}
        self.segments: list[tuple] = []
        self.queued = np.zeros(n, np.int64)  # segments queued per lane
        self.released: list[int] = []  # lanes to release (lockstep servers)
        # Per server, the calls awaiting replies: ``(tag, sent_at)``.
        self.inflight = [collections.deque() for _ in run.lanes.sessions]

    def queue(self, lanes_: np.ndarray, counts: np.ndarray, acts) -> None:
        """Queues one segment per lane (``counts[i]`` rows of ``acts`` each)."""
        if lanes_.size:  # as the env's own action values (Discrete: plus start)
            wire = gym_lanes.env_actions(self.run.lanes.action_space, acts)
            self._append(lanes_, counts, wire)

    def _append(self, lanes_: np.ndarray, counts: np.ndarray, wire) -> None:
        run = self.run
        ranks = self.queued[lanes_].copy()
        self.segments.append((lanes_, run.epoch[lanes_], ranks, counts, wire))
        self.queued[lanes_] += 1

    def flush(self, which: np.ndarray | None = None) -> None:
        """Sends the queued items of the lanes in ``which`` (None: all)."""
        if not self.resets and not self.segments and not self.released:
            return
        run = self.run
        lanes_ = ranks = counts = starts = np.zeros(0, np.int64)
        live, acts = np.zeros(0, bool), None
        if self.segments:
            queued = (np.concatenate(x) for x in zip(*self.segments, strict=True))
            lanes_, epochs, ranks, counts, acts = queued
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            live = epochs == run.epoch[lanes_]
        self.segments = []
        self.queued[:] = 0
        resets, self.resets = self.resets, {}
        if which is not None:  # the other lanes' items wait, in order
            for q in np.flatnonzero(live & ~which[lanes_]):
                self._requeue(lanes_[q], acts[starts[q] : starts[q] + counts[q]])
            live = live & which[lanes_]
            for g in [g for g in resets if not which[g]]:
                self.resets[g] = resets.pop(g)
        top = int(ranks[live].max()) + 1 if live.any() else 1
        for s in range(len(run.lanes.sessions)):
            on_s = live & (run.server[lanes_] == s)
            rs = [g for g in resets if run.server[g] == s]
            if run.lockstep[s]:
                self._flush_lockstep(s, on_s, lanes_, counts, starts, acts, rs, resets)
                continue
            for r in range(top):
                pick = np.flatnonzero(on_s & (ranks == r))
                rr = rs if r == 0 else []
                if pick.size or rr:
                    self._send(s, pick, lanes_, counts, starts, acts, rr, resets)

    def _flush_lockstep(self, s, on_s, lanes_, counts, starts, acts, rs, resets):
        """One call at a time, each lane's next segment cut to one count (a
        VectorEnv server steps every lane at once); the rest waits."""
        pick = np.flatnonzero(on_s)
        if self.inflight[s]:  # wait for the call in flight: queue it all again
            for g in rs:
                self.resets[g] = resets[g]
            for q in pick:
                self._requeue(lanes_[q], acts[starts[q] : starts[q] + counts[q]])
            return
        merged: dict[int, list] = {}
        for q in pick:  # in queue order: ranks ascending per lane
            merged.setdefault(int(lanes_[q]), []).append(
                acts[starts[q] : starts[q] + counts[q]]
            )
        # Each lane's first segment, cut to the shortest: a segment still ends
        # a call (its last observation is the one a plan reads).
        chunks = {g: parts[0] for g, parts in merged.items()}
        if chunks:
            c = min(len(x) for x in chunks.values())
            for g, parts in merged.items():
                if len(parts[0]) > c:
                    self._requeue(g, parts[0][c:])
                for part in parts[1:]:
                    self._requeue(g, part)
            gs = np.asarray(sorted(chunks), np.int64)
            rows = np.concatenate([chunks[g][:c] for g in gs])
            cnt = np.full(gs.size, c, np.int64)
            st = np.arange(gs.size, dtype=np.int64) * c
            # _send reads each lane's rows through (lanes, counts, starts).
            self._send(s, np.arange(gs.size), gs, cnt, st, rows, rs, resets)
        elif rs or any(self.run.server[g] == s for g in self.released):
            self._send(
                s, np.zeros(0, np.int64), lanes_, counts, starts, acts, rs, resets
            )

    def _requeue(self, g: int, rows: np.ndarray) -> None:
        """Queues wire actions again for lane ``g``."""
        self._append(np.asarray([g], np.int64), np.asarray([len(rows)], np.int64), rows)

    def call(self, s, rs, resets, act_g, counts, rows, tag) -> None:
        """One call to server ``s``: the resets of lanes ``rs``, ``counts[i]``
        wire actions (``rows``) for each lane of ``act_g`` (ascending in local
        order) and the lanes released there; ``tag`` waits for the reply."""
        t0 = time.perf_counter()
        run = self.run
        session = run.lanes.sessions[s]
        reset_g = tag[0]
        eps = [resets[g] for g in reset_g]
        release = [g for g in self.released if run.server[g] == s]
        if release:
            self.released = [g for g in self.released if run.server[g] != s]
        size = session.send(
            reset_lanes=run.local[reset_g],
            seeds=run.seeds[eps],
            trials=run.trial_of[eps] if session.trial_index else None,
            max_episode_seconds=run.seconds,
            lanes=run.local[act_g] if act_g.size else None,
            counts=counts,
            actions=rows,
            release=run.local[release] if release else (),
            all_observations=run.every_obs,
            info_keys=run.info_keys,
            info_every_step=run.info_every_step,
        )
        # The call starts when its bytes go out (the server may start at once,
        # before send returns): its span holds the server's step.
        now = session.sent_at
        run.tel.span(
            "encode", t0, now, run.server_rows[s], resets=len(reset_g), lanes=len(act_g)
        )
        run.tel.add("request_bytes", size)
        self.inflight[s].append((tag, now))

    def _send(self, s, pick, lanes_, counts, starts, acts, rs, resets) -> None:
        reset_g = np.asarray(sorted(rs), np.int64)
        act_g = np.zeros(0, np.int64)
        c = rows = None
        if pick.size:
            order = pick[np.argsort(self.run.local[lanes_[pick]], kind="stable")]
            act_g = lanes_[order]
            c = counts[order]
            if np.all(c == 1):
                at = starts[order]
            else:
                at = np.repeat(starts[order] - np.cumsum(c) + c, c) + np.arange(
                    int(c.sum())
                )
            rows = acts[at]
        tag = (reset_g, self.run.epoch[reset_g], act_g, self.run.epoch[act_g])
        self.call(s, rs, resets, act_g, c, rows, tag)

    def drop(self, s: int) -> None:
        """Drops lost server ``s``'s queued resets, releases and calls."""
        server = self.run.server
        for j in np.flatnonzero(server == s).tolist():
            self.resets.pop(j, None)
        self.released = [j for j in self.released if server[j] != s]
        self.inflight[s].clear()
