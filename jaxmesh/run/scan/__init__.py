"""The JAX envs' backend: compiled scan segments (``evaluator``) on a device or a
mesh (``placement``, ``sharded``); ``pure`` is ``make_evaluator``."""

from jaxmesh.run.scan.evaluator import Evaluator, cache_info, clear_cache, run

__all__ = ["Evaluator", "cache_info", "clear_cache", "run"]
