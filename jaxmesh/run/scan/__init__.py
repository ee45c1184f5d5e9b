"""The JAX envs' backend: the budget runs in compiled scan segments.

``evaluator`` holds the ``Evaluator`` (one policy, env and ``RunConfig``, and
the programs compiled for them) and ``run``, what ``jaxmesh.evaluate`` calls
for a JAX env; ``placement`` is where the lanes run (one device or a mesh,
``sharded`` holding the mesh's mechanics); ``pure`` is ``make_evaluator``, the
engine as a pure function of params.
"""

from jaxmesh.run.scan.evaluator import Evaluator, cache_info, clear_cache, run

__all__ = ["Evaluator", "cache_info", "clear_cache", "run"]
