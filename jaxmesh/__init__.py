"""jaxmesh: a jitted, exact policy evaluator for JAX-native and served environments."""

from jaxmesh import adapt, flax_models
from jaxmesh._version import __version__ as __version__
from jaxmesh.cache import enable_compile_cache
from jaxmesh.checkpoint import load_params, save_params
from jaxmesh.core.tally import Results
from jaxmesh.envs import make_env
from jaxmesh.envs.check import SeedReport, check_seeds
from jaxmesh.errors import (
    BadValueError,
    EnvError,
    RemoteConnectionError,
    RemoteEnvError,
    RemoteError,
)
from jaxmesh.execution import Ensemble
from jaxmesh.explain import check_frame_limit, explain
from jaxmesh.model import Model, build_model
from jaxmesh.params import Param, ParamError
from jaxmesh.results.record import Record, Trajectory
from jaxmesh.results.result import EpisodeResult, RunResult, StepEvent
from jaxmesh.results.stats import Comparison
from jaxmesh.results.video import render
from jaxmesh.run.host_agent import Agent, make_agent
from jaxmesh.run.pure import make_evaluator
from jaxmesh.run.resume import EpisodeLog, load_episode_log
from jaxmesh.run.scan import Evaluator, cache_info, clear_cache, evaluate
from jaxmesh.run.sharded import shard_population
from jaxmesh.suite import Suite, SuiteResult, Task, compare, make_suite
from jaxmesh.sweep import Sweep, sweep

#: Served-env names, imported on first use (they need the [remote] extra: gRPC).
_REMOTE = {
    "EnvServer": "jaxmesh.remote.server",
    "ServeOptions": "jaxmesh.remote.server",
    "RemoteEnv": "jaxmesh.remote.envs",
    "RemoteVectorEnv": "jaxmesh.remote.envs",
}


def __getattr__(name: str):
    module = _REMOTE.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxmesh' has no attribute {name!r}")
    from importlib import import_module

    from jaxmesh.remote.address import require_grpc

    require_grpc()
    return getattr(import_module(module), name)


__all__ = [
    "adapt",
    "flax_models",
    "make_env",
    "check_seeds",
    "SeedReport",
    "evaluate",
    "Ensemble",
    "sweep",
    "Sweep",
    "make_evaluator",
    "shard_population",
    "Results",
    "Evaluator",
    "cache_info",
    "clear_cache",
    "BadValueError",
    "RemoteError",
    "EnvError",
    "RemoteEnvError",
    "RemoteConnectionError",
    "EnvServer",
    "ServeOptions",
    "RemoteEnv",
    "RemoteVectorEnv",
    "make_agent",
    "Agent",
    "Model",
    "EpisodeResult",
    "EpisodeLog",
    "load_episode_log",
    "RunResult",
    "StepEvent",
    "Record",
    "Trajectory",
    "render",
    "compare",
    "Suite",
    "SuiteResult",
    "Task",
    "make_suite",
    "Comparison",
    "save_params",
    "load_params",
    "Param",
    "ParamError",
    "build_model",
    "explain",
    "check_frame_limit",
    "enable_compile_cache",
]
