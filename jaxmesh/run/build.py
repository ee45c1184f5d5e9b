"""Probe a policy against an env (shapes only) and build the engine for it.

Also the default plan tile, one of the sizes the compiled program depends on
(the other, the result buffers' capacity, is ``core.results.capacity_for``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.core import agent
from jaxmesh.core.engine import Engine, EngineConfig
from jaxmesh.core.policy import Policy, output_chunk
from jaxmesh.core.results import info_leaves, pow2_at_least
from jaxmesh.explain import check_frame_limit
from jaxmesh.run.checks import Metrics, Settings, resolve_metrics

#: Rows per policy call at h = 1 when plan_tile is left to jaxmesh.
AUTO_TILE_ROWS = 128
#: The smallest default tile.
MIN_TILE_ROWS = 8
PROBE_ROWS = 2  # rows of the shape-only probe of the policy's output


def default_plan_tile(h: int, num_envs: int) -> int:
    """The default tile: ``128 // h`` rows, shrunk to fit few lanes.

    ``min(128 // h, next power of two >= num_envs)``, kept within [8, 128]. Many
    lanes (N >= 128 // h) all get the same tile, so their results are
    bit-identical whatever N is. Fewer lanes get a smaller tile, so a heavy
    policy on 4 lanes computes 8 rows a plan, not 128; their rows match the
    large tile's only where the backend rounds a row the same at both batch
    sizes (docs/evaluation.md has the measurements). Pass ``plan_tile`` to pin
    the tile when runs at different N must agree bit for bit.
    """
    auto = max(MIN_TILE_ROWS, min(AUTO_TILE_ROWS, AUTO_TILE_ROWS // h))
    return max(MIN_TILE_ROWS, min(auto, pow2_at_least(num_envs)))


def _leaf_spec(x: Any) -> jax.ShapeDtypeStruct:
    """Shape and dtype of an array, tracer, abstract value or Python scalar."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), jnp.dtype(x.dtype))
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def abstract(tree: Any) -> Any:
    """The shapes and dtypes of a pytree, as ``jax.ShapeDtypeStruct`` leaves."""
    return jax.tree.map(_leaf_spec, tree)


def signature(tree: Any) -> tuple:
    """A hashable signature of a pytree: structure, shapes and dtypes."""
    leaves = tuple((s.shape, s.dtype) for s in map(_leaf_spec, jax.tree.leaves(tree)))
    return jax.tree.structure(tree), leaves


def probe_chunk(policy: Policy, env: Any, params: Any, horizon: int) -> int | None:
    """Checks the policy's output against the env, by shape only (nothing compiles).

    Returns the chunk length K (None for single actions).

    Raises:
      ValueError: ``horizon`` above the declared ``native_chunk``, or a chunk
        length other than the declared one.
      TypeError: an output that is neither an action nor a chunk.
    """
    if policy.native_chunk is not None and horizon > policy.native_chunk:
        raise ValueError(
            f"horizon={horizon} exceeds policy {policy.name!r}'s "
            f"native_chunk={policy.native_chunk}: use horizon <= "
            f"{policy.native_chunk}"
        )
    probe = agent.make_config(
        env, policy, num_envs=PROBE_ROWS, horizon=1, lead=0, tile=PROBE_ROWS, chunk=None
    )
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # abstract: nothing runs eagerly
    obs = jax.eval_shape(lambda k: env.reset(k)[0], key)
    action = jax.ShapeDtypeStruct(tuple(env.action_shape), env.action_dtype)

    def probe_out(params, obs, action):
        frames = agent.frames(probe, obs, action)
        windows = {
            name: jax.tree.map(
                lambda f, s=decl.stack: jnp.broadcast_to(f, (PROBE_ROWS, s) + f.shape),
                frames[name],
            )
            for name, decl in probe.spec
        }
        rows = lambda tree: jax.tree.map(
            lambda x: jnp.broadcast_to(x, (PROBE_ROWS,) + jnp.shape(x)), tree
        )
        rstate = None if policy.initial_state is None else rows(policy.initial_state())
        keys = jnp.zeros((PROBE_ROWS, 2), jnp.uint32)
        out, _ = policy.apply(params, agent.policy_inputs(probe, windows), keys, rstate)
        return out

    out = jax.eval_shape(probe_out, abstract(params), obs, action)
    return output_chunk(policy, out, env, horizon, PROBE_ROWS)


def env_info(env: Any) -> dict[str, jax.ShapeDtypeStruct] | None:
    """A JAX env's info leaves (shapes only: ``eval_shape`` of its step).

    None when the env has no ``step_with_info`` (it reports no info).
    """
    step = getattr(env, "step_with_info", None)
    if step is None:
        return None
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)

    def one_step(key):
        _, state = env.reset(key)
        action = jnp.zeros(tuple(env.action_shape), env.action_dtype)
        return step(key, state, action)[5]

    return info_leaves(jax.eval_shape(one_step, key))


def engine_metrics(
    env: Any, asked: Metrics
) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The metrics and success key a JAX env's run keeps (nothing compiles).

    Raises:
      ValueError: a key the env's info lacks (naming those it has), or a key
        whose value is not one number per step.
    """
    name = getattr(env, "name", type(env).__name__)
    if not asked.named and not isinstance(asked.success, str):
        if asked.success is False:
            return (), None
        info = env_info(env)  # auto success: only when the info has the key
        if info is None:
            return (), None
    else:
        info = env_info(env)
        if info is None:
            raise ValueError(
                f"metrics={dict(asked.named)!r} / success={asked.success!r}: env "
                f"{name!r} reports no info (it has no step_with_info(key, state, "
                "action) -> (obs, state, reward, terminated, truncated, info)); "
                "gymnax and brax envs have one: add it to your env, or drop "
                "metrics="
            )
    named, success = resolve_metrics(asked, info, name)
    keys = [n for n, _ in named] + ([success] if success else [])
    for key in keys:
        leaf = info[key]
        if tuple(leaf.shape) not in ((), (1,)) or jnp.dtype(leaf.dtype).kind not in (
            "biuf"
        ):
            raise ValueError(
                f"metric {key!r} of env {name!r} is {jnp.dtype(leaf.dtype)}"
                f"{list(leaf.shape)} per step; a metric is one number (or bool) per "
                "step: name a scalar info key"
            )
    return named, success


def check_record_keys(env: Any, record: Any) -> None:
    """Checks a ``jaxmesh.Record``'s observation keys against a JAX env's
    observation, by shape (nothing compiles).

    Raises:
      ValueError: a key the observation lacks, or keys for a one-array
        observation.
    """
    if record is None or record.keys is None:
        return
    from jaxmesh.record import observation_leaves

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    obs = jax.eval_shape(lambda k: env.reset(k)[0], key)
    name = getattr(env, "name", type(env).__name__)
    observation_leaves(obs, record.keys, f"env {name!r}")


def build_engine(
    policy: Policy,
    env: Any,
    settings: Settings,
    chunk: int | None,
    capacity: int,
    metrics: tuple[tuple[tuple[str, str], ...], str | None] = ((), None),
    record: Any = None,
) -> Engine:
    """The engine for a probed policy (``probe_chunk``), env and settings.

    ``metrics`` is ``engine_metrics``'s result: the info keys kept per episode
    and the success key. ``record`` (a ``jaxmesh.Record`` or None) sizes the
    recording buffers; which episodes fill them is data
    (``Engine.first_carry``).

    Raises:
      ValueError: the frame windows of the run's lanes exceed the limit, or a
        record key the observation lacks.
    """
    check_record_keys(env, record)
    h = min(settings.horizon, chunk) if chunk is not None else 1
    lanes = min(settings.num_envs, capacity)
    cfg = agent.make_config(
        env,
        policy,
        num_envs=lanes,
        horizon=settings.horizon,
        lead=settings.prefetch_lead,
        tile=settings.plan_tile or default_plan_tile(h, settings.num_envs),
        chunk=chunk,
    )
    check_frame_limit(policy.spec, env, lanes)
    config = EngineConfig(
        capacity=capacity,
        max_steps=settings.max_steps,
        agent=cfg,
        metrics=metrics[0],
        success=metrics[1],
        record_slots=0 if record is None else len(record.episodes),
        record_steps=0 if record is None else record.max_steps,
        record_keys=None if record is None else record.keys,
    )
    return Engine(policy, env, config)
