"""A policy's convolutions in NHWC/HWIO layout (``jaxmesh.core.convs``).

The rewritten function must give the values of the function as written (JAX's
own convolution, compiled at the top level, is the reference) for every
layout, stride, padding, dilation and group count, and leave no convolution in
another layout in its jaxpr, also inside the policy's own ``jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxmesh.core import convs
from jaxmesh.core.engine import Engine
from jaxmesh.core.policy import resolve_policy

SIZES = {"N": 2, "C": 4, "H": 11, "W": 9, "O": 6, "I": 4}


def conv_layouts(fn, *args):
    """The (lhs, rhs, out) specs of every convolution in ``fn``'s jaxpr,
    nested calls included."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "conv_general_dilated":
                dn = eqn.params["dimension_numbers"]
                found.append((dn.lhs_spec, dn.rhs_spec, dn.out_spec))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


NHWC = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


@pytest.mark.parametrize(
    "dn, groups",
    [
        (("NCHW", "OIHW", "NCHW"), 1),  # PyTorch's / Equinox's layout
        (("NCHW", "OIHW", "NCHW"), 2),  # grouped
        (("NCHW", "HWIO", "NHWC"), 1),
        (("CHWN", "IOHW", "HWNC"), 1),  # every axis moved
        (("NHWC", "HWIO", "NHWC"), 1),  # already fast: left as it is
    ],
)
def test_rewritten_convolution_equals_the_written_one(dn, groups):
    rng = np.random.default_rng(0)
    sizes = dict(SIZES, I=SIZES["C"] // groups)
    x = rng.normal(size=[sizes[c] for c in dn[0]]).astype(np.float32)
    k = rng.normal(size=[sizes[c] for c in dn[1]]).astype(np.float32)

    def f(x, k):
        y = lax.conv_general_dilated(
            x,
            k,
            window_strides=(2, 1),
            padding=((1, 0), (0, 2)),
            rhs_dilation=(1, 2),
            dimension_numbers=dn,
            feature_group_count=groups,
        )
        return jnp.tanh(y), y.sum()

    want = jax.jit(f)(x, k)
    got = jax.jit(convs.rewrite(f))(x, k)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert conv_layouts(convs.rewrite(f), x, k) == [NHWC]


def test_convolutions_inside_the_policys_own_jit_and_vmap():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 8, 8)).astype(np.float32)
    k = rng.normal(size=(6, 4, 3, 3)).astype(np.float32)

    @jax.jit
    def one(x, k):  # one [C, H, W] observation, NCHW with a batch of one
        y = lax.conv_general_dilated(x[None], k, (1, 1), "SAME")
        return jnp.max(y[0], axis=(1, 2))

    f = jax.vmap(one, in_axes=(0, None))
    np.testing.assert_allclose(
        jax.jit(convs.rewrite(f))(x, k), jax.jit(f)(x, k), rtol=1e-5, atol=1e-5
    )
    assert conv_layouts(f, x, k) != [NHWC]
    assert conv_layouts(convs.rewrite(f), x, k) == [NHWC]


def test_a_policy_without_convolutions_is_called_as_it_is():
    x = jnp.arange(3.0)
    f = lambda x: (jnp.sin(x) * 2, {"c": jnp.cos(x)})
    got, want = jax.jit(convs.rewrite(f))(x), jax.jit(f)(x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1]["c"], want[1]["c"])


def test_the_engine_gives_the_cpu_program_an_nhwc_policy():
    def policy(obs):  # an NCHW conv net on one [4, 6, 6] observation
        k = jnp.ones((2, 4, 3, 3), jnp.float32)
        y = lax.conv_general_dilated(obs[None], k, (1, 1), "VALID")
        return jnp.argmax(y.reshape(-1)) % 2

    pol = resolve_policy(policy, with_params=False)
    engine = Engine(pol, None, None)
    obs = jnp.zeros((3, 4, 6, 6), jnp.float32)
    keys = jnp.zeros((3, 2), jnp.uint32)
    apply = lambda o: engine.policy.apply(None, o, keys, None)[0]
    assert conv_layouts(apply, obs) == [NHWC]
    # Wrapping twice adds nothing.
    assert convs.canonical_convs(engine.policy) is engine.policy
