"""jaxmesh: a jitted, exact policy evaluator for JAX-native and served environments.

The public names are imported on first use (``_NAMES``: name -> module), so
that ``import jaxmesh`` (and ``jaxmesh --help``) costs no JAX import; ``from
jaxmesh import evaluate`` and ``jaxmesh.evaluate`` import what they name.
"""

# ruff: noqa: F401 (the TYPE_CHECKING imports are the public names)
from __future__ import annotations

import ast
import sys
from importlib import import_module
from importlib.util import find_spec
from types import ModuleType
from typing import TYPE_CHECKING, Any

from jaxmesh._version import __version__ as __version__

if TYPE_CHECKING:  # the public names, read by _public() too
    from jaxmesh import adapt, flax_models
    from jaxmesh.api import evaluate
    from jaxmesh.cache import enable_compile_cache
    from jaxmesh.checkpoint import load_params, save_params
    from jaxmesh.core.tally import Results
    from jaxmesh.decide import Decision, decide
    from jaxmesh.envs import make_env
    from jaxmesh.errors import (
        BadValueError,
        EnvError,
        HostPolicyError,
        RemoteConnectionError,
        RemoteEnvError,
        RemoteError,
        RemotePolicyError,
    )
    from jaxmesh.execution import Ensemble
    from jaxmesh.explain import check_frame_limit, explain
    from jaxmesh.host_policy import HostPolicy
    from jaxmesh.model import Model, build_model
    from jaxmesh.params import Param, ParamError
    from jaxmesh.remote.envs import RemoteEnv, RemoteVectorEnv
    from jaxmesh.remote.server import EnvServer, ServeOptions
    from jaxmesh.results.record import Record, Trajectory
    from jaxmesh.results.result import EpisodeResult, RunResult, StepEvent
    from jaxmesh.results.stats import Comparison
    from jaxmesh.results.video import render
    from jaxmesh.run.cluster import Ray  # the [ray] extra, imported when a run uses it
    from jaxmesh.run.config import Chunking, Layout, RunConfig, Scoring, Served, Starts
    from jaxmesh.run.host.agent_step import Agent, make_agent
    from jaxmesh.run.resume import EpisodeLog, load_episode_log
    from jaxmesh.run.scan import Evaluator, cache_info, clear_cache
    from jaxmesh.run.scan.pure import make_evaluator
    from jaxmesh.run.scan.sharded import shard_population
    from jaxmesh.run.seed_check import SeedReport, check_seeds
    from jaxmesh.serve import PolicyServer  # the [serve] extra (websockets, msgpack)
    from jaxmesh.serve.remote import RemotePolicy  # the [serve] extra (gRPC, msgpack)
    from jaxmesh.suite import Suite, SuiteResult, Task, compare, make_suite
    from jaxmesh.sweep import Sweep, sweep


def _public() -> dict[str, str]:
    """Each public name -> its module, as the imports above write them."""
    with open(__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    block = next(n for n in tree.body if isinstance(n, ast.If))
    return {a.name: n.module for n in block.body for a in n.names}


_ALL = _public()
#: The public submodules; the served-env names (they need the [remote]
#: extra: gRPC); every other public name and the module it lives in.
_SUBMODULES = tuple(n for n, m in _ALL.items() if m == __name__)
_REMOTE = {n: m for n, m in _ALL.items() if m.startswith("jaxmesh.remote.")}
_NAMES = {n: m for n, m in _ALL.items() if n not in _SUBMODULES and n not in _REMOTE}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(f"{__name__}.{name}")
    module = _NAMES.get(name) or _REMOTE.get(name)
    if module is None:
        # ``jaxmesh.run``, ``jaxmesh.model``, ...: a submodule, as when every
        # module was imported with the package.
        if not name.startswith("_") and find_spec(f"{__name__}.{name}"):
            return import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'jaxmesh' has no attribute {name!r}")
    if name in _REMOTE:
        from jaxmesh.remote.address import require_grpc

        require_grpc()
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(ModuleType):
    """This package, whose public names stay what ``_NAMES`` says: importing a
    submodule named like a public function (``jaxmesh.sweep``,
    ``jaxmesh.explain``) would bind the submodule in its place."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and name in _NAMES:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = list(_ALL)
