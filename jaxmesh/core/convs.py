"""A policy's 2-D convolutions in the layout XLA:CPU runs fast inside loops.

XLA:CPU rewrites a non-NHWC/HWIO convolution to its fast kernel only at a
program's top level; in the engine's loop body it runs on a naive loop, ten
times slower. ``canonical_convs`` writes each as transpose -> NHWC/HWIO
convolution -> transpose, inlining the policy's ``jit``-ed functions and
custom derivative rules (not its own loops or ``cond``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend import core as jcore

#: NHWC, HWIO, NHWC as ``ConvDimensionNumbers`` holds them.
_LHS, _RHS, _OUT = (0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)

#: Calls whose inner jaxpr is inlined when it holds a convolution to rewrite.
_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call")
_CALLS += ("custom_vjp_call", "custom_vjp_call_jaxpr", "checkpoint", "remat")


def canonical_convs(policy: Any) -> Any:
    """``policy`` (a ``jaxmesh.types.Policy``) with its ``apply`` rewritten."""
    if getattr(policy.apply, "_canonical_convs", False):
        return policy
    return dataclasses.replace(policy, apply=rewrite(policy.apply))


def rewrite(fn: Any) -> Any:
    """``fn`` with its non-NHWC 2-D convolutions written as NHWC ones."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        f = functools.partial(fn, **kwargs)
        closed, shape = jax.make_jaxpr(f, return_shape=True)(*args)
        out = _eval(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), out)

    wrapped._canonical_convs = True
    return wrapped


def _slow(eqn: Any) -> bool:
    """A 2-D convolution XLA:CPU would run on its naive loop in a loop body."""
    if eqn.primitive.name != "conv_general_dilated":
        return False
    p = eqn.params
    dn = p["dimension_numbers"]
    return (
        len(dn.lhs_spec) == 4
        and (tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec))
        != (_LHS, _RHS, _OUT)
        and p["batch_group_count"] == 1
        and all(d == 1 for d in p["lhs_dilation"])
        and p.get("out_sharding") is None
    )


def _inner(eqn: Any) -> Any:
    """The inlinable (jaxpr, consts) of a call eqn, or None."""
    if eqn.primitive.name not in _CALLS:
        return None
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        value = eqn.params.get(name)
        if isinstance(value, jcore.ClosedJaxpr):
            return value.jaxpr, value.consts
        if isinstance(value, jcore.Jaxpr) and not value.constvars:
            return value, ()
    return None


def _needs(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` holds a convolution ``_eval`` rewrites."""
    return any(
        _slow(eqn) or ((inner := _inner(eqn)) is not None and _needs(inner[0]))
        for eqn in jaxpr.eqns
    )


def _eval(jaxpr: Any, consts: Any, args: Any) -> list:
    """``jaxpr``'s values, with the convolutions to rewrite rewritten."""
    env = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        inner = _inner(eqn)
        if _slow(eqn):
            outs = [_conv(*invals, **eqn.params)]
        elif inner is not None and _needs(inner[0]):
            outs = _eval(inner[0], inner[1], invals)
        else:
            # (subfuns, params) in JAX releases before 0.7, params since.
            bound = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *invals, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, x in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jcore.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _conv(lhs: Any, rhs: Any, *, dimension_numbers: Any, **params: Any) -> Any:
    """One convolution as transpose -> NHWC/HWIO convolution -> transpose."""
    dn = dimension_numbers
    lhs_b, lhs_f, *lhs_s = dn.lhs_spec
    out_o, out_i, *rhs_s = dn.rhs_spec
    x = lax.transpose(lhs, (lhs_b, *lhs_s, lhs_f))
    k = lax.transpose(rhs, (*rhs_s, out_i, out_o))
    canonical = lax.ConvDimensionNumbers(_LHS, _RHS, _OUT)
    y = lax.conv_general_dilated_p.bind(x, k, dimension_numbers=canonical, **params)
    # y is (batch, *spatial, feature); the result keeps the asked layout.
    b, f, *s = dn.out_spec
    return lax.transpose(y, tuple(np.argsort((b, *s, f)).tolist()))
