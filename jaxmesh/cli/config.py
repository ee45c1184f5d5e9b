"""A run config: its keys (one table, ``SCHEMA``, which ``--help`` prints: this
module imports no JAX), reading it from YAML, ``--set`` overrides."""

from __future__ import annotations

import copy
import re
import shutil
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from jaxmesh.cli.errors import ConfigError
from jaxmesh.trace import REDACTED, is_secret_key


class Key(NamedTuple):
    """One config key: its YAML type, meaning and default as the help prints them."""

    type: str
    help: str
    default: Any = None


#: Every key a run config may hold, as ``KEY (TYPE[; default VALUE]): MEANING``
#: with the meaning wrapped (docs/cli.md says more of each).
_KEYS = """
env (str | list): env id: gymnax:<id>, brax:<name>, playground:<name>,
  libero:<suite>/<i>, gymnasium:<id> (stepped here), <module>:<function> (an env
  factory), grpc://host:port or a list of addresses (required unless tasks or suite)
tasks (mapping): a suite instead of env: task name -> env id, or -> {env,
  env_config, instruction, episodes, seeds, trial_index_base}
suite (str | mapping): a benchmark's suite instead of env or tasks:
  libero:libero_spatial, or {name: ..., tasks: [0, 1], camera_size: ...}
  (jaxmesh.make_suite)
env_config (mapping): keyword arguments of jaxmesh.make_env(env, **env_config), e.g.
  episode_length: 50 (gymnax:, brax:, playground:, libero: ids and env factories
  only)
policy (str): module:Class, module:function or module:model_instance (required)
policy_config (mapping): keyword arguments of Class.from_config(...) or Class(...)
host (bool; default false): the policy function runs on the host with numpy values,
  jaxmesh.HostPolicy(fn) (a function only; a HostPolicy instance needs no key)
episodes (int): episode budget: seeds 0..episodes-1 (null: one per seed, else 1)
seeds (list of int): the seeds, one episode each (not with episodes)
num_envs (int; default 64): parallel lanes
horizon (int; default 1): actions of a chunk executed before the next plan
prefetch_lead (int; default 0): plan L steps before a chunk runs out (0: in step)
delay (int; default 0): inference delay d in steps: a chunk planned d steps before
  it plays, its first d actions skipped (0 < d < horizon)
delay_ms (number): the inference delay in milliseconds: ceil(delay_ms / (1000 dt))
  steps (not with delay)
execution (mapping): null (each plan's first h actions) or ensemble: {m: 0.01}
  (temporal ensembling, jaxmesh.Ensemble)
max_episode_steps (int): cap on an episode's length (null: the env's own limit)
plan_tile (int): rows per policy call (null: chosen by the engine)
segment_steps (int; default 256): env steps per scan segment between host visits
max_episode_seconds (number): wall-clock cap on an episode, gymnasium: and grpc://
  envs only (null: none)
metrics (list | mapping): env info keys kept per episode: [key, ...] (last value) or
  {key: last | sum | max | mean | any}
success (str | false): the info key of an episode's success (null: success or
  is_success when the env has one; false: none)
success_mode (str; default once): the headline success: once (true at any step) or
  end (true at the last step)
record (list | mapping): episodes to record step by step: [0, 3] or {episodes:
  [...], max_steps: N, keys: [...]}; saved to the output's .npz
trial_index_base (int; default 0): episode i gets reset option trial_index =
  trial_index_base + i (gymnasium:, grpc:// envs that take one)
instruction (str): the language instruction of every episode, for a policy with a
  jaxmesh.adapt.Text input
workers (int | mapping): gymnasium:, libero: and factory envs: worker processes
  stepping the lanes (0: this process; null: chosen for the machine), or Ray actors:
  {ray: {num_workers: N, address: ..., num_cpus_per_worker: 1, resources: {...}}}
check_seeds (bool; default false): gymnasium: envs: check that the env is
  reproducible from its seed before the run
token (str): served envs: the servers' session token (null: $JAXMESH_TOKEN)
tls_ca (path): grpcs:// servers: the PEM file of the CA that signed their
  certificates
reply_timeout (number): served envs: seconds a reply may take (null: auto, a hung
  server among several is dropped; .inf: no limit)
on_server_loss (str): served envs over several servers: rerun (the default: a lost
  server's episodes rerun on the others) or raise
transport (str): served envs: auto (the default: shared memory for a server on this
  host), grpc or shm
output (path): the JSON file of the result (null: none); the episode log goes next
  to it as NAME.episodes.jsonl
"""


