"""``jaxmesh explain`` and ``jaxmesh describe``: what a run would read and
hold, and what a model says of itself, with nothing compiled."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Any

import jaxmesh
from jaxmesh.cli.build import build_run, import_target, run_config
from jaxmesh.cli.checks import is_jax_id, is_served, read_config
from jaxmesh.cli.errors import ConfigError, refused
from jaxmesh.envs.gymnasium import make_lanes
from jaxmesh.run.config import Served


def cmd_explain(args: argparse.Namespace) -> int:
    config = read_config(args)
    policy, env, run, _ = build_run(config)
    num_envs = run.num_envs
    if not is_jax_id(env):
        env, lanes = host_env_spec(env, config)
        num_envs = min(num_envs, lanes)
    try:
        explanation = jaxmesh.explain(policy, env, num_envs=num_envs)
    except (ValueError, TypeError) as e:
        raise ConfigError(refused(config, e)) from e
    print(explanation)
    return 0


def host_env_spec(env: str | list[str], config: dict[str, Any]) -> tuple[Any, int]:
    """The spaces of host-stepped envs as an env ``jaxmesh.explain`` reads.

    A ``gymnasium:<id>`` makes one env (then closes it); served envs are asked
    by handshake only (no session is opened, nothing is stepped).

    Returns:
      The spec (``jaxmesh.envs.gymnasium.HostEnvSpec``: shapes only) and how
      many lanes the env offers (a server's lanes; no limit for an id).

    Raises:
      ConfigError: an unknown gymnasium id, or a space jaxmesh does not read.
      jaxmesh.RemoteConnectionError: a server cannot be reached (status 1, as
        for a failed run).
    """
    try:
        if is_served(env):
            from jaxmesh.run.host.served import ServedLanes  # the [remote] extra: gRPC

            addresses = [env] if isinstance(env, str) else list(env)
            served = run_config(config).served or Served()
            lanes = ServedLanes(
                addresses,
                sys.maxsize,
                token=served.token,
                credentials=served.credentials,
            )
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


def cmd_describe(args: argparse.Namespace) -> int:
    obj = import_target(args.target)
    if inspect.isclass(obj):
        build = obj.from_config if hasattr(obj, "from_config") else obj
        try:
            model = build()
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(
                f"cannot build {args.target!r} with no config: {e}"
            ) from e
    else:
        model = obj
    describe = getattr(model, "describe", None)
    if not callable(describe):
        raise ConfigError(
            f"{args.target!r} ({type(model).__name__}) has no describe() method; "
            "describe needs a jaxmesh.Model (a jaxmesh version with Model.describe)"
        )
    print(json.dumps(describe(), indent=2, default=str))
    return 0
