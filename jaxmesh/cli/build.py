"""Builds what a checked run config names: the policy, the env (or a suite) and
``jaxmesh.evaluate``'s arguments; served envs' and policies' credentials (the
session token, TLS from PEM files: gRPC, the ``[remote]`` extra, is imported
only when TLS is asked for)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
from pathlib import Path
from typing import Any

from jaxmesh.cli.checks import execution_of
from jaxmesh.cli.config import load_config
from jaxmesh.cli.errors import ConfigError, refused
from jaxmesh.envs import PREFIXES, make_env
from jaxmesh.envs.gymnasium.lanes import is_factory
from jaxmesh.errors import RemoteConnectionError, RemotePolicyError
from jaxmesh.host_policy import HostPolicy
from jaxmesh.model import Model, resolve_class
from jaxmesh.remote.address import require_grpc
from jaxmesh.remote.protocol import TOKEN_ENV
from jaxmesh.run.backend import HOST, SERVED, backend_of
from jaxmesh.run.config import FLAT, GROUP_OF, RunConfig
from jaxmesh.suite import Suite, Task
from jaxmesh.types import PolicyLike


def import_target(target: str) -> Any:
    """Imports ``module:Name`` (``Name`` may be dotted); ConfigError if it cannot."""
    try:
        return resolve_class(target)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e


#: What building a policy raises for bad input (a served policy's server: not
#: there, or refusing).
_BUILD_ERRORS = (TypeError, ValueError, FileNotFoundError, RemotePolicyError)
_BUILD_ERRORS += (RemoteConnectionError,)


def build_policy(target: str, policy_config: dict[str, Any], host: bool = False) -> Any:
    """The policy ``module:Name`` names: a class, or a function given
    ``policy_config``, built from it; anything else as it is (``host``: a
    function as ``jaxmesh.HostPolicy(fn)``). A Model loads here, so that a bad
    checkpoint is a ConfigError, as is any target that cannot be built."""
    obj = import_target(target)
    if host and (inspect.isclass(obj) or isinstance(obj, PolicyLike)):
        raise ConfigError(
            f"policy {target!r} is a {type(obj).__name__}; host: true wraps a "
            "function obs -> action in jaxmesh.HostPolicy. Drop host:, or point "
            "policy at a function"
        )
    factory = policy_config and inspect.isfunction(obj) and not host
    if inspect.isclass(obj) or factory:
        how = "from_config" if hasattr(obj, "from_config") else "constructor"
        build = obj.from_config if how == "from_config" else obj
        try:
            policy = build(**policy_config)
            if isinstance(policy, Model):
                policy._ensure_loaded()
        except _BUILD_ERRORS as e:
            raise ConfigError(
                f"cannot build policy {target!r} ({how}) from policy_config "
                f"{policy_config!r}: {e}"
            ) from e
        if factory and not isinstance(policy, PolicyLike):
            raise ConfigError(
                f"policy {target!r} with policy_config {policy_config!r} returned "
                f"a {type(policy).__name__}, not a policy: a function given "
                "policy_config builds one (a jaxmesh.Model, a HostPolicy, ...); "
                "drop policy_config to use the function itself as the policy"
            )
        return policy
    if not (isinstance(obj, PolicyLike) or callable(obj)):
        raise ConfigError(
            f"policy {target!r} is a {type(obj).__name__}; expected a class, a "
            "jaxmesh.Model or jaxmesh.HostPolicy instance, or a function obs -> action"
        )
    if policy_config:
        what = f"a {type(obj).__name__} instance"
        if host:
            what = "a function host: true wraps as it is"
        raise ConfigError(
            f"policy {target!r} is {what}, so it takes no policy_config; got "
            f"{policy_config!r}. Remove policy_config, or point policy at a class "
            "or a function that builds the policy from it"
        )
    if isinstance(obj, Model):
        try:
            obj._ensure_loaded()
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(f"cannot load policy {target!r}: {e}") from e
    if host:
        return HostPolicy(obj, name=target.rpartition(":")[2])
    return obj


#: A run config's suffixes: the target is then read as a config file.
CONFIG_SUFFIXES = (".yaml", ".yml")


def is_config_file(target: str) -> bool:
    return target.endswith(CONFIG_SUFFIXES) or Path(target).is_file()


def close(*policies: Any) -> None:
    """Ends served policies' connections (a policy without ``close`` has none)."""
    for policy in policies:
        if callable(getattr(policy, "close", None)):
            policy.close()


