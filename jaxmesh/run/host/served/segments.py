"""Segment planning: which of a lane's known actions go to its server now and
where they are cut (``plan_segments``, over the replay rules of
``jaxmesh.core.replay``); the cut segments go to ``calls.py``'s queue.

It is a mixin of ``pace._Run``, not a collaborator: its methods read and
write the run's one per-lane state (epochs, ring buffers, queues, calls in
flight), which ``_Run.__init__`` sets and the other mixins share; a
collaborator would need that state handed over or split apart, changing the
code that reads it rather than moving it.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxmesh.core import replay, rules


class _Segments:
    """The run's segment planning (see the module docstring)."""

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
