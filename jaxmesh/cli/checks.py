"""Checks the form of a run config (nothing built): its keys, values and env
ids; the rest is left to the run's own checks (``jaxmesh.run.checks``), so that
the command line never disagrees with ``jaxmesh.evaluate``."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmesh.cli.config import (
    MAX_SECONDS,
    REQUIRED,
    SCHEMA,
    apply_overrides,
    load_config,
)
from jaxmesh.cli.errors import ConfigError
from jaxmesh.execution import Ensemble
from jaxmesh.remote.address import SCHEMES, parse_address
from jaxmesh.results.record import Record
from jaxmesh.run.backend import SCAN, backend_of
from jaxmesh.suite import make_suite


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _seconds(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and 0 < v <= MAX_SECONDS


_POLICY = "a string 'module:Name', e.g. jaxmesh.zoo.cartpole:CartPoleMLP"
_KWARGS = "a mapping of keyword arguments"
_SECONDS = f"a number of seconds > 0 and at most {MAX_SECONDS:.0f}, or null for"
#: The form of a config's (and a task's) values, null aside: a test of a
#: value, and what a value that fails it should be.
_FORMS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "policy": (lambda v: isinstance(v, str) and ":" in v, _POLICY),
    "policy_config": (lambda v: isinstance(v, dict), _KWARGS),
    "env_config": (lambda v: isinstance(v, dict), _KWARGS),
    "episodes": (lambda v: _int(v) and v >= 0, "an int >= 0"),
    "trial_index_base": (lambda v: _int(v) and v >= 0, "an int >= 0"),
    "seeds": (lambda v: isinstance(v, list) and all(map(_int, v)), "a list of ints"),
    "max_episode_seconds": (_seconds, f"{_SECONDS} no limit"),
    "reply_timeout": (
        lambda v: v == math.inf or _seconds(v),
        f"{_SECONDS} the default",
    ),
    "check_seeds": (lambda v: isinstance(v, bool), "true or false"),
    "host": (lambda v: isinstance(v, bool), "true or false"),
    "tls_ca": (
        lambda v: isinstance(v, str) and Path(v).is_file(),
        "the path of a PEM file that exists",
    ),
}


def check_run_config(config: dict[str, Any]) -> dict[str, Any]:
    """A run config (read, overrides applied) checked: a new dict with
    ``policy_config`` and ``env_config`` dicts; ConfigError: an unknown or
    missing key, or a value of the wrong type."""
    unknown = sorted(set(config) - set(SCHEMA))
    if unknown:  # with the closest key each may mean
        close = [difflib.get_close_matches(k, list(SCHEMA), n=1) for k in unknown]
        hint = "".join(
            f" (did you mean {c[0]!r} for {k!r}?)"
            for k, c in zip(unknown, close, strict=True)
            if c
        )
        raise ConfigError(
            f"unknown config key(s) {unknown}{hint}; allowed keys: "
            f"{', '.join(SCHEMA)} (see jaxmesh eval --help)"
        )
    if config.get("suite") is not None:
        config = expand_suite(config)
    suite = config.get("tasks") is not None
    if suite and config.get("env") not in (None, ""):
        raise ConfigError(
            f"env={config['env']!r} and tasks: a config runs one env or a suite of "
            "tasks; remove env (each task names its own) or tasks"
        )
    required = [k for k in REQUIRED if not (suite and k == "env")]
    missing = [k for k in required if config.get(k) in (None, "")]
    if missing:
        raise ConfigError(
            f"config is missing {missing}; e.g. env: gymnax:CartPole-v1 and policy: "
            "jaxmesh.zoo.cartpole:CartPoleMLP"
        )
    if suite and config.get("env_config"):
        raise ConfigError(
            f"env_config={config['env_config']!r} with tasks: give each task its own "
            "env_config (tasks: {name: {env: ..., env_config: {...}}})"
        )
    out = dict(config, env_config=_check_run_keys(config))
    if suite:
        out["tasks"] = check_tasks(config["tasks"])
    out["policy_config"] = dict(config.get("policy_config") or {})
    token = config.get("token")
    if token is not None and (not isinstance(token, str) or not token):
        kind = type(token).__name__
        given = "an empty string" if token == "" else f"a value of type {kind}"
        raise ConfigError(  # the value itself is never echoed: it is a secret
            f"token: expected a non-empty string, got {given} (quote it in YAML, "
            "e.g. token: '0123'), or null to use $JAXMESH_TOKEN"
        )
    if out.get("record") is not None:
        out["record"] = check_record_config(out["record"])
    if out.get("output") is not None:
        out["output"] = str(out["output"])
    return out


def _check_run_keys(run: dict[str, Any], where: str = "") -> dict[str, Any]:
    """The env and the values' forms (``_FORMS``) of a config (``where``: '')
    or of its task ``where`` ('tasks.NAME.'), checked; the env_config (a
    task's budget and instruction are ``jaxmesh.Task``'s to check, a config's
    instruction ``jaxmesh.Starts``')."""
    if run.get("env") not in (None, ""):
        check_env(run["env"])
    for key, (ok, expected) in _FORMS.items():
        value = run.get(key)
        if value is not None and not ok(value):
            raise ConfigError(
                f"{where}{key}={value!r}: expected {expected} ({SCHEMA[key].help})"
            )
    env_config = run.get("env_config")
    if env_config and backend_of(run["env"]) != SCAN:
        raise ConfigError(
            f"{where}env_config={env_config!r} with env={run['env']!r}: env_config "
            "only applies to gymnax: and brax: ids (and playground:, libero:, "
            "envpool:); a served env is configured where it is served "
            "(jaxmesh.EnvServer(gymnasium.make(id, **kwargs), ...)), and a gymnasium: "
            "id is made with gymnasium.make(id) as registered: remove env_config"
        )
    return dict(env_config or {})


def check_record_config(value: Any) -> Any:
    """A config's ``record:`` as a ``jaxmesh.Record`` (ConfigError: not a list
    of episodes nor a mapping of its fields)."""
    try:
        if isinstance(value, dict):
            fields = [f.name for f in dataclasses.fields(Record)]
            unknown = sorted(set(value) - set(fields))
            if unknown:
                raise ValueError(f"unknown keys {unknown} (expected {fields})")
            return Record(**value)
        if isinstance(value, int | list) and not isinstance(value, bool):
            return Record(episodes=value)
        raise TypeError(f"a {type(value).__name__}")
    except (TypeError, ValueError) as e:
        raise ConfigError(f"record={value!r}: {e} ({SCHEMA['record'].help})") from e


def check_env(env: Any) -> None:
    """Checks the form of a config's ``env``: an id, ``"grpc://host:port"`` or a
    list of distinct such addresses (parsed, not dialled)."""
    if isinstance(env, str):
        addresses = [env] if env.startswith("grpc:") else []
    elif isinstance(env, list) and env and all(isinstance(e, str) for e in env):
        addresses = env
        not_served = [e for e in env if not e.startswith(SCHEMES)]
        if not_served:
            raise ConfigError(
                f"env={env!r}: a list of envs must hold served addresses "
                f"'grpc://host:port' only, and {not_served} are not; give one env "
                "id, or serve each env (jaxmesh serve-env) and list the addresses"
            )
    else:
        raise ConfigError(
            f"env={env!r}: expected an env id (e.g. gymnax:CartPole-v1 or "
            "gymnasium:CartPole-v1), a served env's address grpc://host:port, or "
            "a list of such addresses"
        )
    for address in addresses:
        if not address.startswith(SCHEMES):
            raise ConfigError(
                f"env={address!r}: a served env's address is 'grpc://host:port' "
                "(or 'grpcs://host:port' over TLS), e.g. grpc://127.0.0.1:5555 "
                "(what `jaxmesh serve-env` printed)"
            )
        try:
            parse_address(address)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"env={address!r}: {e}") from e
    twice = sorted({e for e in addresses if addresses.count(e) > 1})
    if twice:
        raise ConfigError(
            f"env={env!r} lists {twice} more than once; a server holds one session "
            "at a time, so list each server once (its --lanes set how many lanes "
            "it serves)"
        )


