"""``jaxmesh.make_agent``: the jitted agent step alone. The host loop's own
(``PackedStep``) passes fewer buffers (about a microsecond each on a CPU): the
state's small leaves as one buffer of 32-bit words, the masks and counts as one
array each."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.core import agent
from jaxmesh.core.policy import Policy, resolve_policy
from jaxmesh.envs import make_env
from jaxmesh.run import build, checks, plan
from jaxmesh.run.host import direct


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
    """Plan + replay + windows + previous action + masking as the jitted
    functions the scan engine drives (the same per-episode results)."""
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
    """Probes ``pol`` against ``env`` (or a spec), plans and jits the agent
    side: ``(config, chunk, init, step, plan)``; ``tile_lanes``: the lanes the
    default tile is sized for; ``packed``: the host loop's program
    (``PackedStep`` or ``DirectStep``). ValueError or TypeError if it does not fit.
    """
    told, asked = build.told_horizon(pol, settings), build.asks_chunks(settings)
    chunk = build.probe_chunk(
        pol, env, params, settings.horizon, told, chunks_asked=asked
    )
    # The host keeps no per-episode buffers on the device: capacity is the lanes.
    run_plan = plan.plan_run(
        settings, chunk, capacity=settings.num_envs, tile_lanes=tile_lanes
    )
    cfg = build.agent_config(pol, env, run_plan, settings)

    init = functools.partial(agent.init, cfg, pol)  # (obs, lanes)
    step = functools.partial(agent.host_step, cfg, pol)
    if packed and direct.applies(cfg, pol):  # a HostPolicy: numpy, no callback
        step = direct.DirectStep(cfg, pol)
        return cfg, chunk, step.init, step, run_plan
    if packed:
        jitted: list = []

        def init_packed(obs, lanes):
            obs = pol.place(obs)
            if not jitted:  # the layout needs the observations' shapes
                layout = StateLayout.of(jax.eval_shape(init, obs, lanes))
                jitted.append((layout, jax.jit(lambda o, m: layout.pack(init(o, m)))))
            layout, fn = jitted[0]
            return HostState(layout, *fn(obs, lanes))

        return cfg, chunk, init_packed, PackedStep(cfg, pol, step), run_plan
    init_jit = jax.jit(init)
    step_jit = jax.jit(step, donate_argnums=(1,))

    def step_placed(params, state, obs, *rest, episodes=None):
        # Only a sweep's lanes read their episode index (their cell).
        episodes = None if cfg.grid is None else np.asarray(episodes, np.int32)
        return step_jit(params, state, pol.place(obs), *rest, episodes=episodes)

    init_placed = lambda obs, lanes: init_jit(pol.place(obs), lanes)
    return cfg, chunk, init_placed, step_placed, run_plan


#: State leaves up to this size travel in one buffer of 32-bit words; larger
#: ones (image windows, long chunks) stay buffers of their own.
FLAT_MAX_BYTES = 16 * 1024


class _Leaf(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # into the word buffer; -1: a buffer of its own
    index: int  # among the separate buffers (-1: in the word buffer)

    @property
    def words(self) -> int:
        """32-bit words the leaf takes (two per element of 8 bytes)."""
        size = int(np.prod(self.shape, dtype=np.int64))
        return size * max(1, self.dtype.itemsize // 4)


def _as_words(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` go into 32-bit words exactly."""
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
    """``x`` as a flat uint32 vector, exactly."""
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
    if leaf.dtype == np.bool_:
        return xp.reshape(w, leaf.shape) != 0
    if size < 4:  # the low bits of each word
        w = w.astype(np.dtype(f"uint{8 * size}"))
    if xp is np:
        return w.view(leaf.dtype).reshape(leaf.shape)
    extra = (2,) if size == 8 else ()
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
        """The ``AgentState`` of a word buffer and the separate leaves."""
        out = []
        for leaf in self.leaves:
            if leaf.index >= 0:
                out.append(big[leaf.index])
            else:
                w = flat[leaf.offset : leaf.offset + leaf.words]
                out.append(_from_words(w, leaf, xp))
        return jax.tree.unflatten(self.treedef, out)


class HostState:
    """The small leaves in one buffer of 32-bit words, the large ones as they
    are; a field (``.cursor``) reads the host copy, read back once per state."""

    def __init__(self, layout: StateLayout, flat: jax.Array, big: tuple):
        self.layout, self.flat, self.big = layout, flat, big
        self._host: Any = None

    def read_back(self, *arrays: Any) -> tuple:
        """``arrays`` on the host, in one transfer with the word buffer."""
        flat, *got = jax.device_get((self.flat, *arrays))
        # A copy: a view would hold the device buffer, which the next step
        # could then not donate.
        self._host = self.layout.unpack(np.array(flat), self.big, np)
        return tuple(got)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._host is None:
            self.read_back()
        return getattr(self._host, name)


class PackedStep:
    """``agent.host_step`` over a ``HostState``, the masks and counts as one
    array each; one jitted program per pattern of inputs given."""

    def __init__(self, cfg: agent.AgentConfig, pol: Policy, step: Any):
        self.cfg, self.pol, self.step = cfg, pol, step
        # A policy's key is folded with the step indices, ensembling picks its
        # ring's slot by them.
        self.reads_t = pol.stochastic or cfg.ensemble is not None
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
        sig, masks, counts = self.host_inputs(started, active, t, moved, skip, episodes)
        fn, obs = self.program(sig, state.layout), self.pol.place(obs)
        flat, big, actions = fn(
            params, state.flat, state.big, obs, masks, counts, ep_keys, texts
        )
        return HostState(state.layout, flat, big), actions

    def host_inputs(
        self, started, active, t, moved=None, skip=None, episodes=None
    ) -> tuple:
        """``(signature, masks, counts)``; counts None when none is read."""
        masks = (started, active) if moved is None else (started, active, moved)
        counts = []
        if self.reads_t:
            counts.append(t)
        if skip is not None:
            counts.append(skip)
        if self.cfg.grid is not None:  # only a sweep's lanes read their episode
            counts.append(episodes)
        sig = (moved is not None, self.reads_t, skip is not None)
        counts = (
            np.concatenate(counts, dtype=np.int32, casting="unsafe") if counts else None
        )
        return sig, np.concatenate(masks, dtype=bool), counts

    def keys_on_device(self, ep_keys: np.ndarray) -> jax.Array:
        """A copy of the episode keys on the policy's device."""
        return jax.device_put(np.array(ep_keys), self.pol.device)

    def program(self, sig: tuple, layout: StateLayout) -> Any:
        """The jitted program for inputs of signature ``sig``."""
        if sig in self._programs:
            return self._programs[sig]
        (moved, reads_t, skip), n = sig, self.cfg.num_envs
        grid = self.cfg.grid is not None

        def run(params, flat, big, obs, masks, counts, keys, texts):
            masks = jnp.reshape(masks, (-1, n))
            counts = () if counts is None else jnp.reshape(counts, (-1, n))
            at = iter(range(len(counts)))
            t = counts[next(at)] if reads_t else jnp.zeros((n,), jnp.int32)
            state, actions = self.step(
                params,
                layout.unpack(flat, big),
                obs,
                masks[0],
                masks[1],
                keys,
                t,  # zeros where unread
                masks[2] if moved else None,
                counts[next(at)] if skip else None,
                texts,
                counts[next(at)] if grid else None,
            )
            return (*layout.pack(state), actions)

        self._programs[sig] = jax.jit(run, donate_argnums=(1, 2))
        return self._programs[sig]
