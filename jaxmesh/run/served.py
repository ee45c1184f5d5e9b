"""``jaxmesh.evaluate`` over served envs: ``"grpc://host:port"`` or a list of them.

The agent side is the host loop's jitted step (``host.HostAgent``: the same code
as the scan, CONTRACT 17); this module replaces the env step with calls to one
or more env servers (``jaxmesh.EnvServer``, ``jaxmesh serve-env``).

Lanes move at their own pace. A lane takes an agent step as soon as the result of
its previous action (or its reset observation) is in; a lane still waiting for
its server keeps its whole agent state (``host_step``'s ``moved`` mask). The
actions a lane will execute are known ahead of time up to the end of its chunk
(and, under a prefetch lead, of the prefetched chunk), so they go to the server
in **segments** that the server replays, stopping at the episode's end:

- without a lead, a chunk of h actions is one segment: one round trip per plan;
- with a lead L, a chunk is cut at ``h - L``: the head's reply carries the
  observation the prefetch plan reads, and the tail, sent in the next message
  of the same flush, runs on the server while the client plans; the next chunk
  goes out as soon as it is planned, so the server never waits for it.

Messages are flushed when no lane can move (the loop would otherwise wait), one
message per segment rank on each server; a server replies in order. With
several servers or lane groups, reader threads decode replies while the loop
plans; with one of each the loop has nothing to do while it waits, so it takes
each reply off the stream itself (a thread hand-off less). Actions sent after an
episode's end execute nothing (the server's rule), and their replies are
dropped by episode epoch. An action that would fail the run's checks (out of
range, not finite) is never sent: the segment stops before it, and the run
raises ``BadValueError`` at the step that meets it, as in process.

Only the observation leaves the policy reads cross the wire (a Dict or Tuple
observation's leaves, CONTRACT 31: the server is asked for those, and those an
episode recording keeps; one array is the one leaf), every replayed step's when
an observation window reads more than one frame (or an episode is recorded),
else the last of each segment (the frames in between are never read; CONTRACT
19).
The info values asked for (metrics, the success key) cross on those rows, or on
every replayed step's row when a reduction reads every step (success once, a
mean, ...): the server sends them (``info_every_step``) without the observations
in between; a server that does not declare it sends every observation instead.

With ``lane_groups`` G > 1 the lanes form G contiguous groups that take agent
steps in turn, and a group's messages go as soon as none of its lanes can move,
so the device plans for one group while a server steps another. A server over a
``VectorEnv`` says ``lockstep``: it steps every lane at once, so the client sends
one call at a time with each lane's next segment cut to the shortest, and
releases a lane it abandons at ``max_episode_steps`` with nothing left to run.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

import jax
import numpy as np

from jaxmesh.core import replay, rules
from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.envs.gymnasium.spec import spec_for
from jaxmesh.errors import RemoteConnectionError, RemoteEnvError, RemoteError
from jaxmesh.remote import codec
from jaxmesh.remote.session import Session
from jaxmesh.run import backend, stream
from jaxmesh.run.loop import HostLoop

#: A lost server is tried again after these pauses (seconds), for at most
#: ``REJOIN_SECONDS`` after the loss, each try waiting ``REJOIN_CONNECT_SECONDS``
#: for the handshake.
REJOIN_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0)
REJOIN_SECONDS = 60.0
REJOIN_CONNECT_SECONDS = 2.0


#: Lanes from which a served run splits its lanes in two groups by default.
GROUPS_FROM_LANES = 8


def default_lane_groups(num_lanes: int) -> int:
    """Lane groups when the caller gives none: 2 from ``GROUPS_FROM_LANES``
    lanes on, else 1.

    Served, measured on a 2-core machine with the client and the server on it,
    in paired runs (docs/remote.md, "Lane groups"): on 16 HalfCheetah lanes two
    groups beat one in every pair, 1.07-1.38x at h = 1 and 1.09-1.24x at h = 8
    (the device plans for one group while the server steps the other); on 64
    CartPole lanes 1.07-1.16x in four pairs of five, 0.90x in one. Four groups
    were slower. Few lanes gain nothing, and one lane cannot be split.
    """
    return 2 if num_lanes >= GROUPS_FROM_LANES else 1


class ServedLanes:
    """Lanes spread over one or more env servers, one session on each.

    Global lane j is lane ``local[j]`` of server ``server[j]``; lanes are dealt
    round-robin over the servers (so N lanes load S servers evenly).

    Args:
      addresses: the servers (``"grpc://host:port"``).
      num_envs: lanes asked for; the run uses at most the servers' lanes.
      token, connect_timeout: see ``Connection``.
      reply_timeout: seconds a reply may take (see ``Connection``), or
        ``"auto"``: over several servers with ``on_server_loss="rerun"``, a
        server that owes a reply and sends nothing for ``AUTO_FACTOR`` times
        the slowest reply of the run, at least ``AUTO_FLOOR_SECONDS``, is
        dropped (``_Run.drop_hung``); with one server, no limit.
      on_server_loss: ``"rerun"``: a server that dies or stops answering is
        dropped and its unfinished episodes run again on the other servers'
        lanes (the run raises when none is left); ``"raise"``: the run raises.
      transport: ``"auto"``, ``"grpc"`` or ``"shm"``: how each session's calls
        travel (``jaxmesh.remote.session.TRANSPORTS``).

    Raises:
      jaxmesh.RemoteConnectionError: a server cannot be reached or refuses.
      TypeError: servers with different spaces, or a space jaxmesh does not read.
    """

    def __init__(
        self,
        addresses: list[str],
        num_envs: int,
        *,
        token: str | None = None,
        connect_timeout: float = 10.0,
        reply_timeout: float | str | None = None,
        credentials: Any = None,
        on_server_loss: str = "rerun",
        transport: str = "auto",
    ):
        from jaxmesh.remote import spaces

        #: What a run does when a server dies or stops answering (``_Run``).
        self.on_server_loss = on_server_loss

        self.addresses = list(addresses)
        #: Whether a hung server is dropped by the default rule (``"auto"``).
        self.auto_timeout = (
            reply_timeout == backend.AUTO
            and len(self.addresses) > 1
            and on_server_loss == "rerun"
        )
        if reply_timeout == backend.AUTO:
            reply_timeout = None
        self._connect = {
            "token": token,
            "connect_timeout": connect_timeout,
            "reply_timeout": reply_timeout,
            "credentials": credentials,
            "transport": transport,
        }
        self.sessions: list[Session] = []
        try:
            for a in addresses:
                self.sessions.append(Session(a, **self._connect))
        except BaseException:
            self.close()
            raise
        first = self.sessions[0].info
        for c in self.sessions[1:]:
            for field in ("observation", "action"):
                if getattr(c.info, field) != getattr(first, field):
                    self.close()
                    raise TypeError(
                        f"the server at {c.address} declares the {field} space "
                        f"{getattr(c.info, field)}, the one at {first.address} "
                        f"{getattr(first, field)}; every server of a run must serve "
                        "the same env"
                    )
        try:
            self.observation_space = spaces.observation_space(first.observation)
            self.action_space = spaces.leaf_space(first.action)
        except codec.ProtocolError as exc:
            self.close()
            raise RemoteError(
                f"the jaxmesh env server at {first.address} declared spaces this "
                f"client cannot rebuild: {exc}; upgrade the older side",
                address=first.address,
            ) from None
        where = f"served env at {first.address}"
        self.spec = spec_for(
            first.env_name,
            self.observation_space,
            self.action_space,
            where,
            first.dt,
        )
        # Lanes dealt round-robin over the servers.
        self.server: list[int] = []
        self.local: list[int] = []
        taken = [0] * len(self.sessions)
        while len(self.server) < num_envs:
            grew = False
            for s, c in enumerate(self.sessions):
                if taken[s] < c.info.num_lanes and len(self.server) < num_envs:
                    self.server.append(s)
                    self.local.append(taken[s])
                    taken[s] += 1
                    grew = True
            if not grew:
                break
        self.num_lanes = len(self.server)
        #: Lane groups for the run (set by ``group``).
        self.lane_groups = 1

    def group(self, settings: Any, lane_groups: int | None) -> int | None:
        """Sets the run's lane groups; the lanes the default plan tile is sized
        for (None: all of the run's lanes).

        None: ``default_lane_groups``. A lockstep server steps every lane in
        every call, so its lanes form one group. Without a ``plan_tile``, the
        tile of asked-for groups is the default for one group's lanes (a group
        plans alone, and a tile sized for all N lanes would compute rows for
        nothing); default groups keep the tile of all N lanes; the run's
        plan (``jaxmesh.run.plan.plan_run``) sizes it for the effective
        horizon, once the policy's chunk length is known.
        """
        n = min(settings.num_envs, self.num_lanes)
        asked = lane_groups is not None
        if not asked:
            lane_groups = default_lane_groups(n)
        if any(c.lockstep for c in self.sessions):
            lane_groups = 1
        self.lane_groups = max(1, min(lane_groups, n))
        # Default groups keep the tile of all N lanes, so that a run's results
        # are those of one group bit for bit (a tile's size can change a row's
        # rounding); asked-for groups plan in a tile sized for one group.
        if self.lane_groups > 1 and asked and settings.plan_tile is None:
            return -(-n // self.lane_groups)
        return None

    def reconnect(self, s: int, connect_timeout: float) -> Session:
        """A new session with server ``s`` (at its first address), checked to
        serve the same spaces, at least the lanes the run gave it, and every
        step's info when the lost one did (``Session.info_every_step``).

        Raises:
          jaxmesh.RemoteError: it cannot be reached; ValueError: it serves
            something else now.
        """
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


def wire_leaves(spec: Any, program: Any, recorder: Any) -> tuple[str, ...]:
    """The observation leaves a run asks its servers for: those the policy
    reads (``program.layout``) and those an episode recording keeps
    (``Record.keys``; None: every leaf), in the declared order."""
    names = spec.layout.names
    if recorder is None:
        return tuple(program.layout.names)
    if recorder.keys is None:
        return tuple(names)
    read = set(program.layout.names)
    keep = tuple(recorder.keys)
    return tuple(
        n
        for n in names
        if n in read or any(n == k or n.startswith(k + "/") for k in keep)
    )


def needs_every_observation(cfg: Any) -> bool:
    """Whether an observation window reads more than one frame."""
    return any(d.stack > 1 and not d.reads_action for _, d in cfg.spec)


class _Run(HostLoop):
    """One run's pacing over served lanes (see the module docstring); the
    episode and step rules are ``HostLoop``'s.

    Per lane besides: its epoch (bumped whenever the lane's episode changes, so
    that replies for an ended episode are dropped), whether its current
    observation is in (``ready``: it may take an agent step), the actions sent
    for its episode (``sent``) and a ring buffer of step results that came in
    but were not taken yet (``head`` .. ``tail``).
    """

    #: Whether the loop waits for replies only in the order the calls went
    #: (blocking, oldest first): with one server it may then take them off
    #: the stream itself, whatever the lane groups.
    takes_in_order = False

    def __init__(self, *args: Any, **kwargs: Any):
        """``HostLoop``'s arguments; ``lanes`` are ``ServedLanes``."""
        super().__init__(*args, **kwargs)
        lanes, metrics, recorder = self.lanes, self.metrics, self.recorder
        # The server measures max_episode_seconds (HostLoop.t0 stays None).
        self.info_keys = list(metrics.keys)
        self.info_seen: set = set()
        # A reduction other than ``last``, and success once (any step's success
        # key), read every step's info: a server that declares it sends them
        # with the last observation only (``info_every_step``), an older one
        # with every observation. Windows of several frames and recorded
        # episodes read every step's observation.
        every_info = any(red != "last" for _, red in metrics.named) or (
            metrics.tracks_success
        )
        self.every_obs = (
            needs_every_observation(self.cfg)
            or recorder is not None
            or (every_info and not all(c.info_every_step for c in lanes.sessions))
        )
        self.info_every_step = every_info and not self.every_obs
        n, h = self.n, self.cfg.horizon
        self.epoch = np.zeros(n, np.int64)
        self.ready = np.zeros(n, bool)  # its current observation is in: may act
        self.waiting = np.zeros(n, bool)  # acted; that action's result not in yet
        self.sent = np.zeros(n, np.int64)  # actions of the episode sent
        # Step results in, not taken yet: a ring buffer per lane. At most two
        # chunks are ever sent ahead of the step a lane is at.
        cap = self.cap = 2 * h + 2
        self.rb_reward = np.zeros((n, cap), np.float32)
        self.rb_term = np.zeros((n, cap), bool)
        self.rb_trunc = np.zeros((n, cap), bool)
        self.rb_has_obs = np.zeros((n, cap), bool)
        #: The observation leaves asked for (``wire_leaves``); the others stay
        #: zeros in ``obs_leaves``. One array: the one leaf ``""``.
        self.obs_keys = wire_leaves(self.spec, self.program, recorder)
        layout = self.spec.layout
        self.rb_obs = {
            k: np.zeros((n, cap) + layout.shapes[k], layout.dtypes[k])
            for k in self.obs_keys
        }
        self.rb_info = {k: np.zeros((n, cap), np.float64) for k in self.info_keys}
        self.rb_info_has = {k: np.zeros((n, cap), bool) for k in self.info_keys}
        self.capped = np.zeros(n, bool)  # the last result ended at the cap only
        self.released: list[int] = []  # lanes to release (lockstep servers)
        self.head = np.zeros(n, np.int64)
        self.tail = np.zeros(n, np.int64)
        # Queued, not sent: resets (lane -> episode) and segments.
        self.resets: dict[int, int] = {}
        self.seg_lanes: list[np.ndarray] = []
        self.seg_epochs: list[np.ndarray] = []
        self.seg_ranks: list[np.ndarray] = []
        self.seg_counts: list[np.ndarray] = []
        self.seg_actions: list[np.ndarray] = []
        self.queued = np.zeros(n, np.int64)  # segments queued per lane
        self.inflight = [collections.deque() for _ in lanes.sessions]
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.server = np.asarray(lanes.server, np.int64)
        self.local = np.asarray(lanes.local, np.int64)
        self.to_global = []
        for s, c in enumerate(lanes.sessions):
            m = np.full(c.info.num_lanes, -1, np.int64)
            mine = np.flatnonzero(self.server == s)
            m[self.local[mine]] = mine
            self.to_global.append(m)
        self.lockstep = [c.lockstep for c in lanes.sessions]
        #: The slowest reply of the run so far, in seconds from its call
        #: (``drop_hung``).
        self.slowest = 0.0
        #: Servers dropped (``lose_server``), and when the run began.
        self.lost: set[int] = set()
        self.t_start = time.perf_counter()
        # A lost server is tried again in the background (``_reconnect``); a
        # new session waits in ``rejoins`` until the loop takes it.
        self.rejoins: queue.SimpleQueue = queue.SimpleQueue()
        self.stop_rejoining = threading.Event()
        self.rejoin_threads: list[threading.Thread] = []
        self.per_step = self.cfg.horizon == 1 and self.cfg.lead == 0
        # Lane groups (contiguous): the device plans for one while a server
        # steps another. A lockstep server steps every lane in every call.
        groups = max(1, min(lanes.lane_groups, n))
        self.num_groups = groups
        group_of = np.arange(n) * groups // n
        self.group_masks = [group_of == g for g in range(groups)]
        # Timeline rows (jaxmesh.trace), named once rather than on every call.
        self.group_rows = [f"group {g}" for g in range(groups)]
        self.server_rows = [f"server {s}" for s in range(len(lanes.sessions))]

    # Wire --------------------------------------------------------------------------
    def queue_segments(self, lanes_: np.ndarray, counts: np.ndarray, acts) -> None:
        """Queues one segment per lane (``counts[i]`` rows of ``acts`` each)."""
        if not lanes_.size:
            return
        self.seg_lanes.append(lanes_)
        self.seg_epochs.append(self.epoch[lanes_])
        self.seg_ranks.append(self.queued[lanes_].copy())
        self.seg_counts.append(counts)
        # The env's own action values (Discrete: plus ``start``).
        self.seg_actions.append(gym_lanes.env_actions(self.lanes.action_space, acts))
        self.queued[lanes_] += 1

    def flush(self, which: np.ndarray | None = None) -> None:
        """Sends queued resets and segments: one message per rank per server.

        Args:
          which: [N] the lanes (a lane group) whose queued items go now; the
            others stay queued (default: every lane).
        """
        if not self.resets and not self.seg_lanes and not self.released:
            return
        if self.seg_lanes:
            lanes_ = np.concatenate(self.seg_lanes)
            epochs = np.concatenate(self.seg_epochs)
            ranks = np.concatenate(self.seg_ranks)
            counts = np.concatenate(self.seg_counts)
            acts = np.concatenate(self.seg_actions)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            live = epochs == self.epoch[lanes_]
        else:
            lanes_ = np.zeros(0, np.int64)
            ranks = counts = starts = lanes_
            live = np.zeros(0, bool)
            acts = None
        self.seg_lanes, self.seg_epochs, self.seg_ranks = [], [], []
        self.seg_counts, self.seg_actions = [], []
        self.queued[:] = 0
        resets, self.resets = self.resets, {}
        if which is not None:  # the other lanes' items wait, in order
            for q in np.flatnonzero(live & ~which[lanes_]):
                self._requeue(lanes_[q], acts[starts[q] : starts[q] + counts[q]])
            live = live & which[lanes_]
            for g in [g for g in resets if not which[g]]:
                self.resets[g] = resets.pop(g)
        top = int(ranks[live].max()) + 1 if live.any() else 1
        for s in range(len(self.lanes.sessions)):
            on_s = live & (self.server[lanes_] == s)
            rs = [g for g in resets if self.server[g] == s]
            if self.lockstep[s]:
                self._flush_lockstep(s, on_s, lanes_, counts, starts, acts, rs, resets)
                continue
            for r in range(top):
                pick = np.flatnonzero(on_s & (ranks == r))
                rr = rs if r == 0 else []
                if pick.size or rr:
                    self._send(s, pick, lanes_, counts, starts, acts, rr, resets)

    def _flush_lockstep(self, s, on_s, lanes_, counts, starts, acts, rs, resets):
        """One call at a time: each lane's next segment, all cut to one count.

        A VectorEnv server steps every lane at once, so each lane mid-episode
        is in every call with the same count; what is cut off waits for the
        next call (see the server's ``lockstep`` capability).
        """
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
            # _send reads each queued lane's rows through (lanes, counts, starts)
            all_q = np.arange(gs.size)
            self._send(s, all_q, gs, cnt, st, rows, rs, resets)
        elif rs or any(self.server[g] == s for g in self.released):
            self._send(
                s, np.zeros(0, np.int64), lanes_, counts, starts, acts, rs, resets
            )

    def _requeue(self, g: int, rows: np.ndarray) -> None:
        """Queues wire actions again (already converted) for lane ``g``."""
        g = int(g)
        self.seg_lanes.append(np.asarray([g], np.int64))
        self.seg_epochs.append(self.epoch[[g]])
        self.seg_ranks.append(self.queued[[g]].copy())
        self.seg_counts.append(np.asarray([len(rows)], np.int64))
        self.seg_actions.append(rows)
        self.queued[g] += 1

    def _call(self, s, rs, resets, act_g, counts, rows, tag) -> None:
        """One call to server ``s``: the resets of lanes ``rs`` (``resets``:
        lane -> episode), a run of ``counts[i]`` wire actions (``rows``) for
        each lane of ``act_g`` (global lanes, ascending in local order), and
        the lanes released there. ``tag`` (reset lanes, their epochs, action
        lanes, their epochs or group) waits in flight for the reply."""
        t0 = time.perf_counter()
        session = self.lanes.sessions[s]
        reset_g = tag[0]
        eps = [resets[g] for g in reset_g]
        release = [g for g in self.released if self.server[g] == s]
        if release:
            self.released = [g for g in self.released if self.server[g] != s]
        size = session.send(
            reset_lanes=self.local[reset_g],
            seeds=self.seeds[eps],
            trials=self.trial_of[eps] if session.trial_index else None,
            max_episode_seconds=self.seconds,
            lanes=self.local[act_g] if act_g.size else None,
            counts=counts,
            actions=rows,
            release=self.local[release] if release else (),
            all_observations=self.every_obs,
            info_keys=self.info_keys,
            info_every_step=self.info_every_step,
        )
        now = time.perf_counter()
        self.tel.span(
            "encode",
            t0,
            now,
            self.server_rows[s],
            resets=len(reset_g),
            lanes=len(act_g),
        )
        self.tel.add("request_bytes", size)
        self.inflight[s].append((tag, now))

    def _send(self, s, pick, lanes_, counts, starts, acts, rs, resets) -> None:
        reset_g = np.asarray(sorted(rs), np.int64)
        act_g = np.zeros(0, np.int64)
        c = rows = None
        if pick.size:
            order = pick[np.argsort(self.local[lanes_[pick]], kind="stable")]
            act_g = lanes_[order]
            c = counts[order]
            if np.all(c == 1):
                at = starts[order]
            else:
                at = np.repeat(starts[order] - np.cumsum(c) + c, c) + np.arange(
                    int(c.sum())
                )
            rows = acts[at]
        tag = (reset_g, self.epoch[reset_g], act_g, self.epoch[act_g])
        self._call(s, rs, resets, act_g, c, rows, tag)

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

    def hung_limit(self) -> float | None:
        """Seconds a server may owe a reply and send nothing before
        ``drop_hung`` drops it: ``AUTO_FACTOR`` times the slowest reply of the
        run, at least ``AUTO_FLOOR_SECONDS``; None before any reply."""
        if not self.slowest:
            return None
        return max(backend.AUTO_FLOOR_SECONDS, backend.AUTO_FACTOR * self.slowest)

    def _hung_wait(self) -> float | None:
        """How long the next wait for a reply may last before a server would
        be past ``hung_limit`` (None: no limit yet)."""
        limit = self.hung_limit()
        if limit is None:
            return None
        sessions = self.lanes.sessions
        times = [
            since
            for s in range(len(sessions))
            if s not in self.lost and (since := sessions[s].owed_since()) is not None
        ]
        if not times:
            return limit
        return max(min(times) + limit - time.monotonic(), 0.0) + 0.01

    def drop_hung(self) -> None:
        """Drops a server that owes a reply and has sent nothing for longer
        than ``hung_limit`` (``lose_server``), while another one is left: its
        episodes run again on the others."""
        limit = self.hung_limit()
        if limit is None:
            return
        sessions = self.lanes.sessions
        now = time.monotonic()
        for s, session in enumerate(sessions):
            since = None if s in self.lost else session.owed_since()
            if since is None or now - since <= limit:
                continue
            error = RemoteConnectionError(
                f"the jaxmesh env server at {session.address} sent nothing for "
                f"{now - since:.1f} s while owing a reply: past the default reply "
                f"timeout of {limit:.1f} s ({backend.AUTO_FACTOR:g}x the slowest "
                f"reply of this run, {self.slowest:.3f} s, and at least "
                f"{backend.AUTO_FLOOR_SECONDS:g} s); pass reply_timeout= to set "
                "it, or None to wait",
                address=session.address,
                code="DEADLINE_EXCEEDED",
            )
            self.lose_server(s, error)  # False: the last server; it may answer

    def _oldest_in_flight(self) -> int:
        """The server whose oldest call in flight was sent first."""
        waiting = [(q[0][1], s) for s, q in enumerate(self.inflight) if q]
        return min(waiting)[1]

    def lose_server(self, s: int, exc: BaseException) -> bool:
        """Drops server ``s`` after ``exc`` when the run may go on: its lanes
        are gone and the episodes they had not finished run again, from their
        seeds, on the lanes that remain (``HostLoop.lose_lanes``). False (the
        caller raises) under ``on_server_loss="raise"`` or with no other server
        left."""
        sessions = self.lanes.sessions
        left = [t for t in range(len(sessions)) if t != s and t not in self.lost]
        if self.lanes.on_server_loss != "rerun" or not left:
            return False
        self.lost.add(s)
        js = np.flatnonzero(self.server == s)
        self.epoch[js] += 1  # whatever is queued or in flight for them is void
        self.ready[js] = self.waiting[js] = False
        for j in js.tolist():
            self.resets.pop(j, None)
        self.released = [j for j in self.released if self.server[j] != s]
        self.dropped(list(self.inflight[s]))
        self.inflight[s].clear()
        sessions[s].close()
        episodes = self.lose_lanes(js)
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
        self.episodes_out.run_fields.setdefault("server_losses", []).append(loss)
        self.tel.add("server_lost", 1)
        stream.call(self.episodes_out.hooks, "on_fault", dict(loss))
        thread = threading.Thread(target=self._reconnect, args=(s,), daemon=True)
        self.rejoin_threads.append(thread)
        thread.start()
        return True

    def _now(self) -> float:
        return round(time.perf_counter() - self.t_start, 6)

    def _reconnect(self, s: int) -> None:
        """Tries server ``s`` again with backoff (``REJOIN_DELAYS``), for at
        most ``REJOIN_SECONDS``; a session that opens goes to ``rejoins``."""
        end = time.monotonic() + REJOIN_SECONDS
        for delay in REJOIN_DELAYS:
            if self.stop_rejoining.wait(delay) or time.monotonic() > end:
                return
            try:
                session = self.lanes.reconnect(s, REJOIN_CONNECT_SECONDS)
            except Exception:  # not back yet, or something else now
                continue
            if self.stop_rejoining.is_set():
                session.close()
                return
            self.rejoins.put((s, session))
            return

    def take_rejoins(self) -> None:
        """Servers that came back take their lanes again: those lanes start the
        episodes to run again, else the next unstarted ones."""
        while True:
            try:
                s, session = self.rejoins.get_nowait()
            except queue.Empty:
                return
            self.lanes.sessions[s] = session
            session.open(
                replies=self.replies,
                tag=s,
                reader=True,
                observation_keys=self.obs_keys,
            )
            self.lockstep[s] = session.lockstep
            self.tel.add("transport_shm", session.transport == "shm")
            self.lost.discard(s)
            js = np.flatnonzero(self.server == s)
            self.dead[js] = False
            self.capped[js] = False
            self.epoch[js] += 1
            at = self._now()
            for loss in reversed(self.episodes_out.run_fields["server_losses"]):
                if loss["server"] == session.address:
                    loss["rejoined_at_seconds"] = at
                    break
            self.tel.add("server_rejoined", 1)
            event = {"event": "rejoined", "server": session.address, "at_seconds": at}
            stream.call(self.episodes_out.hooks, "on_fault", event)
            free = np.zeros(self.n, bool)
            free[js] = True
            self.take_next(free)

    def stop_rejoins(self) -> None:
        """Ends the reconnect attempts; closes sessions never taken."""
        self.stop_rejoining.set()
        for thread in self.rejoin_threads:
            thread.join(REJOIN_CONNECT_SECONDS + 1.0)
        while True:
            try:
                _, session = self.rejoins.get_nowait()
            except queue.Empty:
                return
            session.close()

    def dropped(self, calls: list) -> None:
        """Calls in flight to a lost server (``(tag, sent_at)``), never to be
        answered."""

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
            for key, x in b.observation.items():
                self.rb_obs[key][gl, pos] = x[live]
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

    # Segments ----------------------------------------------------------------------
    def plan_segments(self, go: np.ndarray, actions: np.ndarray, cursor) -> None:
        """Queues every action of the lanes in ``go`` known now and not sent yet.

        What is known after the step that played index c of a chunk
        (``replay.known_until``: at c = 0 the chunk, at c = h - L under a lead
        the prefetched one too) is cut where the agent must see an observation
        first (``replay.segment_offsets``); no segment passes
        ``max_episode_steps`` or an action that fails the checks. h and L are
        each lane's (``HostLoop.lane_setting``: its cell under a sweep).
        """
        lanes_ = np.flatnonzero(go)
        if self.cfg.horizon == 1 and self.cfg.lead == 0:  # the action, per lane
            j = lanes_[self.sent[lanes_] <= self.t[lanes_]]
            ok = ~rules.failing_actions(np, actions[j], self.spec.num_actions)
            self.queue_segments(j[ok], np.ones(int(ok.sum()), np.int64), actions[j][ok])
            self.sent[j[ok]] += 1
            return
        t = self.t[lanes_].astype(np.int64)  # the step of the action just executed
        played = cursor[lanes_].astype(np.int64) - 1  # its index in its chunk
        cs = t - played
        h, lead = self.lane_setting(lanes_)
        known = replay.known_until(played, t, h, lead, np)
        target = np.minimum(np.maximum(self.sent[lanes_], known), self.max_steps)
        need = target > self.sent[lanes_]
        if not need.any():
            return
        if self.chunk is not None and self.cfg.lead == 0:  # read with the actions
            chunk, pending = self.chunk, None
        else:
            chunk, pending = jax.device_get((self.state.chunk, self.state.pending))
        if self.cfg.lead == 0 and self._one_segment_each(
            lanes_[need], cs[need], target[need], chunk
        ):
            return
        by_rank: dict[int, tuple[list, list, list]] = {}
        for j, cs_j, tgt, h_j, lead_j in zip(
            lanes_[need], cs[need], target[need], h[need], lead[need], strict=True
        ):
            first = int(self.sent[j])
            known = chunk[j, :h_j]
            if lead_j:
                known = np.concatenate([known, pending[j, :h_j]])
            seq = known[first - cs_j : tgt - cs_j]
            bad = rules.failing_actions(np, seq, self.spec.num_actions)
            if bad.any():
                tgt = first + int(np.argmax(bad))
                seq = seq[: tgt - first]
            offsets = replay.segment_offsets(int(h_j), int(lead_j))
            cuts = sorted({int(cs_j) + o for o in offsets if first < cs_j + o < tgt})
            rank = 0
            for cut in [*cuts, int(tgt)]:
                if cut > first:
                    lst = by_rank.setdefault(rank, ([], [], []))
                    lst[0].append(j)
                    lst[1].append(cut - first)
                    lst[2].append(seq[first - self.sent[j] : cut - self.sent[j]])
                    rank += 1
                    first = cut
            self.sent[j] = max(int(self.sent[j]), int(tgt))
        for rank in sorted(by_rank):
            js, cnt, parts = by_rank[rank]
            self.queue_segments(
                np.asarray(js, np.int64),
                np.asarray(cnt, np.int64),
                np.concatenate(parts),
            )

    def _one_segment_each(self, js, cs, target, chunk) -> bool:
        """Without a lead, each lane's known actions are one segment, the rest
        of its chunk: queued for every lane at once (no per-lane work). False
        (nothing queued) when an action fails the checks: the caller then cuts
        each lane's segment before its first bad action."""
        first = self.sent[js]
        counts = target - first
        offset = first - cs  # where the unsent actions start in the chunk
        width = int(counts.max())
        cols = offset[:, None] + np.arange(width)
        keep = np.arange(width) < counts[:, None]
        rows = chunk[js[:, None], np.minimum(cols, chunk.shape[1] - 1)][keep]
        if rules.failing_actions(np, rows, self.spec.num_actions).any():
            return False
        self.queue_segments(js, counts, rows)
        self.sent[js] = np.maximum(first, target)
        return True

    # Episodes (HostLoop's rules; the wire's part here) -----------------------------
    def reset_lanes(self, js: list[int], eps: list[int]) -> None:
        """Queues the resets; a lane is ready when its reset observation is in."""
        for j, i in zip(js, eps, strict=True):
            self.epoch[j] += 1
            self.resets[j] = i
        self.sent[js] = 0
        self.ready[js] = self.waiting[js] = self.started[js] = False
        self.head[js] = self.tail[js] = 0

    def stepped(self, j: np.ndarray, te: np.ndarray, tr: np.ndarray) -> None:
        # A lockstep server's lane that ends at the cap is still mid-episode
        # there: it must be reset even when it takes no next episode.
        self.capped[j] = ~(te | tr)

    def masked(self, js: np.ndarray) -> None:
        for j in js.tolist():
            if self.capped[j] and self.lockstep[self.server[j]]:
                self.released.append(j)  # the server stops expecting it

    def free(self, ended: np.ndarray) -> None:
        self.epoch[ended] += 1  # what is still in flight for it is void
        self.ready[ended] = self.waiting[ended] = False

    def take_results(self) -> None:
        """Lanes waiting for a result that is in take it (one step each)."""
        j = np.flatnonzero(self.waiting & (self.tail > self.head))
        if not j.size:
            return
        pos = self.head[j] % self.cap
        r = self.rb_reward[j, pos]
        te = self.rb_term[j, pos]
        tr = self.rb_trunc[j, pos]
        has = self.rb_has_obs[j, pos]
        jh, ph = j[has], pos[has]
        for key, rb in self.rb_obs.items():
            self.obs_leaves[key][jh] = rb[jh, ph]
        if self.info_keys:
            self.metrics.step(
                j,
                {
                    k: (self.rb_info[k][j, pos], self.rb_info_has[k][j, pos])
                    for k in self.info_keys
                },
            )
        self.head[j] += 1
        self.waiting[j] = False
        self.ready[j] = True
        self.account(j, r, te, tr)

    # The loop ----------------------------------------------------------------------
    def open_sessions(self) -> None:
        """Opens a session on every server and starts the first episodes.

        One server and one group: nothing to do while a reply is out, so the
        loop takes it off the stream itself (a thread hand-off less per call);
        else (or with a reply timeout) reader threads decode replies while the
        loop plans.
        """
        sessions = self.lanes.sessions
        self.direct = (
            len(sessions) == 1
            and (self.num_groups == 1 or self.takes_in_order)
            and sessions[0].reply_timeout is None
        )
        for s, c in enumerate(sessions):
            c.open(
                replies=self.replies,
                tag=s,
                reader=not self.direct,
                observation_keys=self.obs_keys,
            )
            # Sessions on the same-host data path: 1 each, 0 each on gRPC.
            self.tel.add("transport_shm", c.transport == "shm")
        self.state = self.program.init(self.agent_obs, np.zeros(self.n, bool))
        self.take_next(np.ones(self.n, bool))

    def run(self) -> None:
        """Runs the budget (``pace``); reconnect attempts end with it."""
        try:
            self.pace()
        finally:
            self.stop_rejoins()

    def pace(self) -> None:
        self.open_sessions()
        self.flush()
        turn = 0
        while self.active.any():
            while self.take_reply(block=False):  # file what came in meanwhile
                pass
            self.take_results()
            if not self.active.any():
                break
            ready = self.ready & self.active
            if not ready.any():
                self.flush()
                if not self.take_reply():
                    raise RuntimeError(
                        "jaxmesh internal error: lanes wait for results, but no "
                        "call is in flight; please report it "
                        f"(active {np.flatnonzero(self.active).tolist()}, episode "
                        f"{self.episode[self.active].tolist()}, t "
                        f"{self.t[self.active].tolist()}, sent "
                        f"{self.sent[self.active].tolist()}, waiting "
                        f"{self.waiting[self.active].tolist()}, in "
                        f"{(self.tail - self.head)[self.active].tolist()})"
                    )
                self.take_results()
                continue
            # One group at a time, in turn: the others' calls are in flight.
            for k in range(self.num_groups):
                group = self.group_masks[(turn + k) % self.num_groups]
                if (ready & group).any():
                    turn = (turn + k + 1) % self.num_groups
                    break
            replay = ready & self.replays_next()
            if replay.any():
                self.replay(replay)
                continue
            go = ready & group
            t0 = time.perf_counter()
            device = self.agent_step(self.started & go, go, go)
            # h = 1 without a lead: the action is the segment, no cursor read.
            actions, cursor = self.read_actions(device, cursor=not self.per_step)
            self.tel.span(
                "predict",
                t0,
                time.perf_counter(),
                self.group_rows[(turn - 1) % self.num_groups],
            )
            if self.recorder is not None:
                moved = np.flatnonzero(go)
                self.recorder.actions(moved, self.t[moved], actions)
            if self.steps:
                self.step_action[go] = actions[go]
            self.started[go] = False
            self.ready[go] = False
            self.check_actions(go, actions)
            self.plan_segments(go, actions, cursor)
            self.waiting[go] = True
            self.take_results()
            if not (self.ready & group).any():
                self.flush(group if self.num_groups > 1 else None)
        self.finish()

    def replay(self, lanes_: np.ndarray) -> None:
        """The lanes in ``lanes_`` execute their next chunk action without an
        agent step: it was sent with their segment (``HostLoop.replayed``)."""
        js = np.flatnonzero(lanes_)
        actions = self.replayed(js)
        if self.recorder is not None:
            self.recorder.actions(js, self.t[js], actions)
        if self.steps:
            self.step_action[js] = actions[js]
        self.ready[js] = False
        self.check_actions(lanes_, actions)
        self.waiting[js] = True
        self.take_results()

    def check_actions(self, go: np.ndarray, actions: np.ndarray) -> None:
        """Raises BadValueError for an action out of range or not finite (the
        segments stop before it: it is never sent)."""
        faults = self.action_faults(go, actions)
        if faults is not None:
            self.close_episodes(np.zeros(0, np.int64), faults)


