"""Environment adapters: anything the user passes becomes one small ``Env``."""

from __future__ import annotations

from typing import Any

from jaxmesh.envs.brax import BraxEnv
from jaxmesh.envs.gymnax import GymnaxEnv

PREFIXES = ("gymnax", "brax")


def make_env(env: Any, **kwargs) -> Any:
    """Resolves what a user passes as ``env`` into a jaxmesh single-lane env.

    Args:
      env: an id string (``"gymnax:CartPole-v1"``, ``"brax:fast"``), a gymnax
        ``Environment``, an ``(env, env_params)`` tuple, a ``brax.envs.Env``, or
        an object already following ``jaxmesh.types.Env``.
      **kwargs: passed to the env constructor for id strings.

    Raises:
      ValueError: for an unknown id or prefix.
      TypeError: for anything else.
    """
    if isinstance(env, GymnaxEnv | BraxEnv):
        return env
    if isinstance(env, str):
        prefix, sep, name = env.partition(":")
        if not sep or prefix not in PREFIXES or not name:
            raise ValueError(
                f"unknown env id {env!r}: expected 'PREFIX:NAME' with PREFIX one of "
                f"{list(PREFIXES)}, e.g. 'gymnax:CartPole-v1' or 'brax:fast'"
            )
        if prefix == "gymnax":
            from jaxmesh.envs import gymnax

            return gymnax.make(name, **kwargs)
        from jaxmesh.envs import brax

        return brax.make(name, **kwargs)
    if isinstance(env, tuple) and len(env) == 2:
        return GymnaxEnv(env[0], env[1])
    mod = type(env).__module__
    if mod.startswith("gymnax."):
        return GymnaxEnv(env)
    if mod.startswith("brax.") or hasattr(env, "sys") and hasattr(env, "action_size"):
        return BraxEnv(env)
    if all(hasattr(env, a) for a in ("reset", "step", "action_shape", "action_dtype")):
        return env
    raise TypeError(
        f"env {env!r} is not an environment jaxmesh knows: pass an id such as "
        "'gymnax:CartPole-v1', a gymnax Environment or (env, params) tuple, a "
        "brax Env, or an object with reset/step/action_shape/action_dtype"
    )


__all__ = ["make_env", "GymnaxEnv", "BraxEnv"]
