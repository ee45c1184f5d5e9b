"""A served run's servers and traffic: ``ServedLanes`` (a session on each env
server), ``Outbox`` (calls), ``Inbox`` (replies) and ``ServerLoss`` (a server
dropped, tried again and rejoined)."""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

import numpy as np

from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.envs.gymnasium.spec import spec_for
from jaxmesh.errors import RemoteConnectionError, RemoteEnvError, RemoteError
from jaxmesh.remote import codec, spaces
from jaxmesh.remote.session import Session
from jaxmesh.run import backend, stream

#: Lanes from which a served run splits its lanes in two groups by default.
GROUPS_FROM_LANES = 8
#: Seconds a session waits for its server at the run's start.
CONNECT_SECONDS = 10.0
#: Pauses (seconds) before each try of a lost server, for ``REJOIN_SECONDS`` at
#: most after the loss, each try waiting ``REJOIN_CONNECT_SECONDS`` to connect.
REJOIN_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0)
REJOIN_SECONDS = 60.0
REJOIN_CONNECT_SECONDS = 2.0


def default_lane_groups(num_lanes: int) -> int:
    """Lane groups when the caller gives none (docs/remote.md)."""
    return 2 if num_lanes >= GROUPS_FROM_LANES else 1


class ServedLanes:
    """Lanes dealt round-robin over env servers, one session each: lane j is
    lane ``local[j]`` of server ``server[j]``; ``reply_timeout="auto"`` drops a
    hung server when others are left and ``on_server_loss="rerun"``.
    RemoteConnectionError for a server out of reach, TypeError for other spaces."""

    def __init__(
        self,
        addresses: list[str],
        num_envs: int,
        *,
        token: str | None = None,
        reply_timeout: float | str | None = None,
        credentials: Any = None,
        on_server_loss: str = "rerun",
        transport: str = "auto",
    ):
        self.on_server_loss = on_server_loss
        self.addresses = list(addresses)
        self.where = f"{len(addresses)} env server{'s' * (len(addresses) > 1)}"
        self.auto_timeout = (
            reply_timeout == backend.AUTO
            and len(self.addresses) > 1
            and on_server_loss == "rerun"
        )
        if reply_timeout == backend.AUTO:
            reply_timeout = None
        self.reply_timeout = reply_timeout  # every session's
        self._connect = {
            "token": token,
            "connect_timeout": CONNECT_SECONDS,
            "reply_timeout": reply_timeout,
            "credentials": credentials,
            "transport": transport,
        }
        self.sessions: list[Session] = []
        try:
            for a in addresses:
                self.sessions.append(Session(a, **self._connect))
            first = self.sessions[0].info
            for c in self.sessions[1:]:
                for field in ("observation", "action"):
                    if getattr(c.info, field) != getattr(first, field):
                        raise TypeError(
                            f"the server at {c.address} declares the {field} space "
                            f"{getattr(c.info, field)}, the one at {first.address} "
                            f"{getattr(first, field)}; every server of a run must "
                            "serve the same env"
                        )
            try:
                self.observation_space = spaces.observation_space(first.observation)
                self.action_space = spaces.leaf_space(first.action)
            except codec.ProtocolError as exc:
                raise RemoteError(
                    f"the jaxmesh env server at {first.address} declared spaces "
                    f"this client cannot rebuild: {exc}; upgrade the older side",
                    address=first.address,
                ) from None
        except BaseException:
            self.close()
            raise
        where = f"served env at {first.address}"
        self.spec = spec_for(
            first.env_name, self.observation_space, self.action_space, where, first.dt
        )
        # Round-robin: lane k of every server, k ascending.
        dealt = sorted(
            (k, s) for s, c in enumerate(self.sessions) for k in range(c.info.num_lanes)
        )[:num_envs]
        self.local = [k for k, _ in dealt]
        self.server = [s for _, s in dealt]
        self.num_lanes = len(self.server)
        self.lane_groups = 1  # set by ``group``

    @classmethod
    def of(cls, env: Any, num_envs: int, _episodes: int, _workers: int, served: Any):
        """The lanes of a served run (``dispatch.Route.lanes``)."""
        return cls(
            [env] if isinstance(env, str) else list(env),
            num_envs,
            token=served.token,
            credentials=served.credentials,
            reply_timeout=served.reply_timeout,
            on_server_loss=served.on_server_loss or "rerun",
            transport=served.transport or "auto",
        )

    def group(self, settings: Any, lane_groups: int | None) -> int | None:
        """Sets the run's lane groups (one for a lockstep server); returns the
        lanes the default plan tile is sized for (None: all)."""
        n = min(settings.num_envs, self.num_lanes)
        asked = lane_groups is not None
        groups = lane_groups if asked else default_lane_groups(n)
        if any(c.lockstep for c in self.sessions):
            groups = 1
        self.lane_groups = max(1, min(groups, n))
        # Default groups keep the tile of all N lanes, so that a run's results
        # are those of one group bit for bit (a tile's size can change a row's
        # rounding); asked-for groups plan in a tile sized for one group.
        if self.lane_groups > 1 and asked and settings.plan_tile is None:
            return -(-n // self.lane_groups)
        return None

    def reconnect(self, s: int, connect_timeout: float) -> Session:
        """A new session with server ``s``, serving what the lost one did."""
        kw = {**self._connect, "connect_timeout": connect_timeout}
        session = Session(self.addresses[s], **kw)
        old, new = self.sessions[s].info, session.info
        used = sum(1 for x in self.server if x == s)
        same = all(
            getattr(new, f) == getattr(old, f) for f in ("observation", "action")
        ) and (session.info_every_step or not self.sessions[s].info_every_step)
        if not same or new.num_lanes < used:
            session.close()
            raise ValueError(
                f"the server back at {self.addresses[s]} serves other spaces, "
                f"fewer than {used} lanes or an older protocol; it is not rejoined"
            )
        return session

    def close(self) -> None:
        for c in self.sessions:
            c.close()


def _present(b: codec.ResultBatch, key: str) -> np.ndarray:
    """Which rows of reply ``b`` have info ``key`` (the key is in ``b.info``)."""
    present = (b.info_present or {}).get(key)
    return np.ones(len(b.info[key]), bool) if present is None else present


class Inbox:
    """A served run's replies, checked against their calls' tags: resets filed
    into the lanes, step results into a ring buffer per lane (``head`` ..
    ``tail``; at most two chunks ahead) until taken."""

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
        self.head, self.tail = np.zeros((2, n), np.int64)
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
        results = (self.rb_reward, self.rb_term, self.rb_trunc)
        run.account(j, *(x[j, pos] for x in results))

    def take_reply(self, block: bool = True) -> bool:
        """Files the next reply of any server (False: none is in, or expected);
        a failed server is dropped where the run can go on."""
        run, loss = self.run, self.run.loss
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
                wait = loss.hung_wait() if auto else run.lanes.reply_timeout
                try:
                    s, item = self.replies.get(block, wait)
                except queue.Empty:
                    if not block or auto:
                        return block and auto  # a wait cut short: look again
                    raise RemoteConnectionError(
                        "no reply from the jaxmesh env servers "
                        f"{[c.address for c in sessions]} within {wait} s "
                        "(reply_timeout); an env may hang",
                        address=sessions[0].address,
                        code="DEADLINE_EXCEEDED",
                    ) from None
                if s in loss.lost:  # queued before its server was dropped
                    return True
                reply = sessions[s].reply(item)
        except RemoteConnectionError as exc:
            if s is None:  # no reply in time: the server waited on longest
                waiting = [(q[0][1], t) for t, q in enumerate(run.outbox.inflight) if q]
                s = min(waiting)[1]
            if not loss.lose(s, exc):
                raise
            return True
        except RemoteEnvError as exc:  # named with the run's lane and step
            lane = exc.lane
            if s is not None and lane is not None and 0 <= lane < len(run.to_global[s]):
                j = int(run.to_global[s][lane])
                if j >= 0:
                    known = int(self.tail[j] - self.head[j])
                    gym_lanes.mark_where(exc, j, exc.phase, known + exc.steps_done)
            raise
        run.tel.span("decode", reply.arrived, reply.decoded_at, run.server_rows[s])
        run.file_reply(s, reply)
        return True

    def answered(self, s: int, reply: Any, one_step: bool = False) -> tuple:
        """Server ``s``'s oldest call, which ``reply`` answers: ``(tag, lanes)``;
        ProtocolError for other lanes (``one_step``: or steps) than it asked."""
        run, b = self.run, reply.batch
        tag, sent_at = run.outbox.inflight[s].popleft()
        self.slowest = max(self.slowest, reply.arrived - sent_at)
        run.tel.call(run.server_rows[s], sent_at, reply.arrived, reply.server_seconds)
        run.tel.add("queue", time.perf_counter() - reply.decoded_at)
        run.tel.add("reply_bytes", reply.nbytes)
        reset_g, _, act_g, _ = tag
        g = run.to_global[s][b.lanes]
        if reset_g.size:
            asked = np.sort(np.concatenate([run.local[reset_g], run.local[act_g]]))
            steps = np.where(np.isin(g, reset_g), 0, 1) if one_step else 0
        else:  # steps only (most calls): act_g is ascending in local order, as b
            asked, steps = run.local[act_g], 1
        if (
            g.size != asked.size
            or np.any(b.lanes != asked)
            or (one_step and np.any(b.steps != steps))
        ):
            raise codec.ProtocolError(
                f"the server at {run.lanes.sessions[s].address} answered for lanes "
                f"{b.lanes[:16].tolist()} with steps {b.steps[:16].tolist()}, "
                f"asked for {asked[:16].tolist()} (resets "
                f"{run.local[reset_g][:16].tolist()})"
            )
        return tag, g

    def file_reply(self, s: int, reply: Any) -> None:
        """Files one server's reply."""
        run, b = self.run, reply.batch
        (reset_g, reset_ep, act_g, act_ep), g = self.answered(s, reply)
        obs_rows = b.observation
        # Where each lane's observation rows, steps and info rows start: its
        # info rows are its observation rows, or a reset's and every step's.
        row0 = np.concatenate([[0], np.cumsum(b.rows)[:-1]]).astype(np.int64)
        step0 = np.concatenate([[0], np.cumsum(b.steps)[:-1]]).astype(np.int64)
        info0 = row0
        if b.info:
            counts, want = b.info_row_counts, b.rows
            if run.info_every_step:
                want = np.where(b.steps > 0, b.steps, b.rows)
            if not np.array_equal(counts, want):
                i = int(np.argmax(counts != want))
                raise codec.ProtocolError(
                    f"the server at {run.lanes.sessions[s].address} sent "
                    f"{int(counts[i])} info rows for lane {int(b.lanes[i])} "
                    f"({int(b.steps[i])} steps), expected {int(want[i])}"
                )
            info0 = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        is_reset = np.isin(g, reset_g)
        ep_sent = np.zeros(g.size, np.int64)
        ep_sent[is_reset] = reset_ep[np.searchsorted(reset_g, g[is_reset])]
        ep_sent[~is_reset] = act_ep  # act_g is in ascending local order, as b
        live = ep_sent == run.epoch[g]
        rl = np.flatnonzero(live & is_reset)
        if rl.size:
            self.file_resets(b, g[rl], row0[rl], info0[rl])
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
            # A row per step, or (``last``) each lane's last step's alone:
            # (where it goes, its row from where each lane's rows start).
            each = (lane_of, pos), lambda start: np.repeat(start[al], k) + within
            end = (self.tail[g[al]] + k - 1) % self.cap
            last = (g[al], end), lambda start: start[al]
            at, rows = each if run.every_obs else last
            self.rb_has_obs[lane_of, pos] = False
            for key, x in obs_rows.items():
                self.rb_obs[key][at] = x[rows(row0)]
            self.rb_has_obs[at] = True
            if run.info_keys:
                info = self.info_rows(b)
                at, rows = each if run.every_obs or run.info_every_step else last
                for key in run.info_keys:
                    self.rb_info_has[key][lane_of, pos] = False
                    if key in info:
                        self.rb_info[key][at] = info[key][rows(info0)]
                        self.rb_info_has[key][at] = _present(b, key)[rows(info0)]
            self.tail[g[al]] += k

    def file_resets(self, b: codec.ResultBatch, js, rows, info_rows) -> None:
        """Lanes ``js``' resets (rows ``rows``, info rows ``info_rows`` of ``b``)."""
        run = self.run
        for key, x in b.observation.items():
            run.obs_leaves[key][js] = x[rows]
        if run.metrics.tracks_success:
            info, at = self.info_rows(b), info_rows
            run.metrics.reset(js, {k: (info[k][at], _present(b, k)[at]) for k in info})
        run.seen_resets(js)
        if run.recorder is not None:
            run.recorder.reset(js, run.obs)
        run.ready[js] = run.started[js] = True

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


class _Segments:
    """Segment q: lane ``lanes[q]``'s ``counts[q]`` wire actions from ``starts[q]``."""

    def __init__(self, lanes: np.ndarray, counts: np.ndarray, acts: Any):
        self.lanes, self.counts, self.acts = lanes, counts, acts
        self.starts = np.cumsum(counts) - counts

    def rows(self, q: int) -> np.ndarray:
        return self.acts[self.starts[q] : self.starts[q] + self.counts[q]]


class Outbox:
    """Queued resets and segments, flushed into one call per rank per server (one
    at a time to a lockstep server), and the calls in flight with their tags."""

    def __init__(self, run: Any):
        self.run = run
        # Queued: resets (lane -> episode) and segments, each ``(lanes, epochs,
        # ranks, counts, wire actions)``.
        self.resets: dict[int, int] = {}
        self.segments: list[tuple] = []
        self.queued = np.zeros(run.n, np.int64)  # segments queued per lane
        self.released: list[int] = []  # lanes to release (lockstep servers)
        # Per server, the calls awaiting replies: ``(tag, sent_at)``.
        self.inflight = [collections.deque() for _ in run.lanes.sessions]

    def queue(self, lanes_: np.ndarray, counts: np.ndarray, acts) -> None:
        """Queues one segment per lane (``counts[i]`` rows of ``acts`` each)."""
        if lanes_.size:  # as the env's own action values (Discrete: plus start)
            wire = gym_lanes.env_actions(self.run.lanes.action_space, acts)
            self._append(lanes_, counts, wire)

    def _append(self, lanes_: np.ndarray, counts: np.ndarray, wire) -> None:
        ranks = self.queued[lanes_].copy()
        self.segments.append((lanes_, self.run.epoch[lanes_], ranks, counts, wire))
        self.queued[lanes_] += 1

    def flush(self, which: np.ndarray | None = None) -> None:
        """Sends the queued items of the lanes in ``which`` (None: all)."""
        if not self.resets and not self.segments and not self.released:
            return
        run = self.run
        empty = [(np.zeros(0, np.int64),) * 5]
        columns = zip(*(self.segments or empty), strict=True)
        lanes_, epochs, ranks, counts, acts = map(np.concatenate, columns)
        seg = _Segments(lanes_, counts, acts)
        live = epochs == run.epoch[lanes_]
        self.segments = []
        self.queued[:] = 0
        resets, self.resets = self.resets, {}
        if which is not None:  # the other lanes' items wait, in order
            for q in np.flatnonzero(live & ~which[lanes_]):
                self._requeue(lanes_[q], seg.rows(q))
            live = live & which[lanes_]
            for g in [g for g in resets if not which[g]]:
                self.resets[g] = resets.pop(g)
        top = int(ranks[live].max()) + 1 if live.any() else 1
        for s in range(len(run.lanes.sessions)):
            on_s = live & (run.server[lanes_] == s)
            rs = [g for g in resets if run.server[g] == s]
            if run.lockstep[s]:
                self._flush_lockstep(s, np.flatnonzero(on_s), seg, rs, resets)
                continue
            for r in range(top):
                pick = np.flatnonzero(on_s & (ranks == r))
                rr = rs if r == 0 else []
                if pick.size or rr:
                    self._send(s, pick, seg, rr, resets)

    def _flush_lockstep(self, s, pick, seg: _Segments, rs, resets) -> None:
        """One call at a time, the lanes' next segments cut to one length."""
        if self.inflight[s]:  # wait for the call in flight: queue it all again
            for g in rs:
                self.resets[g] = resets[g]
            for q in pick:
                self._requeue(seg.lanes[q], seg.rows(q))
            return
        merged: dict[int, list] = {}
        for q in pick:  # in queue order: ranks ascending per lane
            merged.setdefault(int(seg.lanes[q]), []).append(seg.rows(q))
        # Each lane's first segment, cut to the shortest: a segment still ends
        # a call (its last observation is the one a plan reads).
        if merged:
            c = min(len(parts[0]) for parts in merged.values())
            for g, parts in merged.items():
                if len(parts[0]) > c:
                    self._requeue(g, parts[0][c:])
                for part in parts[1:]:
                    self._requeue(g, part)
            gs = np.asarray(sorted(merged), np.int64)
            rows = np.concatenate([merged[g][0][:c] for g in gs])
            cut = _Segments(gs, np.full(gs.size, c, np.int64), rows)
            self._send(s, np.arange(gs.size), cut, rs, resets)
        elif rs or any(self.run.server[g] == s for g in self.released):
            self._send(s, pick, seg, rs, resets)  # the resets and releases alone

    def _requeue(self, g: int, rows: np.ndarray) -> None:
        """Queues wire actions again for lane ``g``."""
        self._append(np.asarray([g], np.int64), np.asarray([len(rows)], np.int64), rows)

    def call(self, s, resets, act_g, counts, rows, tag) -> None:
        """One call to server ``s``: resets ``tag[0]``, ``counts[i]`` of ``rows``
        per lane of ``act_g`` (in local order), its releases; ``tag`` waits."""
        t0 = time.perf_counter()
        run, reset_g = self.run, tag[0]
        session = run.lanes.sessions[s]
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

    def _send(self, s, pick, seg: _Segments, rs, resets) -> None:
        reset_g = np.asarray(sorted(rs), np.int64)
        act_g = np.zeros(0, np.int64)
        c = rows = None
        if pick.size:
            order = pick[np.argsort(self.run.local[seg.lanes[pick]], kind="stable")]
            act_g = seg.lanes[order]
            c = seg.counts[order]
            # Each row's segment's start, less the rows before it in this call.
            first = np.repeat(seg.starts[order] - np.cumsum(c) + c, c)
            rows = seg.acts[first + np.arange(int(c.sum()))]
        tag = (reset_g, self.run.epoch[reset_g], act_g, self.run.epoch[act_g])
        self.call(s, resets, act_g, c, rows, tag)

    def drop(self, s: int) -> None:
        """Drops lost server ``s``'s queued resets, releases and calls."""
        server = self.run.server
        for j in np.flatnonzero(server == s).tolist():
            self.resets.pop(j, None)
        self.released = [j for j in self.released if server[j] != s]
        self.inflight[s].clear()


class ServerLoss:
    """Drops a server that failed or hung (its episodes run again on the others),
    tries it again in the background and gives its lanes back when it returns."""

    def __init__(self, run: Any):
        self.run = run
        self.lost: set[int] = set()
        self.t_start = time.perf_counter()
        # A lost server is tried again in the background (``_reconnect``); a
        # new session waits in ``rejoins`` until the loop takes it.
        self.rejoins: queue.SimpleQueue = queue.SimpleQueue()
        self.stop_rejoining = threading.Event()
        self.rejoin_threads: list[threading.Thread] = []

    def hung_wait(self) -> float | None:
        """Drops a server that owes a reply past the automatic limit while
        another one is left; how long the next wait may last (None: no limit)."""
        slowest = self.run.inbox.slowest
        if not slowest:
            return None
        limit = max(backend.AUTO_FLOOR_SECONDS, backend.AUTO_FACTOR * slowest)
        sessions, now = self.run.lanes.sessions, time.monotonic()
        times = []  # since when each server kept owes a reply
        for s, session in enumerate(sessions):
            since = None if s in self.lost else session.owed_since()
            if since is None:
                continue
            if now - since > limit:
                error = RemoteConnectionError(
                    f"the jaxmesh env server at {session.address} sent nothing for "
                    f"{now - since:.1f} s while owing a reply: past the default reply "
                    f"timeout of {limit:.1f} s ({backend.AUTO_FACTOR:g}x the slowest "
                    f"reply of this run, {slowest:.3f} s, and at least "
                    f"{backend.AUTO_FLOOR_SECONDS:g} s); pass served=jaxmesh.Served("
                    "reply_timeout=...) to set it, or reply_timeout=None to wait",
                    address=session.address,
                    code="DEADLINE_EXCEEDED",
                )
                if self.lose(s, error):  # False: the last server; it may answer
                    continue
            times.append(since)
        if not times:
            return limit
        return max(min(times) + limit - time.monotonic(), 0.0) + 0.01

    def lose(self, s: int, exc: BaseException) -> bool:
        """Drops server ``s`` after ``exc`` when the run may go on; False (the
        caller raises) under ``on_server_loss="raise"`` or with none left."""
        run, sessions = self.run, self.run.lanes.sessions
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
            run.open_session(s, session)
            run.lockstep[s] = session.lockstep
            self.lost.discard(s)
            js = np.flatnonzero(run.server == s)
            run.dead[js] = run.capped[js] = False
            run.epoch[js] += 1
            at, losses = self._now(), run.episodes_out.run_fields["server_losses"]
            loss = next(x for x in losses[::-1] if x["server"] == session.address)
            loss["rejoined_at_seconds"] = at
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
