"""``jaxmesh.explain``: what a spec reads from an env, and the memory it holds
(nothing compiles: ``jaxmesh.run.footprint`` runs under ``jax.eval_shape``)."""

from __future__ import annotations

from typing import Any

from jaxmesh.run.footprint import LIMIT_ENV, Explanation, check_frame_limit, footprint
from jaxmesh.suite import Suite


def explain(
    spec_or_model: Any, env: Any, num_envs: int = 1, instruction: Any = None
) -> Explanation:
    """Explains what the evaluator will read from ``env`` and hold per lane.

    Args:
      spec_or_model: a spec dict, a ``jaxmesh.Model`` (loaded first), a plain
        policy function, or None (the whole observation).
      env: anything ``jaxmesh.make_env`` accepts, or a ``jaxmesh.Suite`` (its
        first task's env and, unless given, each task's instruction).
      num_envs: lanes to total the memory for.
      instruction: for ``jaxmesh.adapt.Text`` inputs, the run's instruction,
        or a dict of task name to instruction. None: from the ``info_key``.

    Returns:
      An ``Explanation``; ``print`` it for a table.

    Raises:
      ValueError: the spec names an observation key the env does not have, or
        ``num_envs < 1``.
    """
    if isinstance(env, Suite):  # its tasks' instructions, its first task's env
        if instruction is None:
            instruction = {n: t.instruction for n, t in env.tasks.items()}
        env = next(iter(env.tasks.values())).env
    return footprint(spec_or_model, env, num_envs, instruction)


__all__ = ["explain", "check_frame_limit", "Explanation", "LIMIT_ENV"]
