"""The ``jaxmesh`` command line.

Commands::

    jaxmesh eval CONFIG.yaml [--set KEY=VALUE ...] [--no-progress]
                             [--no-compile-cache] [--telemetry] [--report [PATH]]
                             [--video [PATH]] [--trace PATH]
                             [--episode-log PATH | --no-episode-log]
                             [--resume PATH]
    jaxmesh sweep CONFIG.yaml [--set KEY=VALUE ...] [--resume CELLS.jsonl]
    jaxmesh explain CONFIG.yaml [--set KEY=VALUE ...]
    jaxmesh describe MODULE:CLASS
    jaxmesh compare A.json B.json [--resamples N] [--seed S]
    jaxmesh report RESULTS.json [-o REPORT.html]
    jaxmesh check-env ENV [--seed S] [--other S] [--steps N] [--token T]
                          [--tls-ca PEM]
    jaxmesh serve-env ENV [--lanes N] [--address HOST:PORT] [--ready-fd FD]
                          [--token T] [--idle-timeout S] [--insecure]
                          [--tls-cert PEM --tls-key PEM]
                          [--allow-remote-shutdown] [--workers W]

``eval`` reads a YAML run config (keys in ``CONFIG_KEYS``; see ``docs/cli.md``),
applies ``--set`` overrides, builds the env and the policy, runs
``jaxmesh.evaluate`` with a progress bar on stderr, prints the summary (and with
``--telemetry`` the per-call timings of a host-stepped run) and writes the result
as JSON. The env is a JAX env id (``gymnax:``, ``brax:``), a gymnasium id stepped
in this process (``gymnasium:<id>``), or served envs: ``grpc://host:port`` or a
list of such addresses. ``explain`` prints what such a run would read from
the env and hold per lane, compiling nothing. ``compare`` pairs two results
``eval`` wrote (same seeds) episode by episode and prints ``jaxmesh.compare``'s
table. ``report`` writes the HTML report (``jaxmesh.report.write_report``) of a
result ``eval`` wrote; ``eval --report`` writes it at the end of the run;
``eval --video`` records episode 0 (or the config's ``record:`` episodes) and
renders each to a video next to the result (``jaxmesh.render``), which the
report embeds. ``eval`` streams each finished episode to an episode log
(``jaxmesh.EpisodeLog``) next to the result, ``NAME.episodes.jsonl``, and
``eval --resume FILE`` (that log, or a result JSON) runs only the episodes it
lacks. ``check-env`` says whether an env is reproducible from its seed
(``jaxmesh.check_seeds``; exit 0 when it is, 1 when not).
``serve-env`` serves a gymnasium
env over gRPC (``jaxmesh.remote.server.EnvServer``) until SIGTERM or Ctrl-C.

Exit status: 0 on success; 2 for bad input (the command line, the config, or
anything ``jaxmesh.evaluate`` refuses before the run starts), reported as one
line on stderr; an error raised while the run is going keeps its traceback
(status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import difflib
import importlib.util
import inspect
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from jaxmesh._version import __version__
from jaxmesh.cache import CACHE_DIR_ENV, enable_compile_cache
from jaxmesh.trace import REDACTED, is_secret_key, redact_text, secret_values

#: Every key a run config may hold, with what it means.
CONFIG_KEYS: dict[str, str] = {
    "env": "env id, e.g. gymnax:CartPole-v1, brax:fast, gymnasium:CartPole-v1 "
    "(stepped in this process), grpc://host:port (served by jaxmesh serve-env) or "
    "a list of grpc:// addresses (required, unless tasks is given)",
    "tasks": "a suite instead of env: task name -> env id, or a mapping with env "
    "and any of env_config, instruction, episodes, seeds, trial_index_base "
    "(jaxmesh.Suite; top-level episodes/seeds are every task's default)",
    "suite": "a benchmark's suite instead of env or tasks: an id (libero:"
    "libero_spatial) or a mapping with name: and jaxmesh.make_suite's arguments "
    "(tasks: [0, 1] task indices, camera_size, settle_steps, max_episode_steps); "
    "each task named and instructed as the benchmark does (docs/libero.md)",
    "env_config": "mapping passed to jaxmesh.make_env(env, **env_config), "
    "e.g. episode_length: 50 for a brax env, camera_size: 128 for a libero: task "
    "(gymnax:, brax:, playground: and libero: ids only)",
    "token": "served envs: the servers' session token (null: $JAXMESH_TOKEN)",
    "tls_ca": "served envs at grpcs://: a PEM file of the CA (or self-signed "
    "certificate) the servers' certificates are checked against (null: gRPC's "
    "default roots)",
    "reply_timeout": "served envs: seconds a reply may take before the server is "
    "dropped or the run fails (null: auto, over several servers one that answers "
    "nothing for 10x the slowest reply so far, at least 10 s, is dropped; .inf: "
    "as long as the env takes)",
    "on_server_loss": "served envs over several servers: rerun (null: the default; "
    "a lost server's unfinished episodes run again on the others) or raise (the "
    "first loss ends the run)",
    "transport": "served envs: auto (null: the default; shared memory with a server "
    "on this host run by this user, else gRPC), grpc or shm",
    "policy": "module:Class, module:function or module:model_instance (required)",
    "policy_config": "mapping passed to Class.from_config(**...) or Class(**...)",
    "episodes": "episode budget; seeds default to 0..episodes-1",
    "seeds": "explicit list of seeds, one per episode",
    "num_envs": "parallel lanes",
    "horizon": "actions of a chunk executed before the next plan",
    "prefetch_lead": "0 is synchronous; L > 0 plans L steps early",
    "delay": "inference delay d in steps: a chunk planned d steps before it plays, "
    "its first d actions skipped (0 < d < horizon; 0: none); jaxmesh sweep takes "
    "a list",
    "delay_ms": "the inference delay as milliseconds instead of steps: "
    "ceil(delay_ms / (1000 dt)) steps, dt the env's seconds per step (not with "
    "delay; jaxmesh sweep takes a list)",
    "execution": "how a chunk is executed: null (each plan's first h actions) or "
    "ensemble: {m: 0.01} (temporal ensembling, jaxmesh.Ensemble; also "
    "aggregation: average | latest_only, or weights: [...])",
    "max_episode_steps": "cap on episode length (null: the env's own limit)",
    "plan_tile": "rows per policy call (null: chosen by the engine)",
    "segment_steps": "env steps per scan segment between host visits",
    "max_episode_seconds": "wall-clock cap on an episode, gymnasium: and grpc:// "
    "envs only (results then depend on timing)",
    "metrics": "env info keys kept per episode: a list of keys (last value) or a "
    "mapping key: reduction (last, sum, max, mean, any)",
    "success": "info key that is an episode's success signal (null: success or "
    "is_success when the env has one; false: none)",
    "success_mode": "the headline success: once (the signal was true at any step; "
    "the default) or end (true at the episode's last step); both are in the output",
    "record": "episodes to record step by step: a list of episode indices, or a "
    "mapping episodes: [...], max_steps: N, keys: [...] (jaxmesh.Record); the "
    "trajectories go to the output JSON's .npz, and --video renders them",
    "trial_index_base": "gymnasium: and grpc:// envs that declare a trial_index "
    "reset option: episode i gets trial_index = trial_index_base + i (default 0)",
    "instruction": "the language instruction of every episode, for a policy with "
    "a jaxmesh.adapt.Text input (evaluate(..., instruction=...)); null: a Text "
    "with info_key reads each episode's from its reset info",
    "workers": "gymnasium: envs: worker processes that step the lanes (0: in this "
    "process; null: one per core when the env's steps are costly enough)",
    "check_seeds": "gymnasium: envs: before the run, check that the first lane's "
    "env is reproducible from its seed (jaxmesh.check_seeds), else refuse the run "
    "(null/false: no check)",
    "output": "JSON file to write the result to (null: write none); the episode "
    "log goes next to it as NAME.episodes.jsonl",
}
_INT_KEYS = {
    "episodes": 0,
    "num_envs": 1,
    "horizon": 1,
    "prefetch_lead": 0,
    "delay": 0,
    "max_episode_steps": 1,
    "plan_tile": 1,
    "segment_steps": 1,
    "trial_index_base": 0,
    "workers": 0,
}
_REQUIRED = ("env", "policy")
#: The longest time limit a config may set (a timer waits at most
#: ``threading.TIMEOUT_MAX``; null is no limit).
_MAX_SECONDS = 1e9

#: Environment variables of the persistent compilation cache.
CACHE_SWITCH_ENV = "JAXMESH_COMPILE_CACHE"
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")


class ConfigError(Exception):
    """A run config (or a command's argument) is wrong; exit status 2."""


class Interrupted(Exception):
    """A run stopped by Ctrl-C (SIGINT), its message already printed; exit
    status 130 (128 + SIGINT), as a shell reports it."""


class _DuplicateKey(yaml.YAMLError):
    """A mapping of a YAML document names one key twice (YAML itself keeps the
    last one silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor` merges; an explicit key may override
                try:
                    key = self.construct_object(key_node, deep=True)
                    hash(key)
                except (yaml.YAMLError, TypeError):
                    continue  # SafeLoader says what is wrong with it
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(
                        f"line {line}: key {key!r} is given twice (first on line "
                        f"{seen[key]}); YAML would keep only the last value: "
                        "remove one of them"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (``_DuplicateKey``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


# Config ----------------------------------------------------------------------
def _existing_file(path: str | Path, what: str, hint: str) -> Path:
    """``path`` as a Path; ConfigError naming ``what`` and ``hint`` when no
    file is there."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"{what} {str(path)!r} not found (looked in {str(p.absolute())!r}); " + hint
        )
    return p


