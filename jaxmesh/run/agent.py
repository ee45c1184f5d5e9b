"""``jaxmesh.make_agent``: the jitted agent step alone, for host loops that step
their own simulators (the scan engine drives the same functions).

A host loop's own program (``agent_functions(..., packed=True)``) calls the
same ``agent.host_step`` through fewer buffers, which is what a step of a few
lanes costs on a CPU (each buffer in or out of a jitted call costs about a
microsecond, more than the agent's own work on a few KB): the state's small
leaves travel as one buffer of 32-bit words (``HostState``) and the per-lane host inputs
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
#: State leaves up to this size travel in one buffer of 32-bit words; larger
#: ones (image windows, long chunks) stay buffers of their own (copying them
#: would cost more than a buffer).
FLAT_MAX_BYTES = 16 * 1024


class _Leaf(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # into the word buffer; -1: a buffer of its own
    index: int  # among the separate buffers (-1: in the word buffer)

    @property
    def words(self) -> int:
        """32-bit words the leaf takes: one per element (a value of 8 bytes:
        two; of 1 or 2 bytes: zero-extended to one)."""
        size = int(np.prod(self.shape, dtype=np.int64))
        return size * max(1, self.dtype.itemsize // 4)


def _as_words(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` go into 32-bit words exactly: bool, ints
    and floats of whole bytes (not keys, not 4-bit types)."""
    if dtype == np.bool_:
        return True
    if jnp.issubdtype(dtype, jnp.integer):
        bits = jnp.iinfo(dtype).bits
    elif jnp.issubdtype(dtype, jnp.floating):
        bits = jnp.finfo(dtype).bits
    else:
        return False
    return bits == 8 * dtype.itemsize and dtype.itemsize in (1, 2, 4, 8)


