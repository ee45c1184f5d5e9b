"""A served run's pace: ``ServedRun`` (segments cut by ``jaxmesh.core.replay``'s
rules) and ``ServedStepRun``, the per-step case."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxmesh.core import replay, rules
from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.run.host.loop import HostLoop, wire_leaves
from jaxmesh.run.host.served import traffic


class ServedRun(HostLoop):
    """Agent steps for the lanes whose results are in, lane groups in turn, a
    flush when none can move; a lane's epoch, bumped when its episode changes,
    voids replies for an ended episode."""

    # Whether replies are awaited in the order the calls went (then one
    # server's may be taken off its stream directly).
    takes_in_order = False

    def __init__(self, *args: Any):
        super().__init__(*args)
        lanes, metrics, recorder = self.lanes, self.metrics, self.recorder
        # The server measures max_episode_seconds (HostLoop.t0 stays None).
        self.info_keys = list(metrics.keys)
        # A reduction other than ``last`` and success once read every step's
        # info: a server that declares ``info_every_step`` sends them with the
        # last observation only, an older one with every observation.
        every_info = metrics.tracks_success or any(
            r != "last" for _, r in metrics.named
        )
        stacks = any(d.stack > 1 and not d.reads_action for _, d in self.cfg.spec)
        self.every_obs = (
            stacks  # a window of more than one frame
            or recorder is not None
            or (every_info and not all(c.info_every_step for c in lanes.sessions))
        )
        self.info_every_step = every_info and not self.every_obs
        n = self.n
        # May act (its observation is in); awaits its action's result; ended at
        # the cap only. Its episode's epoch and actions sent.
        self.ready, self.waiting, self.capped = np.zeros((3, n), bool)
        self.epoch, self.sent = np.zeros((2, n), np.int64)
        # The leaves asked for; the others stay zeros in ``obs_leaves``.
        self.obs_keys = wire_leaves(self.spec, self.program, recorder)
        self.server = np.asarray(lanes.server, np.int64)
        self.local = np.asarray(lanes.local, np.int64)
        self.to_global = []
        for s, c in enumerate(lanes.sessions):
            m = np.full(c.info.num_lanes, -1, np.int64)
            mine = np.flatnonzero(self.server == s)
            m[self.local[mine]] = mine
            self.to_global.append(m)
        self.lockstep = [c.lockstep for c in lanes.sessions]
        self.server_rows = [f"server {s}" for s in range(len(lanes.sessions))]
        self.outbox, self.inbox = traffic.Outbox(self), traffic.Inbox(self)
        self.loss = traffic.ServerLoss(self)
        self.per_step = self.cfg.h == 1 and self.cfg.lead == 0
        # Lane groups (contiguous): the device plans for one while a server
        # steps another. A lockstep server steps every lane in every call.
        self.num_groups = groups = max(1, min(lanes.lane_groups, n))
        group_of = np.arange(n) * groups // n
        self.group_masks = [group_of == g for g in range(groups)]
        # Timeline rows (jaxmesh.trace), named once rather than on every call.
        self.group_rows = [f"group {g}" for g in range(groups)]

    def reset_lanes(self, js: list[int], eps: list[int]) -> None:
        """Queues the resets; a lane is ready when its reset observation is in."""
        self.epoch[js] += 1
        self.outbox.resets.update(zip(js, eps, strict=True))
        self.sent[js] = 0
        self.ready[js] = self.waiting[js] = self.started[js] = False
        self.inbox.head[js] = self.inbox.tail[js] = 0

    def account(self, j, r, te, tr, faults=None) -> None:
        # A lockstep server's lane that ends at the cap is still mid-episode
        # there: it must be reset even when it takes no next episode.
        self.capped[j] = ~(te | tr)
        super().account(j, r, te, tr, faults)

    def take_next(self, free: np.ndarray) -> np.ndarray:
        self.epoch[free] += 1  # what is still in flight for a free lane is void
        self.ready[free] = self.waiting[free] = False
        masked = super().take_next(free)
        for j in masked.tolist():
            if self.capped[j] and self.lockstep[self.server[j]]:
                self.outbox.released.append(j)  # the server stops expecting it
        return masked

    def file_reply(self, s: int, reply: Any) -> None:
        self.inbox.file_reply(s, reply)

    def open_sessions(self) -> None:
        """Opens the sessions (no reader thread for one) and starts episodes."""
        sessions = self.lanes.sessions
        self.inbox.direct = (
            len(sessions) == 1
            and (self.num_groups == 1 or self.takes_in_order)
            and self.lanes.reply_timeout is None
        )
        for s, c in enumerate(sessions):
            self.open_session(s, c, reader=not self.inbox.direct)
        self.state = self.program.init(self.agent_obs, np.zeros(self.n, bool))
        self.take_next(np.ones(self.n, bool))

    def open_session(self, s: int, session: Any, reader: bool = True) -> None:
        keys, replies = self.obs_keys, self.inbox.replies
        session.open(replies=replies, tag=s, reader=reader, observation_keys=keys)
        # Sessions on the same-host data path: 1 each, 0 each on gRPC.
        self.tel.add("transport_shm", session.transport == "shm")

    def run(self) -> None:
        """Runs the budget; reconnect attempts end with it."""
        try:
            self.pace()
        finally:
            self.loss.stop()

    def pace(self) -> None:
        self.open_sessions()
        self.outbox.flush()
        turn = 0
        while self.active.any():
            while self.inbox.take_reply(block=False):  # file what came in meanwhile
                pass
            self.inbox.take_results()
            if not self.active.any():
                break
            ready = self.ready & self.active
            if not ready.any():
                self.outbox.flush()
                if not self.inbox.take_reply():
                    raise RuntimeError(
                        "jaxmesh internal error: lanes wait for results, but no "
                        "call is in flight; please report it "
                        f"(active {np.flatnonzero(self.active).tolist()}, episode "
                        f"{self.episode[self.active].tolist()}, t "
                        f"{self.t[self.active].tolist()}, sent "
                        f"{self.sent[self.active].tolist()}, waiting "
                        f"{self.waiting[self.active].tolist()}, in "
                        f"{(self.inbox.tail - self.inbox.head)[self.active].tolist()})"
                    )
                self.inbox.take_results()
                continue
            # One group at a time, in turn: the others' calls are in flight.
            for k in range(self.num_groups):
                group = self.group_masks[(turn + k) % self.num_groups]
                if (ready & group).any():
                    turn = (turn + k + 1) % self.num_groups
                    break
            known = ready & self.replays_next()
            if known.any():  # sent with their segments: no agent step
                self.acted(known, self.replayed(np.flatnonzero(known)))
                self.inbox.take_results()
                continue
            go = ready & group
            row = self.group_rows[(turn - 1) % self.num_groups]
            # h = 1 without a lead: the action is the segment, no cursor read.
            actions, cursor, _ = self.predict(go, row, cursor=not self.per_step)
            self.acted(go, actions)
            self.queue_segments(go, actions, cursor)
            self.inbox.take_results()
            if not (self.ready & group).any():
                self.outbox.flush(group if self.num_groups > 1 else None)
        self.finish()

    def acted(self, go: np.ndarray, actions: np.ndarray) -> None:
        """The lanes in ``go`` execute ``actions`` (by lane) and wait."""
        js = np.flatnonzero(go)
        if self.recorder is not None:
            self.recorder.actions(js, self.t[js], actions)
        if self.steps:
            self.step_action[go] = actions[go]
        self.ready[go] = False
        faults = self.action_faults(go, actions)
        if faults is not None:  # BadValueError (the segments stop before it)
            self.close_episodes(np.zeros(0, np.int64), faults)
        self.waiting[go] = True

    def queue_segments(self, go: np.ndarray, actions: np.ndarray, cursor) -> None:
        """Queues the unsent actions of lanes ``go`` known now, cut where the agent
        must see an observation first (``replay``'s rules); no segment passes
        ``max_episode_steps`` or an action that fails the checks."""
        lanes_ = np.flatnonzero(go)
        if self.per_step:  # the action, per lane
            j = lanes_[self.sent[lanes_] <= self.t[lanes_]]
            ok = ~rules.failing_actions(np, actions[j], self.spec.num_actions)
            self.outbox.queue(j[ok], np.ones(int(ok.sum()), np.int64), actions[j][ok])
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
        by_rank: dict[int, list] = {}
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
                    part = seq[first - self.sent[j] : cut - self.sent[j]]
                    by_rank.setdefault(rank, []).append((j, cut - first, part))
                    rank += 1
                    first = cut
            self.sent[j] = max(int(self.sent[j]), int(tgt))
        for rank in sorted(by_rank):
            js, cnt, parts = zip(*by_rank[rank], strict=True)
            lanes_, counts = np.asarray([js, cnt], np.int64)
            self.outbox.queue(lanes_, counts, np.concatenate(parts))

    def _one_segment_each(self, js, cs, target, chunk) -> bool:
        """Without a lead: each lane's chunk's rest as one segment (False: a bad
        action, nothing queued)."""
        first = self.sent[js]
        counts = target - first
        offset = first - cs  # where the unsent actions start in the chunk
        width = int(counts.max())
        cols = offset[:, None] + np.arange(width)
        keep = np.arange(width) < counts[:, None]
        rows = chunk[js[:, None], np.minimum(cols, chunk.shape[1] - 1)][keep]
        if rules.failing_actions(np, rows, self.spec.num_actions).any():
            return False
        self.outbox.queue(js, counts, rows)
        self.sent[js] = np.maximum(first, target)
        return True


class ServedStepRun(ServedRun):
    """``ServedRun``'s results in the per-step case without ring buffers and
    segments; each lane group awaits its replies at its next turn."""

    takes_in_order = True

    @staticmethod
    def applies(program: Any, lanes: traffic.ServedLanes, recorder: Any) -> bool:
        cfg = program.config
        return (
            cfg.h == 1
            and cfg.lead == 0
            and recorder is None
            and not any(c.lockstep for c in lanes.sessions)
        )

    def pending(self, g: int) -> int:
        """Lane group ``g``'s calls in flight."""
        return sum(tag[1] == g for q in self.outbox.inflight for tag, _ in q)

    def pace(self) -> None:
        self.open_sessions()
        while self.active.any():
            for g, group in enumerate(self.group_masks):
                while self.pending(g):
                    self.inbox.take_reply()
                if (self.active & group).any():
                    self._turn(g, group)
        self.finish()

    def _turn(self, g: int, group: np.ndarray) -> None:
        go = self.ready & self.active & group
        wire = None
        if go.any():
            acts, _, _ = self.predict(go, self.group_rows[g])
            self.acted(go, acts)
            wire = gym_lanes.env_actions(self.lanes.action_space, acts)
        stepped = np.flatnonzero(go)
        queued = self.outbox.resets
        resets = {j: queued.pop(j) for j in list(queued) if group[j]}
        many = len(self.lanes.sessions) > 1
        for s in range(len(self.lanes.sessions)):
            on_s = stepped[self.server[stepped] == s] if many else stepped
            rs = [j for j in resets if self.server[j] == s]
            if on_s.size or rs:  # one call: the resets, an action per lane
                reset_g = np.asarray(sorted(rs), np.int64)
                act_g = on_s[np.argsort(self.local[on_s], kind="stable")]
                rows = wire[act_g] if act_g.size else None
                tag = (reset_g, g, act_g, None)
                ones = np.ones(act_g.size, np.int64)
                self.outbox.call(s, resets, act_g, ones, rows, tag)
        if not self.pending(g):
            raise RuntimeError(
                "jaxmesh internal error: a lane group has active lanes but "
                "nothing to send; please report it (active "
                f"{np.flatnonzero(self.active & group).tolist()})"
            )

    def file_reply(self, s: int, reply: Any) -> None:
        """Files one server's reply to a ``_turn``'s call."""
        b = reply.batch
        (reset_g, _, _, _), g = self.inbox.answered(s, reply, one_step=True)
        step_rows: Any = slice(None)
        if reset_g.size:
            is_reset = b.steps == 0
            rows = np.flatnonzero(is_reset)
            self.inbox.file_resets(b, g[is_reset], rows, rows)
            step_rows = np.flatnonzero(~is_reset)
        j = g[step_rows]
        if not j.size:
            return
        # One step per stepped lane (rewards, ends), one row per lane
        # (observations, infos: resets have rows too).
        for key, x in b.observation.items():
            self.obs_leaves[key][j] = x[step_rows]
        if self.info_keys:
            info = self.inbox.info_rows(b)
            none = (np.zeros(j.size), np.zeros(j.size, bool))  # no row had k
            values = dict.fromkeys(self.info_keys, none)
            for k, x in info.items():
                values[k] = x[step_rows], traffic._present(b, k)[step_rows]
            self.metrics.step(j, values)
        self.ready[j] = True
        self.account(j, b.rewards.astype(np.float32), b.terminated, b.truncated)
