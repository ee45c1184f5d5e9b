"""Segment planning for a served run: which of a lane's known actions go to
its server now, and where they are cut (``jaxmesh.core.replay``'s rules).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxmesh.core import replay, rules


def plan_segments(run: Any, go: np.ndarray, actions: np.ndarray, cursor) -> None:
    """Queues every action of the lanes in ``go`` known now
    (``replay.known_until``) and not sent yet, cut where the agent must see an
    observation first (``replay.segment_offsets``); no segment passes
    ``max_episode_steps`` or an action that fails the checks.
    """
    lanes_ = np.flatnonzero(go)
    if run.cfg.h == 1 and run.cfg.lead == 0:  # the action, per lane
        j = lanes_[run.sent[lanes_] <= run.t[lanes_]]
        ok = ~rules.failing_actions(np, actions[j], run.spec.num_actions)
        run.outbox.queue(j[ok], np.ones(int(ok.sum()), np.int64), actions[j][ok])
        run.sent[j[ok]] += 1
        return
    t = run.t[lanes_].astype(np.int64)  # the step of the action just executed
    played = cursor[lanes_].astype(np.int64) - 1  # its index in its chunk
    cs = t - played
    h, lead = run.lane_setting(lanes_)
    known = replay.known_until(played, t, h, lead, np)
    target = np.minimum(np.maximum(run.sent[lanes_], known), run.max_steps)
    need = target > run.sent[lanes_]
    if not need.any():
        return
    if run.chunk is not None and run.cfg.lead == 0:  # read with the actions
        chunk, pending = run.chunk, None
    else:
        chunk, pending = jax.device_get((run.state.chunk, run.state.pending))
    if run.cfg.lead == 0 and _one_segment_each(
        run, lanes_[need], cs[need], target[need], chunk
    ):
        return
    by_rank: dict[int, list] = {}
    for j, cs_j, tgt, h_j, lead_j in zip(
        lanes_[need], cs[need], target[need], h[need], lead[need], strict=True
    ):
        first = int(run.sent[j])
        known = chunk[j, :h_j]
        if lead_j:
            known = np.concatenate([known, pending[j, :h_j]])
        seq = known[first - cs_j : tgt - cs_j]
        bad = rules.failing_actions(np, seq, run.spec.num_actions)
        if bad.any():
            tgt = first + int(np.argmax(bad))
            seq = seq[: tgt - first]
        offsets = replay.segment_offsets(int(h_j), int(lead_j))
        cuts = sorted({int(cs_j) + o for o in offsets if first < cs_j + o < tgt})
        rank = 0
        for cut in [*cuts, int(tgt)]:
            if cut > first:
                part = seq[first - run.sent[j] : cut - run.sent[j]]
                by_rank.setdefault(rank, []).append((j, cut - first, part))
                rank += 1
                first = cut
        run.sent[j] = max(int(run.sent[j]), int(tgt))
    for rank in sorted(by_rank):
        js, cnt, parts = zip(*by_rank[rank], strict=True)
        run.outbox.queue(
            np.asarray(js, np.int64), np.asarray(cnt, np.int64), np.concatenate(parts)
        )


def _one_segment_each(run: Any, js, cs, target, chunk) -> bool:
    """Without a lead: the rest of each lane's chunk as one segment, queued
    at once; False (nothing queued) when an action fails the checks."""
    first = run.sent[js]
    counts = target - first
    offset = first - cs  # where the unsent actions start in the chunk
    width = int(counts.max())
    cols = offset[:, None] + np.arange(width)
    keep = np.arange(width) < counts[:, None]
    rows = chunk[js[:, None], np.minimum(cols, chunk.shape[1] - 1)][keep]
    if rules.failing_actions(np, rows, run.spec.num_actions).any():
        return False
    run.outbox.queue(js, counts, rows)
    run.sent[js] = np.maximum(first, target)
    return True
