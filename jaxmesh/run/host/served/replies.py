"""The incoming side of a served run: ``Inbox``."""

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


class Inbox:
    """A served run's replies, checked against their calls' tags: reset
    observations filed into the lanes, step results into a ring buffer per
    lane (``head`` .. ``tail``; at most two chunks are sent ahead) until
    taken; a failed server goes to ``loss.ServerLoss``."""

    def __init__(self, run: Any):
        self.run = run
        n, layout = run.n, run.spec.layout
        cap = self.cap = 2 * run.cfg.h + 2
        self.rb_reward = np.zeros((n, cap), np.float32)
        self.rb_term, self.rb_trunc, self.rb_has_obs = np.zeros((3, n, cap), bool)
        self.rb_obs = {
            k: np.zeros((n, cap) + layout.shapes[k], layout.dtypes[k])
            for k in run.obs_keys
        }
        self.rb_info = {k: np.zeros((n, cap), np.float64) for k in run.info_keys}
        self.rb_info_has = {k: np.zeros((n, cap), bool) for k in run.info_keys}
        self.head = np.zeros(n, np.int64)
        self.tail = np.zeros(n, np.int64)
        # What the reader threads decoded: ``(server, item)``.
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.direct = False  # replies taken off the one stream here
        self.slowest = 0.0

    def take_results(self) -> None:
        """Lanes waiting for a result that is in take it."""
        run = self.run
        j = np.flatnonzero(run.waiting & (self.tail > self.head))
        if not j.size:
            return
        pos = self.head[j] % self.cap
        has = self.rb_has_obs[j, pos]
        jh, ph = j[has], pos[has]
        for key, rb in self.rb_obs.items():
            run.obs_leaves[key][jh] = rb[jh, ph]
        if run.info_keys:
            info = {
                k: (self.rb_info[k][j, pos], self.rb_info_has[k][j, pos])
                for k in run.info_keys
            }
            run.metrics.step(j, info)
        self.head[j] += 1
        run.waiting[j] = False
        run.ready[j] = True
        run.account(
            j, self.rb_reward[j, pos], self.rb_term[j, pos], self.rb_trunc[j, pos]
        )

    def take_reply(self, block: bool = True) -> bool:
        """Files the next reply of any server; False when none is in (``block``
        False) or expected. A failed server is dropped where the run can go on
        (``ServerLoss.lose``)."""
        run = self.run
        loss = run.loss
        if loss.rejoin_threads:
            loss.take_rejoins()
        sessions = run.lanes.sessions
        if not any(run.outbox.inflight):
            return False
        s: int | None = 0 if self.direct else None
        try:
            if self.direct:
                if not block:
                    return False
                reply = sessions[0].receive()
            else:
                auto = run.lanes.auto_timeout
                if auto:
                    loss.drop_hung()
                    s, item = self._queued_reply(block, loss.hung_wait(), hung=True)
                else:
                    s, item = self._queued_reply(block, sessions[0].reply_timeout)
                if item is None:
                    return block and auto  # a wait cut short: look again
                if s in loss.lost:  # queued before its server was dropped
                    return True
                reply = sessions[s].reply(item)
        except RemoteConnectionError as exc:
            if s is None:  # no reply in time: the server waited on longest
                s = loss.oldest_in_flight()
            if not loss.lose(s, exc):
                raise
            return True
        except RemoteEnvError as exc:
            self._mark_env_error(s, exc)
            raise
        run.tel.span("decode", reply.arrived, reply.decoded_at, run.server_rows[s])
        run.file_reply(s, reply)
        return True

    def _mark_env_error(self, s: int | None, exc: RemoteEnvError) -> None:
        """Marks server ``s``'s env error with the run's lane and step."""
        to_global = self.run.to_global
        if s is None or exc.lane is None or not 0 <= exc.lane < len(to_global[s]):
            return
        j = int(to_global[s][exc.lane])
        if j >= 0:
            known = int(self.tail[j] - self.head[j])
            gym_lanes.mark_where(exc, j, exc.phase, known + exc.steps_done)

    def _queued_reply(
        self, block: bool, timeout: float | None, hung: bool = False
    ) -> tuple[int, Any]:
        """The next queued ``(server, item)``; item None when none is in
        (``block`` False, or ``hung`` and none within ``timeout``)."""
        try:
            if block:
                return self.replies.get(timeout=timeout)
            return self.replies.get_nowait()
        except queue.Empty:
            if not block or hung:
                return 0, None
            raise RemoteConnectionError(
                "no reply from the jaxmesh env servers "
                f"{[c.address for c in self.run.lanes.sessions]} within {timeout} s "
                "(reply_timeout); an env may hang",
                address=self.run.lanes.sessions[0].address,
                code="DEADLINE_EXCEEDED",
            ) from None

    def file_reply(self, s: int, reply: Any) -> None:
        """Files one server's reply."""
        run = self.run
        b = reply.batch
        (reset_g, reset_ep, act_g, act_ep), sent_at = run.outbox.inflight[s].popleft()
        self.tel_reply(s, sent_at, reply)
        g = run.to_global[s][b.lanes]
        if not reset_g.size and b.steps.size and np.all(b.steps == 1):
            # The per-step case (h = 1, every lane one step): no offsets.
            if not np.array_equal(g, act_g):
                raise codec.ProtocolError(
                    f"the server at {run.lanes.sessions[s].address} answered for "
                    f"lanes {b.lanes[:16].tolist()}, asked for "
                    f"{run.local[act_g][:16].tolist()}"
                )
            live = act_ep == run.epoch[g]
            gl = g[live]
            pos = self.tail[gl] % self.cap
            self.rb_reward[gl, pos] = b.rewards[live]
            self.rb_term[gl, pos] = b.terminated[live]
            self.rb_trunc[gl, pos] = b.truncated[live]
            every = bool(live.all())  # the usual reply: no row to mask out
            for key, x in b.observation.items():  # an image row copied once
                self.rb_obs[key][gl, pos] = x if every else x[live]
            self.rb_has_obs[gl, pos] = True
            if run.info_keys:
                info = self.info_rows(b)
                for k in run.info_keys:
                    if k in info:
                        self.rb_info[k][gl, pos] = info[k][live]
                        self.rb_info_has[k][gl, pos] = _present(b, k)[live]
                    else:
                        self.rb_info_has[k][gl, pos] = False
            self.tail[gl] += 1
            return
        asked = np.sort(np.concatenate([run.local[reset_g], run.local[act_g]]))
        if g.size != asked.size or np.any(b.lanes != asked):
            raise codec.ProtocolError(
                f"the server at {run.lanes.sessions[s].address} answered for lanes "
                f"{b.lanes[:16].tolist()}, asked for {asked[:16].tolist()}"
            )
        obs_rows = b.observation
        row0 = np.concatenate([[0], np.cumsum(b.rows)[:-1]]).astype(np.int64)
        step0 = np.concatenate([[0], np.cumsum(b.steps)[:-1]]).astype(np.int64)
        # Info rows: the observation rows, or a reset's and every step's.
        info0 = self._info_starts(s, b) if b.info else row0
        is_reset = np.isin(g, reset_g)
        ep_sent = np.zeros(g.size, np.int64)
        ep_sent[is_reset] = reset_ep[np.searchsorted(reset_g, g[is_reset])]
        ep_sent[~is_reset] = act_ep  # act_g is in ascending local order, as b
        live = ep_sent == run.epoch[g]
        rl = np.flatnonzero(live & is_reset)
        if rl.size:
            for key, x in obs_rows.items():
                run.obs_leaves[key][g[rl]] = x[row0[rl]]
            self.reset_infos(b, g[rl], info0[rl])
            run.seen_resets(g[rl])
            if run.recorder is not None:
                run.recorder.reset(g[rl], run.obs)
            run.ready[g[rl]] = run.started[g[rl]] = True
        # Step results into the ring buffers.
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
            if run.every_obs:
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
            if run.info_keys:
                info = self.info_rows(b)
                each = run.every_obs or run.info_every_step  # a row per step
                for key in run.info_keys:
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

    def _info_starts(self, s: int, b: codec.ResultBatch) -> np.ndarray:
        """Where each lane's info rows start in reply ``b``, checked."""
        counts = b.info_row_counts
        if self.run.info_every_step:
            want = np.where(b.steps > 0, b.steps, b.rows)
        else:
            want = b.rows
        if not np.array_equal(counts, want):
            i = int(np.argmax(counts != want))
            raise codec.ProtocolError(
                f"the server at {self.run.lanes.sessions[s].address} sent "
                f"{int(counts[i])} info rows for lane {int(b.lanes[i])} "
                f"({int(b.steps[i])} steps), expected {int(want[i])}"
            )
        return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)

    def tel_reply(self, s: int, sent_at: float, reply: Any) -> None:
        """A reply's round trip, queueing and size."""
        tel = self.run.tel
        self.slowest = max(self.slowest, reply.arrived - sent_at)
        tel.call(self.run.server_rows[s], sent_at, reply.arrived, reply.server_seconds)
        tel.add("queue", time.perf_counter() - reply.decoded_at)
        tel.add("reply_bytes", reply.nbytes)

    def reset_infos(self, b: codec.ResultBatch, lanes_: np.ndarray, rows) -> None:
        """The success keys of reply ``b``'s reset infos (``rows``)."""
        if self.run.metrics.tracks_success:
            info = self.info_rows(b)
            self.run.metrics.reset(
                lanes_, {k: (info[k][rows], _present(b, k)[rows]) for k in info}
            )

    def info_rows(self, b: codec.ResultBatch) -> dict[str, np.ndarray]:
        """The reply's info leaves asked for, one float per row."""
        out = {}
        for k in self.run.info_keys:
            if k not in b.info:
                continue
            x = np.asarray(b.info[k])
            if x.ndim < 1 or x.size != x.shape[0]:
                raise ValueError(
                    f"served env {self.run.spec.name!r}: info[{k!r}] is "
                    f"{x.dtype}{list(x.shape[1:])} per step; a metric is one number "
                    "(or bool) per step: name a scalar info key"
                )
            out[k] = x.reshape(x.shape[0]).astype(np.float64)
        if b.steps.size and b.steps.sum():  # a reply with steps: their rows
            self.run.metrics.check(set(out), set(b.info))
        return out
