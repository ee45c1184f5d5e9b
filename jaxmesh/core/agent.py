"""The agent side of a step, pure functions of an ``AgentState`` that the scan
engine and the host loops share: ``act`` plans where needed (in tiles of
``tile`` rows, so a row's result never depends on N) and returns one action
per lane, ``observe`` pushes the next observation into the windows, ``begin``
starts episodes (docs/evaluation.md, "The engine"). Plan keys (CONTRACT 5):
``fold_in(fold_in(k, stream), t)``, stream 1 synchronous, 2 prefetch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxmesh.adapt import WHOLE_OBS, PendingChunk, State, Text
from jaxmesh.core import replay, tiles
from jaxmesh.core.keys import fold_in
from jaxmesh.core.policy import Policy
from jaxmesh.execution import lane_weights

STREAM_ENV, STREAM_PLAN, STREAM_PREFETCH = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Static configuration of the agent side."""

    num_envs: int
    h: int  # actions played per plan: min(H, K) (RunConfig's horizon is H)
    lead: int  # effective l = min(L, h)
    tile: int
    action_shape: tuple[int, ...]
    action_dtype: Any
    spec: tuple[tuple[str, Any], ...]  # ((name, declaration), ...)
    raw: bool  # no user spec: the policy sees the observation as it is
    chunked: bool  # the policy emits chunks (else one action per plan)
    #: Inference delay d (CONTRACT 23): a plan plays actions d .. d+h-1.
    delay: int = 0
    #: A ``jaxmesh.Ensemble`` (CONTRACT 22): a plan every step into a ring of
    #: each lane's last K chunks.
    ensemble: Any = None
    chunk_len: int = 1  # K, the policy's chunk length (1 for single actions)
    #: A sweep's (``jaxmesh.sweep``) ``(h, d)`` per cell of ``cell_episodes``
    #: episodes, taken per lane as data; ``h`` and ``lead`` are the largest.
    grid: tuple[tuple[int, int], ...] | None = None
    cell_episodes: int = 0

    @property
    def execution_horizon(self) -> int:
        """Actions executed from one plan (CONTRACT 24)."""
        if self.ensemble is not None:
            return self.chunk_len
        if self.grid is not None:
            return max(h + d for h, d in self.grid)
        return self.h + self.delay

    # ((name, treedef, ((shape, dtype), ...)), ...): each Text input's encoding
    texts: tuple = ()
    #: The spec's PendingChunk inputs (all see the same tail).
    pending_names: tuple[str, ...] = ()


@struct.dataclass
class AgentState:
    chunk: jax.Array  # [N, h, *A] the chunk being replayed
    pending: jax.Array  # [N, h, *A] the prefetched chunk (lead > 0)
    cursor: jax.Array  # [N] actions of `chunk` already executed; h = exhausted
    fresh: jax.Array  # [N] the episode has not planned yet (plan synchronously)
    windows: dict  # name -> pytree of [N, stack, ...]
    texts: dict  # Text input name -> pytree of [N, ...] encoded instructions
    prev: jax.Array  # [N, *A] the previous executed action
    rstate: Any  # [N, ...] recurrent policy state
    predict_calls: jax.Array  # [N] plans issued for the lane's current episode
    rows: jax.Array  # () policy rows computed (tiles x tile)
    ring: Any = None  # [N, K, K, *A] ensembling: step s's chunk in slot s % K
    setting: Any = None  # [N, 2] int32 under a sweep: each lane's (h, d)
    #: [N, K, *A] with a PendingChunk input: the tail of each lane's latest
    #: chunk (``tail_start``), zeros past its ``tail_len`` ([N]) entries.
    tail: Any = None
    tail_len: Any = None


