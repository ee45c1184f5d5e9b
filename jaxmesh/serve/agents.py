"""The server side of the native protocol: each client's lanes as slots of a
pool that runs the host loop's own jitted agent step, planned as the client's
process would plan it (docs/serving.md, "jaxmesh's own protocol: RemotePolicy").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from gymnasium import spaces

from jaxmesh import adapt
from jaxmesh.core import agent
from jaxmesh.core.policy import resolve_policy
from jaxmesh.envs.gymnasium.spec import spec_for
from jaxmesh.run import build, checks
from jaxmesh.run.host.agent_step import agent_functions
from jaxmesh.serve.forward import Forward, Prepared, RequestError

#: Settings a session may give, with their defaults.
SETTINGS = {
    "num_envs": 1,
    "horizon": 1,
    "prefetch_lead": 0,
    "delay": 0,
    "plan_tile": None,
    "tile_lanes": None,
}


def skeleton_to_wire(skeleton: Any) -> Any:
    """An ``ObsLayout.skeleton`` as msgpack values: ``{"l": name}``, ``{"t":
    [...]}``, ``{"d": [[key, sub]]}``."""
    if isinstance(skeleton, str):
        return {"l": skeleton}
    if isinstance(skeleton, tuple):
        return {"t": [skeleton_to_wire(s) for s in skeleton]}
    return {"d": [[k, skeleton_to_wire(s)] for k, s in skeleton.items()]}


def spec_to_wire(spec: Any) -> dict:
    """What the server needs of a ``HostEnvSpec``: the layout, the action."""
    lay = spec.layout
    return {
        "name": spec.name,
        "skeleton": skeleton_to_wire(lay.skeleton),
        "leaves": [[n, list(lay.shapes[n]), lay.dtypes[n].str] for n in lay.names],
        "action_shape": list(spec.action_shape),
        "num_actions": spec.num_actions,
    }


def _space(skeleton: Any, leaves: dict) -> Any:
    if not isinstance(skeleton, dict) or len(skeleton) != 1:
        raise RequestError(f"a malformed observation layout: {skeleton!r}")
    ((kind, value),) = skeleton.items()
    if kind == "l":
        if value not in leaves:
            raise RequestError(f"the layout names leaf {value!r} but declares none")
        shape, dtype = leaves[value]
        if dtype == np.bool_:
            return spaces.MultiBinary(shape) if shape else spaces.Discrete(2)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return spaces.Box(int(info.min), int(info.max), shape, dtype)
        return spaces.Box(-np.inf, np.inf, shape, dtype)
    if kind == "t":
        return spaces.Tuple([_space(s, leaves) for s in value])
    if kind == "d":
        return spaces.Dict({str(k): _space(s, leaves) for k, s in value})
    raise RequestError(f"a malformed observation layout: {skeleton!r}")


def spec_from_wire(desc: Any) -> Any:
    """The ``HostEnvSpec`` a session's ``env`` map describes (RequestError:
    a malformed map, or one the rebuilt spec disagrees with)."""
    try:
        leaves = {
            str(n): (tuple(int(d) for d in shape), np.dtype(dtype))
            for n, shape, dtype in desc["leaves"]
        }
        for _, dtype in leaves.values():
            if dtype.kind not in "biuf":
                raise RequestError(f"an observation leaf of dtype {dtype}")
        obs_space = _space(desc["skeleton"], leaves)
        n = desc["num_actions"]
        if n is not None:
            act_space = spaces.Discrete(int(n))
        else:
            shape = tuple(int(d) for d in desc["action_shape"])
            act_space = spaces.Box(-np.inf, np.inf, shape, np.float32)
        spec = spec_for(str(desc["name"]), obs_space, act_space, "the client's env")
    except RequestError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
        raise RequestError(f"a malformed env description ({why})") from None
    got = {n: (spec.layout.shapes[n], spec.layout.dtypes[n]) for n in spec.layout.names}
    if got != leaves:
        raise RequestError(
            f"the env's observation leaves {leaves} rebuild as {got}; send leaves "
            "in JAX's dtypes (what jaxmesh's host lanes hold)"
        )
    return spec


def _settings(given: Any) -> tuple[Any, int | None]:
    if not isinstance(given, dict) or set(given) - set(SETTINGS):
        raise RequestError(
            f"settings {given!r}: expected a map with keys among {sorted(SETTINGS)}"
        )
    s = {**SETTINGS, **given}
    tile_lanes = s["tile_lanes"]
    if tile_lanes is not None and not (isinstance(tile_lanes, int) and tile_lanes >= 1):
        raise RequestError(f"tile_lanes={tile_lanes!r}: expected None or an int >= 1")
    try:
        settings = checks.check_settings(
            s["num_envs"],
            s["horizon"],
            s["prefetch_lead"],
            None,
            s["plan_tile"],
            delay=s["delay"],
        )
    except (TypeError, ValueError) as e:
        raise RequestError(str(e)) from None
    return settings, tile_lanes


#: The plans (probes) kept, oldest dropped first.
MAX_PLANS = 64
#: The compiled steps (lane counts) a pool keeps, least recently used first.
MAX_PROGRAMS = 4
#: Pools with no session kept for the next run, least recently emptied first.
MAX_IDLE_POOLS = 16
#: The most lanes one session may open (``PolicyServer(max_lanes=)``).
MAX_LANES = 4096


def _compile(pol: Any, spec: Any, settings: Any, params: Any, size: int) -> tuple:
    """A pool's (config, init, step) for ``size`` lanes (no cycle to the pool)."""
    settings = settings._replace(num_envs=size)
    cfg, _, init, step, _ = agent_functions(pol, spec, settings, params, packed=True)
    return cfg, init, step


