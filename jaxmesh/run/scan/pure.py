"""``jaxmesh.make_evaluator``: the engine as a pure function of policy params."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmesh.core.policy import resolve_policy
from jaxmesh.core.tally import Results, empty
from jaxmesh.envs import make_env
from jaxmesh.envs.timing import step_seconds
from jaxmesh.run import build, checks, plan
from jaxmesh.run.config import RunConfig, from_keywords


def make_evaluator(
    policy: Any,
    env: Any,
    config: RunConfig | None = None,
    *,
    episodes: int | None = None,
    seeds: Sequence[int] | None = None,
    **settings: Any,
):
    """The engine as a pure function of policy params.

    ``policy`` is ``fn(params, obs[, key])`` (single lane) or a
    ``jaxmesh.Model`` whose ``params`` the function replaces. The returned
    ``evaluator(params, seeds=None) -> Results`` (``jaxmesh.core.tally``; seeds
    default to those given here) can be jitted, vmapped over a population or
    called in a training step. It scores the whole budget through bad values,
    the first one in ``fault``. ``config`` and keywords are ``evaluate``'s,
    but for what needs the host between segments (``Starts``, ``Served``,
    workers, devices, a wall-clock cap), refused.

    Example::

      run = jaxmesh.make_evaluator(apply, "gymnax:CartPole-v1", episodes=16)
      returns = jax.jit(jax.vmap(run))(population).returns  # [P, 16]
    """
    config = from_keywords(config, settings, "jaxmesh.make_evaluator")
    # What needs the host between segments is refused: one program runs it all.
    given = checks.changed(config.starts) + [
        name
        for name in ("served", "workers", "max_episode_seconds")
        if getattr(config, name) is not None
    ]
    given += [name for name in checks.changed(config.layout) if name != "plan_tile"]
    if given:
        raise ValueError(
            f"make_evaluator(..., {given[0]}=...): the pure evaluator is one "
            "program over the whole budget, with no host between segments, so it "
            f"does not take {given[0]}; use jaxmesh.evaluate or jaxmesh.Evaluator"
        )
    seeds_arr = checks.resolve_budget(episodes, seeds, device_buffers=True)
    env_obj = make_env(env)
    name = getattr(env_obj, "name", type(env_obj).__name__)
    settings = checks.resolve_delay_ms(config.settings, step_seconds(env_obj), name)
    pol = resolve_policy(policy, with_params=True)
    kept = build.engine_metrics(env_obj, config.scoring.asked)  # checked once
    e = int(seeds_arr.size)
    engines: dict = {}

    def evaluator(params: Any, seeds: Any = None) -> Results:
        s = seeds_arr if seeds is None else seeds
        if not hasattr(s, "dtype"):  # a list: checked before any device work
            s = np.asarray(s)
        if np.shape(s) != (e,) or not jnp.issubdtype(s.dtype, jnp.integer):
            raise ValueError(
                f"seeds must be ints of shape ({e},) (one per budgeted episode), "
                f"got {s.dtype} {np.shape(s)}; pass {e} seeds or build the "
                "evaluator with another budget"
            )
        if e == 0:
            return empty(0, 0, metrics=kept[0], success=kept[1] is not None)
        sig = build.signature(params)
        if sig not in engines:
            chunk = build.run_chunk(pol, env_obj, params, settings)
            # One program holds the whole budget: its buffers are e entries.
            run_plan = plan.plan_run(settings, chunk, capacity=e)
            engines[sig] = build.build_engine(pol, env_obj, run_plan, settings, kept)
        return engines[sig].run(params, jnp.asarray(s, jnp.int32))

    return evaluator
