"""jaxmesh: a jitted, exact policy evaluator for JAX-native environments."""

from jaxmesh import adapt, flax_models
from jaxmesh.cache import enable_compile_cache
from jaxmesh.checkpoint import load_params, save_params
from jaxmesh.core.results import Results
from jaxmesh.envs import make_env
from jaxmesh.errors import BadValueError
from jaxmesh.explain import check_frame_limit, explain
from jaxmesh.model import Model, build_model
from jaxmesh.params import Param, ParamError
from jaxmesh.run.agent import Agent, make_agent
from jaxmesh.run.pure import make_evaluator
from jaxmesh.run.results import EpisodeResult, RunResult
from jaxmesh.run.scan import Evaluator, cache_info, clear_cache, evaluate

__version__ = "0.1.0"

__all__ = [
    "adapt",
    "flax_models",
    "make_env",
    "evaluate",
    "make_evaluator",
    "Results",
    "Evaluator",
    "cache_info",
    "clear_cache",
    "BadValueError",
    "make_agent",
    "Agent",
    "Model",
    "EpisodeResult",
    "RunResult",
    "save_params",
    "load_params",
    "Param",
    "ParamError",
    "build_model",
    "explain",
    "check_frame_limit",
    "enable_compile_cache",
]
