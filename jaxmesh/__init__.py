"""jaxmesh: a jitted, exact policy evaluator for JAX-native environments."""

from jaxmesh import adapt, flax_models
from jaxmesh.checkpoint import load_params, save_params
from jaxmesh.driver import Agent, Outcome, evaluate, make_agent, make_evaluator
from jaxmesh.envs import make_env
from jaxmesh.explain import check_frame_limit, explain
from jaxmesh.model import Model, build_model
from jaxmesh.params import Param, ParamError
from jaxmesh.results import EpisodeResult, RunResult

__version__ = "0.1.0"

__all__ = [
    "adapt",
    "flax_models",
    "make_env",
    "evaluate",
    "make_evaluator",
    "Outcome",
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
]
