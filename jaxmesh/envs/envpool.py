"""EnvPool envs (C++ simulators on a thread pool) stepped inside the jitted loop.

A run builds one pool for its budget (``EnvPoolEnv.bind``: env ``i`` is seeded
for episode ``i``), called through EnvPool's XLA interface with 64-bit values
as uint32 pairs (docs/envpool.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.envs.brax import StepWithInfo, positive_int
from jaxmesh.envs.names import check_id, need

#: Atari defaults: an episode is a whole game, rewards are not clipped (as
#: evaluation protocols score them).
ATARI_DEFAULTS = {"episodic_life": False, "reward_clip": False}

#: The episodes of one pool, at most (about 1 MiB an env); a larger budget runs
#: in pieces, one pool each.
POOL_EPISODES = 1000

#: The seed of the spare env of each lane (its episodes are never reported).
SPARE_SEED = 0

_MSB = np.uint32(0x80000000)


def make(task_id: str, pool_episodes: int = POOL_EPISODES, **kwargs: Any) -> EnvPoolEnv:
    """An EnvPool task (``"HalfCheetah-v5"``) as a jaxmesh env.

    Args:
      pool_episodes: the episodes of one pool (and one compile), at most.
      **kwargs: EnvPool's own ``make`` arguments, but ``num_envs``,
        ``batch_size``, ``seed``, ``env_seed`` and ``env_type`` (jaxmesh's).

    Raises:
      ImportError: envpool is not installed.
      ValueError: an unknown task id (naming the closest ones).
      TypeError: a keyword jaxmesh sets itself, or one EnvPool does not take.
    """
    envpool = need("envpool", f"envpool:{task_id}", "envpool")
    known = envpool.list_all_envs()
    check_id("EnvPool task", task_id, known, "envpool.list_all_envs() lists them")
    ours = sorted(
        set(kwargs) & {"num_envs", "batch_size", "seed", "env_seed", "env_type"}
    )
    if ours:
        raise TypeError(
            f"envpool:{task_id} got {ours}: jaxmesh sets them (one env per "
            "episode, seeded with that episode's seed, one batch of num_envs "
            "lanes); pass num_envs= and seeds= to jaxmesh.evaluate instead"
        )
    spec = envpool.make_spec(task_id)
    defaults = {k: v for k, v in ATARI_DEFAULTS.items() if hasattr(spec.config, k)}
    kwargs = {**defaults, **kwargs}
    try:
        one = envpool.make(task_id, env_type="gymnasium", num_envs=1, **kwargs)
    except TypeError as e:
        raise TypeError(
            f"envpool:{task_id} does not take {sorted(kwargs)} ({e}); its options "
            f"are the fields of envpool.make_spec({task_id!r}).config"
        ) from e
    hint = ", the episodes of one pool (one EnvPool env each)"
    pool_episodes = positive_int("pool_episodes", pool_episodes, hint)
    return EnvPoolEnv(task_id, kwargs, _Specs.of(one), pool_episodes=pool_episodes)


@dataclasses.dataclass(frozen=True)
class _Specs:
    """A pool's arrays: EnvPool's state keys and dtypes, one env's action."""

    state_keys: tuple[str, ...]
    action_keys: tuple[str, ...]
    action_shape: tuple[int, ...]
    action_dtype: Any  # as the program holds it (float32 for EnvPool's float64)
    raw_action_dtype: Any  # as EnvPool takes it
    num_actions: int | None
    state_dtypes: tuple[Any, ...]  # per state key, as EnvPool writes it
    state_shapes: tuple[tuple[int, ...], ...]  # per state key, one env's

    @staticmethod
    def of(pool: Any) -> _Specs:
        space = pool.action_space
        discrete = hasattr(space, "n")
        keys = tuple(pool._state_keys)
        xla = dict(pool._xla())
        recv = xla["recv"][1][1][1:]  # (dtype, [1, *shape]) per state key
        send = xla["send"][1][0][1:]  # the same per action key
        raw = np.dtype(send[list(pool._action_keys).index("action")][0])
        dtypes = tuple(np.dtype(d) for d, _ in recv)
        shapes = tuple(tuple(s)[1:] for _, s in recv)
        return _Specs(
            state_keys=keys,
            action_keys=tuple(pool._action_keys),
            action_shape=() if discrete else tuple(space.shape),
            action_dtype=np.dtype(np.int32) if discrete else _narrow(raw),
            raw_action_dtype=raw,
            num_actions=int(space.n) if discrete else None,
            state_dtypes=dtypes,
            state_shapes=shapes,
        )

    def leaf(self, key: str) -> jax.ShapeDtypeStruct:
        i = self.state_keys.index(key)
        return jax.ShapeDtypeStruct(self.state_shapes[i], _narrow(self.state_dtypes[i]))

    @property
    def info_keys(self) -> tuple[str, ...]:
        """The info leaves a step reports (EnvPool's, less its env ids)."""
        keys = [k for k in self.state_keys if k.startswith("info:")]
        keys = [k for k in keys if k not in ("info:env_id", "info:players.env_id")]
        return (*keys, "elapsed_step")


_NARROW = {np.dtype(f"{k}64"): np.dtype(f"{k}32") for k in ("float", "int", "uint")}


def _narrow(dtype: Any) -> np.dtype:
    """The dtype the program holds for an EnvPool dtype (no 64-bit types)."""
    return _NARROW.get(np.dtype(dtype), np.dtype(dtype))


@dataclasses.dataclass(eq=False)
class EnvPoolEnv(StepWithInfo):
    """An EnvPool task: ``reset`` and ``step`` give shapes only; a run steps
    ``bind(seeds, num_envs)`` (``jaxmesh.evaluate``, ``jaxmesh.Evaluator``;
    not ``make_evaluator``: the pool is built from the seeds)."""

    task_id: str
    kwargs: dict
    specs: _Specs
    name: str = ""
    pool_episodes: int = POOL_EPISODES

    def __post_init__(self):
        if not self.name:
            self.name = f"envpool:{self.task_id}"
        self.action_shape = self.specs.action_shape
        self.action_dtype = self.specs.action_dtype
        self.num_actions = self.specs.num_actions

    def reset(self, key: jax.Array):
        """Shapes only; the state is a digest of the task and its options
        (which ``resume=``'s env digest traces)."""
        text = repr((self.task_id, sorted(self.kwargs.items())))
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4]) >> 1
        return _zeros(self.specs.leaf("obs")), jnp.int32(digest)

    def step_with_info(self, key: jax.Array, state: Any, action: jax.Array):
        """Shapes only (see ``reset``)."""
        keys = self.specs.info_keys
        info = {k.removeprefix("info:"): _zeros(self.specs.leaf(k)) for k in keys}
        obs = self.reset(key)[0]
        return obs, state, jnp.float32(0), jnp.bool_(False), jnp.bool_(False), info

    def step_lanes(self, *args: Any) -> Any:
        raise TypeError(
            f"{self.name}: an EnvPool env's pool is built per run from the run's "
            "seeds (one env per episode); run it with jaxmesh.evaluate or "
            "jaxmesh.Evaluator, which build it, not with make_evaluator"
        )

    reset_lanes = step_lanes

    def bind(self, seeds: Any, num_envs: int) -> BoundPool:
        """The pool of one run: env ``i`` seeded with ``seeds[i]``, then one
        spare env per lane; batches of ``num_envs``."""
        import envpool

        seeds = [int(s) for s in np.asarray(seeds).reshape(-1)]
        n = int(num_envs)
        pool = envpool.make(
            self.task_id,
            env_type="gymnasium",
            num_envs=len(seeds) + n,
            batch_size=n,
            env_seed=seeds + [SPARE_SEED] * n,
            **self.kwargs,
        )
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(EnvPoolEnv)}
        return BoundPool(**fields, pool=pool, episodes=len(seeds), lanes=n)


