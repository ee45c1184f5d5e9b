"""The ``jaxmesh`` command line.

Commands::

    jaxmesh eval CONFIG.yaml [--set KEY=VALUE ...] [--no-progress]
    jaxmesh describe MODULE:CLASS

``eval`` reads a YAML run config (keys in ``CONFIG_KEYS``; see ``docs/cli.md``),
applies ``--set`` overrides, builds the env and the policy, runs
``jaxmesh.evaluate`` with a progress bar on stderr, prints the summary and
writes the result as JSON. A bad config exits with status 2 and a message on
stderr; a successful run exits 0.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import importlib
import inspect
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

#: Every key a run config may hold, with what it means.
CONFIG_KEYS: dict[str, str] = {
    "env": "env id, e.g. gymnax:CartPole-v1 (required)",
    "policy": "module:Class or module:function to import (required)",
    "policy_config": "mapping passed to Class.from_config(**...) or Class(**...)",
    "episodes": "episode budget; seeds default to 0..episodes-1",
    "seeds": "explicit list of seeds, one per episode",
    "num_envs": "parallel lanes",
    "horizon": "actions of a chunk executed before the next plan",
    "prefetch_lead": "0 is synchronous; L > 0 plans L steps early",
    "max_episode_steps": "cap on episode length (null: the env's own limit)",
    "plan_tile": "rows per policy call",
    "segment_steps": "env steps per scan segment between host visits",
    "output": "JSON file to write the result to (null: write none)",
}
_INT_KEYS = {
    "episodes": 0,
    "num_envs": 1,
    "horizon": 1,
    "prefetch_lead": 0,
    "max_episode_steps": 1,
    "plan_tile": 1,
    "segment_steps": 1,
}
_REQUIRED = ("env", "policy")


class ConfigError(Exception):
    """A run config (or a command's argument) is wrong; exit status 2."""


# Config ----------------------------------------------------------------------
def load_config(path: str | Path) -> dict[str, Any]:
    """Reads a YAML run config (a mapping at the top level).

    Raises:
      ConfigError: the file is missing, is not valid YAML, or is not a mapping.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"config file {str(path)!r} not found (looked in {str(p.absolute())!r}); "
            "pass the path of a YAML run config, e.g. configs/cartpole.yaml"
        )
    try:
        data = yaml.safe_load(p.read_text())
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

    Values are parsed as YAML scalars (``8`` is an int, ``null`` is None,
    ``true`` a bool, anything else a string). Returns a new dict.

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
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
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


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Checks keys and value types; returns the config with defaults filled.

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
        allowed = "\n".join(f"  {k}: {doc}" for k, doc in CONFIG_KEYS.items())
        raise ConfigError(
            f"unknown config key(s) {unknown}{hint}; allowed keys:\n{allowed}"
        )
    missing = [k for k in _REQUIRED if config.get(k) in (None, "")]
    if missing:
        raise ConfigError(
            f"config is missing {missing}; e.g. env: gymnax:CartPole-v1 and policy: "
            "jaxmesh.zoo.cartpole:CartPoleMLP"
        )
    for key in ("env", "policy"):
        if not isinstance(config[key], str):
            raise ConfigError(f"{key}={config[key]!r}: expected a string")
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
    pc = config.get("policy_config")
    if pc is not None and not isinstance(pc, dict):
        raise ConfigError(
            f"policy_config={pc!r}: expected a mapping of keyword arguments"
        )
    seeds = config.get("seeds")
    if seeds is not None and not (
        isinstance(seeds, list)
        and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise ConfigError(f"seeds={seeds!r}: expected a list of ints")
    out = dict(config)
    out["policy_config"] = dict(pc or {})
    if out.get("output") is not None:
        out["output"] = str(out["output"])
    return out


# Building --------------------------------------------------------------------
def import_target(target: str) -> Any:
    """Imports ``module:Name`` (``Name`` may be dotted).

    Raises:
      ConfigError: bad form, or the module or name cannot be found.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{target!r}: expected 'module:Name', e.g. jaxmesh.zoo.cartpole:CartPoleMLP"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"{target!r}: cannot import module {module_name!r}: {e}"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{target!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def build_policy(target: str, policy_config: dict[str, Any]) -> Any:
    """Builds the policy named by ``module:Name``.

    A class is built with ``Class.from_config(**policy_config)`` if it has
    ``from_config``, else ``Class(**policy_config)``. Anything else callable (a
    function, a model instance) is used as it is, with no ``policy_config``.

    Raises:
      ConfigError: the target cannot be imported or built from the config.
    """
    obj = import_target(target)
    if inspect.isclass(obj):
        how = "from_config" if hasattr(obj, "from_config") else "constructor"
        build = obj.from_config if how == "from_config" else obj
        try:
            policy = build(**policy_config)
            from jaxmesh.model import Model

            if isinstance(policy, Model):
                # Load the weights now: a bad checkpoint is a config error.
                policy._ensure_loaded()
            return policy
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(
                f"cannot build policy {target!r} ({how}) from policy_config "
                f"{policy_config!r}: {e}"
            ) from e
    if not callable(obj):
        raise ConfigError(
            f"policy {target!r} is a {type(obj).__name__}; expected a class, a "
            "jaxmesh.Model or a function obs -> action"
        )
    if policy_config:
        raise ConfigError(
            f"policy {target!r} is not a class, so it takes no policy_config; got "
            f"{policy_config!r}. Remove policy_config or point policy at a class"
        )
    return obj


# Progress --------------------------------------------------------------------
class Progress:
    """A tqdm bar on stderr: episodes done of the budget, and env steps/s.

    The rate while running counts the steps of finished episodes since the
    first one ended (so compile time is excluded); at the end it shows the run's
    exact ``steps_per_second``.
    """

    def __init__(self, enabled: bool = True, stream: Any = None):
        self.enabled = enabled
        self.stream = stream
        self.bar = None
        self.steps = 0
        self.t_first: float | None = None
        self.steps_first = 0

    def on_run_start(self, info: dict) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=info.get("episodes"),
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

    def on_run_end(self, result: Any) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"{result.steps_per_second:,.0f} env steps/s", refresh=False
            )
            self.bar.close()


