"""A run's identity: digests of its policy, params and env, which ``resume=``
compares (docs/evaluation.md, "A run's identity"); a resumed run's indices."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxmesh.adapt import host_array
from jaxmesh.run.kept import Kept

_INDICES: contextvars.ContextVar = contextvars.ContextVar(
    "jaxmesh_resume_indices", default=None
)


def episode_indices(count: int) -> np.ndarray:
    """The budget index of each of a run's episodes (a resumed run's differ)."""
    got = _INDICES.get()
    return np.arange(count, dtype=np.int64) if got is None else got


@contextlib.contextmanager
def _within(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def resumed_indices(indices: np.ndarray) -> contextlib.AbstractContextManager:
    """Inside the block, ``episode_indices`` gives ``indices``."""
    return _within(_INDICES, indices)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# SGR escape sequences (colours), should a JAX version print them regardless.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _hasher() -> Any:
    return hashlib.blake2b(digest_size=16)


def _leaf_bytes(h: Any, leaf: Any) -> None:
    try:
        a = np.asarray(jax.device_get(leaf))
    except Exception:  # not an array (a key, an opaque object): its repr
        h.update(_ADDRESS.sub("", repr(leaf)).encode())
        return
    if a.dtype == object:
        h.update(_ADDRESS.sub("", repr(a.tolist())).encode())
        return
    # A value jax would convert (float64 numpy under 32-bit jax) digests as
    # the value the run evaluates.
    a = np.ascontiguousarray(host_array(a))
    h.update(f"{a.dtype}|{a.shape}|".encode())
    h.update(a.tobytes())


def program_digest(closed: Any) -> str:
    """A digest of a ``ClosedJaxpr``'s text (no colour, no addresses) and consts."""
    h = _hasher()
    text = closed.jaxpr.pretty_print(use_color=False)
    h.update(_ADDRESS.sub("", _ANSI.sub("", text)).encode())
    for c in closed.consts:
        _leaf_bytes(h, c)
    return h.hexdigest()


#: ``(env, digest)`` by the env's id: the env kept alive, so its id is not reused.
_ENVS = Kept()


def env_digest(env: Any) -> str:
    """A JAX env's digest: its name and its ``reset``, ``step``, ``draw`` programs."""
    return _ENVS.get(id(env), lambda: (env, _env_digest(env)))[1]


def _env_digest(env: Any) -> str:
    h = _hasher()
    h.update(f"{getattr(env, 'name', type(env).__name__)}|".encode())
    k = jax.ShapeDtypeStruct((2,), np.uint32)
    try:
        reset, (_, state) = jax.make_jaxpr(env.reset, return_shape=True)(k)
        action = jax.ShapeDtypeStruct(tuple(env.action_shape), env.action_dtype)
        step = jax.make_jaxpr(env.step)(k, state, action)
    except Exception as e:  # an env that cannot be traced apart: its type only
        h.update(f"untraced|{type(env).__module__}.{type(env).__qualname__}".encode())
        h.update(type(e).__name__.encode())
    else:
        h.update(program_digest(reset).encode())
        h.update(program_digest(step).encode())
    draw = getattr(env, "draw", None)  # a Playground env's domain randomizer
    if callable(draw):
        with contextlib.suppress(Exception):
            h.update(program_digest(jax.make_jaxpr(draw)(k)).encode())
    return h.hexdigest()


def host_env_digest(lanes: Any) -> str:
    """A host-stepped env's digest: its name, observation layout and actions."""
    spec, layout = lanes.spec, lanes.spec.layout
    h = _hasher()
    h.update(
        f"{spec.name}|{spec.action_shape}|{spec.action_dtype}|{spec.num_actions}|"
        f"{layout.names}|{layout.shapes}|{layout.dtypes}".encode()
    )
    return h.hexdigest()


_PARAMS: contextvars.ContextVar = contextvars.ContextVar(
    "jaxmesh_params_digest", default=None
)
_LAST: list = []  # (leaves, digest) of the last jax.Array params digested


def params_digest(params: Any) -> str | None:
    """A digest of the params' structure, dtypes, shapes and values (or None)."""
    if params is None:
        return None
    leaves = jax.tree.leaves(params)
    immutable = all(isinstance(x, jax.Array) for x in leaves)
    if immutable and _LAST and len(_LAST[0]) == len(leaves):
        if all(a is b for a, b in zip(_LAST[0], leaves, strict=True)):
            return _LAST[1]
    h = _hasher()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        h.update(f"{jax.tree_util.keystr(path)}|".encode())
        _leaf_bytes(h, leaf)
    digest = h.hexdigest()
    if immutable:
        _LAST[:] = [leaves, digest]
    return digest


def evaluating(fields: dict) -> contextlib.AbstractContextManager:
    """Within: the caller's fingerprint fields, for ``run_identity``."""
    return _within(_PARAMS, dict(fields))


def run_identity(env: str, policy: str) -> dict:
    """``RunResult.fingerprint``: ``evaluating``'s fields, digests, JAX version."""
    out = dict(_PARAMS.get() or {})
    out.update(env=env, policy=policy, jax=jax.__version__)
    return out