@dataclasses.dataclass(eq=False)
class BoundPool(EnvPoolEnv):
    """One run's pool (``EnvPoolEnv.bind``), stepped for all lanes at once.

    A lane's state is the id of the env it steps: its episode's (env ``i`` for
    episode ``i``) or, while it runs none, its spare one (``episodes + lane``).
    """

    pool: Any = None
    episodes: int = 0
    lanes: int = 0

    def __post_init__(self):
        super().__post_init__()
        fns = dict(self.pool._xla())
        self._handle = np.frombuffer(fns["recv"][0], np.uint8).copy()
        self._send = _ffi(self.pool, "send", *fns["send"])
        self._recv = _ffi(self.pool, "recv", *fns["recv"])

    def _spare(self) -> jax.Array:
        return self.episodes + jnp.arange(self.lanes, dtype=jnp.int32)

    def reset_lanes(self, begins: jax.Array, episode: jax.Array, state: jax.Array):
        """Starts episode ``episode[j]`` on each lane in ``begins`` (the others
        step their spare envs): the observations and the new state."""
        target = jnp.where(begins, episode, self._spare())
        action = jnp.zeros((self.lanes, *self.action_shape), self.action_dtype)
        out = self._round(target, action)
        return out["obs"], jnp.where(begins, episode, state)

    def step_lanes(self, active: jax.Array, state: jax.Array, action: jax.Array):
        """One step of every lane (inactive ones: their spare env): ``(obs,
        state, reward, terminated, truncated, info)``."""
        target = jnp.where(active, state, self._spare())
        out = self._round(target, action)
        trunc = out["trunc"]
        terminated = out["done"] & ~trunc  # EnvPool's gymnasium rule
        info = {k.removeprefix("info:"): out[k] for k in self.specs.info_keys}
        reward = out["reward"].astype(jnp.float32)
        return out["obs"], state, reward, terminated, trunc, info

    def _round(self, target: jax.Array, action: jax.Array) -> dict:
        """One send of ``action`` to envs ``target`` and its receive, in lane
        order, 64-bit values narrowed."""
        sp = self.specs
        handle = jnp.asarray(self._handle)
        raw = _widen(action, sp.raw_action_dtype)
        args = {"env_id": target, "players.env_id": target, "action": raw}
        handle = self._send(handle, *(args[k] for k in sp.action_keys))[0]
        values = self._recv(handle)[1:]
        out = dict(zip(sp.state_keys, values, strict=True))
        # Lane j's row is the one whose env id is target[j] (an [N, N]
        # comparison: one fused kernel, cheaper than sorting).
        got = out["info:env_id"]
        rows = jnp.argmax(target[:, None] == got[None, :], axis=1)
        return {
            k: _narrow_array(v[rows], dt)
            for (k, v), dt in zip(out.items(), sp.state_dtypes, strict=True)
        }