#: The keys of a task in a config's ``tasks:`` mapping.
TASK_KEYS = ("env", "env_config", "instruction", "episodes", "seeds")
TASK_KEYS += ("trial_index_base",)


def expand_suite(config: dict[str, Any]) -> dict[str, Any]:
    """A config's ``suite:`` as the ``tasks:`` it stands for (each task's env
    id, instruction and env_config); ConfigError: with env or tasks, or a suite
    ``jaxmesh.make_suite`` refuses."""
    given = config["suite"]
    for other in ("env", "tasks", "env_config"):
        if config.get(other) not in (None, "", {}):
            raise ConfigError(
                f"suite={given!r} and {other}: a suite names its tasks and their "
                f"envs; remove {other} (env options go in suite: {{name: ..., "
                "camera_size: ...}})"
            )
    args = {"name": given} if isinstance(given, str) else given
    if not isinstance(args, dict) or not isinstance(args.get("name"), str):
        raise ConfigError(
            f"suite={given!r}: expected a suite id (e.g. libero:libero_spatial) or "
            "a mapping with name: <id> and make_suite's options (tasks: [0, 1], "
            "camera_size: 128, ...)"
        )
    try:
        suite = make_suite(**args, episodes=None)
    except (ValueError, TypeError, ImportError, RuntimeError) as e:
        raise ConfigError(f"suite={given!r}: {e}") from e
    tasks = {}
    for name, task in suite.tasks.items():
        suite_name, index = task.env.args[:2]  # functools.partial(LiberoEnv, ...)
        tasks[name] = {
            "env": f"libero:{suite_name}/{index}",
            "instruction": task.instruction,
            "env_config": dict(task.env.keywords),
        }
    out = {k: v for k, v in config.items() if k not in ("suite", "env_config")}
    return dict(out, tasks=tasks)


