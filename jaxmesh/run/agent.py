"""``jaxmesh.make_agent``: the jitted agent step alone, for host loops that step
their own simulators (the scan engine drives the same functions)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmesh.core import agent
from jaxmesh.core.policy import Policy, resolve_policy
from jaxmesh.envs import make_env
from jaxmesh.run import build, checks, plan


class Agent(NamedTuple):
    """The jitted agent side alone, for host loops that step envs themselves.

    Attributes:
      config: the static agent configuration (effective horizon, lead, tile).
      params: the policy's own params (a Model's ``params``; None for functions).
      init: ``init(obs, lanes) -> state``; lanes in ``lanes`` begin at ``obs``.
      step: ``step(params, state, obs, started, active, ep_keys, t, moved=None)
        -> (state, actions)``; see ``jaxmesh.core.agent.host_step``.
        Observations are put on the policy's device first.
    """

    config: agent.AgentConfig
    params: Any
    init: Any
    step: Any


def make_agent(
    policy: Any,
    env: Any,
    *,
    num_envs: int,
    horizon: int = 1,
    prefetch_lead: int = 0,
    plan_tile: int | None = None,
) -> Agent:
    """Plan + replay + windows + previous action + masking as jitted functions.

    The scan engine and a host loop over remote simulators drive the same
    functions, so both give the same per-episode results.
    """
    settings = checks.check_settings(num_envs, horizon, prefetch_lead, None, plan_tile)
    env_obj = make_env(env)
    pol = resolve_policy(policy, with_params=False)
    params = pol.default_params()
    cfg, _, init, step, _ = agent_functions(pol, env_obj, settings, params)
    return Agent(cfg, params, init, step)


def agent_functions(
    pol: Policy, env: Any, settings: Any, params: Any, tile_lanes: int | None = None
) -> tuple:
    """Probes ``pol`` against ``env``, plans the run and jits its agent side.

    Args:
      pol, env, params: the resolved policy, the env (or a host env's spec) and
        the params the policy is probed with.
      settings: the checked settings (``settings.num_envs`` lanes).
      tile_lanes: the lanes the default plan tile is sized for (None: all of
        them; served lane groups plan one group at a time).

    Returns ``(config, chunk, init, step, plan)``: ``init(obs, lanes)`` and
    ``step(params, state, obs, started, active, ep_keys, t, ..., episodes=)``
    (``agent.host_step``; the state is donated; observations are put on the
    policy's device first; ``episodes``, [N] each lane's budget episode, is
    read under a sweep's grid only), and the run's
    ``jaxmesh.run.plan.RunPlan``.

    Raises:
      ValueError, TypeError: the policy's output does not fit the env, or the
        frame windows exceed the limit (nothing compiles).
    """
    chunk = build.probe_chunk(pol, env, params, settings.horizon)
    # The host keeps no per-episode buffers on the device: capacity is the lanes.
    run_plan = plan.plan_run(
        settings, chunk, capacity=settings.num_envs, tile_lanes=tile_lanes
    )
    cfg = build.agent_config(pol, env, run_plan)

    def init(obs, lanes):
        return agent.init(cfg, pol, obs, lanes)

    def step(
        params,
        state,
        obs,
        started,
        active,
        ep_keys,
        t,
        moved=None,
        skip=None,
        texts=None,
        episodes=None,
    ):
        return agent.host_step(
            cfg,
            pol,
            params,
            state,
            obs,
            started,
            active,
            ep_keys,
            t,
            moved,
            skip,
            texts,
            episodes,
        )

    init_jit = jax.jit(init)
    step_jit = jax.jit(step, donate_argnums=(1,))

    def step_placed(params, state, obs, *rest, episodes=None):
        # Only a sweep's lanes read their episode index (their cell).
        episodes = None if cfg.grid is None else np.asarray(episodes, np.int32)
        return step_jit(params, state, pol.place(obs), *rest, episodes=episodes)

    return (
        cfg,
        chunk,
        lambda obs, lanes: init_jit(pol.place(obs), lanes),
        step_placed,
        run_plan,
    )
