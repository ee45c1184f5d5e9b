"""The JAX envs' backend: the budget runs in compiled scan segments
(``evaluator``), on one device or a mesh (``placement``, ``sharded``);
``pure`` is ``make_evaluator``.
"""

from jaxmesh.run.scan.evaluator import Evaluator, cache_info, clear_cache, run

__all__ = ["Evaluator", "cache_info", "clear_cache", "run"]
