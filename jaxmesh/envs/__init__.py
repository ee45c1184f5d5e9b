"""Environment adapters: anything the user passes becomes one small ``Env``.

Episode ends follow gymnasium's rule in every adapter: ``terminated`` is the
env's terminal state, ``truncated`` a time limit (both on a capped terminal
step); either ends the episode, and the last step's reward counts.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxmesh.envs import brax, envpool, gymnax, playground
from jaxmesh.envs.brax import BraxEnv
from jaxmesh.envs.gymnax import GymnaxEnv
from jaxmesh.envs.names import did_you_mean
from jaxmesh.envs.playground import PlaygroundEnv


def _make_playground(name: str, **kwargs: Any) -> PlaygroundEnv:
    try:
        return playground.make(name, **kwargs)
    except TypeError as e:
        if "unexpected keyword" not in str(e):
            raise
        raise TypeError(
            f"Playground env {name!r} does not take {sorted(kwargs)}: pass "
            "config_overrides={...} (Playground config keys), config, "
            "episode_length, randomize or menagerie (a MuJoCo Menagerie checkout)"
        ) from e


def _make_libero(name: str, **kwargs: Any) -> Any:
    from jaxmesh.envs import libero  # defines a gymnasium.Env: imports gymnasium

    return libero.make(name, **kwargs)


class Family(NamedTuple):
    """One env id prefix: its ``make(name, **kwargs)`` (None: stepped on the
    host), the pip extra it needs ('' for none) and its hint."""

    make: Callable[..., Any] | None
    extra: str
    hint: str


#: Every env id prefix jaxmesh knows.
FAMILIES: dict[str, Family] = {
    "gymnax": Family(
        gymnax.make,
        "gymnax",
        "gymnax:<id>, a gymnax env run in JAX (gymnax:CartPole-v1)",
    ),
    "brax": Family(brax.make, "brax", "brax:<name>, a brax env run in JAX (brax:ant)"),
    "playground": Family(
        _make_playground,
        "playground",
        "playground:<name>, a MuJoCo Playground env run in JAX "
        "(playground:CartpoleBalance)",
    ),
    "libero": Family(
        _make_libero,
        "libero",
        "libero:<suite>/<i>, a LIBERO task (libero:libero_spatial/0)",
    ),
    "envpool": Family(
        envpool.make,
        "envpool",
        "envpool:<id>, an EnvPool task stepped inside the jitted loop "
        "(envpool:HalfCheetah-v5)",
    ),
    "gymnasium": Family(
        None,
        "",
        "gymnasium:<id>, a gymnasium env stepped in this process "
        "(gymnasium:CartPole-v1)",
    ),
    "grpc": Family(
        None,
        "remote",
        "grpc://host:port, an env served by jaxmesh serve-env "
        "(grpcs://host:port over TLS)",
    ),
}

#: The prefixes ``make_env`` builds.
PREFIXES = tuple(p for p, f in FAMILIES.items() if f.make is not None)

#: What jaxmesh needs from an env of its own protocol (``jaxmesh.types.Env``).
PROTOCOL = {
    "name": "a str naming the env in results",
    "action_shape": "a tuple of ints, one lane's action shape",
    "action_dtype": "a dtype, int32 for discrete actions, float32 for continuous ones",
    "num_actions": "the number of discrete actions, or None for continuous ones",
    "reset": "reset(key) -> (obs, state)",
    "step": "step(key, state, action) -> (obs, state, reward, terminated, truncated)",
}

_KNOWN = (
    "pass an id such as 'gymnax:CartPole-v1', 'brax:ant' or "
    "'playground:CartpoleBalance', a gymnax Environment or (env, env_params) "
    "tuple, a brax Env, a MuJoCo Playground env, or an object with "
    + ", ".join(PROTOCOL)
    + " (jaxmesh.types.Env)"
)


def make_env(env: Any, **kwargs: Any) -> Any:
    """Resolves what a user passes as ``env`` into a jaxmesh single-lane env.

    Args:
      env: an id (``"gymnax:CartPole-v1"``, ``"brax:ant"``), a gymnax
        ``Environment`` or ``(env, env_params)`` tuple, a ``brax.envs.Env``, a
        MuJoCo Playground env, or an object that follows ``jaxmesh.types.Env``
        (every attribute in ``PROTOCOL``).
      **kwargs: for ids only, as the family's ``make`` takes them
        (``jaxmesh.envs.gymnax.make``: ``max_steps_in_episode=50``).

    Returns:
      A ``GymnaxEnv``, ``BraxEnv``, ``PlaygroundEnv`` or ``EnvPoolEnv``, or
      ``env`` itself when it follows the protocol; for a ``libero:`` id, a
      picklable factory of a ``LiberoEnv``.

    Raises:
      ValueError: for an unknown id or prefix (naming the closest ones).
      TypeError: for an object jaxmesh cannot use (naming each missing
        attribute), or kwargs the env does not take.

    Example:
      >>> env = make_env("gymnax:CartPole-v1", max_steps_in_episode=50)
      >>> env.num_actions
      2
    """
    if isinstance(env, str):
        return _from_id(env, kwargs)
    if kwargs:
        raise TypeError(
            f"make_env got keyword arguments {sorted(kwargs)} with an env object "
            f"({type(env).__name__}); they only apply to env ids: pass "
            "'PREFIX:NAME' with them, or build the env object with them yourself"
        )
    if isinstance(env, GymnaxEnv | BraxEnv | PlaygroundEnv):
        return env
    if isinstance(env, tuple) and len(env) == 2 and _loaded(env[0], *_LIBRARY[0][:2]):
        return GymnaxEnv(*env)
    for module, cls, adapt in _LIBRARY:
        if _loaded(env, module, cls):
            return adapt(env)
    return _check_protocol(env)


def _from_id(env_id: str, kwargs: dict) -> Any:
    prefix, sep, name = env_id.partition(":")
    if sep and prefix in PREFIXES and name:
        return FAMILIES[prefix].make(name, **kwargs)
    expected = (
        f"expected 'PREFIX:NAME' with PREFIX one of {list(PREFIXES)}, "
        "e.g. 'gymnax:CartPole-v1' or 'brax:ant'"
    )
    hints = [f.hint for f in FAMILIES.values()]
    if not sep:
        hint = did_you_mean(env_id, _all_ids(), key=lambda i: i.partition(":")[2])
        hint = f" {hint}" if hint else ""
        raise ValueError(
            f"env id {env_id!r} has no prefix;{hint} an env id names its kind "
            f"first: {'; '.join(hints)}"
        )
    if prefix not in PREFIXES:
        hint = did_you_mean(prefix, FAMILIES) or "known: " + "; ".join(hints)
        raise ValueError(f"unknown env prefix {prefix!r} in {env_id!r}; {hint}")
    raise ValueError(f"env id {env_id!r} names no env after {prefix!r} ({expected})")


def _all_ids() -> list[str]:
    """Every 'PREFIX:NAME' of the installed libraries (for hints)."""
    ids = []
    for prefix, module, names in (
        ("gymnax", "gymnax", "registered_envs"),
        ("brax", "brax.envs", "_envs"),
    ):
        try:
            ids += [f"{prefix}:{n}" for n in getattr(import_module(module), names)]
        except ImportError:
            pass
    if "mujoco_playground" in sys.modules:  # importing it takes seconds
        from mujoco_playground import registry

        ids += [f"playground:{n}" for n in registry.ALL_ENVS]
    return ids


#: A library's env class (module, name) and its adapter (a Playground env
#: keeps its config's episode_length and action_repeat).
_LIBRARY = (
    ("gymnax.environments.environment", "Environment", GymnaxEnv),
    ("brax.envs.base", "Env", brax.from_env),
    ("mujoco_playground._src.mjx_env", "MjxEnv", PlaygroundEnv),
)


def _loaded(env: Any, module: str, cls: str) -> bool:
    """Whether ``env`` is a ``module.cls`` (never while ``module`` is not loaded)."""
    mod = sys.modules.get(module)
    return mod is not None and isinstance(env, getattr(mod, cls))


def _check_protocol(env: Any) -> Any:
    missing = [a for a in PROTOCOL if not _has(env, a)]
    if missing:
        lacks = "; ".join(f"{a} ({PROTOCOL[a]})" for a in missing)
        raise TypeError(
            f"env {_short_repr(env)} is not an environment jaxmesh knows: it lacks "
            f"{lacks}. Add what is missing, or {_KNOWN}"
        )
    fits = {
        "name": lambda v: isinstance(v, str),
        "reset": callable,
        "step": callable,
        "action_shape": lambda v: all(operator.index(d) >= 0 for d in v),
        "action_dtype": lambda v: jnp.dtype(v) is not None,
        "num_actions": lambda v: (
            v is None or (not isinstance(v, bool) and operator.index(v) >= 1)
        ),
    }
    bad = []
    for a, fit in fits.items():
        value = getattr(env, a)
        try:
            ok = fit(value)
        except TypeError:
            ok = False
        if not ok:
            bad.append(f"{a} is not callable" if fit is callable else f"{a}={value!r}")
    if bad:
        expected = "; ".join(f"{a}: {d}" for a, d in PROTOCOL.items())
        raise TypeError(
            f"env {_short_repr(env)} has {', '.join(bad)}; jaxmesh needs {expected}"
        )
    return env


def _has(env: Any, attr: str) -> bool:
    # A property that raises (gymnax's NotImplementedError) provides nothing.
    try:
        getattr(env, attr)
    except Exception:
        return False
    return True


def _short_repr(env: Any) -> str:
    r = repr(env)
    return r if len(r) <= 80 else f"{type(env).__name__} object"


__all__ = [
    "make_env",
    "FAMILIES",
    "Family",
    "PREFIXES",
    "GymnaxEnv",
    "BraxEnv",
    "PlaygroundEnv",
    "PROTOCOL",
    "did_you_mean",
]