def _zeros(s: jax.ShapeDtypeStruct) -> jax.Array:
    return jnp.zeros(s.shape, s.dtype)


def _ffi(pool: Any, name: str, handle: bytes, specs: tuple, capsules: tuple):
    """EnvPool's XLA call ``name`` with 64-bit buffers declared as uint32 pairs
    (their bytes), so that no 64-bit type enters the program."""
    _, outs = specs
    # One handler per pool class (the pool is the handle): a reused name
    # names the same one.
    target = f"jaxmesh_envpool_{type(pool).__name__}_{id(pool)}_{name}"
    jax.ffi.register_ffi_target(target, capsules[0], platform="cpu", api_version=1)
    results = tuple(_buffer(np.dtype(d), tuple(s)) for d, s in outs)
    call = jax.ffi.ffi_call(
        target, results, has_side_effect=True, input_output_aliases={0: 0}
    )
    value = int.from_bytes(handle, byteorder=sys.byteorder, signed=False)
    return lambda *args: call(*args, handle=value)


def _buffer(dtype: np.dtype, shape: tuple) -> jax.ShapeDtypeStruct:
    if dtype.itemsize == 8:
        return jax.ShapeDtypeStruct((*shape, 2), np.uint32)
    return jax.ShapeDtypeStruct(shape, dtype)


def _narrow_array(x: jax.Array, dtype: np.dtype) -> jax.Array:
    """A received leaf in the program's dtype (``_narrow``)."""
    if dtype.itemsize != 8:
        return x
    lo, hi = x[..., 0], x[..., 1]
    if dtype == np.float64:
        return f64_bits_to_f32(lo, hi)
    return jax.lax.bitcast_convert_type(lo, _narrow(dtype))  # the low word


def _widen(action: jax.Array, raw: np.dtype) -> jax.Array:
    """An action in EnvPool's dtype (float64: as uint32 pairs, exact)."""
    if raw == np.float64:
        lo, hi = f32_to_f64_bits(jnp.asarray(action, jnp.float32))
        return jnp.stack([lo, hi], axis=-1)
    return jnp.asarray(action, raw)