def load_config(path: str | Path) -> dict[str, Any]:
    """Reads a YAML run config (a mapping at the top level).

    Raises:
      ConfigError: the file is missing, cannot be read, is not UTF-8, is not
        valid YAML, or is not a mapping.
    """
    p = _existing_file(
        path,
        "config file",
        "pass the path of a YAML run config, e.g. configs/cartpole.yaml",
    )
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text (byte "
            f"0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {str(path)!r}: cannot read it ({e})") from e
    try:
        data = _yaml_load(text)
    except _DuplicateKey as e:
        raise ConfigError(f"config file {str(path)!r}, {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} holds a {type(data).__name__}; expected a "
            f"mapping of keys {sorted(CONFIG_KEYS)}"
        )
    return data


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict:
    """Applies ``KEY=VALUE`` overrides; dotted keys reach into mappings.

    Values are parsed as YAML (``8`` is an int, ``null`` is None, ``true`` a
    bool, ``[1, 2]`` a list, anything else a string). Returns a new dict.

    Raises:
      ConfigError: an override without ``=``, or a dotted key through a value
        that is not a mapping.
    """
    out = copy.deepcopy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"--set {item!r}: expected KEY=VALUE, e.g. --set episodes=20 or "
                "--set policy_config.checkpoint=ckpt/mlp"
            )
        try:
            value = _yaml_load(raw) if raw.strip() else ""
        except _DuplicateKey as e:
            raise ConfigError(f"--set {key.strip()}=...: {e}") from None
        except yaml.YAMLError as e:
            if is_secret_key(key.strip().split(".")[-1]):  # never echo a secret
                raise ConfigError(
                    f"--set {key.strip()}={REDACTED}: cannot parse the value as "
                    "YAML; quote it, e.g. --set \"token='...'\""
                ) from None
            raise ConfigError(f"--set {item!r}: cannot parse the value: {e}") from e
        parts = key.strip().split(".")
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(
                    f"--set {item!r}: {where!r} is {child!r}, not a mapping, so it "
                    "has no sub-keys"
                )
            node = child
        node[parts[-1]] = value
    return out


def check_run_config(config: dict[str, Any]) -> dict[str, Any]:
    """Checks a run config's keys and value types; fills the defaults.

    Only the form is checked here; ``jaxmesh.evaluate`` checks how the values
    fit together (budget against seeds, horizon against the model, ...).

    Args:
      config: the mapping read from YAML, overrides applied.

    Returns:
      A new dict with ``policy_config`` and ``env_config`` as dicts.

    Raises:
      ConfigError: an unknown or missing key, or a value of the wrong type.
    """
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        close = [difflib.get_close_matches(k, list(CONFIG_KEYS), n=1) for k in unknown]
        hint = "".join(
            f" (did you mean {c[0]!r} for {k!r}?)"
            for k, c in zip(unknown, close, strict=True)
            if c
        )
        raise ConfigError(
            f"unknown config key(s) {unknown}{hint}; allowed keys: "
            f"{', '.join(CONFIG_KEYS)} (see jaxmesh eval --help)"
        )
    if config.get("suite") is not None:
        config = expand_suite(config)
    suite = config.get("tasks") is not None
    if suite and config.get("env") not in (None, ""):
        raise ConfigError(
            f"env={config['env']!r} and tasks: a config runs one env or a suite of "
            "tasks; remove env (each task names its own) or tasks"
        )
    required = [k for k in _REQUIRED if not (suite and k == "env")]
    missing = [k for k in required if config.get(k) in (None, "")]
    if missing:
        raise ConfigError(
            f"config is missing {missing}; e.g. env: gymnax:CartPole-v1 and policy: "
            "jaxmesh.zoo.cartpole:CartPoleMLP"
        )
    if not isinstance(config["policy"], str):
        raise ConfigError(f"policy={config['policy']!r}: expected a string")
    if suite:
        config = dict(config, tasks=check_tasks(config["tasks"]))
    else:
        check_env(config["env"])
    if ":" not in config["policy"]:
        raise ConfigError(
            f"policy={config['policy']!r}: expected 'module:Name', e.g. "
            "jaxmesh.zoo.cartpole:CartPoleMLP"
        )
    for key, low in _INT_KEYS.items():
        v = config.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
            raise ConfigError(
                f"{key}={v!r}: expected an int >= {low} ({CONFIG_KEYS[key]})"
            )
    execution_of(config.get("execution"))
    out = dict(config)
    for key in ("policy_config", "env_config"):
        value = config.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"{key}={value!r}: expected a mapping of keyword arguments "
                f"({CONFIG_KEYS[key]})"
            )
        out[key] = dict(value or {})
    delay_ms = config.get("delay_ms")
    if delay_ms is not None and not isinstance(delay_ms, list):
        from jaxmesh.run.checks import check_delay_ms

        try:
            check_delay_ms(delay_ms, config.get("delay") or 0)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{e} ({CONFIG_KEYS['delay_ms']})") from e
    for key in ("max_episode_seconds", "reply_timeout"):
        value = config.get(key)
        if key == "reply_timeout" and value == math.inf:
            continue  # no limit
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
            or value > _MAX_SECONDS
        ):
            raise ConfigError(
                f"{key}={value!r}: expected a number of seconds > 0 and at most "
                f"{_MAX_SECONDS:.0f} ({CONFIG_KEYS[key]}), or null for "
                + ("the default" if key == "reply_timeout" else "no limit")
            )
    loss = config.get("on_server_loss")
    if loss is not None:
        from jaxmesh.run.backend import check_server_loss

        try:
            check_server_loss(loss)
        except ValueError as e:
            raise ConfigError(f"{e} ({CONFIG_KEYS['on_server_loss']})") from e
    check = config.get("check_seeds")
    if check is not None and not isinstance(check, bool):
        raise ConfigError(
            f"check_seeds={check!r}: expected true or false "
            f"({CONFIG_KEYS['check_seeds']})"
        )
    ca = config.get("tls_ca")
    if ca is not None and not (isinstance(ca, str) and Path(ca).is_file()):
        raise ConfigError(
            f"tls_ca={ca!r}: expected the path of a PEM file that exists "
            f"({CONFIG_KEYS['tls_ca']})"
        )
    token = config.get("token")
    if token is not None and (not isinstance(token, str) or not token):
        kind = type(token).__name__
        given = "an empty string" if token == "" else f"a value of type {kind}"
        raise ConfigError(  # the value itself is never echoed: it is a secret
            f"token: expected a non-empty string, got {given} (quote it in YAML, "
            "e.g. token: '0123'), or null to use $JAXMESH_TOKEN"
        )
    if suite and out["env_config"]:
        raise ConfigError(
            f"env_config={out['env_config']!r} with tasks: give each task its own "
            "env_config (tasks: {name: {env: ..., env_config: {...}}})"
        )
    if not suite and out["env_config"] and not _is_jax_id(config["env"]):
        raise ConfigError(
            f"env_config={out['env_config']!r} with env={config['env']!r}: "
            "env_config only applies to gymnax: and brax: ids (and playground:, "
            "libero:); a served env is "
            "configured where it is served (jaxmesh.EnvServer(gymnasium.make(id, "
            "**kwargs), ...)), and a gymnasium: id is made with gymnasium.make(id) "
            "as registered: remove env_config"
        )
    text = config.get("instruction")
    if text is not None and not isinstance(text, str):
        raise ConfigError(
            f"instruction={text!r}: expected a string (quote it in YAML) or null "
            f"({CONFIG_KEYS['instruction']})"
        )
    seeds = config.get("seeds")
    if seeds is not None and not (
        isinstance(seeds, list)
        and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise ConfigError(f"seeds={seeds!r}: expected a list of ints")
    if config.get("metrics") is not None or config.get("success") is not None:
        from jaxmesh.run.checks import check_metrics

        try:
            check_metrics(config.get("metrics"), config.get("success"))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{e} ({CONFIG_KEYS['metrics']})") from e
    if config.get("success_mode") is not None:
        from jaxmesh.run.checks import check_success_mode

        try:
            check_success_mode(config["success_mode"])
        except ValueError as e:
            raise ConfigError(str(e)) from e
    if out.get("record") is not None:
        out["record"] = check_record_config(out["record"])
    if out.get("output") is not None:
        out["output"] = str(out["output"])
    return out


def check_record_config(value: Any) -> Any:
    """A config's ``record:`` as a ``jaxmesh.Record``.

    Raises:
      ConfigError: not a list of episodes nor a mapping of ``Record``'s fields.
    """
    from jaxmesh.results.record import Record

    if isinstance(value, Record):
        return value
    try:
        if isinstance(value, dict):
            fields = {"episodes", "keys", "max_steps", "frames", "states"}
            unknown = sorted(set(value) - fields)
            if unknown:
                raise ValueError(
                    f"unknown keys {unknown} (expected episodes, keys, max_steps, "
                    "frames, states)"
                )
            return Record(**value)
        if isinstance(value, int | list) and not isinstance(value, bool):
            return Record(episodes=value)
        raise TypeError(f"a {type(value).__name__}")
    except (TypeError, ValueError) as e:
        raise ConfigError(f"record={value!r}: {e} ({CONFIG_KEYS['record']})") from e


def check_env(env: Any) -> None:
    """Checks the form of a config's ``env``; addresses are parsed, not dialled.

    Args:
      env: an env id string, ``"grpc://host:port"``, or a non-empty list of
        distinct ``"grpc://host:port"`` addresses (lanes dealt over the servers).

    Raises:
      ConfigError: anything else, or a malformed address.
    """
    if isinstance(env, str):
        if env.startswith("grpc:"):
            _check_address(env)
        return
    if not (isinstance(env, list) and env and all(isinstance(e, str) for e in env)):
        raise ConfigError(
            f"env={env!r}: expected an env id (e.g. gymnax:CartPole-v1 or "
            "gymnasium:CartPole-v1), a served env's address grpc://host:port, or "
            "a list of such addresses"
        )
    from jaxmesh.remote.address import SCHEMES

    not_served = [e for e in env if not e.startswith(SCHEMES)]
    if not_served:
        raise ConfigError(
            f"env={env!r}: a list of envs must hold served addresses "
            f"'grpc://host:port' only, and {not_served} are not; give one env id, "
            "or serve each env (jaxmesh serve-env) and list the addresses"
        )
    for address in env:
        _check_address(address)
    twice = sorted({e for e in env if env.count(e) > 1})
    if twice:
        raise ConfigError(
            f"env={env!r} lists {twice} more than once; a server holds one session "
            "at a time, so list each server once (its --lanes set how many lanes "
            "it serves)"
        )


def _check_address(address: str) -> None:
    from jaxmesh.remote.address import SCHEMES, parse_address

    if not address.startswith(SCHEMES):
        raise ConfigError(
            f"env={address!r}: a served env's address is 'grpc://host:port' "
            "(or 'grpcs://host:port' over TLS), e.g. grpc://127.0.0.1:5555 (what "
            "`jaxmesh serve-env` printed)"
        )
    try:
        parse_address(address)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"env={address!r}: {e}") from e