class _StepRun(_Run):
    """The per-step case (h = 1, no lead, no recording, no lockstep server),
    without ``_Run``'s ring buffers and segments: one pass over numpy arrays
    per call.

    The lane groups take turns. At its turn, a group takes in the replies to
    its last calls, its lanes that have their observation act, and its
    actions and resets go to the servers, one call per server; the group's
    replies are awaited only at its next turn, so with G > 1 the device plans
    for one group while the servers step the others. The lanes that end in
    one reply take the next episodes in ascending lane order (CONTRACT 3); a
    lane that starts an episode waits one call for its reset observation. The
    same episodes, seeds and results as ``_Run``.
    """

    takes_in_order = True

    @staticmethod
    def applies(program: Any, lanes: ServedLanes, recorder: Any) -> bool:
        cfg = program.config
        return (
            cfg.horizon == 1
            and cfg.lead == 0
            and recorder is None
            and not any(c.lockstep for c in lanes.sessions)
        )

    def pace(self) -> None:
        self.pending = [0] * self.num_groups  # calls in flight per group
        self.open_sessions()
        while self.active.any():
            for g, group in enumerate(self.group_masks):
                while self.pending[g]:
                    self.take_reply()
                if (self.active & group).any():
                    self._turn(g, group)
        self.finish()

    def _turn(self, g: int, group: np.ndarray) -> None:
        """Group ``g``'s agent step and calls."""
        go = self.ready & self.active & group
        wire = None
        if go.any():
            t0 = time.perf_counter()
            device = self.agent_step(self.started & go, go, go)
            acts, _ = self.read_actions(device)
            self.tel.span("predict", t0, time.perf_counter(), self.group_rows[g])
            if self.steps:
                self.step_action[go] = acts[go]
            self.started[go] = False
            self.check_actions(go, acts)
            wire = gym_lanes.env_actions(self.lanes.action_space, acts)
        stepped = np.flatnonzero(go)
        resets = {j: i for j, i in self.resets.items() if group[j]}
        for j in resets:
            del self.resets[j]
        many = len(self.lanes.sessions) > 1
        for s in range(len(self.lanes.sessions)):
            on_s = stepped[self.server[stepped] == s] if many else stepped
            rs = [j for j in resets if self.server[j] == s]
            if on_s.size or rs:
                self._send_step(s, rs, resets, on_s, wire, g)
        self.ready[go] = False
        if not self.pending[g]:
            raise RuntimeError(
                "jaxmesh internal error: a lane group has active lanes but "
                "nothing to send; please report it (active "
                f"{np.flatnonzero(self.active & group).tolist()})"
            )

    def dropped(self, calls: list) -> None:
        for (_, group, _, _), _ in calls:
            self.pending[group] -= 1

    def _send_step(self, s, rs, resets, act_g, wire, group) -> None:
        """One call of lane group ``group`` to server ``s``: the resets ``rs``
        and one action per lane of ``act_g`` (global lanes)."""
        reset_g = np.asarray(sorted(rs), np.int64)
        rows = None
        if act_g.size:
            act_g = act_g[np.argsort(self.local[act_g], kind="stable")]
            rows = wire[act_g]
        ones = np.ones(act_g.size, np.int64)
        self._call(s, rs, resets, act_g, ones, rows, (reset_g, group, act_g, None))
        self.pending[group] += 1

    def _file_reply(self, s: int, reply: Any) -> bool:
        """Files one server's reply to ``_send_step`` and accounts its steps."""
        b = reply.batch
        (reset_g, group, act_g, _), sent_at = self.inflight[s].popleft()
        self.pending[group] -= 1
        self._tel_reply(s, sent_at, reply)
        g = self.to_global[s][b.lanes]
        if reset_g.size:
            asked = np.sort(np.concatenate([self.local[reset_g], self.local[act_g]]))
            steps = np.where(np.isin(g, reset_g), 0, 1)
        else:  # steps only (most calls): act_g is ascending in local order
            asked, steps = self.local[act_g], 1
        if g.size != asked.size or np.any(b.lanes != asked) or np.any(b.steps != steps):
            raise codec.ProtocolError(
                f"the server at {self.lanes.sessions[s].address} answered for lanes "
                f"{b.lanes[:16].tolist()} with steps {b.steps[:16].tolist()}, "
                f"asked for {asked[:16].tolist()} (resets "
                f"{self.local[reset_g][:16].tolist()})"
            )
        obs_rows = b.observation
        leaves = self.obs_leaves
        if reset_g.size:
            is_reset = b.steps == 0
            rl = g[is_reset]
            for key, x in obs_rows.items():
                leaves[key][rl] = x[is_reset]
            self.reset_infos(b, rl, np.flatnonzero(is_reset))
            self.seen_resets(rl)
            self.ready[rl] = self.started[rl] = True
            step_rows = np.flatnonzero(~is_reset)
            j = g[step_rows]
        else:
            step_rows = None
            j = g
        if not j.size:
            return True
        # One step per stepped lane (rewards, ends), one row per lane
        # (observations, infos: resets have rows too).
        pick = (lambda x: x) if step_rows is None else (lambda x: x[step_rows])
        r = b.rewards.astype(np.float32)
        te, tr = b.terminated, b.truncated
        for key, x in obs_rows.items():
            leaves[key][j] = pick(x)
        if self.info_keys:
            info = self.info_rows(b)
            self.metrics.step(
                j,
                {
                    k: (
                        (pick(info[k]), pick(_present(b, k)))
                        if k in info
                        else (np.zeros(j.size), np.zeros(j.size, bool))
                    )
                    for k in self.info_keys
                },
            )
        self.ready[j] = True
        self.account(j, r, te, tr)
        return True


def run_class(program: Any, lanes: ServedLanes, recorder: Any) -> type[_Run]:
    """The pacing of a served run: ``_StepRun`` in the per-step case, else
    ``_Run``; both take ``HostLoop``'s arguments."""
    return _StepRun if _StepRun.applies(program, lanes, recorder) else _Run


__all__ = [
    "ServedLanes",
    "wire_leaves",
    "run_class",
    "needs_every_observation",
    "default_lane_groups",
    "GROUPS_FROM_LANES",
]
