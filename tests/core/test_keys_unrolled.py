"""``jaxmesh.core.keys.eval_unrolled`` against the traced function itself.

The engine runs a gymnax env's reset through it (CONTRACT 5: the env's keys
are JAX's), so every draw must be JAX's bit for bit: uniform, normal, integer
and Bernoulli draws, splits, fold-ins, draws from a vmapped key array, under
jit and under vmap, over many keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core import keys


def draws(k):
    """A reset-like function: every way an env draws from its key."""
    a = jax.random.uniform(k, (4,), minval=-0.05, maxval=0.05)
    k2, k3 = jax.random.split(k)
    b = jax.random.normal(jax.random.fold_in(k3, 7), (3, 2))
    c = jax.random.randint(k2, (5,), 0, 100)
    d = jax.random.bernoulli(k, 0.3, (7,))
    typed = jax.random.wrap_key_data(k)
    e = jax.vmap(lambda kk: jax.random.uniform(kk, (2,)))(jax.random.split(typed, 3))
    f = jax.random.bits(typed, (3,), jnp.uint16)
    g = jax.random.choice(jax.random.key(3), 10, (2,))  # a key made inside
    return {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f, "g": g}


CLOSED = jax.make_jaxpr(draws)(jax.ShapeDtypeStruct((2,), jnp.uint32))
TREE = jax.tree.structure(jax.eval_shape(draws, jax.random.PRNGKey(0)))


def unrolled(k):
    return jax.tree.unflatten(TREE, keys.eval_unrolled(CLOSED, k))


def assert_same(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1])
def test_eval_unrolled_draws_jax_values_under_jit(seed):
    k = jax.random.PRNGKey(seed)
    assert_same(jax.jit(unrolled)(k), draws(k))


def test_eval_unrolled_draws_jax_values_under_vmap_on_drawn_keys():
    rng = np.random.default_rng(0)
    k = rng.integers(0, 2**32, size=(32, 2), dtype=np.uint64).astype(np.uint32)
    got = jax.jit(jax.vmap(unrolled))(jnp.asarray(k))
    want = [draws(jnp.asarray(k[i])) for i in range(len(k))]
    assert_same(got, jax.tree.map(lambda *x: jnp.stack(x), *want))


def test_eval_unrolled_compiles_no_hash_loop():
    """JAX's CPU lowering hashes in a while loop; the unrolled one has none."""
    k = jax.random.PRNGKey(0)
    assert "while" in jax.jit(draws).lower(k).as_text()
    assert "while" not in jax.jit(unrolled).lower(k).as_text()


def test_uses_threefry_sees_draws_only():
    assert keys.uses_threefry(CLOSED.jaxpr)
    plain = jax.make_jaxpr(lambda k: (k.astype(jnp.float32) * 2.0, k))
    assert not keys.uses_threefry(plain(jax.random.PRNGKey(0)).jaxpr)
    with jax.default_prng_impl("rbg"):
        rbg = jax.make_jaxpr(lambda k: jax.random.uniform(k, (3,)))
        assert not keys.uses_threefry(rbg(jax.random.PRNGKey(0)).jaxpr)