def _backend(env: Any) -> str:
    """The backend ``jaxmesh.evaluate`` runs ``env`` on (``run.backend``): the
    same test, so the command line never disagrees with it."""
    from jaxmesh.run.backend import backend_of

    return backend_of(env)


def _is_served(env: Any) -> bool:
    from jaxmesh.run.backend import SERVED

    return _backend(env) == SERVED


def _is_gymnasium_id(env: Any) -> bool:
    from jaxmesh.run.backend import HOST

    return _backend(env) == HOST


def _is_jax_id(env: Any) -> bool:
    from jaxmesh.run.backend import SCAN

    return _backend(env) == SCAN


# Building --------------------------------------------------------------------
def import_target(target: str) -> Any:
    """Imports ``module:Name`` (``Name`` may be dotted).

    Raises:
      ConfigError: bad form, or the module or name cannot be found.
    """
    from jaxmesh.model import resolve_class

    try:
        return resolve_class(target)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e


def build_policy(target: str, policy_config: dict[str, Any]) -> Any:
    """Builds the policy named by ``module:Name``.

    A class is built with ``Class.from_config(**policy_config)`` if it has
    ``from_config``, else ``Class(**policy_config)``. A ``jaxmesh.Model``
    instance or a function is used as it is, with no ``policy_config``. A Model's
    ``load`` runs here, so that a bad checkpoint is a config error.

    Raises:
      ConfigError: the target cannot be imported or built from the config.
    """
    from jaxmesh.model import Model

    obj = import_target(target)
    if inspect.isclass(obj):
        how = "from_config" if hasattr(obj, "from_config") else "constructor"
        build = obj.from_config if how == "from_config" else obj
        try:
            policy = build(**policy_config)
            if isinstance(policy, Model):
                policy._ensure_loaded()
            return policy
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(
                f"cannot build policy {target!r} ({how}) from policy_config "
                f"{policy_config!r}: {e}"
            ) from e
    if not (isinstance(obj, Model) or callable(obj)):
        raise ConfigError(
            f"policy {target!r} is a {type(obj).__name__}; expected a class, a "
            "jaxmesh.Model instance or a function obs -> action"
        )
    if policy_config:
        raise ConfigError(
            f"policy {target!r} is not a class, so it takes no policy_config; got "
            f"{policy_config!r}. Remove policy_config or point policy at a class"
        )
    if isinstance(obj, Model):
        try:
            obj._ensure_loaded()
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(f"cannot load policy {target!r}: {e}") from e
    return obj


#: The keys of a task in a config's ``tasks:`` mapping.
TASK_KEYS = (
    "env",
    "env_config",
    "instruction",
    "episodes",
    "seeds",
    "trial_index_base",
)


def expand_suite(config: dict[str, Any]) -> dict[str, Any]:
    """A config's ``suite:`` as the ``tasks:`` it stands for (``jaxmesh.
    make_suite``): each task's env id, instruction and env_config.

    Raises:
      ConfigError: with env or tasks, or a suite make_suite refuses.
    """
    import jaxmesh

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
    options = {k: v for k, v in args.items() if k not in ("name", "tasks")}
    try:
        suite = jaxmesh.make_suite(
            args["name"], tasks=args.get("tasks"), episodes=None, **options
        )
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
    """A config's ``tasks:`` as task name -> a mapping of ``TASK_KEYS``.

    Raises:
      ConfigError: not a non-empty mapping, a task without an env, an unknown
        key, or a value of the wrong type.
    """
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
        check_env(task["env"])
        said = task.get("instruction")
        if said is not None and not isinstance(said, str):
            raise ConfigError(f"{where}.instruction={said!r}: expected a string")
        for key, low in (("episodes", 1), ("trial_index_base", 0)):
            v = task.get(key)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or v < low
            ):
                raise ConfigError(f"{where}.{key}={v!r}: expected an int >= {low}")
        seeds = task.get("seeds")
        if seeds is not None and not (
            isinstance(seeds, list)
            and seeds
            and all(isinstance(x, int) and not isinstance(x, bool) for x in seeds)
        ):
            raise ConfigError(f"{where}.seeds={seeds!r}: expected a list of ints")
        env_config = task.get("env_config") or {}
        if not isinstance(env_config, dict):
            raise ConfigError(f"{where}.env_config={env_config!r}: expected a mapping")
        if env_config and not _is_jax_id(task["env"]):
            raise ConfigError(
                f"{where}.env_config={env_config!r}: env_config applies to gymnax:, "
                "brax:, playground: and libero: ids only"
            )
        out[str(name)] = dict(task, env_config=dict(env_config))
    return out


def build_suite(tasks: dict[str, dict[str, Any]]) -> Any:
    """A checked ``tasks:`` mapping as a ``jaxmesh.Suite`` (each env as
    ``build_env`` makes it; a gymnasium: id is made when its task runs)."""
    import jaxmesh

    built = {}
    for name, t in tasks.items():
        env = build_env(t["env"], t["env_config"])
        try:
            built[name] = jaxmesh.Task(
                env,
                instruction=t.get("instruction"),
                episodes=t.get("episodes"),
                seeds=t.get("seeds"),
                trial_index_base=t.get("trial_index_base"),
            )
        except (ValueError, TypeError) as e:
            raise ConfigError(f"tasks.{name}: {e}") from e
    return jaxmesh.Suite(built)


def build_env(env_id: str | list[str], env_config: dict[str, Any]) -> Any:
    """The env to evaluate on, its refusals as ConfigError.

    A ``gymnax:`` or ``brax:`` id is ``jaxmesh.make_env(env_id, **env_config)``.
    A ``gymnasium:<id>`` and served addresses are passed on as they are
    (``jaxmesh.evaluate`` makes the envs, or connects when the run starts);
    here only the packages they need are looked for.

    Raises:
      ConfigError: an unknown env id, keyword arguments the env refuses, or a
        missing package (gymnasium; gRPC for served envs).
    """
    import jaxmesh

    if _is_served(env_id):
        from jaxmesh.remote.address import require_grpc

        try:
            require_grpc()
        except ImportError as e:
            raise ConfigError(f"env={env_id!r}: {e}") from e
        return env_id
    if _is_gymnasium_id(env_id):
        if importlib.util.find_spec("gymnasium") is None:
            raise ConfigError(
                f"env={env_id!r}: gymnasium is not installed; run: pip install "
                "gymnasium (gymnasium[mujoco] for the MuJoCo envs)"
            )
        return env_id
    try:
        return jaxmesh.make_env(env_id, **env_config)
    except (ValueError, TypeError, ImportError) as e:
        given = f" with env_config {env_config!r}" if env_config else ""
        raise ConfigError(f"cannot make env {env_id!r}{given}: {e}") from e


def _channel_credentials(ca: str | None) -> Any:
    """``grpc.ssl_channel_credentials`` trusting the PEM file ``ca`` (None: none)."""
    if ca is None:
        return None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())


def _reply_timeout(value: Any) -> Any:
    """A config's ``reply_timeout``: null is the default (``"auto"``), ``.inf``
    no limit, a number the seconds."""
    if value is None:
        return "auto"
    return None if value == math.inf else value


def served_options(config: dict[str, Any]) -> Any:
    """A config's served-env options as ``jaxmesh.run.backend.ServedOptions``
    (``jaxmesh.evaluate`` checks them, and refuses them for an env that is not
    served)."""
    from jaxmesh.run.backend import ServedOptions

    return ServedOptions(
        token=config.get("token"),
        credentials=_channel_credentials(config.get("tls_ca")),
        reply_timeout=_reply_timeout(config.get("reply_timeout")),
        on_server_loss=config.get("on_server_loss"),
        transport=config.get("transport"),
    )


