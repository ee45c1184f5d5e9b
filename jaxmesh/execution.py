"""Temporal ensembling (``Ensemble``): its weight rule, written once here, runs
in the jitted agent step (``jaxmesh.core.agent``) for every env
(docs/contract.md, items 22-23)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

#: The aggregations of the chunks that cover a step (lerobot's names).
AGGREGATIONS = ("weighted_average", "average", "latest_only")


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """Temporal ensembling of chunks (ACT): plan every step, average the overlap.

    The executed action at step t is ``sum_i w_i c_i[t - t_i] / sum_i w_i``
    over the chunks that still cover t, oldest first (CONTRACT 22).
    Continuous actions only.

    Args:
      m: the decay of ``weighted_average``: ``w_i = exp(-m * i)`` (ACT uses
        0.01; a larger m trusts the older chunks more).
      aggregation: ``"weighted_average"`` (the default: ``exp(-m * i)``, or
        ``weights``), ``"average"`` (every covering chunk alike) or
        ``"latest_only"`` (the newest chunk's first action: the plain
        horizon-1 run of the same policy).
      weights: ``weighted_average`` only: K weights, ``w_i = weights[i]`` for
        the i-th covering chunk, oldest first (at an episode's start, with
        n < K chunks, the first n). Replaces ``m``.

    Raises:
      ValueError, TypeError: a negative or non-finite m, an unknown
        aggregation, weights for another aggregation, or weights that are not
        finite and >= 0 with a positive first one.

    Example::

      chunking = jaxmesh.Chunking(execution=jaxmesh.Ensemble(0.01))
      result = jaxmesh.evaluate(act_policy, env, chunking=chunking)
    """

    m: float = 0.01
    aggregation: str = "weighted_average"
    weights: tuple[float, ...] | None = None

    def __post_init__(self):
        m = self.m
        if isinstance(m, bool) or not isinstance(m, numbers.Real):
            raise TypeError(f"Ensemble(m={m!r}): expected a float >= 0 (ACT: 0.01)")
        if not math.isfinite(m) or m < 0:
            raise ValueError(f"Ensemble(m={m!r}): expected a finite float >= 0")
        object.__setattr__(self, "m", float(m))
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"Ensemble(aggregation={self.aggregation!r}): expected one of "
                f"{', '.join(AGGREGATIONS)}"
            )
        w = self.weights
        if w is None:
            return
        if self.aggregation != "weighted_average":
            raise ValueError(
                f"Ensemble(weights=..., aggregation={self.aggregation!r}): weights "
                "are for aggregation='weighted_average'; drop one of them"
            )
        try:
            if isinstance(w, str | bytes) or not isinstance(w, Sequence):
                raise TypeError
            w = tuple(float(x) for x in w)
        except (TypeError, ValueError):
            raise TypeError(
                f"Ensemble(weights={self.weights!r}): expected a sequence of K "
                "floats, oldest chunk first"
            ) from None
        if not w or not all(math.isfinite(x) and x >= 0 for x in w) or w[0] <= 0:
            raise ValueError(
                f"Ensemble(weights={self.weights!r}): expected finite weights >= 0 "
                "with a positive first one (the oldest chunk's, which is the only "
                "one at an episode's first step)"
            )
        object.__setattr__(self, "weights", w)

    def describe(self) -> str:
        """A short label for results and summaries."""
        if self.aggregation != "weighted_average":
            return f"ensemble({self.aggregation})"
        if self.weights is not None:
            return f"ensemble(weights={list(self.weights)})"
        return f"ensemble(m={self.m:g})"

    def check_chunk(self, chunk: int) -> None:
        """Refuses ``weights`` of another length than the chunk's K."""
        if self.weights is not None and len(self.weights) != chunk:
            raise ValueError(
                f"Ensemble(weights=...) gives {len(self.weights)} weights for "
                f"chunks of K={chunk} actions: give one weight per covering "
                f"chunk, {chunk} of them"
            )

    def weights_table(self, chunk: int) -> tuple[float, ...]:
        """``w_i`` for i = 0..K-1 (oldest first), as static floats."""
        if self.aggregation in ("average", "latest_only"):
            return (1.0,) * chunk
        if self.weights is not None:
            return self.weights
        return tuple(math.exp(-self.m * i) for i in range(chunk))


def lane_weights(ensemble: Ensemble, age: Any, valid: Any, chunk: int) -> Any:
    """The unnormalised [N, K] float32 weight of each lane's buffered chunks, 0
    where not ``valid`` (it covers this step); ``age``: steps since planned."""
    if ensemble.aggregation == "latest_only":
        return jnp.where(valid & (age == 0), 1.0, 0.0).astype(jnp.float32)
    n = jnp.sum(valid, axis=-1, keepdims=True)
    i = jnp.clip(n - 1 - age, 0, chunk - 1)  # the position, oldest first
    table = jnp.asarray(ensemble.weights_table(chunk), jnp.float32)
    return jnp.where(valid, table[i], 0.0)


def checked_execution(execution: Any) -> Ensemble | None:
    """``execution=``: None (chunks replayed as they are) or an ``Ensemble``."""
    if execution is None or isinstance(execution, Ensemble):
        return execution
    raise TypeError(
        f"execution={execution!r}: expected None (replay each chunk's first h "
        "actions) or jaxmesh.Ensemble(m=0.01) (temporal ensembling)"
    )