def check_tasks(tasks: Any) -> dict[str, dict[str, Any]]:
    """A config's ``tasks:`` checked, as task name -> a mapping of
    ``TASK_KEYS``."""
    if not isinstance(tasks, dict) or not tasks:
        raise ConfigError(
            f"tasks={tasks!r}: expected a mapping of task name -> env id (or -> "
            "a mapping with env: ...), e.g. tasks: {reach: gymnasium:FetchReach-v4}"
        )
    out: dict[str, dict[str, Any]] = {}
    for name, task in tasks.items():
        where = f"tasks.{name}"
        task = {"env": task} if isinstance(task, str | list) else task
        if not isinstance(task, dict):
            raise ConfigError(
                f"{where}={task!r}: expected an env id or a mapping with env: ..."
            )
        unknown = sorted(set(task) - set(TASK_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {unknown}; a task takes {list(TASK_KEYS)}"
            )
        if task.get("env") in (None, ""):
            raise ConfigError(f"{where}: the task needs an env: ...")
        out[str(name)] = dict(task, env_config=_check_run_keys(task, f"{where}."))
    return out


def execution_of(value: Any) -> Any:
    """A config's ``execution`` (not null), ``{ensemble: {...}}``, as a
    ``jaxmesh.Ensemble(**...)``."""
    if not isinstance(value, dict) or set(value) != {"ensemble"}:
        raise ConfigError(
            f"execution={value!r}: expected null or a mapping ensemble: {{m: 0.01}} "
            f"({SCHEMA['execution'].help})"
        )
    args = value["ensemble"] or {}
    if not isinstance(args, dict):
        raise ConfigError(
            f"execution.ensemble={args!r}: expected a mapping of jaxmesh.Ensemble's "
            "arguments (m, aggregation, weights), e.g. {m: 0.01}"
        )
    try:
        return Ensemble(**args)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"execution.ensemble: {e}") from e


def read_config(path: str, sets: list[str]) -> dict[str, Any]:
    """The checked config of a command's ``CONFIG.yaml`` and ``--set``s."""
    return check_run_config(apply_overrides(load_config(path), sets))