def execution_of(value: Any) -> Any:
    """A config's ``execution``: None, or ``{ensemble: {...}}`` as a
    ``jaxmesh.Ensemble(**...)``.

    Raises:
      ConfigError: any other value, or arguments ``Ensemble`` refuses.
    """
    if value is None:
        return None
    from jaxmesh.execution import Ensemble

    if not isinstance(value, dict) or set(value) != {"ensemble"}:
        raise ConfigError(
            f"execution={value!r}: expected null or a mapping ensemble: {{m: 0.01}} "
            f"({CONFIG_KEYS['execution']})"
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


def build_run(config: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """The policy, the env and ``evaluate``'s keyword arguments of a config."""
    policy = build_policy(config["policy"], config["policy_config"])
    if config.get("tasks") is not None:
        env = build_suite(config["tasks"])
    else:
        env = build_env(config["env"], config["env_config"])
    keys = (*_INT_KEYS, "seeds", "max_episode_seconds", "metrics", "success")
    keys += ("record", "success_mode", "instruction", "delay_ms")
    kwargs = {k: config[k] for k in keys if config.get(k) is not None}
    if config.get("check_seeds"):
        kwargs["check_seeds"] = True
    if config.get("execution") is not None:
        kwargs["execution"] = execution_of(config["execution"])
    served = served_options(config)._asdict()
    reply_timeout = served.pop("reply_timeout")
    kwargs.update((k, v) for k, v in served.items() if v is not None)
    if config.get("reply_timeout") is not None:  # else evaluate's default
        kwargs["reply_timeout"] = reply_timeout  # None for .inf: no limit
    return policy, env, kwargs


# Compilation cache ------------------------------------------------------------
def compile_cache_wanted(flag_off: bool) -> bool:
    """Whether the CLI should use the cache: on unless the flag or env says off.

    Raises:
      ConfigError: ``JAXMESH_COMPILE_CACHE`` holds something else than a switch.
    """
    raw = os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()
    if raw not in _OFF + _ON:
        raise ConfigError(
            f"{CACHE_SWITCH_ENV}={os.environ[CACHE_SWITCH_ENV]!r}: expected 0 or 1 "
            "(also false/true, no/yes, off/on); unset it to use the cache"
        )
    return not flag_off and raw not in _OFF


# Progress --------------------------------------------------------------------
class Progress:
    """A tqdm bar on stderr: episodes done of the budget, and env steps/s.

    The rate while running counts the steps of finished episodes since the
    first one ended (so compile time is excluded); at the end it shows the run's
    exact ``steps_per_second``.
    """

    def __init__(self, enabled: bool = True, stream: Any = None, initial: int = 0):
        self.enabled = enabled
        self.stream = stream
        #: Episodes done before the run starts (a resumed run's earlier ones).
        self.initial = initial
        self.bar = None
        self.steps = 0
        self.t_first: float | None = None
        self.steps_first = 0

    def on_run_start(self, info: dict) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=info.get("episodes"),
            initial=self.initial,
            desc=f"{info.get('policy', '')} on {info.get('env', '')}",
            unit="ep",
            file=self.stream if self.stream is not None else sys.stderr,
            disable=not self.enabled,
            dynamic_ncols=True,
        )

    def on_episode_end(self, ep: Any) -> None:
        now = time.perf_counter()
        self.steps += int(ep.length)
        if self.t_first is None:
            self.t_first, self.steps_first = now, self.steps
        elif now > self.t_first:
            rate = (self.steps - self.steps_first) / (now - self.t_first)
            self.bar.set_postfix_str(f"{rate:,.0f} env steps/s", refresh=False)
        self.bar.update(1)

    def on_fault(self, info: dict) -> None:
        """A lost or rejoined server, or a lost worker process: one line on
        stderr above the bar (printed even with the bar off)."""
        event = info.get("event")
        if event == "lost":
            line = (
                f"jaxmesh: lost the env server {info.get('server')} "
                f"({info.get('error')}); its {info.get('lanes')} lanes are out and "
                f"{info.get('episodes_rerun')} unfinished episodes run again on "
                "the other servers"
            )
        elif event == "rejoined":
            line = f"jaxmesh: the env server {info.get('server')} is back"
        elif event == "worker lost":
            line = (
                f"jaxmesh: a worker process died; {len(info.get('episodes_rerun', []))}"
                " unfinished episodes run again on a new one"
            )
        else:
            line = f"jaxmesh: {info}"
        stream = self.stream if self.stream is not None else sys.stderr
        if self.bar is not None and self.enabled:
            self.bar.write(line, file=stream)
        else:
            print(line, file=stream)

    def on_run_end(self, result: Any) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"{result.steps_per_second:,.0f} env steps/s", refresh=False
            )
            self.bar.close()


class _Started:
    """A hook that marks the end of ``evaluate``'s checks.

    ``evaluate`` calls ``on_run_start`` once its input is checked and the policy
    probed, before anything compiles: a ValueError/TypeError raised before then
    is bad input, one raised after is a failure of the run.

    In a suite each task's run starts anew: ``finished`` names the tasks done,
    and ``started`` is reset after each, so that a later task's refusal is bad
    input too (the tasks before it are kept in the output JSON).
    """

    def __init__(self) -> None:
        self.started = False
        self.finished: list[str] = []

    def on_run_start(self, info: dict) -> None:
        del info
        self.started = True

    def on_task_end(self, name: str, result: Any) -> None:
        del result
        self.finished.append(name)
        self.started = False


# Commands --------------------------------------------------------------------
def _refused(config: dict[str, Any], error: Any, task: str | None = None) -> str:
    """``evaluate``'s refusal of a config, with no secret of it in the text.

    A suite's refusal names its task (``task``), else all of its tasks."""
    tasks = config.get("tasks")
    if tasks is None:
        where = f"env {config['env']!r}"
    elif task is not None and task in tasks:
        where = f"task {task!r} (env {tasks[task]['env']!r})"
    else:
        where = f"tasks {list(tasks)}"
    text = f"policy {config['policy']!r} on {where}: {error}"
    return redact_text(text, secret_values(config))


def _read_config(args: argparse.Namespace) -> dict[str, Any]:
    return check_run_config(apply_overrides(load_config(args.config), args.set))


def check_writable(*paths: tuple[str, Any]) -> None:
    """Refuses, before the run, every ``(what, path)`` where a file cannot be
    written: a directory, a folder that cannot be made, one that is not
    writable, a read-only file. The folders are made here (None: skipped).

    Raises:
      ConfigError: naming the flag or key, the path and what to do.
    """
    for what, path in paths:
        if path is None:
            continue
        p = Path(path)
        fix = f"pass a file path in a writable folder, e.g. {what} results/run.json"
        if what == "output":
            fix = "set output to a file in a writable folder (--set output=r.json)"
        if p.is_dir():
            raise ConfigError(
                f"{what} {str(p)!r} is a directory, not a file; {fix} (a file "
                "inside it: " + repr(str(p / "result.json")) + ")"
            )
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".jaxmesh-probe-", dir=p.parent)
            os.close(fd)
            os.unlink(probe)
            if p.exists():
                with open(p, "a"):  # a file there must take writes (not truncated)
                    pass
        except OSError as e:
            why = e.strerror or str(e)
            raise ConfigError(
                f"{what} {str(p)!r} cannot be written ({why}: "
                f"{e.filename or p.parent!s}); {fix}; checked before the run so "
                "that no result is lost"
            ) from None


def write_json(path: Path, data: Any, command: str, log: Path | None = None) -> Path:
    """Writes ``data`` as JSON to ``path``; returns where it went.

    Should that fail (the folder removed or the disk full during the run), the
    result is written to a file in the working directory (else in the
    temporary directory) instead, and a line on stderr says where.
    """
    text = json.dumps(data, indent=2) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path
    except OSError as e:
        error = e
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        try:
            fd, name = tempfile.mkstemp(
                prefix=f"{path.stem}.", suffix=path.suffix or ".json", dir=folder
            )
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError:
            continue
        also = f"; the episode log {log} holds its episodes too" if log else ""
        print(
            f"jaxmesh {command}: error: cannot write {str(path)!r} "
            f"({error.strerror or error}); the result is in {name} instead{also}",
            file=sys.stderr,
        )
        return Path(name)
    raise error


def _resume_command(args: argparse.Namespace, config: dict, path: Any) -> str:
    """The command line that continues this run from ``path`` (secrets out)."""
    import shlex

    parts = ["jaxmesh", args.command, args.config]
    for item in args.set:
        parts += ["--set", item]
    if getattr(args, "episode_log", None) is not None:
        parts += ["--episode-log", str(args.episode_log)]
    parts += ["--resume", str(path)]
    return redact_text(shlex.join(parts), secret_values(config))


def _run_eval(
    args: argparse.Namespace,
    config: dict[str, Any],
    log_path: Path | None,
    policy: Any,
    env: Any,
    hooks: list,
    kwargs: dict,
) -> Any:
    """``jaxmesh.evaluate`` for ``eval``: an interrupted or failed run says
    where its finished episodes are and the command that continues it
    (Ctrl-C: one message, exit status 130; a failure: a note under its
    traceback)."""
    import jaxmesh

    try:
        return jaxmesh.evaluate(policy, env, hooks=hooks, **kwargs)
    except (ConfigError, ValueError, TypeError) as e:
        if not any(getattr(h, "started", False) for h in hooks):
            raise  # a refusal: nothing ran
        hint = _kept(args, config, log_path, e)
        e.add_note(hint)
        raise
    except KeyboardInterrupt as e:
        kept = _kept(args, config, log_path, e)
        print(f"jaxmesh {args.command}: interrupted. {kept}", file=sys.stderr)
        raise Interrupted() from None
    except Exception as e:
        e.add_note(_kept(args, config, log_path, e))
        raise