class Pool:
    """The lanes of the sessions that share one agent program, resized (their
    states moved) when a session joins or leaves; ``lock`` held by a step and
    by a resize."""

    def __init__(self, pol: Any, params: Any, spec: Any, settings: Any):
        self.params, self.layout = params, spec.layout
        self.lock = threading.Lock()
        self.sessions: list[PolicySession] = []
        self.size = 0
        self.state: Any = None
        self.rows = 0
        #: size -> (config, init, step), the least recently used dropped
        #: (``settings``: the plan tile pinned to the sessions').
        self.program = functools.lru_cache(MAX_PROGRAMS)(
            functools.partial(_compile, pol, spec, settings, params)
        )
        k = jax.eval_shape(jax.random.PRNGKey, 0)
        self._key = (tuple(k.shape), k.dtype)
        self.leaves = self.layout.empty((0,))
        #: The leaves in the observation's tree order (what a request sends).
        self.order = jax.tree.leaves(
            self.layout.build({n: n for n in self.layout.names})
        )

    @property
    def lanes(self) -> int:
        return sum(s.slots.size for s in self.sessions)

    def _resize(self, size: int, keep: list[PolicySession]) -> None:
        """``size`` lanes, the sessions ``keep`` first (their lanes' state,
        observations, keys and steps moved along); the rest free."""
        self.cfg, init, self.step = self.program(size)
        self.skipping = agent.can_skip(self.cfg)
        leaves = self.layout.empty((size,), aligned=True)
        keys = np.zeros((size, *self._key[0]), self._key[1])
        t = np.zeros(size, np.int32)
        obs = self.layout.build(leaves)
        state = init(obs, np.zeros(size, bool))
        src = [session.slots for session in keep]
        ends = itertools.accumulate(s.size for s in src)
        slots = [np.arange(end - s.size, end) for s, end in zip(src, ends, strict=True)]
        if src and self.state is not None:
            src, dst = np.concatenate(src), np.concatenate(slots)
            for name in leaves:
                leaves[name][dst] = self.leaves[name][src]
            keys[dst], t[dst] = self.keys[src], self.t[src]
            old = self.state.layout.unpack(self.state.flat, self.state.big)
            new = state.layout.unpack(state.flat, state.big)
            old_size = self.size

            def move(a: Any, b: Any) -> Any:
                if a.ndim and a.shape[0] == old_size:  # a lane's rows
                    return b.at[dst].set(a[src])
                return a  # the rows count

            moved = jax.tree.map(move, old, new)
            state = type(state)(state.layout, *state.layout.pack(moved))
        for session, new in zip(keep, slots, strict=True):
            session.slots = new
        self.size, self.state = size, state
        self.leaves, self.obs, self.keys, self.t = leaves, obs, keys, t
        self.warm_up()

    def add(self, session: PolicySession, lanes: int) -> None:
        """Gives ``session`` ``lanes`` lanes (after every other session's)."""
        with self.lock:
            self._resize(self.lanes + lanes, list(self.sessions))
            session.slots = np.arange(self.size - lanes, self.size)
            self.sessions.append(session)

    def remove(self, session: PolicySession) -> None:
        """Takes ``session``'s lanes away (the others' states kept)."""
        with self.lock:
            if session not in self.sessions:
                return
            self.sessions.remove(session)
            if self.sessions:
                self._resize(self.lanes, list(self.sessions))
            else:  # the lanes' memory goes; the programs stay for the next
                self.size, self.state = 0, None
                self.leaves = self.layout.empty((0,))
                self.obs = self.keys = self.t = None

    def warm_up(self) -> None:
        """Compiles the step (every lane masked)."""
        off = np.zeros(self.size, bool)
        skip = np.zeros(self.size, np.int32) if self.skipping else None
        self._step(off, off, off, skip)
        self.rows = int(self.state.rows)

    def _step(self, started: Any, active: Any, moved: Any, skip: Any) -> Any:
        """The agent step over every lane; its actions, read back."""
        lanes = (self.obs, started, active, self.keys, self.t, moved, skip, {})
        self.state, actions = self.step(self.params, self.state, *lanes)
        (actions,) = self.state.read_back(actions)
        return actions

    def run(self, requests: list[Step]) -> list[dict]:
        """One pool step for the sessions' ``requests``; each one's reply."""
        with self.lock:
            size = self.size
            started, active, moved = (np.zeros(size, bool) for _ in range(3))
            skip = np.zeros(size, np.int32) if self.skipping else None
            for r in requests:
                sl = r.session.slots
                at = sl[r.moved]
                for name, x in zip(self.order, r.obs, strict=True):
                    self.leaves[name][at] = x
                started[sl], active[sl], moved[sl] = r.started, r.active, r.moved
                self.keys[sl], self.t[sl] = r.keys, r.t
                if skip is not None and r.skip is not None:
                    skip[sl] = r.skip
            actions = self._step(started, active, moved, skip)
            st = self.state
            rows = int(st.rows)
            delta, self.rows = rows - self.rows, rows
            lanes = {
                "actions": actions,
                "cursor": np.asarray(st.cursor, np.int64),
                "predict_calls": np.asarray(st.predict_calls, np.int32),
                "chunk": np.asarray(jax.device_get(st.chunk)),
            }
            if self.cfg.lead:
                lanes["pending"] = np.asarray(jax.device_get(st.pending))
        # (A session's slots index its rows: each is a contiguous copy.)
        return [
            {"rows": delta, **{k: x[r.session.slots] for k, x in lanes.items()}}
            for r in requests
        ]


