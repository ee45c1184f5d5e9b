"""``jaxmesh.core.keys.fold_in`` against ``jax.random.fold_in`` itself.

The engine derives every env-step and policy key with it (CONTRACT 5), so it
must give JAX's keys bit for bit: on keys and data drawn over their whole
ranges, on the hand-picked edges, and once each word's top bit is set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core import keys

EDGES = np.array([0, 1, 2, 31, 32, 2**31 - 2, 2**31 - 1], np.int32)


def jax_fold_in(k, d):
    """The reference: JAX's own ``fold_in``, one key at a time."""
    return np.stack([np.asarray(jax.random.fold_in(k[i], d[i])) for i in range(len(d))])


def drawn(n, seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 2**32, size=(n, 2), dtype=np.uint64).astype(np.uint32)
    d = rng.integers(0, 2**31, size=(n,), dtype=np.int64).astype(np.int32)
    return k, d


@pytest.mark.parametrize("seed", [0, 1])
def test_fold_in_is_jax_fold_in_on_drawn_keys_and_data(seed):
    k, d = drawn(64, seed)
    got = jax.jit(keys.fold_in)(jnp.asarray(k), jnp.asarray(d))
    np.testing.assert_array_equal(np.asarray(got), jax_fold_in(k, d))


def test_fold_in_is_jax_fold_in_on_edges_and_seed_keys():
    k = np.asarray(jax.vmap(jax.random.PRNGKey)(jnp.asarray(EDGES)))
    top = np.full((len(EDGES), 2), 0xFFFFFFFF, np.uint32)
    for base in (k, top):
        got = keys.fold_in(jnp.asarray(base), jnp.asarray(EDGES))
        np.testing.assert_array_equal(np.asarray(got), jax_fold_in(base, EDGES))


def test_fold_in_takes_one_scalar_for_every_key():
    k, _ = drawn(5, 2)
    got = keys.fold_in(jnp.asarray(k), 7)
    np.testing.assert_array_equal(np.asarray(got), jax_fold_in(k, np.full(5, 7)))


def test_fold_in_is_jax_fold_in_under_another_default_prng():
    """With ``rbg`` keys (four words, not Threefry's two), it is JAX's."""
    with jax.default_prng_impl("rbg"):
        assert not keys.threefry_default()
        k = np.asarray(jax.vmap(jax.random.PRNGKey)(jnp.arange(3)))
        got = keys.fold_in(jnp.asarray(k), jnp.arange(3))
        np.testing.assert_array_equal(np.asarray(got), jax_fold_in(k, np.arange(3)))
    assert keys.threefry_default()