def f64_bits_to_f32(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """The float32 nearest (ties to even) to the float64 of bits ``hi:lo``
    (uint32 words), as numpy's ``astype(np.float32)``; inf and nan kept."""
    u32 = jnp.uint32
    sign = hi & u32(_MSB)
    e = ((hi >> 20) & u32(0x7FF)).astype(jnp.int32)
    sig_hi = (hi & u32(0xFFFFF)) | u32(1 << 20)  # 21 bits, the implicit one
    e32 = e - 896  # the float32 biased exponent
    # Keep 24 bits of the 53-bit significand (fewer for a subnormal result).
    r = jnp.clip(29 + jnp.maximum(1 - e32, 0), 29, 60)
    s_lo = jnp.minimum(r, 31).astype(u32)
    kept_lo = (sig_hi << (32 - s_lo)) | (lo >> s_lo)  # r < 32
    kept_hi = sig_hi >> jnp.clip(r - 32, 0, 31).astype(u32)  # r >= 32
    kept = jnp.where(r < 32, kept_lo, jnp.where(r - 32 > 20, u32(0), kept_hi))
    # The dropped bits against half of the last kept bit, as (high, low) words.
    low_mask = jnp.where(r < 32, (u32(1) << s_lo) - 1, u32(0xFFFFFFFF))
    rem_lo = lo & low_mask
    hi_bits = jnp.clip(r - 32, 0, 31).astype(u32)
    rem_hi = jnp.where(r <= 32, u32(0), sig_hi & ((u32(1) << hi_bits) - 1))
    half_lo = jnp.where(r <= 32, u32(1) << (s_lo - 1).astype(u32), u32(0))
    half_lo = jnp.where(r == 32, u32(_MSB), half_lo)
    half_hi = jnp.where(r > 32, u32(1) << jnp.clip(r - 33, 0, 31).astype(u32), u32(0))
    above = (rem_hi > half_hi) | ((rem_hi == half_hi) & (rem_lo > half_lo))
    tie = (rem_hi == half_hi) & (rem_lo == half_lo)
    up = above | (tie & ((kept & 1) == 1))
    body = (jnp.maximum(e32, 1) - 1).astype(u32) << 23
    bits = body + kept + up.astype(u32)
    bits = jnp.where(e32 >= 255, u32(0x7F800000), bits)
    nan = (e == 0x7FF) & (((hi & u32(0xFFFFF)) | lo) != 0)
    bits = jnp.where(e == 0x7FF, u32(0x7F800000), bits)
    bits = jnp.where(nan, u32(0x7FC00000), bits)
    bits = jnp.where(e == 0, u32(0), bits)  # float64 zero and subnormals
    return jax.lax.bitcast_convert_type(bits | sign, jnp.float32)


def f32_to_f64_bits(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The float64 equal to float32 ``x``, as (low, high) uint32 words."""
    u32 = jnp.uint32
    b = jax.lax.bitcast_convert_type(x, u32)
    sign = b & u32(_MSB)
    e = ((b >> 23) & u32(0xFF)).astype(jnp.int32)
    m = b & u32(0x7FFFFF)
    # Normal numbers: rebias the exponent, move the mantissa up 29 bits.
    hi = (((e + 896).astype(u32)) << 20) | (m >> 3)
    lo = (m & u32(7)) << 29
    # inf and nan
    hi = jnp.where(e == 255, u32(0x7FF00000) | (m >> 3), hi)
    # Subnormals: normalize (the top set bit p of m becomes the implicit one).
    p = 31 - jax.lax.clz(m).astype(jnp.int32)
    frac = m ^ (u32(1) << jnp.clip(p, 0, 31).astype(u32))
    s = 52 - p  # shift of frac into the 52-bit mantissa, 30..52
    sub_hi = jnp.where(
        s >= 32,
        frac << jnp.clip(s - 32, 0, 31).astype(u32),
        frac >> jnp.clip(32 - s, 0, 31).astype(u32),
    )
    sub_lo = jnp.where(s >= 32, u32(0), frac << jnp.clip(s, 0, 31).astype(u32))
    sub_hi = (((p - 149 + 1023).astype(u32)) << 20) | sub_hi
    sub = (e == 0) & (m != 0)
    hi = jnp.where(sub, sub_hi, hi)
    lo = jnp.where(sub, sub_lo, lo)
    zero = (e == 0) & (m == 0)
    hi = jnp.where(zero, u32(0), hi)
    lo = jnp.where(zero, u32(0), lo)
    return lo, hi | sign