def _schema(text: str) -> dict[str, Key]:
    """``_KEYS`` as key -> ``Key`` (the default parsed as YAML)."""
    out = {}
    for entry in re.split(r"\n(?! )", text.strip()):
        head, _, meaning = " ".join(entry.split("\n  ")).partition("): ")
        key, _, kind = head.partition(" (")
        kind, _, default = kind.partition("; default ")
        out[key] = Key(kind, meaning, yaml.safe_load(default) if default else None)
    return out


SCHEMA: dict[str, Key] = _schema(_KEYS)
REQUIRED = ("env", "policy")
#: The longest time limit a config may set (a timer waits at most
#: ``threading.TIMEOUT_MAX``; null is no limit).
MAX_SECONDS = 1e9


def keys_help(width: int | None = None) -> str:
    """``SCHEMA`` as the help prints it, wrapped to ``width`` (None: the
    terminal's, as argparse does)."""
    if width is None:
        width = shutil.get_terminal_size().columns - 2
    column = max(map(len, SCHEMA)) + 4
    lines = ["config keys (YAML; --set KEY=VALUE overrides one; docs/cli.md):"]
    for key, k in SCHEMA.items():
        default = ""
        if k.default is not None:
            shown = yaml.safe_dump(k.default, default_flow_style=True)
            default = f" (default: {shown.strip().removesuffix('...').strip()})"
        lines.append(
            textwrap.fill(
                f"{k.type}: {k.help}{default}",
                width=max(width, column + 40),
                initial_indent=f"  {key:<{column - 2}}",
                subsequent_indent=" " * column,
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)


class _DuplicateKey(yaml.YAMLError):
    """A mapping names one key twice (YAML itself keeps the last silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                # A key may override a merged one (`<<: *anchor`); SafeLoader
                # refuses a key that is no scalar (unhashable).
                merge = key_node.tag == "tag:yaml.org,2002:merge"
                if merge or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(
                        f"line {line}: key {key!r} is given twice (first on line "
                        f"{seen[key]}); YAML would keep only the last value: "
                        "remove one of them"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (``_DuplicateKey``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def read_text(path: str | Path, what: str, hint: str) -> str:
    """The UTF-8 text of the file ``what`` at ``path``; ConfigError (``hint``:
    what to pass) when it is missing, unreadable or not UTF-8."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"{what} {str(path)!r} not found (looked in {str(p.absolute())!r}); " + hint
        )
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} {str(path)!r} is not UTF-8 text (byte "
            f"0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"{what} {str(path)!r}: cannot read it ({e})") from e


def read_resume(path: str, hint: str, parse: Callable[[str], Any]) -> Any:
    """``parse`` of the ``--resume`` file's text (``read_text``); ConfigError
    when ``parse`` raises ValueError/OSError."""
    text = read_text(path, "--resume file", hint)
    try:
        return parse(text)
    except (ValueError, OSError) as e:
        raise ConfigError(f"--resume {path!r}: {e}") from e


def load_config(path: str | Path) -> dict[str, Any]:
    """Reads a YAML run config: a mapping, else a ConfigError (as for a file
    missing, unreadable, not UTF-8 or not valid YAML)."""
    hint = "pass the path of a YAML run config, e.g. configs/cartpole.yaml"
    text = read_text(path, "config file", hint)
    try:
        data = yaml_load(text)
    except _DuplicateKey as e:
        raise ConfigError(f"config file {str(path)!r}, {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from e
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} holds a {type(data).__name__}; expected a "
            f"mapping of keys {sorted(SCHEMA)}"
        )
    return data


def _override(item: str) -> tuple[list[str], Any]:
    """A ``KEY=VALUE`` override's dotted key and its YAML value."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"--set {item!r}: expected KEY=VALUE, e.g. --set episodes=20 or "
            "--set policy_config.checkpoint=ckpt/mlp"
        )
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except _DuplicateKey as e:
        raise ConfigError(f"--set {key.strip()}=...: {e}") from None
    except yaml.YAMLError as e:
        if is_secret_key(key.strip().split(".")[-1]):  # never echo a secret
            raise ConfigError(
                f"--set {key.strip()}={REDACTED}: cannot parse the value as "
                "YAML; quote it, e.g. --set \"token='...'\""
            ) from None
        raise ConfigError(f"--set {item!r}: cannot parse the value: {e}") from e
    return key.strip().split("."), value


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict:
    """``config`` with ``KEY=VALUE`` overrides (values parsed as YAML; dotted
    keys reach into mappings); another ``policy`` drops the file's
    ``policy_config`` (not the command line's). ConfigError: a bad override."""
    sets = [(item, *_override(item)) for item in overrides]
    out = copy.deepcopy(config)
    policies = [value for _, parts, value in sets if parts == ["policy"]]
    if policies and policies[-1] != config.get("policy"):
        out.pop("policy_config", None)
    for item, parts, value in sets:
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