# Commands --------------------------------------------------------------------
def cmd_eval(args: argparse.Namespace) -> int:
    import jaxmesh

    config = validate_config(apply_overrides(load_config(args.config), args.set))
    policy = build_policy(config["policy"], config["policy_config"])
    kwargs = {k: config[k] for k in (*_INT_KEYS, "seeds") if config.get(k) is not None}
    try:
        env = jaxmesh.make_env(config["env"])
    except (ValueError, TypeError, ImportError) as e:
        raise ConfigError(f"env={config['env']!r}: {e}") from e
    result = jaxmesh.evaluate(
        policy, env, hooks=Progress(enabled=not args.no_progress), **kwargs
    )
    print(result.summary())
    if config.get("output"):
        out = Path(config["output"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        print(f"wrote {out}")
    return 0


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


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxmesh", description="Evaluate RL policies with jaxmesh."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ev = sub.add_parser(
        "eval",
        help="evaluate a policy from a YAML run config",
        description="Evaluate a policy from a YAML run config. Config keys: "
        + "; ".join(f"{k}: {d}" for k, d in CONFIG_KEYS.items()),
    )
    ev.add_argument("config", help="YAML run config, e.g. configs/cartpole.yaml")
    ev.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (dotted for nested: policy_config.checkpoint=X); "
        "repeatable; VALUE is parsed as a YAML scalar",
    )
    ev.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr"
    )
    ev.set_defaults(run=cmd_eval)
    de = sub.add_parser("describe", help="print a model's describe() as JSON")
    de.add_argument(
        "target", help="module:Class, e.g. jaxmesh.zoo.cartpole:CartPoleMLP"
    )
    de.set_defaults(run=cmd_describe)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``jaxmesh`` command line; returns the exit status.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
      0 on success, 2 for a bad command line or config (message on stderr).
    """
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the message
        return int(e.code or 0)
    try:
        return args.run(args)
    except ConfigError as e:
        print(f"jaxmesh {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