def _kept(
    args: argparse.Namespace, config: dict, log_path: Path | None, exc: Any
) -> str:
    """Where a stopped run's finished episodes are, and how to continue it
    (never raises: the run's own error comes first)."""
    try:
        return _keep(args, config, log_path, exc)
    except Exception as e:  # e.g. the partial result cannot be written either
        return f"jaxmesh: the finished episodes could not be saved ({e})."


def _keep(args: argparse.Namespace, config: dict, log_path: Any, exc: Any) -> str:
    from jaxmesh.suite import SuiteResult

    partial = getattr(exc, "partial_result", None)
    output = Path(config["output"]) if config.get("output") else None
    if isinstance(partial, SuiteResult):
        if output is None:
            return "The finished tasks are not saved (the config has no output)."
        where = write_json(output, partial.to_dict(), args.command)
        return (
            f"The finished tasks and episodes are in {where}; to run only the "
            f"rest: {_resume_command(args, config, where)}"
        )
    n = 0 if partial is None else partial.num_episodes
    if log_path is not None:
        where = log_path
    elif partial is not None and n:
        stem = output.with_suffix(".partial.json") if output else Path("partial.json")
        where = write_json(stem, partial.to_dict(), args.command)
    else:
        return f"{n} episodes had finished; nothing to resume from."
    return (
        f"{n} finished episodes are in {where}; to run only the rest: "
        f"{_resume_command(args, config, where)}"
    )


def cmd_eval(args: argparse.Namespace) -> int:
    config = _read_config(args)
    if compile_cache_wanted(args.no_compile_cache):
        try:
            enable_compile_cache()
        except OSError as e:  # a cache we cannot write only costs compile time
            print(
                f"jaxmesh eval: warning: compilation cache off ({e}); set "
                f"{CACHE_DIR_ENV} to a writable directory",
                file=sys.stderr,
            )
    report = report_path(args.report, config, args.config)
    suite = config.get("tasks") is not None
    video = video_path(getattr(args, "video", None), config)
    if video is not None and config.get("record") is None:
        config["record"] = check_record_config([0])
    resume_from = getattr(args, "resume", None)
    earlier = load_resume(resume_from) if resume_from is not None else None
    # A suite keeps no episode log: its output JSON is written after every task.
    log_path = None if suite else episode_log_path(args, config)
    output = Path(config["output"]) if config.get("output") else None
    npz = output.with_suffix(".npz") if output and config.get("record") else None
    check_writable(
        ("output", output),
        ("--episode-log", log_path),
        ("--report", report),
        ("--trace", getattr(args, "trace", None)),
        ("--video", video),
        ("the recorded episodes' file", npz),
    )
    policy, env, kwargs = build_run(config)
    if getattr(args, "trace", None) is not None:
        kwargs["trace"] = args.trace
    started = _Started()
    done = 0 if earlier is None or suite else earlier.num_episodes
    hooks: list = [started, Progress(enabled=not args.no_progress, initial=done)]
    if suite and config.get("output"):
        hooks.append(_SuiteSaver(Path(config["output"]), earlier))
    from jaxmesh.run import resume as resume_mod

    params = getattr(policy, "params", None)  # a Model's; a function has none
    steps = config.get("max_episode_steps")
    if log_path is not None:
        # A resumed run appends to its log; a new run starts it afresh.
        log = resume_mod.EpisodeLog(log_path, params=params, max_episode_steps=steps)
        hooks += [_LogStart(log_path, fresh=earlier is None), log]
        fp = dict(log.fp)
    else:
        fp = resume_mod.fingerprint(steps, params, digest=params is not None)
    if earlier is not None:
        kwargs["resume"] = earlier
    try:
        result = _run_eval(args, config, log_path, policy, env, hooks, kwargs)
    except (ValueError, TypeError) as e:  # jaxmesh.ParamError is a ValueError
        if started.started:
            raise
        text: Any = e
        if earlier is not None and str(e).startswith("resume="):
            text = f"--resume {resume_from}: {str(e).removeprefix('resume=: ')}"
        if not suite:
            raise ConfigError(_refused(config, text)) from e
        done = started.finished
        task = next((n for n in config["tasks"] if n not in done), None)
        line = _refused(config, text, task if done or earlier is not None else None)
        if done and config.get("output"):
            line += (
                f" (the tasks finished before it, {done}, are in {config['output']}: "
                f"fix this one, then --resume {config['output']} runs only the rest)"
            )
        elif done:
            line += f" (the tasks finished before it, {done}, are not saved: no output)"
        raise ConfigError(line) from e
    if suite:
        return _finish_suite(result, config, report, video)
    # What a later --resume of this result checks: the step cap, the params.
    result.fingerprint = {**(result.fingerprint or {}), **fp}
    print(result.summary())
    if args.telemetry:
        print(result.format_telemetry())
    base = output.parent if output is not None else None
    # The result first, then what is optional (trajectories, videos, report):
    # a failure in those never costs the result.
    written = None
    if output is not None:
        written = write_json(output, result.to_dict(), "eval", log_path)
        print(f"wrote {written}")
        if result.trajectories:
            print(f"wrote {result.save_trajectories(written.with_suffix('.npz'))}")
    if video is not None:
        write_videos(result, video, base, args.video is not _VIDEO_NEXT_TO_OUTPUT)
        if written is not None:  # the result lists its videos
            written = write_json(written, result.to_dict(), "eval", log_path)
    if report is not None:
        write_report_file(result, report, base)
    return 0 if written is None or written == output else 1


#: ``jaxmesh sweep``: the config keys that may hold a list of values to sweep.
SWEEP_AXES = ("delay", "horizon", "delay_ms")


def cmd_sweep(args: argparse.Namespace) -> int:
    import jaxmesh

    raw = apply_overrides(load_config(args.config), args.set)
    axes = {}
    for key in SWEEP_AXES:
        value = raw.pop(key, None)
        if value is None and key == "delay_ms":
            continue
        if value is None:
            value = [0 if key == "delay" else 1]
        axes[key] = value if isinstance(value, list) else [value]
    config = check_run_config(raw)
    if config.get("tasks") is not None:
        raise ConfigError(
            "jaxmesh sweep with tasks: a sweep runs one env; pick a task with "
            "--set env=..."
        )
    output = Path(config["output"]) if config.get("output") else None
    cells_path = None if output is None else output.with_suffix(SWEEP_CELLS_SUFFIX)
    resume_from = getattr(args, "resume", None)
    earlier = None
    if resume_from is not None:
        earlier = _existing_file(
            resume_from,
            "--resume file",
            f"pass the cells file of the sweep to continue (NAME{SWEEP_CELLS_SUFFIX} "
            "next to its output)",
        )
    check_writable(("output", output), ("the sweep's cells file", cells_path))
    policy, env, kwargs = build_run(config)
    from jaxmesh.run.resume import params_digest

    identity = _jsonable(
        {
            **{k: v for k, v in config.items() if k != "output" and v is not None},
            **axes,
            "params": params_digest(getattr(policy, "params", None)),
        }
    )
    done = {} if earlier is None else load_sweep_cells(earlier, identity)
    cells = None
    if cells_path is not None:
        cells = SweepCells(cells_path, identity, done)
    try:
        result = jaxmesh.sweep(
            policy,
            env,
            **axes,
            **kwargs,
            on_cell=None if cells is None else cells.write,
            resume=done or None,
        )
    except (ValueError, TypeError) as e:
        if cells is not None and cells.started:
            if cells.count:
                e.add_note(_sweep_kept(args, config, cells))
            raise
        raise ConfigError(_refused(config, e)) from e
    except KeyboardInterrupt:
        kept = "No cell was kept (no output)."
        if cells is not None:
            kept = _sweep_kept(args, config, cells)
        print(f"jaxmesh sweep: interrupted. {kept}", file=sys.stderr)
        raise Interrupted() from None
    except Exception as e:
        if cells is not None and cells.count:
            e.add_note(_sweep_kept(args, config, cells))
        raise
    finally:
        if cells is not None:
            cells.close()
    print(result.summary())
    if output is not None:
        written = write_json(output, result.to_dict(), "sweep", cells_path)
        print(f"wrote {written}")
        return 0 if written == output else 1
    return 0


#: The suffix of the file next to a sweep's output JSON where each finished
#: cell is written as it finishes.
SWEEP_CELLS_SUFFIX = ".cells.jsonl"
#: The key of a sweep cells file's first line.
SWEEP_CELLS_KEY = "jaxmesh_sweep_cells"


def _jsonable(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples as lists, objects as text)."""
    return json.loads(json.dumps(value, default=str))


class SweepCells:
    """``jaxmesh sweep``'s cells file, ``NAME.cells.jsonl``: a first line with
    the sweep's config (``{"jaxmesh_sweep_cells": 1, "config": {...}}``), then
    one flushed line per finished cell (``{"cell": {"delay", "horizon",
    "result"}}``), written as each cell ends: a stopped sweep keeps them, and
    ``--resume`` runs only the others. A new sweep starts the file afresh; a
    resumed one rewrites the cells it continues from, then appends."""

    def __init__(self, path: Path, identity: dict, done: dict):
        self.path, self.identity, self.done = path, identity, dict(done)
        self.file: Any = None
        self.count = 0
        self.started = False

    def _open(self) -> None:
        if not self.done and self.path.is_file() and self.path.stat().st_size:
            print(
                f"jaxmesh sweep: note: starting the cells file {self.path} afresh "
                f"(--resume {self.path} continues the sweep it holds)",
                file=sys.stderr,
            )
        # The head and the resumed cells go in whole (a new file renamed over
        # the old), so that the file never holds fewer cells than before.
        lines = [{SWEEP_CELLS_KEY: 1, "config": self.identity}]
        for (d, h), r in self.done.items():
            lines.append({"cell": {"delay": d, "horizon": h, "result": r.to_dict()}})
        fresh = self.path.with_name(self.path.name + ".new")
        fresh.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
        os.replace(fresh, self.path)
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _line(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def write(self, delay: int, horizon: int, result: Any) -> None:
        """``jaxmesh.sweep``'s ``on_cell``: one finished cell."""
        self.started = True
        if self.file is None:
            self._open()
        record = {"delay": delay, "horizon": horizon, "result": result.to_dict()}
        self._line({"cell": record})
        self.count += 1

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _sweep_kept(args: argparse.Namespace, config: dict, cells: SweepCells) -> str:
    n = cells.count + len(cells.done)
    if not n:
        return "No cell had finished."
    return (
        f"{n} finished cell(s) are in {cells.path}; to run only the rest: "
        f"{_resume_command(args, config, cells.path)}"
    )


