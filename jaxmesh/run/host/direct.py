"""A host loop's agent step for a ``jaxmesh.HostPolicy`` with nothing to do on
the device (``applies``): ``jaxmesh.core.agent.host_step`` in numpy, the same
actions lane by lane without a jitted call and callback (about 60 us on a CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxmesh.core import agent, replay
from jaxmesh.host_policy import row_seeds


def applies(cfg: agent.AgentConfig, pol: Any) -> bool:
    """Whether ``pol`` is a ``HostPolicy`` that ``DirectStep`` can step."""
    return (
        pol.host is not None
        and cfg.raw
        and cfg.lead == 0
        and cfg.delay == 0
        and cfg.ensemble is None
        and cfg.grid is None
        and not cfg.pending_names
        and not cfg.texts
        and pol.initial_state is None
    )


@dataclasses.dataclass(eq=False)
class DirectState:
    """The ``AgentState`` fields a host loop reads, in numpy, updated in place."""

    window: Any  # each lane's observation it plans from: leaves [N, ...]
    chunk: np.ndarray  # [N, h, *A] the chunk being replayed
    pending: np.ndarray  # [N, h, *A] zeros (no lead)
    cursor: np.ndarray  # int32 [N], h = exhausted
    predict_calls: np.ndarray  # int32 [N] plans of each lane's episode
    rows: np.ndarray  # int32 () rows the policy computed

    def read_back(self, *arrays: Any) -> tuple:
        """``arrays`` on the host (``HostState.read_back``'s signature)."""
        return tuple(np.asarray(a) for a in arrays)


class DirectStep:
    """``init(obs, lanes) -> DirectState`` and ``PackedStep``'s call."""

    def __init__(self, cfg: agent.AgentConfig, pol: Any):
        self.cfg, self.host, self.pol = cfg, pol.host, pol
        self._row: Any = None  # one row's output struct (HostPolicy._output)
        self._lanes = np.arange(cfg.num_envs)
        self._flat: dict = {}  # what -> (tree, its leaves, its treedef)
        self._seeds = jax.jit(
            lambda keys, t: row_seeds(agent.plan_keys(keys, t, agent.STREAM_PLAN))
        )

    def init(self, obs: Any, lanes: Any) -> DirectState:
        cfg = self.cfg
        n, h = cfg.num_envs, cfg.h
        as_jax = lambda x: np.asarray(x, jax.dtypes.canonicalize_dtype(x.dtype))
        obs = jax.tree.map(lambda x: as_jax(np.asarray(x)), obs)  # the jit's dtypes
        self._row = self.host._output(obs)
        chunk = np.zeros((n, h) + cfg.action_shape, cfg.action_dtype)
        return DirectState(
            window=jax.tree.map(np.array, obs),
            chunk=chunk,
            pending=np.zeros_like(chunk),
            cursor=np.full(n, h, np.int32),
            predict_calls=np.zeros(n, np.int32),
            rows=np.zeros((), np.int32),
        )

    def keys_on_device(self, ep_keys: np.ndarray) -> np.ndarray:
        """A copy of the episode keys, on the host."""
        return np.array(ep_keys)

    def __call__(
        self,
        params,
        state,
        obs,
        started,
        active,
        ep_keys,
        t,
        moved=None,
        skip=None,
        texts=None,
        episodes=None,
    ) -> tuple[DirectState, np.ndarray]:
        del params, texts  # fn holds its weights; no text input
        h = self.cfg.h
        cursor = state.cursor
        if skip is not None:  # agent.skip_replayed (no input reads the action)
            cursor += skip
        # agent.observe, then agent.begin: a one-frame window is the observation.
        # (np.count_nonzero: ``.all()`` / ``.any()`` of [N] bool in a fifth the time)
        every = moved is None or np.count_nonzero(moved) == moved.size
        new = None if every else moved | started
        window, given = self._leaves("window", state.window), self._leaves("obs", obs)
        for w, o in zip(window[1], given[1], strict=True):
            if new is None:
                np.copyto(w, o, casting="unsafe")  # as JAX's dtype: float32
            else:
                w[new] = o[new]
        if np.count_nonzero(started):
            cursor[started] = h
            state.predict_calls[started] = 0
        # agent.act without a lead: the lanes whose chunk is exhausted plan.
        due = active & replay.exhausted(cursor, h)
        lanes = due.nonzero()[0]  # [N] bool: np.flatnonzero without its ravel
        if lanes.size:
            self._plan(state, lanes, ep_keys, t, episodes)
        if h == 1:  # every chunk is one action: no index to play
            action = state.chunk[:, 0].copy()
        else:
            action = state.chunk[self._lanes, replay.play_index(cursor, h, np)]
        cursor += active  # agent._executed
        return state, action

    def _leaves(self, what: str, tree: Any) -> tuple:
        """``(tree, leaves, treedef)``, kept: a loop passes the same ones each step."""
        if what not in self._flat or self._flat[what][0] is not tree:
            self._flat[what] = (tree, *jax.tree.flatten(tree))
        return self._flat[what]

    def _plan(
        self, state: DirectState, lanes: np.ndarray, ep_keys, t, episodes
    ) -> None:
        """The policy on the rows of ``lanes``; their chunks start over."""
        h = self.cfg.h
        sel = slice(None) if lanes.size == self.cfg.num_envs else lanes
        seeds = None
        if self.pol.stochastic:
            seeds = np.asarray(self._seeds(ep_keys, np.asarray(t, np.int32)))[sel]
        # Copies: fn may keep what it is given.
        _, window, tree = self._leaves("window", state.window)
        leaves = [np.array(x[sel]) for x in window]
        whole = jax.tree_util.treedef_is_leaf(tree)  # one array, not a nest
        rows = leaves[0] if whole else jax.tree.unflatten(tree, leaves)
        told = None if episodes is None else np.asarray(episodes)[sel]
        out = self.host.plan(rows, seeds, lanes, self._row, told)
        state.chunk[sel] = out[:, :h] if self.cfg.chunked else out[:, None]
        state.cursor[sel] = 0
        state.predict_calls[sel] += 1
        state.rows += lanes.size
