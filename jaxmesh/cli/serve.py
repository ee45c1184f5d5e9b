"""``jaxmesh check-env`` and ``jaxmesh serve-env`` (its server, the ``[remote]``
extra, is imported when it runs); ``serve_until_stopped`` for both servers."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from jaxmesh.cli.build import (
    channel_credentials,
    need_packages,
    server_credentials,
    token_of,
)
from jaxmesh.cli.checks import check_env
from jaxmesh.cli.errors import ConfigError
from jaxmesh.envs import libero
from jaxmesh.envs.gymnasium.lanes import PREFIX, parse_id
from jaxmesh.run.backend import SERVED, backend_of
from jaxmesh.run.seed_check import check_seeds


def cmd_check_env(args: argparse.Namespace) -> int:
    """Prints ``jaxmesh.check_seeds``' report; 0 when reproducible, 1 when not."""
    env = args.env
    check_env(env)  # an address's form, before anything is dialled
    served = backend_of(env) == SERVED
    if not served and (args.token is not None or args.tls_ca is not None):
        raise ConfigError(
            f"--token / --tls-ca are for a served env (grpc://host:port); env "
            f"{env!r} runs in this process"
        )
    if args.tls_ca is not None and not Path(args.tls_ca).is_file():
        raise ConfigError(f"--tls-ca {args.tls_ca!r}: no such PEM file")
    need_packages(env)
    extra = {}
    if served:
        extra["token"] = token_of(args.token)
        extra["credentials"] = channel_credentials(args.tls_ca)
    try:
        report = check_seeds(env, args.seed, args.other, steps=args.steps, **extra)
    except (ValueError, TypeError, ImportError) as e:
        raise ConfigError(f"cannot check env {env!r}: {e}") from e
    print(report.message)
    return 0 if report.reproducible else 1


#: What ``serve-env`` takes as its env, for its refusals.
SERVE_ENV_FORMS = (
    "serve-env serves gymnasium envs: give gymnasium:<id> or <id> (e.g. "
    "gymnasium:CartPole-v1), or gymnasium:<module>:<id> for an env that <module> "
    "registers when imported"
)


def serve_env_id(env: str) -> str:
    """``serve-env``'s env as ``"gymnasium:<id>"``: a bare ``<id>`` gets the
    prefix, another prefix is a ConfigError (gymnasium would import it as a
    module and quietly serve its own env), as is an id ``parse_id`` refuses."""
    if env.startswith(PREFIX + ":"):
        full = env
    elif ":" not in env:
        full = f"{PREFIX}:{env}"
    else:
        first = env.partition(":")[0]
        if first.lower() in ("gymnax", "brax"):
            why = (
                f"{first}: envs are JAX envs: they run inside the evaluating "
                f"process (env: {env} in a run config), not on a server"
            )
        elif first.lower() in ("grpc", "grpcs"):
            why = "this is a served env's address (what eval connects to)"
        else:
            why = (
                f"gymnasium would import the module {first!r} first; if it "
                f"registers the env, give gymnasium:{env}"
            )
        raise ConfigError(f"env {env!r}: {why}; {SERVE_ENV_FORMS}")
    try:
        parse_id(full)
    except ValueError as e:
        raise ConfigError(f"{e} ({SERVE_ENV_FORMS})") from e
    return full


def _libero_lanes(env_id: str, env_config: str | None, lanes: int | None) -> Any:
    """``serve-env libero:<suite>/<i>``: a factory of its ``lanes`` envs, the
    id and ``--env-config`` checked now (ConfigError: a bad one, or LIBERO or
    its OpenGL library missing)."""
    try:
        options = json.loads(env_config) if env_config is not None else {}
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"--env-config {env_config!r}: not JSON ({e}); expected an object such "
            "as '{\"camera_size\": 128}'"
        ) from e
    if not isinstance(options, dict):
        raise ConfigError(
            f"--env-config {env_config!r}: expected a JSON object of the env's "
            "options (camera_size, settle_steps, max_episode_steps)"
        )
    if lanes is not None and (isinstance(lanes, bool) or lanes < 1):
        raise ConfigError(f"--lanes {lanes}: expected an int >= 1")
    name = env_id.partition(":")[2]
    try:
        libero.make(name, **options)
    except (ValueError, TypeError, ImportError, RuntimeError) as e:
        raise ConfigError(f"cannot serve {env_id!r}: {e}") from e
    return functools.partial(libero.make_envs, name, lanes or 1, **options)


@contextlib.contextmanager
def _native_stderr_held() -> Any:
    """Holds back what gRPC's C core writes to fd 2 within: written out after,
    dropped when it raises (the error is jaxmesh's one line)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as held:
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        text = held.read().decode("utf-8", "replace")
        if text:
            sys.stderr.write(text)
            sys.stderr.flush()


def cmd_serve_env(args: argparse.Namespace) -> int:
    """Serves a gymnasium env over gRPC until SIGTERM/SIGINT (exit 0)."""
    from jaxmesh.remote.server import EnvServer, ServeOptions  # [remote]: gRPC

    lanes = args.lanes
    if args.env.startswith("libero:"):
        env, lanes = _libero_lanes(args.env, args.env_config, lanes), None
    elif args.env_config is not None:
        raise ConfigError(
            f"--env-config with {args.env!r}: it applies to libero:<suite>/<i> ids; "
            "a gymnasium:<id> is made as registered: remove --env-config"
        )
    else:
        env = serve_env_id(args.env)
    check_ready_fd(args.ready_fd)
    credentials = server_credentials(args.tls_cert, args.tls_key)
    try:
        options = ServeOptions(
            idle_timeout_seconds=args.idle_timeout,
            allow_remote_shutdown=args.allow_remote_shutdown,
            token=token_of(args.token),
            workers=args.workers,
        )
        # A failed bind is reported as one line of ours, not after gRPC's log.
        with _native_stderr_held():
            server = EnvServer(
                env,
                args.address,
                options=options,
                lanes=lanes,
                insecure=args.insecure,
                credentials=credentials,
            ).start()
    except (ValueError, TypeError, OSError) as e:
        raise ConfigError(f"cannot serve {env!r} on {args.address!r}: {e}") from e

    return serve_until_stopped(
        server,
        f"jaxmesh serve-env: serving {args.env} ({server.num_lanes} lanes) at "
        f"{server.address}",
        args.ready_fd,
    )


def check_ready_fd(ready_fd: int | None) -> None:
    """Refuses a ``--ready-fd`` that is not an open file descriptor."""
    if ready_fd is None:
        return
    try:
        os.fstat(ready_fd)
    except OSError as e:
        raise ConfigError(
            f"--ready-fd {ready_fd}: not an open file descriptor ({e}); "
            "pass one the parent keeps open (e.g. subprocess pass_fds)"
        ) from e


def serve_until_stopped(server: Any, what: str, ready_fd: int | None) -> int:
    """Prints the started ``server``'s address (stdout) and ``what`` it serves
    (stderr), tells a parent on ``--ready-fd``, and returns 0 once SIGTERM or
    Ctrl-C has shut it down."""

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(server.address, flush=True)
    print(f"{what}; SIGTERM or Ctrl-C stops it", file=sys.stderr, flush=True)
    if ready_fd is not None:
        os.write(ready_fd, f"{server.address}\n".encode())
        os.close(ready_fd)
    while not server.wait(1.0):
        pass
    return 0