def load_sweep_cells(path: Path, identity: dict) -> dict:
    """The finished cells of a sweep cells file (``SweepCells``), checked to be
    of the sweep ``identity`` describes.

    Returns:
      ``(delay, horizon) -> RunResult``; a line cut short (a sweep killed while
      writing it) is skipped.

    Raises:
      ConfigError: not a cells file, or a sweep of another config (naming the
        key that differs).
    """
    from jaxmesh.results.result import RunResult

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--resume {str(path)!r}: cannot read it ({e})") from e
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):  # cut short by a killed sweep
                continue
            raise ConfigError(
                f"--resume {str(path)!r}: line {n} is not JSON; expected the cells "
                f"file of jaxmesh sweep (NAME{SWEEP_CELLS_SUFFIX})"
            ) from None
    head = records[0] if records else None
    if not (isinstance(head, dict) and SWEEP_CELLS_KEY in head):
        raise ConfigError(
            f"--resume {str(path)!r}: not a sweep's cells file (its first line holds "
            f"no {SWEEP_CELLS_KEY!r}); pass the NAME{SWEEP_CELLS_SUFFIX} file next to "
            "the output of the sweep to continue"
        )
    before = head.get("config") or {}
    for key in sorted(set(before) | set(identity)):
        if before.get(key) != identity.get(key):
            raise ConfigError(
                f"--resume {str(path)!r}: the earlier sweep had {key}="
                f"{before.get(key)!r}, this call {identity.get(key)!r}; a sweep "
                "resumes only with the same config (pass the same one, or start a "
                "new sweep without --resume)"
            )
    cells = {}
    try:
        for rec in records[1:]:
            c = rec["cell"]
            cells[(int(c["delay"]), int(c["horizon"]))] = RunResult.from_dict(
                c["result"]
            )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"--resume {str(path)!r}: a malformed cell ({e})") from e
    return cells


class _SuiteSaver:
    """The hook that writes a suite's output JSON after every task, so a run
    that fails keeps the tasks it finished (``--resume`` continues it)."""

    def __init__(self, path: Path, earlier: Any):
        self.path = path
        self.tasks = dict(getattr(earlier, "tasks", None) or {})

    def on_task_end(self, name: str, result: Any) -> None:
        from jaxmesh.suite import SuiteResult

        self.tasks[name] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(SuiteResult(dict(self.tasks)).to_dict(), indent=2)
        self.path.write_text(text + "\n")


def _finish_suite(
    result: Any, config: dict[str, Any], report: Path | None, video: Path | None
) -> int:
    """``eval``'s output of a suite: the per-task table, the videos (each
    task's recorded episodes, ``<video stem>.<task>.ep<i><suffix>``), the
    JSON, the report."""
    print(result.summary())
    if video is not None:
        for name, task in result.tasks.items():
            target = video.with_name(f"{video.stem}.{name}{video.suffix}")
            write_videos(task, target, None, explicit=False)
    if config.get("output"):
        out = Path(config["output"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        print(f"wrote {out}")
    if report is not None:
        write_report_file(result, report)
    return 0


#: The suffix of the episode log next to the output JSON.
EPISODE_LOG_SUFFIX = ".episodes.jsonl"


def episode_log_path(args: argparse.Namespace, config: dict[str, Any]) -> Path | None:
    """Where ``eval`` streams its episodes: ``--episode-log PATH``, else next to
    the output JSON as ``NAME.episodes.jsonl``; None with ``--no-episode-log``
    or when the config writes no JSON.

    Raises:
      ConfigError: the path is the output JSON or the config itself.
    """
    if getattr(args, "no_episode_log", False):
        return None
    given = getattr(args, "episode_log", None)
    output = config.get("output")
    if given is not None:
        path = Path(given)
    elif output:
        path = Path(output).with_suffix(EPISODE_LOG_SUFFIX)
    else:
        return None
    for name, other in (("the config", args.config), ("output", output)):
        if other and path.resolve() == Path(other).resolve():
            raise ConfigError(
                f"--episode-log {str(path)!r} is {name} file {str(other)!r}; the "
                "log would overwrite it: pass another path, e.g. --episode-log "
                "run.episodes.jsonl"
            )
    return path


class _LogStart:
    """The hook before ``eval``'s ``jaxmesh.EpisodeLog``: once the run starts
    (so that a refused run leaves an earlier log as it was), it makes the log's
    folder and, for a new run (``fresh``), empties the file: a log holds one
    run and its resumptions."""

    def __init__(self, path: Path, fresh: bool):
        self.path, self.fresh = path, fresh

    def on_run_start(self, info: dict) -> None:
        del info
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.fresh:
            return
        if self.path.is_file() and self.path.stat().st_size:
            print(
                f"jaxmesh eval: note: starting the episode log {self.path} afresh "
                f"(--resume {self.path} continues the run it holds)",
                file=sys.stderr,
            )
        self.path.write_text("", encoding="utf-8")


def load_resume(path: str | Path) -> Any:
    """The earlier run ``eval --resume PATH`` continues, as a ``RunResult``: an
    episode log (its first line is a ``jaxmesh_episode_log`` run line:
    ``jaxmesh.load_episode_log``) or a result JSON (``RunResult.from_dict``).

    Raises:
      ConfigError: the file is missing, or is neither.
    """
    from jaxmesh.run.resume import LOG_KEY, load_episode_log, load_results

    p = _existing_file(
        path,
        "--resume file",
        "pass the episode log (NAME.episodes.jsonl) or the result JSON of the run "
        "to continue",
    )
    try:
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"--resume {str(path)!r}: cannot read it as text ({e})"
        ) from e
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = None  # a result JSON is indented: its first line is "{"
    try:
        if isinstance(head, dict) and LOG_KEY in head:
            return load_episode_log(p)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"neither an episode log (a first line holding {LOG_KEY!r}) nor "
                f"a result JSON ({e})"
            ) from None
        if isinstance(data, dict) and data.get("suite"):
            from jaxmesh.suite import SuiteResult

            return SuiteResult.from_dict(data)
        return load_results(p)  # RunResult.from_dict, with each episode's line
    except (ValueError, OSError) as e:
        raise ConfigError(f"--resume {str(path)!r}: {e}") from e


#: ``--video`` given without a path.
_VIDEO_NEXT_TO_OUTPUT = object()


def video_path(given: Any, config: dict[str, Any]) -> Path | None:
    """Where ``eval --video`` writes the first recorded episode's video,
    checked before the run (imageio is needed).

    Without a path: next to the output JSON as ``<name>.ep<i>.mp4``, or
    ``video.ep<i>.mp4`` without one.

    Raises:
      ConfigError: imageio (or imageio-ffmpeg for a non-GIF) is missing.
    """
    if given is None:
        return None
    if given is _VIDEO_NEXT_TO_OUTPUT:
        output = config.get("output")
        path = Path(output).with_suffix(".mp4") if output else Path("video.mp4")
    else:
        path = Path(given)
    need = ["imageio"] + ([] if path.suffix.lower() == ".gif" else ["imageio_ffmpeg"])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"--video {str(path)!r} needs {', '.join(missing)}, which is not "
            "installed; run: pip install 'jaxmesh[video]'"
        )
    return path


def write_videos(
    result: Any, path: Path, base: Path | None, explicit: bool = True
) -> None:
    """Renders every recorded episode (``jaxmesh.render``): episode i to
    ``<path stem>.ep<i><suffix>``, or to ``path`` itself when it was given
    (``explicit``) and one episode was recorded. Video names in the result
    become relative to ``base`` (the output JSON's folder), where ``jaxmesh
    report`` reads them.
    """
    from jaxmesh.results.video import render

    trajectories = result.trajectories or []
    for tr in trajectories:
        if explicit and len(trajectories) == 1:
            target = path
        else:
            target = path.with_name(f"{path.stem}.ep{tr.episode}{path.suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        frames = None
        if tr.frames is None and "libero:" in str(result.env):
            # Worker processes capture no render() frames: a LIBERO episode's
            # video is its recorded camera image.
            from jaxmesh.envs.libero import video_frame as frames
        try:
            render(result, tr.episode, target, frames=frames)
        except (ValueError, ImportError) as e:
            raise ConfigError(f"--video: episode {tr.episode}: {e}") from e
        print(f"wrote {target}")
    if base is not None:
        result.videos = [
            os.path.relpath(Path(v).absolute(), base.absolute()) for v in result.videos
        ]


#: ``--report`` given without a path.
_NEXT_TO_OUTPUT = object()


def _need_matplotlib(what: str) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            f"{what} needs matplotlib, which is not installed; run: pip install "
            "'jaxmesh[report]'"
        )


