"""``jaxmesh serve-policy``: a model served to simulator or robot clients,
their requests batched (``jaxmesh.PolicyServer``; the server is the
``[serve]`` extra, imported when the command runs)."""

from __future__ import annotations

import argparse
from typing import Any

from jaxmesh.cli.build import is_config_file, load_policy, tls_files, token_of
from jaxmesh.cli.config import load_config
from jaxmesh.cli.errors import ConfigError
from jaxmesh.cli.explain import served_inputs
from jaxmesh.cli.serve import check_ready_fd, serve_until_stopped


def declared_inputs(args: argparse.Namespace, policy: Any) -> dict | None:
    """The observation a request holds (``PolicyServer(inputs=)``, openpi
    only): the ``--input`` options, else what a run config's env gives
    (ConfigError: a malformed or repeated ``--input``, or one with grpc)."""
    from jaxmesh.serve.forward import parse_input

    given = args.input
    if args.protocol != "openpi":
        if given:
            raise ConfigError(
                f"--input {given[0]!r}: --protocol {args.protocol} reads each "
                "client's observation layout from its session; drop --input"
            )
        return None
    if not given and is_config_file(args.policy):
        return served_inputs(policy, load_config(args.policy))
    inputs: dict = {}
    for text in given or ():
        try:
            key, leaf = parse_input(text)
        except ValueError as e:
            raise ConfigError(f"--input: {e}") from e
        if key in inputs:
            raise ConfigError(f"--input {text!r}: key {key!r} is given twice")
        inputs[key] = tuple(leaf)
    return inputs or None


def cmd_serve_policy(args: argparse.Namespace) -> int:
    """Serves a policy until SIGTERM/SIGINT (exit 0)."""
    try:
        from jaxmesh.serve import PolicyServer  # [serve]: websockets, msgpack
    except ImportError as e:
        raise ConfigError(str(e)) from e

    check_ready_fd(args.ready_fd)
    tls = tls_files(args.tls_cert, args.tls_key)
    policy = load_policy(args.policy)
    inputs = declared_inputs(args, policy)
    try:
        server = PolicyServer(
            policy,
            args.address,
            protocol=args.protocol,
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            idle_timeout=args.idle_timeout,
            max_lanes=args.max_lanes,
            token=token_of(args.token),
            tls=tls,
            insecure=args.insecure,
            inputs=inputs,
        ).start()
    except (ValueError, TypeError, OSError) as e:
        raise ConfigError(
            f"cannot serve {args.policy!r} on {args.address!r}: {e}"
        ) from e

    return serve_until_stopped(
        server,
        f"jaxmesh serve-policy: serving {args.policy} ({args.protocol}, max batch "
        f"{args.max_batch}) at {server.url}; a request holds {server.expects}",
        args.ready_fd,
    )
