"""The pacing of a served run: ``ServedRun`` (a ``HostLoop`` with an
``outbox``, ``inbox`` and ``loss``) and ``ServedStepRun``, the per-step case.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.remote import codec
from jaxmesh.run.host.loop import HostLoop, wire_leaves
from jaxmesh.run.host.served.calls import Outbox
from jaxmesh.run.host.served.loss import ServerLoss
from jaxmesh.run.host.served.pool import ServedLanes
from jaxmesh.run.host.served.replies import Inbox, _present
from jaxmesh.run.host.served.segments import plan_segments


class ServedRun(HostLoop):
    """One run's pacing over ``ServedLanes``: agent steps for the lanes whose
    results are in, flushes when none can move, lane groups in turn. Per lane
    an epoch, bumped whenever its episode changes, voids replies for an ended
    episode."""

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
        every_info = any(red != "last" for _, red in metrics.named) or (
            metrics.tracks_success
        )
        stacks = any(d.stack > 1 and not d.reads_action for _, d in self.cfg.spec)
        self.every_obs = (
            stacks  # a window of more than one frame
            or recorder is not None
            or (every_info and not all(c.info_every_step for c in lanes.sessions))
        )
        self.info_every_step = every_info and not self.every_obs
        n = self.n
        self.epoch = np.zeros(n, np.int64)
        self.ready = np.zeros(n, bool)  # its current observation is in: may act
        self.waiting = np.zeros(n, bool)  # acted; that action's result not in yet
        self.sent = np.zeros(n, np.int64)  # actions of the episode sent
        self.capped = np.zeros(n, bool)  # the last result ended at the cap only
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
        self.outbox, self.inbox, self.loss = Outbox(self), Inbox(self), ServerLoss(self)
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
        for j, i in zip(js, eps, strict=True):
            self.epoch[j] += 1
            self.outbox.resets[j] = i
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
        """Opens a session on every server and starts the first episodes (with
        one server and group, no reader thread: a hand-off less per call)."""
        sessions = self.lanes.sessions
        self.inbox.direct = (
            len(sessions) == 1
            and (self.num_groups == 1 or self.takes_in_order)
            and sessions[0].reply_timeout is None
        )
        for s, c in enumerate(sessions):
            c.open(
                replies=self.inbox.replies,
                tag=s,
                reader=not self.inbox.direct,
                observation_keys=self.obs_keys,
            )
            # Sessions on the same-host data path: 1 each, 0 each on gRPC.
            self.tel.add("transport_shm", c.transport == "shm")
        self.state = self.program.init(self.agent_obs, np.zeros(self.n, bool))
        self.take_next(np.ones(self.n, bool))

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
            replay = ready & self.replays_next()
            if replay.any():  # sent with their segments: no agent step
                self.acted(replay, self.replayed(np.flatnonzero(replay)))
                self.inbox.take_results()
                continue
            go = ready & group
            row = self.group_rows[(turn - 1) % self.num_groups]
            # h = 1 without a lead: the action is the segment, no cursor read.
            actions, cursor, _ = self.predict(go, row, cursor=not self.per_step)
            self.acted(go, actions)
            plan_segments(self, go, actions, cursor)
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
        self.check_actions(go, actions)
        self.waiting[go] = True

    def check_actions(self, go: np.ndarray, actions: np.ndarray) -> None:
        """BadValueError for a bad action (the segments stop before it)."""
        faults = self.action_faults(go, actions)
        if faults is not None:
            self.close_episodes(np.zeros(0, np.int64), faults)


class ServedStepRun(ServedRun):
    """The per-step case (``applies``) without ``ServedRun``'s ring buffers
    and segments: one pass over numpy arrays per call, the lane groups in turn,
    each awaiting its replies at its next turn. ``ServedRun``'s results."""

    takes_in_order = True

    @staticmethod
    def applies(program: Any, lanes: ServedLanes, recorder: Any) -> bool:
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
            if self.steps:
                self.step_action[go] = acts[go]
            self.check_actions(go, acts)
            wire = gym_lanes.env_actions(self.lanes.action_space, acts)
        stepped = np.flatnonzero(go)
        queued = self.outbox.resets
        resets = {j: i for j, i in queued.items() if group[j]}
        for j in resets:
            del queued[j]
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
                self.outbox.call(s, rs, resets, act_g, ones, rows, tag)
        self.ready[go] = False
        if not self.pending(g):
            raise RuntimeError(
                "jaxmesh internal error: a lane group has active lanes but "
                "nothing to send; please report it (active "
                f"{np.flatnonzero(self.active & group).tolist()})"
            )

    def file_reply(self, s: int, reply: Any) -> None:
        """Files one server's reply to a ``_turn``'s call."""
        b = reply.batch
        (reset_g, _, act_g, _), sent_at = self.outbox.inflight[s].popleft()
        self.inbox.tel_reply(s, sent_at, reply)
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
        obs_rows, leaves = b.observation, self.obs_leaves
        step_rows: Any = slice(None)
        if reset_g.size:
            is_reset = b.steps == 0
            rl = g[is_reset]
            for key, x in obs_rows.items():
                leaves[key][rl] = x[is_reset]
            self.inbox.reset_infos(b, rl, np.flatnonzero(is_reset))
            self.seen_resets(rl)
            self.ready[rl] = self.started[rl] = True
            step_rows = np.flatnonzero(~is_reset)
        j = g[step_rows]
        if not j.size:
            return
        # One step per stepped lane (rewards, ends), one row per lane
        # (observations, infos: resets have rows too).
        for key, x in obs_rows.items():
            leaves[key][j] = x[step_rows]
        if self.info_keys:
            info = self.inbox.info_rows(b)
            none = (np.zeros(j.size), np.zeros(j.size, bool))  # no row had k
            values = {
                k: (info[k][step_rows], _present(b, k)[step_rows])
                if k in info
                else none
                for k in self.info_keys
            }
            self.metrics.step(j, values)
        self.ready[j] = True
        self.account(j, b.rewards.astype(np.float32), b.terminated, b.truncated)