@dataclasses.dataclass(eq=False)
class PolicySession:
    """One client's run: its pool and slots ([n] slot of each lane)."""

    id: int
    pool: Pool
    slots: np.ndarray


class Step(NamedTuple):
    """One step request of a session, checked (arrays by the session's lane)."""

    session: PolicySession
    obs: list  # the moved lanes' leaves, in the observation's tree order
    started: np.ndarray
    active: np.ndarray
    moved: np.ndarray
    keys: np.ndarray
    t: np.ndarray
    skip: np.ndarray | None


class Pools:
    """Every session's slots, in pools of one agent program each (arguments
    as ``PolicyServer``'s), driven by the server's ``Batcher``."""

    def __init__(self, model: Any, *, max_batch: int, max_lanes: int = MAX_LANES):
        self.policy = resolve_policy(model, with_params=False)
        self.name = self.policy.name
        why = [
            f"input {name!r} is a Text (the instruction is not sent yet)"
            for name in adapt.text_inputs(self.policy.spec)
        ]
        if why:
            raise ValueError(
                f"cannot serve policy {self.name!r} over gRPC: {'; '.join(why)}"
            )
        self.params = self.policy.default_params()
        self.lanes = max_batch
        self.max_lanes = max_lanes
        self.max_batch = 4096
        self._pools: dict[Any, list[Pool]] = {}
        #: (env signature, settings, tile lanes) -> (config, chunk, digest).
        self._plans: dict[tuple, tuple] = {}
        #: Pools without a session, the one emptied longest ago first.
        self._idle: list[Pool] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open(self, desc: Any) -> tuple[PolicySession, dict]:
        """A session for the client's ``desc`` (``{"env": spec_to_wire,
        "settings": {...}}``), and what the client needs of its plan
        (RequestError: malformed, or the policy does not fit)."""
        if not isinstance(desc, dict) or "env" not in desc:
            raise RequestError("an open request needs 'env' and 'settings'")
        spec = spec_from_wire(desc["env"])
        settings, tile_lanes = _settings(desc.get("settings", {}))
        if settings.num_envs > self.max_lanes:
            raise RequestError(
                f"num_envs={settings.num_envs}: this policy server opens at most "
                f"{self.max_lanes} lanes per session; run with num_envs <= "
                f"{self.max_lanes}, or start the server with a larger max_lanes "
                "(serve-policy --max-lanes N)"
            )
        pol = self.policy
        spec = spec.reading(adapt.read_keys(pol.spec))
        # The probe traces the model: once per env layout and settings.
        planned = (spec.signature, settings, tile_lanes)
        known = self._plans.get(planned)
        if known is None:
            try:
                cfg, chunk, _, _, _ = agent_functions(
                    pol, spec, settings, self.params, tile_lanes
                )
                digest = build.policy_digest(
                    pol,
                    spec,
                    self.params,
                    settings.horizon,
                    build.told_horizon(pol, settings),
                )
            except Exception as e:  # noqa: BLE001 - the model's own trace refused
                # Whatever the model raises (flax's ScopeParamShapeError is
                # neither a TypeError nor a ValueError) is the client's to hear.
                raise RequestError(
                    f"policy {self.name!r} does not fit env {spec.name!r} with "
                    f"these settings: {type(e).__name__}: {e}"
                ) from None
            with self._lock:
                if len(self._plans) >= MAX_PLANS:
                    self._plans.pop(next(iter(self._plans)))
                known = self._plans[planned] = (cfg, chunk, digest)
        cfg, chunk, digest = known
        n = settings.num_envs
        # Pools share a program: the same plan but for the lanes (the tile fixed).
        key = (spec.signature, dataclasses.replace(cfg, num_envs=0))
        pinned = settings._replace(plan_tile=cfg.tile)
        with self._lock:  # (a resize compiles: sessions open one at a time)
            pools = self._pools.setdefault(key, [])
            pool = next(
                (p for p in pools if not p.sessions or p.lanes + n <= self.lanes),
                None,
            )
            if pool is None:
                pool = Pool(pol, self.params, spec, pinned)
                pools.append(pool)
            self._idle = [p for p in self._idle if p is not pool]
            session = PolicySession(next(self._ids), pool, np.zeros(0, np.int64))
            pool.add(session, n)
            if dataclasses.replace(pool.cfg, num_envs=0) != key[1]:
                pool.remove(session)
                raise RuntimeError(
                    f"a pool of {pool.size} lanes plans {pool.cfg}, not {cfg}"
                )
        info = {
            "session": session.id,
            "policy": self.name,
            "chunk": chunk,
            "horizon": cfg.h,
            "lead": cfg.lead,
            "tile": cfg.tile,
            "digest": digest,
            "can_skip": agent.can_skip(cfg),
            # The observation leaves the policy reads, in the order a step
            # sends them.
            "leaves": list(pool.order),
            "stochastic": pol.stochastic,
        }
        return session, info

    def close(self, session: PolicySession) -> None:
        """Frees the session's slots; past ``MAX_IDLE_POOLS`` pools without a
        session, the one emptied longest ago is dropped with its programs."""
        with self._lock:
            pool = session.pool
            if session not in pool.sessions:
                return
            pool.remove(session)
            if pool.sessions:
                return
            self._idle = [p for p in self._idle if p is not pool] + [pool]
            while len(self._idle) > MAX_IDLE_POOLS:
                old = self._idle.pop(0)
                for pools in self._pools.values():
                    if old in pools:
                        pools.remove(old)
            self._pools = {k: v for k, v in self._pools.items() if v}

    def check(self, session: PolicySession, msg: Any) -> Prepared:
        """A step request as the batcher's ``Prepared`` (RequestError: malformed)."""
        n = session.slots.size
        if not isinstance(msg, dict):
            raise RequestError("a step request is a map")

        def lanes(key: str, dtype: Any, optional: bool = False) -> np.ndarray | None:
            x = msg.get(key)
            if x is None and optional:
                return None
            if not isinstance(x, np.ndarray) or x.shape[:1] != (n,):
                got = None if x is None else getattr(x, "shape", type(x).__name__)
                raise RequestError(
                    f"step request {key!r} is {got}; expected an array of {n} lanes"
                )
            return np.asarray(x, dtype)

        started, active, moved = (
            lanes(k, bool) for k in ("started", "active", "moved")
        )
        t, keys = lanes("t", np.int32), lanes("keys", session.pool.keys.dtype)
        skip = lanes("skip", np.int32, optional=True)
        obs = msg.get("obs")
        pool = session.pool
        m = int(moved.sum())
        if not isinstance(obs, list) or len(obs) != len(pool.order):
            raise RequestError(
                f"step request 'obs' holds {type(obs).__name__}; expected a list of "
                f"{len(pool.order)} leaves"
            )
        for name, x in zip(pool.order, obs, strict=True):
            want = (m, *pool.layout.shapes[name])
            if not isinstance(x, np.ndarray) or x.shape != want:
                raise RequestError(
                    f"observation leaf {name!r} is {getattr(x, 'shape', x)!r}; "
                    f"expected {want} (the moved lanes' rows)"
                )
        step = Step(session, obs, started, active, moved, keys, t, skip)
        return Prepared(step, id(pool))

    def run(self, rows: list[Prepared]) -> Forward:
        """One pool step for the requests ``rows`` (all of one pool)."""
        t0 = time.perf_counter()
        requests = [r.inputs for r in rows]
        replies = requests[0].session.pool.run(requests)
        return Forward(replies, len(rows), time.perf_counter() - t0)

    def compiled(self) -> int:
        pools = [p for pools in self._pools.values() for p in pools]
        return sum(p.program.cache_info().currsize for p in pools)


__all__ = ["Pool", "Pools", "PolicySession", "spec_from_wire", "spec_to_wire"]