def load_policy(target: str) -> Any:
    """The policy a run config file or ``module:attr`` names (ConfigError: it
    cannot be read, imported or built)."""
    if is_config_file(target):
        return config_policy(load_config(target), target)
    if ":" not in target:
        raise ConfigError(
            f"{target!r} is neither a run config (.yaml) nor module:attr (e.g. "
            "my_policies:MyModel); give one of them"
        )
    return build_policy(target, {})


def config_policy(config: dict[str, Any], target: str = "") -> Any:
    """The policy of ``config`` (read from ``target``) built from its
    ``policy_config``; ConfigError if it cannot be."""
    policy = config.get("policy")
    if not isinstance(policy, str):
        raise ConfigError(
            f"config file {target!r} names no policy (policy: module:Name); "
            "serve-policy serves the policy a run config names"
        )
    policy_config = config.get("policy_config") or {}
    if not isinstance(policy_config, dict):
        raise ConfigError(
            f"config file {target!r}: policy_config is a "
            f"{type(policy_config).__name__}; expected a mapping"
        )
    return build_policy(policy, policy_config, bool(config.get("host")))


def build_suite(tasks: dict[str, dict[str, Any]]) -> Any:
    """A checked ``tasks:`` mapping as a ``jaxmesh.Suite``."""
    built = {}
    for name, t in tasks.items():
        env = build_env(t["env"], t["env_config"])
        try:
            keys = ("instruction", "episodes", "seeds", "trial_index_base")
            built[name] = Task(env, **{k: t.get(k) for k in keys})
        except (ValueError, TypeError) as e:
            raise ConfigError(f"tasks.{name}: {e}") from e
    return Suite(built)


def build_env(env_id: str | list[str], env_config: dict[str, Any]) -> Any:
    """The env to evaluate on: ``make_env(env_id, **env_config)``, an env
    factory, or a ``gymnasium:<id>`` or served addresses as they are."""
    if backend_of(env_id) in (SERVED, HOST):
        need_packages(env_id)
        return env_id
    factory = env_factory(env_id, env_config)
    if factory is not None:
        return factory
    try:
        return make_env(env_id, **env_config)
    except (ValueError, TypeError, ImportError) as e:
        given = f" with env_config {env_config!r}" if env_config else ""
        text = f"cannot make env {env_id!r}{given}: {e}"
        if env_id.partition(":")[0] not in PREFIXES:
            text += f"; {_OWN_ENV}"
        raise ConfigError(text) from e


def need_packages(env_id: Any) -> None:
    """Refuses a served env without gRPC, a gymnasium: id without gymnasium."""
    if backend_of(env_id) == SERVED:
        try:
            require_grpc()
        except ImportError as e:
            raise ConfigError(f"env={env_id!r}: {e}") from e
    elif backend_of(env_id) == HOST and importlib.util.find_spec("gymnasium") is None:
        raise ConfigError(
            f"env={env_id!r}: gymnasium is not installed; run: pip install "
            "gymnasium (gymnasium[mujoco] for the MuJoCo envs)"
        )


#: How a config names an env of the user's own.
_OWN_ENV = (
    "an env of your own is gymnasium:<module>:<Id> (importing <module> registers "
    "<Id> with gymnasium) or <module>:<function>, a function that returns a "
    "gymnasium.Env (env_config: its keyword arguments)"
)


