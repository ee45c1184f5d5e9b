"""Where a reply is taken and filed: ``take_reply`` (off the stream, or from
the reader threads' queue), ``_file_reply`` (reset observations into the
lanes, step results into each lane's ring buffer, checked against the call's
tag), the info rows a reply carries and its telemetry.

It is a mixin of ``pace._Run``, not a collaborator: its methods read and
write the run's one per-lane state (epochs, ring buffers, queues, calls in
flight), which ``_Run.__init__`` sets and the other mixins share; a
collaborator would need that state handed over or split apart, changing the
code that reads it rather than moving it. A server that fails while a reply is
awaited is handed to ``loss.py`` (``lose_server``).
"""

from __future__ import annotations

import queue
import time
from typing import Any

import numpy as np

from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.errors import RemoteConnectionError, RemoteEnvError
from jaxmesh.remote import codec


def _present(b: codec.ResultBatch, key: str) -> np.ndarray:
    """Which rows of reply ``b`` have info ``key`` (the key is in ``b.info``)."""
    present = (b.info_present or {}).get(key)
    return np.ones(len(b.info[key]), bool) if present is None else present


class _Replies:
    """The run's replies: taken, checked and filed (see the module docstring)."""

    def take_reply(self, block: bool = True) -> bool:
        """Files the next reply of any server; False when none is in (``block``
        False) or none is expected. A server that failed is dropped when the
        run can go on without it (``lose_server``)."""
        if self.rejoin_threads:
            self.take_rejoins()
        sessions = self.lanes.sessions
        if not any(self.inflight):
            return False
        s: int | None = 0 if self.direct else None
        try:
            if self.direct:
                if not block:
                    return False
                reply = sessions[0].receive()
            else:
                auto = self.lanes.auto_timeout
                if auto:
                    self.drop_hung()
                    s, item = self._queued_reply(block, self._hung_wait(), hung=True)
                else:
                    s, item = self._queued_reply(block, sessions[0].reply_timeout)
                if item is None:
                    return block and auto  # a wait cut short: look again
                if s in self.lost:  # queued before its server was dropped
                    return True
                reply = sessions[s].reply(item)
        except RemoteConnectionError as exc:
            if s is None:  # no reply in time: the server waited on longest
                s = self._oldest_in_flight()
            if not self.lose_server(s, exc):
                raise
            return True
        except RemoteEnvError as exc:
            self._mark_env_error(s, exc)
            raise
        tel = self.tel
        row = self.server_rows[s]
        tel.span("decode", reply.arrived, reply.decoded_at, row)
        return self._file_reply(s, reply)

    def _mark_env_error(self, s: int | None, exc: RemoteEnvError) -> None:
        """Marks the env error server ``s`` sent with the run's lane and the
        step of its episode (``HostLoop.env_error`` names them): the call that
        failed is the oldest in flight, so every earlier step of the lane is
        in (``head`` .. ``tail``)."""
        if s is None or exc.lane is None or not 0 <= exc.lane < len(self.to_global[s]):
            return
        j = int(self.to_global[s][exc.lane])
        if j >= 0:
            known = int(self.tail[j] - self.head[j])
            gym_lanes.mark_where(exc, j, exc.phase, known + exc.steps_done)

    def _queued_reply(
        self, block: bool, timeout: float | None, hung: bool = False
    ) -> tuple[int, Any]:
        """The next reply a reader thread queued: ``(server, item)``; item None
        when none is in and ``block`` is False, or (``hung``) when none came
        within ``timeout``."""
        try:
            if block:
                return self.replies.get(timeout=timeout)
            return self.replies.get_nowait()
        except queue.Empty:
            if not block or hung:
                return 0, None
            raise RemoteConnectionError(
                "no reply from the jaxmesh env servers "
                f"{[c.address for c in self.lanes.sessions]} within {timeout} s "
                "(reply_timeout); an env may hang",
                address=self.lanes.sessions[0].address,
                code="DEADLINE_EXCEEDED",
            ) from None

    def _file_reply(self, s: int, reply: Any) -> bool:
        """Files one server's reply: reset observations, step results."""
        b = reply.batch
        (reset_g, reset_ep, act_g, act_ep), sent_at = self.inflight[s].popleft()
        self._tel_reply(s, sent_at, reply)
        g = self.to_global[s][b.lanes]
        if not reset_g.size and b.steps.size and np.all(b.steps == 1):
            # The per-step case (h = 1, every lane one step): no offsets.
            if not np.array_equal(g, act_g):
                raise codec.ProtocolError(
                    f"the server at {self.lanes.sessions[s].address} answered for "
                    f"lanes {b.lanes[:16].tolist()}, asked for "
                    f"{self.local[act_g][:16].tolist()}"
                )
            live = act_ep == self.epoch[g]
            gl = g[live]
            pos = self.tail[gl] % self.cap
            self.rb_reward[gl, pos] = b.rewards[live]
            self.rb_term[gl, pos] = b.terminated[live]
            self.rb_trunc[gl, pos] = b.truncated[live]
            every = bool(live.all())  # the usual reply: no row to mask out
            for key, x in b.observation.items():  # an image row copied once
                self.rb_obs[key][gl, pos] = x if every else x[live]
            self.rb_has_obs[gl, pos] = True
            if self.info_keys:
                info = self.info_rows(b)
                for k in self.info_keys:
                    if k in info:
                        self.rb_info[k][gl, pos] = info[k][live]
                        self.rb_info_has[k][gl, pos] = _present(b, k)[live]
                    else:
                        self.rb_info_has[k][gl, pos] = False
            self.tail[gl] += 1
            return True
        asked = np.sort(np.concatenate([self.local[reset_g], self.local[act_g]]))
        if g.size != asked.size or np.any(b.lanes != asked):
            raise codec.ProtocolError(
                f"the server at {self.lanes.sessions[s].address} answered for lanes "
                f"{b.lanes[:16].tolist()}, asked for {asked[:16].tolist()}"
            )
        obs_rows = b.observation
        row0 = np.concatenate([[0], np.cumsum(b.rows)[:-1]]).astype(np.int64)
        step0 = np.concatenate([[0], np.cumsum(b.steps)[:-1]]).astype(np.int64)
        # Info rows: the observation rows, or a reset's and every step's.
        info0 = row0
        if b.info:
            info0 = self._info_starts(s, b)
        is_reset = np.isin(g, reset_g)
        ep_sent = np.zeros(g.size, np.int64)
        ep_sent[is_reset] = reset_ep[np.searchsorted(reset_g, g[is_reset])]
        # act_g is in ascending local order, as the reply
        act_pos = np.flatnonzero(~is_reset)
        ep_sent[act_pos] = act_ep
        live = ep_sent == self.epoch[g]
        # Resets: the reset observation.
        rl = np.flatnonzero(live & is_reset)
        if rl.size:
            for key, x in obs_rows.items():
                self.obs_leaves[key][g[rl]] = x[row0[rl]]
            self.reset_infos(b, g[rl], info0[rl])
            self.seen_resets(g[rl])
            if self.recorder is not None:
                self.recorder.reset(g[rl], self.obs)
            self.ready[g[rl]] = self.started[g[rl]] = True
        # Replays: step results into the ring buffers.
        al = np.flatnonzero(live & ~is_reset & (b.steps > 0))
        if al.size:
            k = b.steps[al]
            lane_of = np.repeat(g[al], k)
            within = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
            src = np.repeat(step0[al], k) + within
            pos = (np.repeat(self.tail[g[al]], k) + within) % self.cap
            self.rb_reward[lane_of, pos] = b.rewards[src]
            self.rb_term[lane_of, pos] = b.terminated[src]
            self.rb_trunc[lane_of, pos] = b.truncated[src]
            if self.every_obs:
                rows = np.repeat(row0[al], k) + within
                for key, x in obs_rows.items():
                    self.rb_obs[key][lane_of, pos] = x[rows]
                self.rb_has_obs[lane_of, pos] = True
            else:
                self.rb_has_obs[lane_of, pos] = False
                last = (self.tail[g[al]] + k - 1) % self.cap
                for key, x in obs_rows.items():
                    self.rb_obs[key][g[al], last] = x[row0[al]]
                self.rb_has_obs[g[al], last] = True
            if self.info_keys:
                info = self.info_rows(b)
                each = self.every_obs or self.info_every_step  # a row per step
                for key in self.info_keys:
                    self.rb_info_has[key][lane_of, pos] = False
                    if key not in info:
                        continue
                    if each:
                        rows = np.repeat(info0[al], k) + within
                        self.rb_info[key][lane_of, pos] = info[key][rows]
                        self.rb_info_has[key][lane_of, pos] = _present(b, key)[rows]
                    else:  # ``last``: each lane's last step, as its observation
                        self.rb_info[key][g[al], last] = info[key][info0[al]]
                        self.rb_info_has[key][g[al], last] = _present(b, key)[info0[al]]
            self.tail[g[al]] += k
        return True

    def _info_starts(self, s: int, b: codec.ResultBatch) -> np.ndarray:
        """Where each lane's info rows start in reply ``b``, checked: with
        ``info_every_step`` a reset's row and one per executed step, else the
        observation rows."""
        counts = b.info_row_counts
        if self.info_every_step:
            want = np.where(b.steps > 0, b.steps, b.rows)
        else:
            want = b.rows
        if not np.array_equal(counts, want):
            i = int(np.argmax(counts != want))
            raise codec.ProtocolError(
                f"the server at {self.lanes.sessions[s].address} sent "
                f"{int(counts[i])} info rows for lane {int(b.lanes[i])} "
                f"({int(b.steps[i])} steps), expected {int(want[i])}"
            )
        return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)

    def _tel_reply(self, s: int, sent_at: float, reply: Any) -> None:
        """A reply's round trip, queueing and size in the telemetry."""
        tel = self.tel
        self.slowest = max(self.slowest, reply.arrived - sent_at)
        tel.call(self.server_rows[s], sent_at, reply.arrived, reply.server_seconds)
        tel.add("queue", time.perf_counter() - reply.decoded_at)
        tel.add("reply_bytes", reply.nbytes)

    def reset_infos(self, b: codec.ResultBatch, lanes_: np.ndarray, rows) -> None:
        """The success keys of the reset infos of reply ``b`` (its rows
        ``rows``, one per lane of ``lanes_``)."""
        if self.metrics.tracks_success:
            info = self.info_rows(b)
            self.metrics.reset(
                lanes_, {k: (info[k][rows], _present(b, k)[rows]) for k in info}
            )

    def info_rows(self, b: codec.ResultBatch) -> dict[str, np.ndarray]:
        """The reply's info leaves asked for, one float per row.

        Raises:
          ValueError: a leaf that is not one number per row.
        """
        out = {}
        for k in self.info_keys:
            if k not in b.info:
                continue
            x = np.asarray(b.info[k])
            if x.ndim < 1 or x.size != x.shape[0]:
                raise ValueError(
                    f"served env {self.spec.name!r}: info[{k!r}] is "
                    f"{x.dtype}{list(x.shape[1:])} per step; a metric is one number "
                    "(or bool) per step: name a scalar info key"
                )
            out[k] = x.reshape(x.shape[0]).astype(np.float64)
            self.info_seen.add(k)
        if b.steps.size and b.steps.sum():  # a reply with steps: their rows
            self.metrics.check(set(out), set(b.info))
        return out