def _to_words(x: jax.Array) -> jax.Array:
    """``x`` as a flat uint32 vector (``_Leaf.words`` long), exactly."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint32)
    elif x.dtype.itemsize < 4:  # the same bits, zero-extended
        unsigned = jnp.dtype(f"uint{8 * x.dtype.itemsize}")
        x = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    else:
        x = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.reshape(x, (-1,))


def _from_words(w: Any, leaf: _Leaf, xp: Any) -> Any:
    """The leaf's value from its words (``xp``: jnp under jit, or np)."""
    size = leaf.dtype.itemsize
    if xp is np:
        if leaf.dtype == np.bool_:
            return (w != 0).reshape(leaf.shape)
        if size < 4:
            w = w.astype(f"uint{8 * size}")
        return w.view(leaf.dtype).reshape(leaf.shape)
    if leaf.dtype == np.bool_:
        return jnp.reshape(w, leaf.shape) != 0
    if size < 4:
        w = w.astype(jnp.dtype(f"uint{8 * size}"))
        return jax.lax.bitcast_convert_type(jnp.reshape(w, leaf.shape), leaf.dtype)
    extra = () if size == 4 else (size // 4,)
    return jax.lax.bitcast_convert_type(jnp.reshape(w, leaf.shape + extra), leaf.dtype)


class StateLayout(NamedTuple):
    """Where each leaf of an ``AgentState`` lies in a ``HostState``."""

    treedef: Any
    leaves: tuple[_Leaf, ...]

    @staticmethod
    def of(state: Any) -> StateLayout:
        """The layout of ``state`` (arrays or ``jax.ShapeDtypeStruct``s)."""
        leaves, treedef = jax.tree.flatten(state)
        out, offset, index = [], 0, 0
        for x in leaves:
            leaf = _Leaf(tuple(x.shape), np.dtype(x.dtype), offset, -1)
            if _as_words(leaf.dtype) and leaf.words * 4 <= FLAT_MAX_BYTES:
                offset += leaf.words
            else:
                leaf = leaf._replace(offset=-1, index=index)
                index += 1
            out.append(leaf)
        return StateLayout(treedef, tuple(out))

    def pack(self, state: Any) -> tuple[jax.Array, tuple]:
        """(word buffer, separate leaves) of ``state`` (under jit)."""
        flat, big = [jnp.zeros((0,), jnp.uint32)], []
        for leaf, x in zip(self.leaves, jax.tree.leaves(state), strict=True):
            if (tuple(x.shape), np.dtype(x.dtype)) != (leaf.shape, leaf.dtype):
                raise TypeError(
                    f"agent state leaf {x.shape} {x.dtype} is not the "
                    f"{leaf.shape} {leaf.dtype} the state began with"
                )
            if leaf.index >= 0:
                big.append(x)
            else:
                flat.append(_to_words(x))
        return jnp.concatenate(flat), tuple(big)

    def unpack(self, flat: Any, big: tuple, xp: Any = jnp) -> Any:
        """The ``AgentState`` of a word buffer and the separate leaves (``xp``:
        jnp under jit; np for a buffer read back on the host)."""
        out = []
        for leaf in self.leaves:
            if leaf.index >= 0:
                out.append(big[leaf.index])
            else:
                w = flat[leaf.offset : leaf.offset + leaf.words]
                out.append(_from_words(w, leaf, xp))
        return jax.tree.unflatten(self.treedef, out)


class HostState:
    """The agent state of a host loop's program: the small leaves in one
    buffer of 32-bit words on the device, the large ones as they are.

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
    a host loop's program: ``init(obs, lanes) -> HostState`` and a
    ``PackedStep``."""
    jitted: list = []

    def init_placed(obs, lanes):
        obs = pol.place(obs)
        if not jitted:  # the layout needs the observations' shapes
            layout = StateLayout.of(jax.eval_shape(init, obs, lanes))
            jitted.append((layout, jax.jit(lambda o, m: layout.pack(init(o, m)))))
        layout, fn = jitted[0]
        return HostState(layout, *fn(obs, lanes))

    return init_placed, PackedStep(cfg, pol, step)


_MASKS = ("started", "active", "moved")


class PackedStep:
    """``step(params, state, obs, started, active, ep_keys, t, moved=None,
    skip=None, texts=None, episodes=None) -> (HostState, actions)``: the
    pytree step over a ``HostState``, its host inputs in one array.

    The host inputs (numpy: bool masks, int step counts, the uint32 episode
    keys) go to the device as one int32 array of rows (``host_inputs``), one
    row per mask or count and one per 32-bit word of a key; a key array that
    is no numpy uint32 array goes as it is. One jitted program per pattern of
    inputs given (``program``).
    """

    def __init__(self, cfg: agent.AgentConfig, pol: Policy, step: Any):
        self.cfg, self.pol, self.step = cfg, pol, step
        self._programs: dict = {}

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
    ):
        sig, rows, keys = self.host_inputs(
            started, active, ep_keys, t, moved, skip, episodes
        )
        fn = self.program(sig, state.layout)
        flat, big, actions = fn(
            params, state.flat, state.big, self.pol.place(obs), rows, keys, texts
        )
        return HostState(state.layout, flat, big), actions

    def host_inputs(
        self, started, active, ep_keys, t, moved=None, skip=None, episodes=None
    ) -> tuple:
        """``(signature, rows, keys)``: the int32 rows of the host inputs and
        the keys when they are not among them (else None)."""
        given = {"started": started, "active": active, "t": t}
        if moved is not None:
            given["moved"] = moved
        if skip is not None:
            given["skip"] = skip
        if self.cfg.grid is not None:  # only a sweep's lanes read their episode
            given["episodes"] = episodes
        n, k = self.cfg.num_envs, len(given)
        words = key_shape = None
        keys = ep_keys
        if isinstance(ep_keys, np.ndarray) and ep_keys.dtype == np.uint32:
            words = ep_keys.reshape(n, -1).view(np.int32).T
            key_shape, keys = tuple(ep_keys.shape[1:]), None
        rows = np.empty((k + (0 if words is None else words.shape[0]), n), np.int32)
        for i, x in enumerate(given.values()):
            rows[i] = x
        if words is not None:
            rows[k:] = words
        return (tuple(given), key_shape), rows, keys

    def program(self, sig: tuple, layout: StateLayout) -> Any:
        """The jitted ``(params, flat, big, obs, rows, keys, texts) -> (flat,
        big, actions)`` for inputs of signature ``sig`` (the flat state and
        its large leaves donated)."""
        fn = self._programs.get(sig)
        if fn is None:
            fn = self._programs[sig] = self._build(*sig, layout)
        return fn

    def _build(self, names: tuple, key_shape: Any, layout: StateLayout) -> Any:
        def run(params, flat, big, obs, rows, keys, texts):
            got = {
                name: rows[i] != 0 if name in _MASKS else rows[i]
                for i, name in enumerate(names)
            }
            if key_shape is not None:  # the keys' 32-bit words, a row each
                words = rows[len(names) :].T
                keys = jax.lax.bitcast_convert_type(words, jnp.uint32)
                keys = jnp.reshape(keys, (rows.shape[1],) + key_shape)
            state, actions = self.step(
                params,
                layout.unpack(flat, big),
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
            return (*layout.pack(state), actions)

        return jax.jit(run, donate_argnums=(1, 2))