def make_config(env, policy: Policy, *, horizon, lead, chunk, **fields) -> AgentConfig:
    """The static agent configuration; ``fields``: the ``AgentConfig`` fields
    taken as given (``num_envs``, ``tile``, ``delay``, ``ensemble``, ...)."""
    raw = policy.spec is None
    items = ((WHOLE_OBS, State()),) if raw else tuple(policy.spec.items())
    h = min(horizon, chunk) if chunk is not None else 1
    texts = []
    for name, decl in items:
        if isinstance(decl, Text):
            sig = decl.signature()
            if sig is None:
                raise ValueError(
                    f"input {name!r} is a jaxmesh.adapt.Text but no instruction was "
                    "encoded for it: pass evaluate(..., starts=jaxmesh.Starts("
                    "instruction='...')), or on a host-stepped env Text(..., "
                    "info_key=...)"
                )
            leaves, treedef = jax.tree.flatten(sig)
            texts.append(
                (name, treedef, tuple((x.shape, jnp.dtype(x.dtype)) for x in leaves))
            )
    return AgentConfig(
        h=h,
        lead=min(lead, h),
        action_shape=tuple(env.action_shape),
        action_dtype=jnp.dtype(env.action_dtype),
        spec=items,
        raw=raw,
        chunked=chunk is not None,
        chunk_len=1 if chunk is None else chunk,
        texts=tuple(texts),
        pending_names=tuple(n for n, d in items if isinstance(d, PendingChunk)),
        **fields,
    )


def windowed(cfg: AgentConfig) -> tuple[tuple[str, Any], ...]:
    """The inputs kept as frame windows."""
    return tuple((n, d) for n, d in cfg.spec if d.reads_obs or d.reads_action)


def pending_value(tail: jax.Array, tail_len: jax.Array, delay: Any) -> dict:
    """What a PendingChunk input shows per row: the tail, its mask and ``d``."""
    k = tail.shape[1]
    mask = jnp.arange(k, dtype=jnp.int32)[None, :] < tail_len[:, None]
    delay = jnp.broadcast_to(jnp.asarray(delay, jnp.int32), tail_len.shape)
    return {"actions": tail, "mask": mask, "delay": delay}


def pending_zeros(cfg: AgentConfig, n: int, length: int) -> dict:
    """A PendingChunk input's value at an episode's start (nothing valid)."""
    tail = jnp.zeros((n, length) + cfg.action_shape, cfg.action_dtype)
    return pending_value(tail, jnp.zeros((n,), jnp.int32), cfg.delay)


def tail_start(h: Any, d: Any, planned_late: bool) -> Any:
    """The entry of a new chunk from which the next plan's PendingChunk shows
    it (CONTRACT 29): h - d for a synchronous plan, h for one planned ahead."""
    return h if planned_late else h - d


def _take(x: jax.Array, at: jax.Array, axis: int = 1) -> jax.Array:
    """``x``'s entries ``at`` along ``axis`` (``at`` spans the leading axes)."""
    at = jnp.reshape(at, at.shape + (1,) * (x.ndim - at.ndim))
    return jnp.take_along_axis(x, at, axis=axis)


def _shifted(out: jax.Array, start: Any, k: int) -> tuple[jax.Array, jax.Array]:
    """``out[:, start:]`` zero-padded to K entries, and the valid entries."""
    start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), out.shape[:1])
    at = start[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]
    got = _take(out, jnp.clip(at, 0, out.shape[1] - 1))
    return _where(at < out.shape[1], got, 0), jnp.maximum(out.shape[1] - start, 0)


def text_zeros(cfg: AgentConfig, n: int, xp: Any = jnp) -> dict:
    """Zeros of the Text inputs' encodings for ``n`` lanes."""
    return {
        name: jax.tree.unflatten(
            treedef, [xp.zeros((n,) + tuple(s), d) for s, d in leaves]
        )
        for name, treedef, leaves in cfg.texts
    }


def frames(cfg: AgentConfig, obs: Any, action: jax.Array) -> dict:
    """Single-lane processed frames of every windowed input."""
    return {name: decl.frame(obs, action) for name, decl in windowed(cfg)}


def _where(mask, a, b):
    """Per-lane select over pytrees with a leading lane axis."""

    def sel(x, y):
        m = jnp.reshape(mask, mask.shape + (1,) * (x.ndim - mask.ndim))
        return jnp.where(m, x, y)

    return jax.tree.map(sel, a, b)