def report_path(given: Any, config: dict[str, Any], config_path: str) -> Path | None:
    """Where ``eval --report`` writes the report, checked before the run.

    ``--report`` alone puts it next to the result JSON (``output`` with the
    suffix ``.html``), or in ``report.html`` when the config writes no JSON.

    Raises:
      ConfigError: matplotlib is missing, or the path is the config's or the
        JSON's own (the report would overwrite it).
    """
    if given is None:
        return None
    _need_matplotlib("--report")
    if given is _NEXT_TO_OUTPUT:
        output = config.get("output")
        path = Path(output).with_suffix(".html") if output else Path("report.html")
    else:
        path = Path(given)
    for name, other in (("the config", config_path), ("output", config.get("output"))):
        if other and path.resolve() == Path(other).resolve():
            raise ConfigError(
                f"--report {str(path)!r} is {name} file {str(other)!r}; the report "
                "would overwrite it: pass another path, e.g. --report report.html"
            )
    return path


def write_report_file(result: Any, path: Path, base: Path | None = None) -> None:
    """Writes ``result``'s HTML report to ``path`` and says so on stdout.

    ``base``: the folder relative video paths of the result are read from.

    Raises:
      ConfigError: the file cannot be written.
    """
    from jaxmesh.results.report import write_report, write_suite_report
    from jaxmesh.suite import SuiteResult

    try:
        if isinstance(result, SuiteResult):
            write_suite_report(result, path)
        else:
            write_report(result, path, base=base)
    except OSError as e:
        raise ConfigError(
            f"cannot write the report to {str(path)!r}: {e}; pass a writable path"
        ) from e
    print(f"wrote {path}")


def cmd_explain(args: argparse.Namespace) -> int:
    import jaxmesh

    config = _read_config(args)
    policy, env, _ = build_run(config)
    num_envs = config.get("num_envs")
    if num_envs is None:  # what evaluate would use
        num_envs = inspect.signature(jaxmesh.evaluate).parameters["num_envs"].default
    if not _is_jax_id(env):
        env, lanes = host_env_spec(env, config)
        num_envs = min(num_envs, lanes)
    try:
        explanation = jaxmesh.explain(policy, env, num_envs=num_envs)
    except (ValueError, TypeError) as e:
        raise ConfigError(_refused(config, e)) from e
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
        if _is_served(env):
            from jaxmesh.run.served import ServedLanes

            addresses = [env] if isinstance(env, str) else list(env)
            served = served_options(config)
            lanes = ServedLanes(
                addresses,
                sys.maxsize,
                token=served.token,
                credentials=served.credentials,
            )
            count = lanes.num_lanes
        else:
            from jaxmesh.envs.gymnasium import make_lanes

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


def load_result(path: str | Path) -> Any:
    """The ``RunResult`` in a JSON file written by ``jaxmesh eval``.

    Raises:
      ConfigError: the file is missing, is not JSON, or is not a result.
    """
    from jaxmesh.results.result import RunResult

    p = _existing_file(
        path,
        "result file",
        "pass the JSON that jaxmesh eval wrote (its config's output key)",
    )
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"result file {str(path)!r} is not valid JSON: {e}") from e
    try:
        result = RunResult.from_dict(data)
        npz = p.with_suffix(".npz")  # what eval wrote for a run with record:
        if data.get("recorded") and npz.is_file():
            result.load_trajectories(npz, data["recorded"])
        return result
    except (ValueError, OSError) as e:
        raise ConfigError(f"result file {str(path)!r}: {e}") from e


def cmd_compare(args: argparse.Namespace) -> int:
    from jaxmesh.results.stats import compare

    a, b = load_result(args.a), load_result(args.b)
    try:
        comparison = compare(a, b, resamples=args.resamples, seed=args.seed)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{args.a} and {args.b}: {e}") from e
    print(comparison)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    _need_matplotlib("jaxmesh report")
    result = load_result(args.results)
    out = Path(args.output) if args.output else Path(args.results).with_suffix(".html")
    if out.resolve() == Path(args.results).resolve():
        raise ConfigError(
            f"-o {str(out)!r} is the results file itself; pass another path, e.g. "
            "-o report.html"
        )
    write_report_file(result, out, Path(args.results).parent)
    return 0


def cmd_check_env(args: argparse.Namespace) -> int:
    """Prints ``jaxmesh.check_seeds``' report; 0 when reproducible, 1 when not."""
    from jaxmesh.envs.check import check_seeds
    from jaxmesh.run.backend import SERVED

    env = args.env
    check_env(env)  # an address's form, before anything is dialled
    served = _backend(env) == SERVED
    if not served and (args.token is not None or args.tls_ca is not None):
        raise ConfigError(
            f"--token / --tls-ca are for a served env (grpc://host:port); env "
            f"{env!r} runs in this process"
        )
    if args.tls_ca is not None and not Path(args.tls_ca).is_file():
        raise ConfigError(f"--tls-ca {args.tls_ca!r}: no such PEM file")
    if _is_gymnasium_id(env) and importlib.util.find_spec("gymnasium") is None:
        raise ConfigError(
            f"env={env!r}: gymnasium is not installed; run: pip install gymnasium"
        )
    extra = {}
    if served:
        from jaxmesh.remote.address import require_grpc
        from jaxmesh.remote.protocol import TOKEN_ENV

        try:
            require_grpc()
        except ImportError as e:
            raise ConfigError(f"env={env!r}: {e}") from e
        token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
        extra = {
            "token": token or None,
            "credentials": _channel_credentials(args.tls_ca),
        }
    try:
        report = check_seeds(env, args.seed, args.other, steps=args.steps, **extra)
    except (ValueError, TypeError, ImportError) as e:
        raise ConfigError(f"cannot check env {env!r}: {e}") from e
    print(report.message)
    return 0 if report.reproducible else 1


def _server_credentials(cert: str | None, key: str | None) -> Any:
    """``grpc.ssl_server_credentials`` from PEM files (None: no TLS)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError(
            f"--tls-cert {cert!r} and --tls-key {key!r}: TLS needs both the "
            "certificate chain and its private key (PEM files); give both, or "
            "neither for a plain server"
        )
    import grpc

    pems = []
    for flag, path in (("--tls-key", key), ("--tls-cert", cert)):
        try:
            pems.append(Path(path).read_bytes())
        except OSError as e:
            raise ConfigError(f"{flag} {path!r}: cannot read it ({e})") from e
    return grpc.ssl_server_credentials([(pems[0], pems[1])])


#: What ``serve-env`` takes as its env, for its refusals.
SERVE_ENV_FORMS = (
    "serve-env serves gymnasium envs: give gymnasium:<id> or <id> (e.g. "
    "gymnasium:CartPole-v1), or gymnasium:<module>:<id> for an env that <module> "
    "registers when imported"
)


def serve_env_id(env: str) -> str:
    """``serve-env``'s env argument as ``"gymnasium:<id>"``.

    ``gymnasium:<id>`` is kept, a bare ``<id>`` gets the prefix. Anything else
    with a colon is refused: gymnasium would read ``gymnax:CartPole-v1`` as
    "import gymnax, then make CartPole-v1" and quietly serve its own env.

    Raises:
      ConfigError: another prefix, or an id ``lanes.parse_id`` refuses.
    """
    from jaxmesh.envs.gymnasium.lanes import PREFIX, parse_id

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
    """``serve-env libero:<suite>/<i>``: a factory of its ``lanes`` envs (built
    when the server starts), the id and ``--env-config`` checked now.

    Raises:
      ConfigError: bad JSON, an unknown suite, task or option, LIBERO or its
        OpenGL library missing.
    """
    import functools

    from jaxmesh.envs import libero

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
    """Holds back what is written to file descriptor 2 inside the block (gRPC's
    C core logs there, e.g. its own line for a port in use).

    On success it is written out after the block; when the block raises it is
    dropped: the error is reported as jaxmesh's one line. Where fd 2 cannot be
    redirected, the block runs as it is.
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    held = tempfile.TemporaryFile()
    ok = False
    try:
        os.dup2(held.fileno(), 2)
        yield
        ok = True
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if ok:
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()
        held.close()