def env_factory(env_id: str, env_config: dict[str, Any]) -> Any:
    """The env factory ``env: module:function`` names, with ``env_config`` as
    its keyword arguments; None for another kind of id (ConfigError: the
    module imports but holds no such factory)."""
    module, sep, _ = env_id.partition(":")
    if not sep or module in PREFIXES or not module.replace(".", "").isidentifier():
        return None
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):  # a parent package that is missing
        return None
    try:
        obj = import_target(env_id)
    except ConfigError as e:
        raise ConfigError(f"env {env_id!r}: {e}; {_OWN_ENV}") from e
    if not is_factory(obj):
        noun = type(obj).__name__
        a = "an" if noun[:1].lower() in "aeiou" else "a"
        raise ConfigError(
            f"env {env_id!r} is {a} {noun}, not an env factory; {_OWN_ENV}"
        )
    return functools.partial(obj, **env_config) if env_config else obj


def run_config(config: dict[str, Any]) -> RunConfig:
    """A config's ``jaxmesh.RunConfig``, built (and so checked) once, from its
    flat keys (``prefetch_lead`` is ``Chunking.prefetch_lead``); ConfigError
    with the refusal's message."""
    fields = set(FLAT) | set(GROUP_OF)
    settings = {k: v for k, v in config.items() if k in fields and v is not None}
    if not settings.get("check_seeds"):
        settings.pop("check_seeds", None)
    if "execution" in settings:
        settings["execution"] = execution_of(settings["execution"])
    if config.get("tls_ca") is not None:
        settings["credentials"] = channel_credentials(config["tls_ca"])
    groups: dict[str, dict[str, Any]] = {}
    for name in [k for k in settings if k in GROUP_OF]:
        groups.setdefault(GROUP_OF[name], {})[name] = settings.pop(name)
    try:  # RunConfig builds each group from its mapping
        return RunConfig(**settings, **groups)
    except (ValueError, TypeError) as e:  # a refusal, before anything is built
        raise ConfigError(refused(config, e)) from e


def build_run(config: dict[str, Any]) -> tuple[Any, Any, RunConfig, dict[str, Any]]:
    """A config's policy, env, ``RunConfig`` and the call's own arguments (the
    budget, the episodes to record)."""
    run = run_config(config)  # refused before a policy or an env is built
    policy = config_policy(config)
    if config.get("tasks") is not None:
        env = build_suite(config["tasks"])
    else:
        env = build_env(config["env"], config["env_config"])
    keys = ("episodes", "seeds", "record")
    call = {k: config[k] for k in keys if config.get(k) is not None}
    return policy, env, run, call


def token_of(given: str | None) -> str | None:
    """``--token``, else ``$JAXMESH_TOKEN`` (None: neither, or empty)."""
    return (given if given is not None else os.environ.get(TOKEN_ENV)) or None


def channel_credentials(ca: str | None) -> Any:
    """``grpc.ssl_channel_credentials`` trusting the PEM file ``ca`` (None: none)."""
    if ca is None:
        return None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())


def tls_files(cert: str | None, key: str | None) -> tuple[str, str] | None:
    """``--tls-cert`` and ``--tls-key``: both, or neither (None: no TLS)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError(
            f"--tls-cert {cert!r} and --tls-key {key!r}: TLS needs both the "
            "certificate chain and its private key (PEM files); give both, or "
            "neither for a plain server"
        )
    return cert, key


def server_credentials(cert: str | None, key: str | None) -> Any:
    """``grpc.ssl_server_credentials`` from PEM files (None: no TLS)."""
    if tls_files(cert, key) is None:
        return None
    import grpc

    pems = []
    for flag, path in (("--tls-key", key), ("--tls-cert", cert)):
        try:
            pems.append(Path(path).read_bytes())
        except OSError as e:
            raise ConfigError(f"{flag} {path!r}: cannot read it ({e})") from e
    return grpc.ssl_server_credentials([(pems[0], pems[1])])