def policy_inputs(
    cfg: AgentConfig, windows: dict, texts: dict, pending: dict | None = None
) -> Any:
    """What the policy sees per lane."""
    out = {}
    for name, decl in cfg.spec:
        if isinstance(decl, Text):
            out[name] = texts[name]
            continue
        if isinstance(decl, PendingChunk):
            out[name] = pending
            continue
        w = windows[name]
        out[name] = w if decl.stack > 1 else jax.tree.map(lambda x: x[:, 0], w)
    return out[WHOLE_OBS] if cfg.raw else out


def _reset_windows(cfg: AgentConfig, obs: Any, prev: jax.Array) -> dict:
    """Every lane's windows filled with copies of its reset frame."""
    first = jax.vmap(lambda o, a: frames(cfg, o, a))(obs, prev)
    return {
        name: jax.tree.map(
            lambda f, s=decl.stack: jnp.repeat(f[:, None], s, axis=1), first[name]
        )
        for name, decl in windowed(cfg)
    }


def _initial_rstate(policy: Policy, n: int) -> Any:
    """The policy's initial recurrent state for ``n`` lanes."""
    if policy.initial_state is None:
        return None
    one = policy.initial_state()
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), one)


def init(cfg: AgentConfig, policy: Policy, obs: Any, lanes: jax.Array) -> AgentState:
    """Agent state for N lanes; lanes in ``lanes`` begin an episode at ``obs``."""
    n, h, k = cfg.num_envs, cfg.h, cfg.chunk_len
    zeros = lambda *shape: jnp.zeros(shape + cfg.action_shape, cfg.action_dtype)
    zeros_a, prev = zeros(n, h), zeros(n)
    pending = bool(cfg.pending_names)
    state = AgentState(
        chunk=zeros_a,
        pending=zeros_a,
        cursor=jnp.full((n,), h, jnp.int32),
        fresh=jnp.ones((n,), bool),
        windows=_reset_windows(cfg, obs, prev),
        texts=text_zeros(cfg, n),
        prev=prev,
        rstate=_initial_rstate(policy, n),
        predict_calls=jnp.zeros((n,), jnp.int32),
        rows=jnp.zeros((), jnp.int32),
        ring=zeros(n, k, k) if cfg.ensemble is not None else None,
        setting=None
        if cfg.grid is None
        else jnp.broadcast_to(jnp.asarray(cfg.grid[0], jnp.int32), (n, 2)),
        tail=zeros(n, k) if pending else None,
        tail_len=jnp.zeros((n,), jnp.int32) if pending else None,
    )
    return begin(cfg, policy, state, lanes, obs)