def cmd_serve_env(args: argparse.Namespace) -> int:
    """Serves a gymnasium env over gRPC until SIGTERM/SIGINT (exit 0)."""
    import signal
    import threading

    from jaxmesh.remote.protocol import TOKEN_ENV
    from jaxmesh.remote.server import EnvServer, ServeOptions

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
    if args.ready_fd is not None:
        try:
            os.fstat(args.ready_fd)
        except OSError as e:
            raise ConfigError(
                f"--ready-fd {args.ready_fd}: not an open file descriptor ({e}); "
                "pass one the parent keeps open (e.g. subprocess pass_fds)"
            ) from e
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    credentials = _server_credentials(args.tls_cert, args.tls_key)
    try:
        options = ServeOptions(
            idle_timeout_seconds=args.idle_timeout,
            allow_remote_shutdown=args.allow_remote_shutdown,
            token=token or None,
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

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(server.address, flush=True)
    print(
        f"jaxmesh serve-env: serving {args.env} ({server.num_lanes} lanes) at "
        f"{server.address}; SIGTERM or Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    if args.ready_fd is not None:
        os.write(args.ready_fd, f"{server.address}\n".encode())
        os.close(args.ready_fd)
    while not server.wait(1.0):
        pass
    return 0


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config, e.g. configs/cartpole.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (dotted for nested: policy_config.checkpoint=X); "
        "repeatable; VALUE is parsed as YAML",
    )


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxmesh", description="Evaluate RL policies with jaxmesh."
    )
    parser.add_argument("--version", action="version", version=f"jaxmesh {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    keys = "; ".join(f"{k}: {d}" for k, d in CONFIG_KEYS.items())
    ev = sub.add_parser(
        "eval",
        help="evaluate a policy from a YAML run config",
        description=f"Evaluate a policy from a YAML run config. Config keys: {keys}",
    )
    _add_config_args(ev)
    ev.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr"
    )
    ev.add_argument(
        "--no-compile-cache",
        action="store_true",
        help=f"do not use the persistent compilation cache (also {CACHE_SWITCH_ENV}=0;"
        f" its directory: ${CACHE_DIR_ENV}, else ~/.cache/jaxmesh/xla)",
    )
    ev.add_argument(
        "--telemetry",
        action="store_true",
        help="after the summary, print per-call timings (predict, env step, "
        "encode, decode, wire, queue; message bytes) of a gymnasium: or grpc:// "
        "run: result.format_telemetry()",
    )
    ev.add_argument(
        "--report",
        nargs="?",
        const=_NEXT_TO_OUTPUT,
        default=None,
        metavar="PATH",
        help="after the run, write its HTML report (summary, plots, settings, "
        "telemetry, episodes) to PATH; without PATH, next to the output JSON "
        "(.html) or to report.html. Needs matplotlib (pip install "
        "'jaxmesh[report]')",
    )
    ev.add_argument(
        "--video",
        nargs="?",
        const=_VIDEO_NEXT_TO_OUTPUT,
        default=None,
        metavar="PATH",
        help="record episode 0 (or the config's record: episodes) and render "
        "each to a video (jaxmesh.render): PATH (.mp4, .gif), or without PATH "
        "next to the output JSON as NAME.ep<i>.mp4; the report embeds them. "
        "Needs imageio (pip install 'jaxmesh[video]')",
    )
    ev.add_argument(
        "--trace",
        default=None,
        metavar="PATH",
        help="write the run's timeline to PATH as Chrome-trace / Perfetto JSON "
        "(open it at https://ui.perfetto.dev)",
    )
    logs = ev.add_mutually_exclusive_group()
    logs.add_argument(
        "--episode-log",
        default=None,
        metavar="PATH",
        help="stream each finished episode to this JSON-lines file (default: next "
        f"to the output JSON as NAME{EPISODE_LOG_SUFFIX}; none without output); a "
        "new run starts it afresh, --resume appends to it",
    )
    logs.add_argument(
        "--no-episode-log", action="store_true", help="write no episode log"
    )
    ev.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue an earlier run of this config: PATH is its episode log or "
        "its result JSON; only the episodes it lacks run, and the output holds "
        "the whole budget. A file of another run (policy, params, env, seeds, "
        "settings) is refused (status 2)",
    )
    ev.set_defaults(run=cmd_eval)
    sw = sub.add_parser(
        "sweep",
        help="score a policy at every delay x horizon of a grid, in one program",
        description="Score a policy from a YAML run config at every (delay, "
        "horizon) of a grid (jaxmesh.sweep), on the same seeds: e.g. --set "
        "delay=[0,1,2,4] --set horizon=[4,8]. Prints the table of success rate "
        "and mean return per cell and writes the sweep's JSON to the config's "
        "output.",
    )
    _add_config_args(sw)
    sw.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help=f"continue a stopped sweep of this config: PATH is its NAME"
        f"{SWEEP_CELLS_SUFFIX} (each finished cell, written next to the output as "
        "it finished); only the other cells run. A sweep of another config is "
        "refused (status 2)",
    )
    sw.set_defaults(run=cmd_sweep)
    ex = sub.add_parser(
        "explain",
        help="print what a run config's policy reads and holds per lane",
        description="Print jaxmesh.explain(policy, env, num_envs) for a run "
        "config: the observation leaves read, the frame windows and their bytes "
        f"per lane and for num_envs lanes. Compiles nothing. Config keys: {keys}",
    )
    _add_config_args(ex)
    ex.set_defaults(run=cmd_explain)
    de = sub.add_parser("describe", help="print a model's describe() as JSON")
    de.add_argument(
        "target", help="module:Class, e.g. jaxmesh.zoo.cartpole:CartPoleMLP"
    )
    de.set_defaults(run=cmd_describe)
    co = sub.add_parser(
        "compare",
        help="compare two eval results on the same seeds, episode by episode",
        description="Pair two results written by jaxmesh eval (the same seeds) "
        "episode by episode and print jaxmesh.compare(A, B): the mean of B - A, "
        "its percentile bootstrap interval (95%%) and the share of seeds where B "
        "scores more (ties count half).",
    )
    co.add_argument("a", metavar="A.json", help="the baseline result")
    co.add_argument("b", metavar="B.json", help="the result compared with it")
    co.add_argument(
        "--resamples",
        type=int,
        default=10_000,
        metavar="N",
        help="bootstrap resamples (default 10000)",
    )
    co.add_argument(
        "--seed", type=int, default=0, help="the bootstrap's seed (default 0)"
    )
    co.set_defaults(run=cmd_compare)
    rp = sub.add_parser(
        "report",
        help="write the HTML report of a result eval wrote",
        description="Write one self-contained HTML page (summary table, plots, "
        "settings, telemetry, the first 1,000 episodes) of a result written by "
        "jaxmesh eval (its config's output key). Needs matplotlib (pip install "
        "'jaxmesh[report]').",
    )
    rp.add_argument("results", metavar="RESULTS.json", help="the result of eval")
    rp.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="REPORT.html",
        help="the HTML file to write (default: RESULTS with the suffix .html)",
    )
    rp.set_defaults(run=cmd_report)
    ce = sub.add_parser(
        "check-env",
        help="check that an env is reproducible from its seed",
        description="Reset the env twice with --seed and once with --other, step "
        "each --steps times with one fixed action, and print jaxmesh.check_seeds'"
        "s report: whether the same seed gives the same observations, rewards and "
        "ends (reproducible), and another seed something else (seed-sensitive). "
        "Exit status 0 when reproducible, 1 when not, 2 for bad input.",
    )
    ce.add_argument(
        "env",
        help="gymnasium:<id> (made here), grpc://host:port (lane 0 of a server, "
        "which must be free), or a JAX env id (gymnax:, brax:)",
    )
    ce.add_argument("--seed", type=int, default=0, help="the seed reset twice (0)")
    ce.add_argument(
        "--other", type=int, default=1, help="the seed compared with it (1)"
    )
    ce.add_argument(
        "--steps",
        type=int,
        default=5,
        metavar="N",
        help="env steps compared after each reset (default 5)",
    )
    ce.add_argument(
        "--token",
        default=None,
        help="a served env's session token (default: $JAXMESH_TOKEN)",
    )
    ce.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="grpcs:// servers: the CA the server's certificate is checked against",
    )
    ce.set_defaults(run=cmd_check_env)
    se = sub.add_parser(
        "serve-env",
        help="serve a gymnasium env over gRPC (jaxmesh.EnvServer)",
        description="Serve a gymnasium env's lanes over gRPC until SIGTERM or "
        "Ctrl-C. Prints the address on stdout once serving. Binding a "
        "non-loopback address needs --token (or JAXMESH_TOKEN) or --insecure.",
    )
    se.add_argument(
        "env",
        help="gymnasium:<id> or <id>, e.g. gymnasium:CartPole-v1 "
        "(gymnasium:<module>:<id> imports <module> first), or a LIBERO task "
        "libero:<suite>/<i> (options: --env-config)",
    )
    se.add_argument(
        "--lanes", type=int, default=None, help="envs to make (lanes; default 1)"
    )
    se.add_argument(
        "--address",
        default="127.0.0.1:0",
        help="HOST:PORT to bind (default 127.0.0.1:0: a free loopback port)",
    )
    se.add_argument(
        "--ready-fd",
        type=int,
        default=None,
        metavar="FD",
        help="write the address and a newline to this fd once serving, then close it",
    )
    se.add_argument(
        "--token",
        default=None,
        help="session token every call must carry (default: $JAXMESH_TOKEN)",
    )
    se.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="end a session after S seconds without a request (default 300)",
    )
    se.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback address with no token and no TLS",
    )
    se.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help="serve over TLS with this certificate chain (clients: grpcs://)",
    )
    se.add_argument(
        "--tls-key", default=None, metavar="PEM", help="the --tls-cert private key"
    )
    se.add_argument(
        "--allow-remote-shutdown",
        action="store_true",
        help="let the Shutdown RPC stop the server",
    )
    se.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="W",
        help="worker processes stepping groups of a gymnasium:<id> env's lanes "
        "(threads for envs built by a factory; default 1)",
    )
    se.add_argument(
        "--env-config",
        default=None,
        metavar="JSON",
        help="libero:<suite>/<i> envs: their options as a JSON object, e.g. "
        "'{\"camera_size\": 128}' (jaxmesh.make_env(env, **options))",
    )
    se.set_defaults(run=cmd_serve_env)
    return parser


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``jaxmesh`` command line; returns the exit status.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
      0 on success, 2 for bad input (one line on stderr). An error raised while
      a run is going propagates with its traceback.
    """
    # As ``python -m`` does: a config's ``policy: mymodule:fn`` names a module
    # in the working directory (the console script leaves it off sys.path).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the message
        return int(e.code or 0)
    try:
        return args.run(args)
    except Interrupted:
        return 130
    except ConfigError as e:
        # No secret is echoed: the token given on the command line or in
        # $JAXMESH_TOKEN (a config's token is taken out where it is read).
        given = {"token": getattr(args, "token", None)}
        line = redact_text(_one_line(str(e)), secret_values(given))
        print(f"jaxmesh {args.command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
