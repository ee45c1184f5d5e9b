"""Turns what a user passes as a policy into the engine's
``jaxmesh.types.Policy``: a plain single-lane function is wrapped here; anything
else provides ``as_policy`` (``jaxmesh.types.PolicyLike``, e.g. a Model).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.types import Policy, PolicyLike

#: The optional parameter telling a chunk corner how many of its actions the
#: run executes from one plan (CONTRACT 24).
EXECUTION_HORIZON = "execution_horizon"


def positional_arity(fn: Callable) -> int | None:
    """Required positional parameters of ``fn`` (None: unknowable)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    # Parameter kinds are ordered: positional-only, then positional-or-keyword.
    return sum(
        p.kind <= p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params
    )


def takes_param(fn: Callable, name: str) -> bool:
    """Whether ``fn``'s signature has a parameter called ``name``."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _wrap_function(fn: Callable, name: str, with_params: bool) -> tuple[Callable, bool]:
    """``fn(obs[, key])`` (``with_params``: ``fn(params, obs[, key])``; or an
    optional ``key=``) as a batched ``apply``: returns ``(apply, stochastic)``;
    TypeError for another arity."""
    arity = positional_arity(fn)
    base = 1 + int(with_params)
    if arity is None:
        arity = base
    if arity not in (base, base + 1):
        want = "(params, obs[, key])" if with_params else "(obs) or (obs, key)"
        raise TypeError(
            f"policy {name!r} takes {arity} required positional arguments; "
            f"expected {want}"
        )
    # A stochastic policy takes the key positionally, or as an optional `key=`.
    by_keyword = arity == base and takes_param(fn, "key")
    stochastic = arity == base + 1 or by_keyword

    def apply(params, obs, keys, rstate, execution_horizon=None):
        kw = {} if execution_horizon is None else {EXECUTION_HORIZON: execution_horizon}

        def one(params, obs, key):
            args = ((params,) if with_params else ()) + (obs,)
            if by_keyword:
                return fn(*args, key=key, **kw)
            return fn(*args, *((key,) if stochastic else ()), **kw)

        return jax.vmap(one, in_axes=(None, 0, 0))(params, obs, keys), rstate

    return apply, stochastic


def resolve_policy(policy: Any, *, with_params: bool) -> Policy:
    """Resolves a ``PolicyLike`` or a single-lane function (with
    ``with_params``: ``fn(params, obs[, key])``) into the engine's ``Policy``.

    Raises:
      TypeError: neither, a function of the wrong arity, or ``as_policy``
        returned no ``Policy``.
    """
    if isinstance(policy, PolicyLike):
        pol = policy.as_policy(with_params=with_params)
        if not isinstance(pol, Policy):
            raise TypeError(
                f"{type(policy).__name__}.as_policy returned a "
                f"{type(pol).__name__}; expected a jaxmesh.types.Policy"
            )
        if pol.device is None:  # numpy leaves put on the device once, not per call
            own = pol.default_params
            put = lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x
            pol = dataclasses.replace(
                pol, default_params=lambda: jax.tree.map(put, own())
            )
        return pol
    if not callable(policy):
        raise TypeError(
            f"policy {policy!r} is not callable: pass a function obs -> action "
            "(or chunk), or a jaxmesh.Model"
        )
    name = getattr(policy, "__name__", type(policy).__name__)
    apply, stochastic = _wrap_function(policy, name, with_params)
    return Policy(
        name=name,
        apply=apply,
        stochastic=stochastic,
        takes_execution_horizon=takes_param(policy, EXECUTION_HORIZON),
    )


def declares_chunk(policy: Policy) -> bool:
    """Whether the policy declares chunks."""
    return (
        policy.native_chunk is not None
        or policy.declares_chunk
        or policy.takes_execution_horizon
    )


def action_space(env: Any) -> str:
    """The env's action space in words, for messages."""
    a = tuple(env.action_shape)
    if env.num_actions is not None:
        return f"Discrete({env.num_actions}): one action is an int of shape {a}"
    return f"one action of shape {a}, {jnp.dtype(env.action_dtype)}"


def output_chunk(
    policy: Policy,
    out: jax.ShapeDtypeStruct,
    env: Any,
    horizon: int,
    rows: int,
    *,
    chunk_meant: bool = False,
) -> int | None:
    """Tells a chunk (returns K) from a single action (None) by shape; a chunk
    nobody asked for (``chunk_meant``: the run or inputs do) played at horizon
    1 warns (CONTRACT 11).

    Raises:
      TypeError: neither shape, or a float output for a discrete env.
      ValueError: the chunk length differs from the declared ``native_chunk``.
    """
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(
            f"policy {policy.name!r} returned a {type(out).__name__}; expected one "
            f"array of shape {tuple(env.action_shape)} (an action) or "
            f"(K,) + {tuple(env.action_shape)} (a chunk)"
        )
    a = tuple(env.action_shape)
    shape = tuple(out.shape[1:])
    if len(out.shape) == 0 or out.shape[0] != rows:
        raise TypeError(
            f"policy {policy.name!r}: its batched corner returned shape "
            f"{tuple(out.shape)} for a batch of {rows} rows; expected ({rows},) + "
            f"{a} or ({rows}, K) + {a}"
        )
    if shape == a:
        k = None
    elif len(shape) == len(a) + 1 and shape[1:] == a and shape[0] >= 1:
        k = shape[0]
    else:
        raise TypeError(
            f"policy {policy.name!r} returned shape {shape} per lane; the env's "
            f"action shape is {a}: return one action of shape {a} or a chunk of "
            f"shape (K,) + {a}"
        )
    if env.num_actions is not None and not jnp.issubdtype(out.dtype, jnp.integer):
        raise TypeError(
            f"policy {policy.name!r} returned {out.dtype} {shape} for a discrete env "
            f"with {env.num_actions} actions: return integer actions "
            "(e.g. jnp.argmax(logits, -1)), not logits or probabilities"
        )
    declared = policy.native_chunk
    if declared is not None and (k or 1) != declared:  # a single action: 1
        raise ValueError(
            f"policy {policy.name!r} declares native_chunk={declared} but its "
            f"prediction has length {k or 1} (shape {shape}); make them agree"
        )
    if k is not None and horizon == 1 and not (chunk_meant or declares_chunk(policy)):
        name = getattr(env, "name", type(env).__name__)
        warnings.warn(  # CONTRACT 11
            f"policy {policy.name!r} returned shape {shape} per lane, read as a chunk "
            f"of {k} actions for env {name!r} (action space {action_space(env)}); at "
            "horizon=1 only each chunk's first action is played. If the policy means "
            f"one action, return shape {a} (index what it computes, e.g. obs[2] "
            "instead of obs, or jnp.argmax(logits, -1)). If it means a chunk, declare "
            f"it to silence this warning: jaxmesh.Model(fn, native_chunk={k}), a "
            "predict_chunk corner or an execution_horizon parameter (and "
            f"horizon={k} plays all of it)",
            UserWarning,
            stacklevel=4,
        )
    if k is None and horizon > 1:
        warnings.warn(
            f"policy {policy.name!r} returns single actions, so horizon={horizon} "
            "cannot replay a chunk; it plans every step (horizon 1)",
            UserWarning,
            stacklevel=4,
        )
    return k
