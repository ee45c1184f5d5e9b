"""``jax.random.fold_in`` for the engine's per-lane keys, as one fused kernel.

On a CPU, JAX lowers Threefry-2x32 to a five-iteration loop, which compiles to
about sixteen kernels in loops that run every step. ``fold_in`` here is the
same hash written out (one elementwise kernel), bit for bit
``jax.random.fold_in``'s; under another default PRNG it is that function.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

#: Threefry-2x32's rotation constants, for rounds 0-3 and 4-7 of each 8.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
#: Threefry's key-schedule parity constant (Skein's C240 for 32-bit words).
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al., SC'11) of the word pairs
    ``(x0, x1)`` under the key ``(k0, k1)``; uint32 arrays that broadcast."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):  # five groups of four rounds, a key injection after each
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def threefry_default() -> bool:
    """Whether JAX's keys are Threefry-2x32 ones (its default PRNG)."""
    return jax.config.jax_default_prng_impl == "threefry2x32"


def fold_in(keys: jax.Array, data) -> jax.Array:
    """``jax.vmap(jax.random.fold_in)(keys, data)``: [n, 2] uint32 raw keys and
    [n] (or scalar) non-negative int32 data."""
    if not threefry_default():
        data = jnp.broadcast_to(jnp.asarray(data), keys.shape[:1])
        return jax.vmap(jax.random.fold_in)(keys, data)
    keys = jnp.asarray(keys, jnp.uint32)
    d = jnp.asarray(data).astype(jnp.uint32)
    zero = jnp.zeros(jnp.broadcast_shapes(keys.shape[:1], jnp.shape(d)), jnp.uint32)
    y0, y1 = threefry2x32(keys[:, 0], keys[:, 1], zero, zero + d)
    return jnp.stack([y0, y1], axis=1)


def _threefry_key(x) -> bool:
    """Whether ``x`` (an array or its shape) holds typed Threefry-2x32 keys."""
    tag = jax.extend.random.threefry_prng_impl.tag
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) and (
        str(x.dtype) == f"key<{tag}>"
    )


def _key_op(name: str, params: dict, key: jax.Array, *rest):
    """A typed-key primitive (``random_bits``, ``random_split``,
    ``random_fold_in``) on Threefry keys, computed from the keys' data by
    JAX's own Threefry implementation with the hash unrolled."""
    impl = jax.extend.random.threefry_prng_impl
    if name == "random_bits":
        fn = lambda k: impl.random_bits(k, params["bit_width"], params["shape"])
    elif name == "random_split":
        fn = lambda k: impl.split(k, params["shape"])
    else:
        fn = lambda k, m: impl.fold_in(k, m)
    for _ in range(key.ndim):  # per key of a key array, as JAX's rule does
        fn = jax.vmap(fn)
    data = jax.random.key_data(key)
    out = _unrolled_fn(fn)(data, *rest)
    if name == "random_bits":
        return out
    return jax.random.wrap_key_data(out, impl=jax.random.key_impl(key))


def _unrolled_fn(fn):
    def call(*args):
        closed = jax.make_jaxpr(fn)(*args)
        return jax.tree.unflatten(
            jax.tree.structure(jax.eval_shape(fn, *args)),
            eval_unrolled(closed, *jax.tree.leaves(args)),
        )

    return call


_KEY_OPS = ("random_bits", "random_split", "random_fold_in")


def uses_threefry(jaxpr: Any) -> bool:
    """Whether a jaxpr (or the jitted programs it calls) hashes Threefry keys
    outside loops and branches (what ``eval_unrolled`` replaces)."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "threefry2x32" or (
            name in _KEY_OPS and _threefry_key(eqn.invars[0].aval)
        ):
            return True
        if name in ("jit", "pjit") and uses_threefry(eqn.params["jaxpr"].jaxpr):
            return True
    return False


def eval_unrolled(closed: Any, *args) -> list:
    """``closed``'s outputs for ``args`` (flat), its Threefry hashes (and the
    typed-key draws, splits and fold-ins made of them) computed by
    ``threefry2x32`` in one elementwise kernel rather than JAX's CPU lowering,
    a five-iteration loop of about a dozen kernels; bit for bit the same.
    Hashes inside loops, branches or custom-derivative rules are left as
    they are."""
    jaxpr = closed.jaxpr
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, closed.consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "threefry2x32":
            outs = list(threefry2x32(*ins))
        elif name in _KEY_OPS and _threefry_key(eqn.invars[0].aval):
            outs = [_key_op(name, eqn.params, *ins)]
        elif name in ("jit", "pjit"):
            outs = eval_unrolled(eqn.params["jaxpr"], *ins)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*ins, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]
