"""``jax.random.fold_in`` for the engine's per-lane keys, as one fused kernel:
on a CPU JAX lowers Threefry-2x32 to a loop of about sixteen kernels; written
out it is one elementwise kernel, bit for bit the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: Threefry-2x32's rotation constants, for rounds 0-3 and 4-7 of each 8.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
#: Threefry's key-schedule parity constant (Skein's C240 for 32-bit words).
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32, 20 rounds (Salmon et al., SC'11), of uint32 arrays."""
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
    """``jax.vmap(jax.random.fold_in)(keys, data)`` for [n, 2] raw keys."""
    if not threefry_default():
        data = jnp.broadcast_to(jnp.asarray(data), keys.shape[:1])
        return jax.vmap(jax.random.fold_in)(keys, data)
    keys = jnp.asarray(keys, jnp.uint32)
    d = jnp.asarray(data).astype(jnp.uint32)
    zero = jnp.zeros(jnp.broadcast_shapes(keys.shape[:1], jnp.shape(d)), jnp.uint32)
    y0, y1 = threefry2x32(keys[:, 0], keys[:, 1], zero, zero + d)
    return jnp.stack([y0, y1], axis=1)
