"""``jaxmesh.make_agent``: the jitted agent step alone, for host loops that step
their own simulators (the scan engine drives the same functions).

A host loop's own program (``agent_functions(..., packed=True)``) calls the
same ``agent.host_step`` through fewer buffers, which is what a step of a few
lanes costs on a CPU (each buffer in or out of a jitted call costs about a
microsecond, more than the agent's own work on a few KB): the state's small
leaves travel as one byte buffer (``HostState``) and the per-lane host inputs
(masks, step indices, episode keys) as one int32 array. Bitcasts only: the
step computes exactly what ``host_step`` computes on the pytree.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.core import agent
from jaxmesh.core.policy import Policy, resolve_policy
from jaxmesh.envs import make_env
from jaxmesh.run import build, checks, plan


class Agent(NamedTuple):
    """The jitted agent side alone, for host loops that step envs themselves.

    Attributes:
      config: the static agent configuration (effective horizon, lead, tile).
      params: the policy's own params (a Model's ``params``; None for functions).
      init: ``init(obs, lanes) -> state``; lanes in ``lanes`` begin at ``obs``.
      step: ``step(params, state, obs, started, active, ep_keys, t, moved=None)
        -> (state, actions)``; see ``jaxmesh.core.agent.host_step``.
        Observations are put on the policy's device first.
    """

    config: agent.AgentConfig
    params: Any
    init: Any
    step: Any


def make_agent(
    policy: Any,
    env: Any,
    *,
    num_envs: int,
    horizon: int = 1,
    prefetch_lead: int = 0,
    plan_tile: int | None = None,
) -> Agent:
    """Plan + replay + windows + previous action + masking as jitted functions.

    The scan engine and a host loop over remote simulators drive the same
    functions, so both give the same per-episode results.
    """
    settings = checks.check_settings(num_envs, horizon, prefetch_lead, None, plan_tile)
    env_obj = make_env(env)
    pol = resolve_policy(policy, with_params=False)
    params = pol.default_params()
    cfg, _, init, step, _ = agent_functions(pol, env_obj, settings, params)
    return Agent(cfg, params, init, step)


def agent_functions(
    pol: Policy,
    env: Any,
    settings: Any,
    params: Any,
    tile_lanes: int | None = None,
    packed: bool = False,
) -> tuple:
    """Probes ``pol`` against ``env``, plans the run and jits its agent side.

    Args:
      pol, env, params: the resolved policy, the env (or a host env's spec) and
        the params the policy is probed with.
      settings: the checked settings (``settings.num_envs`` lanes).
      tile_lanes: the lanes the default plan tile is sized for (None: all of
        them; served lane groups plan one group at a time).
      packed: the host loop's program: its state is a ``HostState`` and its
        step takes its host inputs as numpy arrays (``packed_step``); else the
        state is the ``AgentState`` pytree (``make_agent``).

    Returns ``(config, chunk, init, step, plan)``: ``init(obs, lanes)`` and
    ``step(params, state, obs, started, active, ep_keys, t, ..., episodes=)``
    (``agent.host_step``; the state is donated; observations are put on the
    policy's device first; ``episodes``, [N] each lane's budget episode, is
    read under a sweep's grid only), and the run's
    ``jaxmesh.run.plan.RunPlan``.

    Raises:
      ValueError, TypeError: the policy's output does not fit the env, or the
        frame windows exceed the limit (nothing compiles).
    """
    told = build.told_horizon(pol, settings)
    chunk = build.probe_chunk(pol, env, params, settings.horizon, told)
    # The host keeps no per-episode buffers on the device: capacity is the lanes.
    run_plan = plan.plan_run(
        settings, chunk, capacity=settings.num_envs, tile_lanes=tile_lanes
    )
    cfg = build.agent_config(pol, env, run_plan)

    def init(obs, lanes):
        return agent.init(cfg, pol, obs, lanes)

    def step(
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
    ):
        return agent.host_step(
            cfg,
            pol,
            params,
            state,
            obs,
            started,
            active,
            ep_keys,
            t,
            moved,
            skip,
            texts,
            episodes,
        )

    if packed:
        init_p, step_p = packed_functions(cfg, pol, init, step)
        return cfg, chunk, init_p, step_p, run_plan

    init_jit = jax.jit(init)
    step_jit = jax.jit(step, donate_argnums=(1,))

    def step_placed(params, state, obs, *rest, episodes=None):
        # Only a sweep's lanes read their episode index (their cell).
        episodes = None if cfg.grid is None else np.asarray(episodes, np.int32)
        return step_jit(params, state, pol.place(obs), *rest, episodes=episodes)

    return (
        cfg,
        chunk,
        lambda obs, lanes: init_jit(pol.place(obs), lanes),
        step_placed,
        run_plan,
    )


# The host loop's program: the same step through fewer buffers --------------------
#: State leaves up to this size travel in one byte buffer; larger ones (image
#: windows, long chunks) stay buffers of their own (copying them would cost
#: more than a buffer).
FLAT_MAX_BYTES = 16 * 1024
_FLAT_KINDS = "biuf"  # bitcast to bytes as they are (bool as uint8)


class _Leaf(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # into the byte buffer; -1: a buffer of its own
    index: int  # among the separate buffers (-1: in the byte buffer)


class StateLayout(NamedTuple):
    """Where each leaf of an ``AgentState`` lies in a ``HostState``."""

    treedef: Any
    leaves: tuple[_Leaf, ...]
    nbytes: int

    @staticmethod
    def of(state: Any) -> StateLayout:
        """The layout of ``state`` (arrays or ``jax.ShapeDtypeStruct``s)."""
        leaves, treedef = jax.tree.flatten(state)
        out, offset, index = [], 0, 0
        for x in leaves:
            dtype = np.dtype(x.dtype)
            size = int(np.prod(x.shape, dtype=np.int64)) * dtype.itemsize
            if dtype.kind in _FLAT_KINDS and size <= FLAT_MAX_BYTES:
                out.append(_Leaf(tuple(x.shape), dtype, offset, -1))
                offset += size
            else:
                out.append(_Leaf(tuple(x.shape), dtype, -1, index))
                index += 1
        return StateLayout(treedef, tuple(out), offset)

    def pack(self, state: Any) -> tuple[jax.Array, tuple]:
        """(byte buffer, separate leaves) of ``state`` (under jit)."""
        flat, big = [jnp.zeros((0,), jnp.uint8)], []
        for leaf, x in zip(self.leaves, jax.tree.leaves(state), strict=True):
            if (tuple(x.shape), np.dtype(x.dtype)) != (leaf.shape, leaf.dtype):
                raise TypeError(
                    f"agent state leaf {x.shape} {x.dtype} is not the "
                    f"{leaf.shape} {leaf.dtype} the state began with"
                )
            if leaf.index >= 0:
                big.append(x)
                continue
            if x.dtype == jnp.bool_:
                x = x.astype(jnp.uint8)
            x = jax.lax.bitcast_convert_type(x, jnp.uint8)
            flat.append(jnp.reshape(x, (-1,)))
        return jnp.concatenate(flat), tuple(big)

    def unpack(self, flat: Any, big: tuple, xp: Any = jnp) -> Any:
        """The ``AgentState`` of a byte buffer and the separate leaves (``xp``:
        jnp under jit; np for a buffer read back on the host)."""
        out = []
        for leaf in self.leaves:
            if leaf.index >= 0:
                out.append(big[leaf.index])
                continue
            size = int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
            raw = flat[leaf.offset : leaf.offset + size]
            if xp is np:
                out.append(raw.view(leaf.dtype).reshape(leaf.shape))
            elif leaf.dtype == np.bool_:
                out.append(jnp.reshape(raw, leaf.shape) != 0)
            else:
                width = () if leaf.dtype.itemsize == 1 else (leaf.dtype.itemsize,)
                raw = jnp.reshape(raw, leaf.shape + width)
                out.append(jax.lax.bitcast_convert_type(raw, leaf.dtype))
        return jax.tree.unflatten(self.treedef, out)


class HostState:
    """The agent state of a host loop's program: the small leaves in one byte
    buffer on the device, the large ones as they are.

    Reading a field (``state.cursor``, ``state.predict_calls``, ...) gives its
    value on the host (numpy; a large leaf: its device array), read back once
    per state; the next step donates the buffers.
    """

    def __init__(self, layout: StateLayout, flat: jax.Array, big: tuple):
        self.layout, self.flat, self.big = layout, flat, big
        self._host: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._host is None:
            flat = np.asarray(jax.device_get(self.flat))
            self._host = self.layout.unpack(flat, self.big, np)
        return getattr(self._host, name)


def packed_functions(cfg: agent.AgentConfig, pol: Policy, init: Any, step: Any):
    """``init`` and ``step`` (the pytree functions of ``agent_functions``) as
    a host loop's program: ``(init(obs, lanes) -> HostState, step(params,
    state, obs, started, active, ep_keys, t, moved=None, skip=None,
    texts=None, episodes=None) -> (HostState, actions))``.

    The host inputs (numpy: bool masks, int step counts, the uint32 episode
    keys) go to the device as one int32 array of rows, one row per mask or
    count and one per 32-bit word of a key; a key array that is no numpy
    uint32 array goes as it is.
    """
    jitted: dict = {}

    def init_placed(obs, lanes):
        obs = pol.place(obs)
        if "init" not in jitted:  # the layout needs the observations' shapes
            layout = StateLayout.of(jax.eval_shape(init, obs, lanes))
            jitted["init"] = layout, jax.jit(lambda o, m: layout.pack(init(o, m)))
        layout, fn = jitted["init"]
        return HostState(layout, *fn(obs, lanes))

    def unpack_rows(rows, names, key_shape):
        masks = ("started", "active", "moved")
        got = {n: rows[i] != 0 if n in masks else rows[i] for i, n in enumerate(names)}
        if key_shape is not None:  # the keys' 32-bit words, a row each
            words = jax.lax.bitcast_convert_type(rows[len(names) :].T, jnp.uint32)
            got["ep_keys"] = jnp.reshape(words, (rows.shape[1],) + key_shape)
        return got

    def build_step(names, key_shape, layout):
        def run(params, flat, big, obs, rows, keys, texts):
            got = unpack_rows(rows, names, key_shape)
            if key_shape is not None:
                keys = got["ep_keys"]
            state = layout.unpack(flat, big)
            state, actions = step(
                params,
                state,
                obs,
                got["started"],
                got["active"],
                keys,
                got["t"],
                got.get("moved"),
                got.get("skip"),
                texts,
                got.get("episodes"),
            )
            flat, big = layout.pack(state)
            return flat, big, actions

        return jax.jit(run, donate_argnums=(1, 2))

    def step_placed(
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
    ):
        given = {"started": started, "active": active, "t": t}
        if moved is not None:
            given["moved"] = moved
        if skip is not None:
            given["skip"] = skip
        if cfg.grid is not None:  # only a sweep's lanes read their episode
            given["episodes"] = episodes
        names = tuple(given)
        keys = ep_keys
        words = None
        if isinstance(ep_keys, np.ndarray) and ep_keys.dtype == np.uint32:
            words = ep_keys.reshape(cfg.num_envs, -1).view(np.int32).T
            keys = None
        rows = np.empty(
            (len(names) + (0 if words is None else words.shape[0]), cfg.num_envs),
            np.int32,
        )
        for i, x in enumerate(given.values()):
            rows[i] = x
        if words is not None:
            rows[len(names) :] = words
        key_shape = None if words is None else tuple(ep_keys.shape[1:])
        sig = (names, key_shape)
        fn = jitted.get(sig)
        if fn is None:
            fn = jitted[sig] = build_step(names, key_shape, state.layout)
        flat, big, actions = fn(
            params, state.flat, state.big, pol.place(obs), rows, keys, texts
        )
        return HostState(state.layout, flat, big), actions

    return init_placed, step_placed
