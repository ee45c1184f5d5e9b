"""Turns what a user passes as a policy into one batched apply function.

Whatever the user wrote (a single-lane function, or a ``jaxmesh.Model`` with any
of its corners), the engine sees ``apply(params, inputs, keys, rstate) ->
(outputs, rstate)`` over a batch of rows, plus what it needs to know: whether the
policy is stochastic or recurrent, its declared chunk length and its spec.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.model import Model, positional_arity, takes_param


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    name: str
    apply: Callable[..., tuple[Any, Any]]
    stochastic: bool
    initial_state: Callable[[], Any] | None
    native_chunk: int | None
    spec: dict | None
    params: Any
    model: Model | None


def _wrap_function(fn: Callable, name: str, with_params: bool) -> tuple[Callable, bool]:
    """A single-lane function as a batched (params, obs, keys) -> out."""
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

    def one(params, obs, key):
        args = ((params,) if with_params else ()) + (obs,)
        if by_keyword:
            return fn(*args, key=key)
        if stochastic:
            args += (key,)
        return fn(*args)

    def apply(params, obs, keys, rstate):
        out = jax.vmap(one, in_axes=(None, 0, 0))(params, obs, keys)
        return out, rstate

    return apply, stochastic


def _model_apply(model: Model) -> tuple[Callable, bool]:
    """The batched corner of an authored model, derived by vmap where missing."""
    own = model.corners()
    if "predict_chunk_batch" in own or "predict_chunk" in own:
        batch_name, single_name = "predict_chunk_batch", "predict_chunk"
    else:
        batch_name, single_name = "predict_batch", "predict"
    batched = batch_name in own
    corner = getattr(model, batch_name if batched else single_name)
    stochastic = takes_param(corner, "key")
    recurrent = model.recurrent

    def call(obs, key, state):
        kw = {}
        if stochastic:
            kw["key"] = key
        if recurrent:
            kw["state"] = state
        out = corner(obs, **kw)
        if recurrent:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"{model.name}.{corner.__name__} is recurrent (the model "
                    "defines initial_state) and must return (output, new_state)"
                )
            return out
        return out, state

    def apply(params, obs, keys, rstate):
        with model.bound(params):
            if batched:
                return call(obs, keys, rstate)
            return jax.vmap(call)(obs, keys, rstate)

    return apply, stochastic


def resolve_policy(policy: Any, *, with_params: bool) -> Policy:
    """Resolves a user policy.

    Args:
      policy: a callable or a ``jaxmesh.Model``.
      with_params: True for ``make_evaluator``, where a plain function takes the
        params first (``fn(params, obs[, key])``).
    """
    if isinstance(policy, Model):
        model = policy
        # load() may set the spec or native_chunk as well as the weights.
        model._ensure_loaded()
        if model._fn is not None:
            apply, stochastic = _wrap_function(
                model._fn, model.name, with_params or model._fn_takes_params
            )
            fn_params = model._fn_takes_params or with_params
            if not fn_params:
                inner = apply
                apply = lambda params, obs, keys, rstate: inner(None, obs, keys, rstate)
        else:
            apply, stochastic = _model_apply(model)
        return Policy(
            name=model.name,
            apply=apply,
            stochastic=stochastic,
            initial_state=model.initial_state if model.recurrent else None,
            native_chunk=model.native_chunk,
            spec=model.spec,
            params=model.params,
            model=model,
        )
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
        initial_state=None,
        native_chunk=None,
        spec=None,
        params=None,
        model=None,
    )


def output_chunk(
    policy: Policy, out: jax.ShapeDtypeStruct, env: Any, horizon: int, rows: int
) -> int | None:
    """Tells a chunk (returns K) from a single action (returns None) by shape.

    Raises:
      TypeError: the output is neither ``action_shape`` nor ``(K,) + action_shape``,
        or a float output for a discrete env.
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
    if declared is not None:
        got = k if k is not None else 1
        if got != declared:
            raise ValueError(
                f"policy {policy.name!r} declares native_chunk={declared} but its "
                f"prediction has length {got} (shape {shape}); make them agree"
            )
    if k is None and horizon > 1:
        warnings.warn(
            f"policy {policy.name!r} returns single actions, so horizon={horizon} "
            "cannot replay a chunk; it plans every step (horizon 1)",
            UserWarning,
            stacklevel=4,
        )
    return k
