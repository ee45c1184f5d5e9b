"""``jaxmesh explain`` and ``jaxmesh describe``, nothing compiled."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Any

import jax

import jaxmesh
from jaxmesh import adapt
from jaxmesh.cli.build import (
    CONFIG_SUFFIXES,
    build_env,
    build_run,
    config_policy,
    import_target,
)
from jaxmesh.cli.checks import read_config
from jaxmesh.cli.config import load_config
from jaxmesh.cli.errors import ConfigError, refused
from jaxmesh.core.policy import resolve_policy
from jaxmesh.envs.gymnasium import make_lanes
from jaxmesh.run.backend import SCAN, SERVED, backend_of
from jaxmesh.run.config import Served
from jaxmesh.run.footprint import KEY
from jaxmesh.serve.forward import STATE_KEYS


def cmd_explain(args: argparse.Namespace) -> int:
    config = read_config(args.config, args.set)
    policy, env, run, _ = build_run(config)
    num_envs = run.num_envs
    if backend_of(env) != SCAN:
        env, lanes = host_env_spec(env, run.served)
        num_envs = min(num_envs, lanes)
    try:
        explanation = jaxmesh.explain(policy, env, num_envs=num_envs)
    except (ValueError, TypeError) as e:
        raise ConfigError(refused(config, e)) from e
    print(explanation)
    return 0


def host_env_spec(
    env: str | list[str], served: Served | None = None
) -> tuple[Any, int]:
    """The spaces of host-stepped envs (a ``gymnasium:<id>`` made once, served
    envs asked by handshake) as a ``HostEnvSpec``, and the lanes the env offers
    (no limit for an id); ConfigError: an unknown id or an unread space (an
    unreachable server raises ``RemoteConnectionError``, as a failed run)."""
    try:
        if backend_of(env) == SERVED:
            from jaxmesh.run.host.served import ServedLanes  # the [remote] extra: gRPC

            addresses = [env] if isinstance(env, str) else list(env)
            s = served or Served()
            kw = {"token": s.token, "credentials": s.credentials}
            lanes = ServedLanes(addresses, sys.maxsize, **kw)
            count = lanes.num_lanes
        else:
            lanes = make_lanes(env, 1, 1)
            count = sys.maxsize
    except (ValueError, TypeError) as e:
        raise ConfigError(f"cannot read the spaces of env {env!r}: {e}") from e
    try:
        return lanes.spec, count
    finally:
        lanes.close()


def served_inputs(policy: Any, config: dict[str, Any]) -> dict[str, tuple] | None:
    """What ``policy`` served for ``config``'s env reads, as
    ``PolicyServer(inputs=)`` takes it (key -> ``(shape, dtype)``); None when
    that cannot be told here."""
    env = config.get("env")
    if not isinstance(env, str) or backend_of(env) == SERVED:
        return None
    try:
        if backend_of(env) == SCAN:
            made = build_env(env, config.get("env_config") or {})
            obs = jax.eval_shape(lambda k: made.reset(k)[0], KEY)
        else:
            lay = host_env_spec(env)[0].layout
            leaf = lambda n: jax.ShapeDtypeStruct(lay.shapes[n], lay.dtypes[n])
            obs = jax.tree.map(leaf, lay.skeleton)
        spec = resolve_policy(policy, with_params=False).spec
    except Exception:  # noqa: BLE001 - then the inputs are not declared
        return None
    if hasattr(obs, "shape"):
        if spec is not None and any(k is not None for k in adapt.read_keys(spec)):
            return None
        return {STATE_KEYS[0]: (tuple(obs.shape), obs.dtype)}
    if not isinstance(obs, dict) or not all(hasattr(v, "shape") for v in obs.values()):
        return None
    reads = adapt.read_keys(spec)
    keys = list(obs) if None in reads else reads
    if any(k not in obs for k in keys):
        return None
    return {k: (tuple(obs[k].shape), obs[k].dtype) for k in keys}


def cmd_describe(args: argparse.Namespace) -> int:
    config = None
    if args.target.endswith(CONFIG_SUFFIXES):
        config = load_config(args.target)
        obj = config_policy(config, args.target)
    else:
        obj = import_target(args.target)
    model = obj
    if inspect.isclass(obj):
        try:
            model = getattr(obj, "from_config", obj)()
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(
                f"cannot build {args.target!r} with no config: {e}"
            ) from e
    describe = getattr(model, "describe", None)
    if not callable(describe):
        raise ConfigError(
            f"{args.target!r} ({type(model).__name__}) has no describe() method; "
            "describe needs a jaxmesh.Model (a jaxmesh version with Model.describe)"
        )
    out = describe()
    # What the model reads, with shapes where a run config's env tells them.
    inputs = None if config is None else served_inputs(model, config)
    if inputs is not None:
        out["inputs"] = {
            k: {"shape": list(shape), "dtype": str(dtype)}
            for k, (shape, dtype) in inputs.items()
        }
    elif out.get("spec") is not None:
        out["inputs"] = f"the observation keys {out.get('reads')} (see spec)"
    else:
        out["inputs"] = (
            "the whole observation, as the env gives it (no spec). Served over "
            "openpi's protocol, declare its shape (serve-policy --input "
            "observation/state=float32[N], or serve a run config: its env tells it); "
            "clients then send it under 'observation/state', 'state' or 'obs'"
        )
    print(json.dumps(out, indent=2, default=str))
    return 0