def cell_setting(cfg: AgentConfig, episodes: Any, xp: Any = jnp) -> Any:
    """[N, 2] the ``(h, d)`` of each lane's episode under a sweep."""
    table = xp.asarray(cfg.grid, xp.int32)
    cell = xp.clip(xp.asarray(episodes) // cfg.cell_episodes, 0, len(cfg.grid) - 1)
    return table[cell]


def begin(
    cfg: AgentConfig,
    policy: Policy,
    state: AgentState,
    mask: jax.Array,
    obs: Any,
    episodes: jax.Array | None = None,
) -> AgentState:
    """Starts episodes on the lanes in ``mask`` from their reset observation
    (under a sweep with the (h, d) of their ``episodes``)."""
    n, h = cfg.num_envs, cfg.h
    prev0 = jnp.zeros((n,) + cfg.action_shape, cfg.action_dtype)
    full = _reset_windows(cfg, obs, prev0)
    windows = {k: _where(mask, w, state.windows[k]) for k, w in full.items()}
    rstate = state.rstate
    if policy.initial_state is not None:
        rstate = _where(mask, _initial_rstate(policy, n), rstate)
    setting = state.setting
    if cfg.grid is not None and episodes is not None:
        setting = jnp.where(mask[:, None], cell_setting(cfg, episodes), setting)
    if cfg.pending_names:
        state = state.replace(
            tail=_where(mask, jnp.zeros_like(state.tail), state.tail),
            tail_len=jnp.where(mask, 0, state.tail_len),
        )
    return state.replace(
        setting=setting,
        cursor=jnp.where(mask, h, state.cursor),
        fresh=state.fresh | mask,
        windows=windows,
        prev=_where(mask, prev0, state.prev),
        rstate=rstate,
        predict_calls=jnp.where(mask, 0, state.predict_calls),
    )


def plan_keys(ep_keys: jax.Array, t: jax.Array, stream: int) -> jax.Array:
    """[N] the keys a stochastic policy plans with at each lane's step ``t``."""
    return fold_in(fold_in(ep_keys, stream), t)


def _plan(
    cfg: AgentConfig,
    policy: Policy,
    params: Any,
    state: AgentState,
    need: jax.Array,
    buf: Any,
    keys: jax.Array,
    write: Any = None,
    start: Any = 0,
    episodes: Any = None,
) -> tuple[Any, AgentState, jax.Array]:
    """Plans the lanes in ``need`` in fixed tiles, ``write(buf, idx, out)``
    putting a tile's chunks into ``buf`` (default: their first h actions);
    with a PendingChunk input ``out[start:]`` becomes the tail. Returns the
    buffer, the state and the rows computed."""
    pending = None
    if cfg.pending_names:
        _, delay, _ = _replay_setting(cfg, state)
        pending = pending_value(state.tail, state.tail_len, delay)
    inputs = policy_inputs(cfg, state.windows, state.texts, pending)
    told = {}
    if policy.takes_execution_horizon and cfg.chunked:
        told = {"execution_horizon": cfg.execution_horizon}
    if write is None:
        write = lambda buf, idx, out: tiles.put(buf, idx, out[:, : cfg.h])

    def body(idx, carry):
        buf, rstate, tail = carry
        rows = lambda x: tiles.take(x, idx)
        kw = dict(told)
        if policy.takes_rows:  # each row's lane, -1 for padding
            kw["rows"] = jnp.where(idx < need.shape[0], idx, -1)
            if episodes is not None:
                kw["episodes"] = rows(episodes)
        out, new_r = policy.apply(
            params,
            jax.tree.map(rows, inputs),
            rows(keys),
            jax.tree.map(rows, rstate),
            **kw,
        )
        out = jnp.asarray(out)
        if not cfg.chunked:
            out = out[:, None]
        elif out.shape[1] < cfg.execution_horizon:
            raise ValueError(
                f"policy {policy.name!r} returned chunks of {out.shape[1]} actions "
                f"(told execution_horizon={told.get('execution_horizon')}); this run "
                f"executes {cfg.execution_horizon} actions of each plan: return at "
                "least that many"
            )
        buf = write(buf, idx, out)
        rstate = jax.tree.map(lambda a, b: tiles.put(a, idx, b), rstate, new_r)
        if tail is not None:
            at = start if isinstance(start, int) else tiles.take(start, idx)
            new_tail, new_len = _shifted(out, at, cfg.chunk_len)
            tail = (tiles.put(tail[0], idx, new_tail), tiles.put(tail[1], idx, new_len))
        return buf, rstate, tail

    tail = (state.tail, state.tail_len) if cfg.pending_names else None
    (buf, rstate, tail), n_tiles = tiles.for_each_tile(
        need, cfg.tile, body, (buf, state.rstate, tail)
    )
    state = state.replace(rstate=rstate)
    if tail is not None:
        state = state.replace(tail=tail[0], tail_len=tail[1])
    # A policy told its rows (a HostPolicy) computes the real ones only.
    computed = jnp.sum(need, dtype=jnp.int32) if policy.takes_rows else None
    return buf, state, n_tiles * cfg.tile if computed is None else computed


def act(
    cfg: AgentConfig,
    policy: Policy,
    params: Any,
    state: AgentState,
    active: jax.Array,
    ep_keys: jax.Array,
    t: jax.Array,
    episodes: jax.Array | None = None,
) -> tuple[AgentState, jax.Array]:
    """Plans where needed and returns the action each ``active`` lane
    executes now at step ``t``; ``episodes`` is told to a policy that
    ``takes_rows``."""
    if cfg.ensemble is not None:  # every active lane plans into slot t % K
        k = cfg.chunk_len
        slot = t % k
        keys = plan_keys(ep_keys, t, STREAM_PLAN) if policy.stochastic else ep_keys

        def write(ring, idx, out):
            at = tiles.take(slot, idx)
            return ring.at[idx, at].set(out[:, :k].astype(ring.dtype), mode="drop")

        ring, state, rows = _plan(
            cfg, policy, params, state, active, state.ring, keys, write, 0, episodes
        )
        action = ensemble_action(cfg, ring, t)
        state = state.replace(
            chunk=action[:, None],
            cursor=jnp.zeros_like(state.cursor),
            ring=ring,
            predict_calls=state.predict_calls + active,
            rows=state.rows + rows,
        )
        return _executed(cfg, state, active, action), action
    h, lead = cfg.h, cfg.lead
    hl, dl, lead_l = _replay_setting(cfg, state)
    exhausted = active & replay.exhausted(state.cursor, hl)
    if lead == 0:
        sync, chunk = exhausted, state.chunk
    else:
        takes = exhausted & ~state.fresh & (lead_l > 0)
        sync = exhausted & ~takes
        chunk = _where(takes, state.pending, state.chunk)
    cursor = jnp.where(exhausted, 0, state.cursor)

    def plan(s, need, buf, stream, write, ahead):
        keys = plan_keys(ep_keys, t, stream) if policy.stochastic else ep_keys
        start = tail_start(hl, dl, ahead)
        return _plan(cfg, policy, params, s, need, buf, keys, write, start, episodes)

    chunk, state, rows = plan(state, sync, chunk, STREAM_PLAN, None, False)
    calls = state.predict_calls + sync
    pending = state.pending
    if lead > 0:
        # A delay d plans at cursor h - d and plays actions d .. d+h-1.
        pre = active & replay.prefetch_due(cursor, hl, lead_l)

        def late(buf, idx, out):
            start = dl if isinstance(dl, int) else tiles.take(dl, idx)
            return tiles.put(buf, idx, _actions_from(out, start, h))

        pending, state, more = plan(state, pre, pending, STREAM_PREFETCH, late, True)
        rows = rows + more
        calls = calls + pre
    action = _take(chunk, replay.play_index(cursor, hl, jnp)[:, None])[:, 0]
    state = state.replace(
        chunk=chunk,
        pending=pending,
        cursor=cursor,
        predict_calls=calls,
        rows=state.rows + rows,
    )
    return _executed(cfg, state, active, action), action


def _replay_setting(cfg: AgentConfig, state: AgentState) -> tuple[Any, Any, Any]:
    """Each lane's (h, d, lead): static ints, or [N] arrays under a sweep."""
    if cfg.grid is None:
        return cfg.h, cfg.delay, cfg.lead
    hl, dl = state.setting[:, 0], state.setting[:, 1]
    return hl, dl, dl


def _actions_from(out: jax.Array, start: Any, h: int) -> jax.Array:
    """Actions ``start .. start + h - 1`` of each chunk (past K: the last)."""
    if isinstance(start, int):
        return out[:, start : start + h]
    return _take(out, jnp.clip(start[:, None] + jnp.arange(h), 0, out.shape[1] - 1))


def _executed(
    cfg: AgentConfig, state: AgentState, active: jax.Array, action: jax.Array
) -> AgentState:
    """The state after the active lanes execute ``action``."""
    prev = _where(active, action, state.prev)
    return state.replace(
        cursor=state.cursor + active,
        fresh=state.fresh & ~active,
        windows=_pushed(cfg, state.windows, active, prev=prev),
        prev=prev,
    )


def ensemble_action(cfg: AgentConfig, ring: jax.Array, t: jax.Array) -> jax.Array:
    """[N] the ensembled action at step ``t``: ring slot s holds the chunk
    planned ``(t - s) % K`` steps ago, its entry for step t at that age."""
    k = cfg.chunk_len
    age = (t[:, None] - jnp.arange(k, dtype=t.dtype)[None, :]) % k  # [N, K]
    valid = age <= t[:, None]
    w = lane_weights(cfg.ensemble, age, valid, k)  # [N, K]
    entries = _take(ring, age, axis=2)[:, :, 0]  # [N, K, *A]
    w = jnp.reshape(w, w.shape + (1,) * len(cfg.action_shape))
    total = jnp.sum(w * entries.astype(jnp.float32), axis=1)
    return (total / jnp.sum(w, axis=1)).astype(cfg.action_dtype)


def _pushed(
    cfg: AgentConfig, windows: dict, mask: Any, obs: Any = None, prev: Any = None
) -> dict:
    """``windows`` with ``prev`` pushed into those that read the action, or
    ``obs``'s frames into those that read it, where ``mask`` (None: all)."""

    def push(w, f):
        f = f[:, None].astype(w.dtype)
        moved = f if w.shape[1] == 1 else jnp.concatenate([w[:, 1:], f], axis=1)
        return moved if mask is None else _where(mask, moved, w)

    windows = dict(windows)
    for name, decl in cfg.spec:
        if decl.reads_action if obs is None else decl.reads_obs:
            frame = prev if obs is None else jax.vmap(decl.frame)(obs)
            windows[name] = jax.tree.map(push, windows[name], frame)
    return windows


def observe(
    cfg: AgentConfig, state: AgentState, obs: Any, mask: jax.Array | None = None
) -> AgentState:
    """Pushes the observation into the obs windows (of the lanes in ``mask``)."""
    return state.replace(windows=_pushed(cfg, state.windows, mask, obs=obs))


def can_skip(cfg: AgentConfig) -> bool:
    """Whether a host loop may ``skip_replayed``."""
    return cfg.h > 1 and all(decl.stack == 1 for _, decl in cfg.spec)


def plans_due(cfg: AgentConfig, cursor: Any, h: Any = None, lead: Any = None) -> Any:
    """[N] lanes whose next action needs an agent step (``replay.due``)."""
    if h is None:
        h, lead = cfg.h, cfg.lead
    return replay.due(cursor, h, lead)


def skip_replayed(cfg: AgentConfig, state: AgentState, skip: jax.Array) -> AgentState:
    """Advances each lane past ``skip`` chunk actions the host executed
    without an agent step (``can_skip`` configs only)."""
    cursor = state.cursor + skip
    last = _take(state.chunk, jnp.clip(cursor - 1, 0, cfg.h - 1)[:, None])[:, 0]
    moved = skip > 0
    prev = _where(moved, last, state.prev)
    windows = _pushed(cfg, state.windows, moved, prev=prev)
    return state.replace(cursor=cursor, prev=prev, windows=windows)


def host_step(
    cfg: AgentConfig,
    policy: Policy,
    params: Any,
    state: AgentState,
    obs: Any,
    started: jax.Array,
    active: jax.Array,
    ep_keys: jax.Array,
    t: jax.Array,
    moved: jax.Array | None = None,
    skip: jax.Array | None = None,
    texts: dict | None = None,
    episodes: jax.Array | None = None,
) -> tuple[AgentState, jax.Array]:
    """One agent step for a host loop, in the scan engine's order: observe (the
    lanes in ``moved``, None: all), begin the episodes in ``started`` (under a
    sweep with their budget ``episodes``), then plan and act; a lane neither
    moved nor ``active`` keeps its whole state. ``skip``: the replayed actions
    each lane executed since its last agent step (``skip_replayed``); ``texts``:
    the Text inputs' encodings (None: the state's). Returns the new state and
    [N] actions (meaningless for inactive lanes)."""
    if texts is not None:
        state = state.replace(texts=texts)
    if skip is not None:
        state = skip_replayed(cfg, state, skip)
    state = observe(cfg, state, obs, moved)
    state = begin(cfg, policy, state, started, obs, episodes)
    return act(cfg, policy, params, state, active, ep_keys, t)
