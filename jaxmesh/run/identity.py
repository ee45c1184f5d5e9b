"""A run's identity: digests of the policy's traced program, its params and the
env, which ``resume=`` compares (docs/evaluation.md, "A run's identity"), and the
budget index of each episode of a resumed run.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import hashlib
import re
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

# The budget index of each episode of a run (a resumed run runs some of them) --
_INDICES: contextvars.ContextVar = contextvars.ContextVar(
    "jaxmesh_resume_indices", default=None
)


def episode_indices(count: int) -> np.ndarray:
    """The budget index of each of a run's ``count`` episodes: ``0..count-1``,
    or inside a resumed run the missing episodes' indices."""
    got = _INDICES.get()
    return np.arange(count, dtype=np.int64) if got is None else got


@contextlib.contextmanager
def resumed_indices(indices: np.ndarray) -> Iterator[None]:
    """Inside the block, ``episode_indices`` gives ``indices`` (a resumed
    run's missing episodes, ``jaxmesh.run.resume``)."""
    token = _INDICES.set(indices)
    try:
        yield
    finally:
        _INDICES.reset(token)


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
    a = np.ascontiguousarray(
        a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False)
    )
    h.update(f"{a.dtype}|{a.shape}|".encode())
    h.update(a.tobytes())


def tree_digest(tree: Any) -> str | None:
    """A digest of a pytree's structure, dtypes, shapes and values (None for
    None). Reads every leaf to the host."""
    if tree is None:
        return None
    h = _hasher()
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        h.update(f"{jax.tree_util.keystr(path)}|".encode())
        _leaf_bytes(h, leaf)
    return h.hexdigest()


def program_text(jaxpr: Any) -> str:
    """A jaxpr's text as every process prints it: without colour (``str``
    colours it on a terminal) and object addresses."""
    text = jaxpr.pretty_print(use_color=False)
    return _ADDRESS.sub("", _ANSI.sub("", text))


def program_digest(closed: Any) -> str:
    """A digest of a ``ClosedJaxpr``: its ``program_text`` and its constants."""
    h = _hasher()
    h.update(program_text(closed.jaxpr).encode())
    for c in closed.consts:
        _leaf_bytes(h, c)
    return h.hexdigest()


# The env ------------------------------------------------------------------------
_ENVS: collections.OrderedDict = collections.OrderedDict()


def env_digest(env: Any) -> str:
    """A JAX env's digest: its name and the programs of its ``reset``,
    ``step`` and (a Playground env's randomizer) ``draw``, traced for shapes
    once per env object."""
    key = id(env)
    if key in _ENVS:
        return _ENVS[key][1]
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
    _ENVS[key] = (env, h.hexdigest())  # the env kept alive: its id is not reused
    while len(_ENVS) > 16:
        _ENVS.popitem(last=False)
    return _ENVS[key][1]


def host_env_digest(lanes: Any) -> str:
    """A host-stepped env's digest: its name, observation layout (leaf names,
    shapes, dtypes) and action shape, dtype and count, as every kind of lanes
    (in process, workers, served) sees them alike."""
    spec = lanes.spec
    layout = spec.layout
    h = _hasher()
    h.update(f"{spec.name}|{spec.action_shape}|{spec.action_dtype}|".encode())
    h.update(f"{spec.num_actions}|{layout.names}|{layout.shapes}|".encode())
    h.update(f"{layout.dtypes}".encode())
    return h.hexdigest()


_PARAMS: contextvars.ContextVar = contextvars.ContextVar(
    "jaxmesh_params_digest", default=None
)
_LAST: list = []  # (leaves, digest) of the last jax.Array params digested


def params_digest(params: Any) -> str | None:
    """``tree_digest`` of the params a run evaluates (None: none); the very
    ``jax.Array`` leaves digested last time are not read again."""
    if params is None:
        return None
    leaves = jax.tree.leaves(params)
    immutable = all(isinstance(x, jax.Array) for x in leaves)
    if immutable and _LAST and len(_LAST[0]) == len(leaves):
        if all(a is b for a, b in zip(_LAST[0], leaves, strict=True)):
            return _LAST[1]
    digest = tree_digest(params)
    if immutable:
        _LAST[:] = [leaves, digest]
    return digest


@contextlib.contextmanager
def evaluating(fields: dict) -> Iterator[None]:
    """Within: the fingerprint fields only the caller knows, for ``run_identity``."""
    token = _PARAMS.set(dict(fields))
    try:
        yield
    finally:
        _PARAMS.reset(token)


def run_identity(env: str, policy: str) -> dict:
    """The fingerprint a run records (``RunResult.fingerprint``): the fields
    given to ``evaluating``, the env's and policy's digests, the JAX version."""
    out = dict(_PARAMS.get() or {})
    out.update(env=env, policy=policy, jax=jax.__version__)
    return out


__all__ = [
    "episode_indices",
    "resumed_indices",
    "tree_digest",
    "program_text",
    "program_digest",
    "env_digest",
    "host_env_digest",
    "params_digest",
    "evaluating",
    "run_identity",
]
