"""Probe a policy against an env (shapes only) and build the engine for a
``jaxmesh.run.plan.RunPlan`` (``default_plan_tile`` is re-exported from there)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh import adapt
from jaxmesh.adapt import leaf_spec, signature
from jaxmesh.core import agent
from jaxmesh.core.carry import EngineConfig, TrialReset
from jaxmesh.core.engine import Engine
from jaxmesh.core.policy import EXECUTION_HORIZON, Policy, output_chunk
from jaxmesh.core.tally import info_leaves
from jaxmesh.results.record import observation_leaves, records_states
from jaxmesh.run import identity
from jaxmesh.run.checks import Metrics, resolve_metrics
from jaxmesh.run.footprint import KEY, check_frame_limit
from jaxmesh.run.kept import Kept
from jaxmesh.run.plan import (
    RunPlan,
    default_plan_tile,  # noqa: F401 - re-exported
)

PROBE_ROWS = 2  # rows of the shape-only probe of the policy's output


def abstract(tree: Any) -> Any:
    """The shapes and dtypes of a pytree, as ``jax.ShapeDtypeStruct`` leaves."""
    return jax.tree.map(leaf_spec, tree)


#: Probe programs by (policy, env, params' signature): their digest for the
#: run's identity, beside what the key names (kept alive: no id is reused).
_PROGRAMS = Kept(64)


def _program(policy: Any, env: Any, params: Any) -> SimpleNamespace:
    key = (id(policy.apply), id(env), signature(params))
    new = lambda: SimpleNamespace(apply=policy.apply, env=env, digest=None)
    return _PROGRAMS.get(key, new)


def policy_digest(
    policy: Policy, env: Any, params: Any, horizon: int, told: int | None = None
) -> str:
    """The digest of the probe's program of ``policy`` on ``env`` (probed again)."""
    kept = _program(policy, env, params)
    if kept.digest is None:
        # The run's own probe has warned of what this one would find.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            probe_chunk(policy, env, params, horizon, told)
    return kept.digest


def told_horizon(policy: Policy, settings: Any) -> int | None:
    """The ``execution_horizon`` told to a policy that takes it, h + d (CONTRACT 24)."""
    if not policy.takes_execution_horizon or settings.execution is not None:
        return None
    return settings.horizon + settings.delay


def asks_chunks(settings: Any) -> bool:
    """Whether a chunk at horizon 1 is meant (an ensemble or a delay)."""
    return (
        settings.execution is not None
        or bool(settings.delay)
        or settings.delay_ms is not None
    )


def run_chunk(policy: Policy, env: Any, params: Any, settings: Any) -> int | None:
    """``probe_chunk`` as a run with these ``settings`` calls it."""
    told = told_horizon(policy, settings)
    asked = asks_chunks(settings)
    return probe_chunk(policy, env, params, settings.horizon, told, chunks_asked=asked)


def probe_chunk(
    policy: Policy,
    env: Any,
    params: Any,
    horizon: int,
    told: int | None = None,
    *,
    chunks_asked: bool = False,
) -> int | None:
    """The policy's chunk length K (None: single actions), checked by shape;
    unless ``chunks_asked``, a chunk at horizon 1 warns (CONTRACT 11)."""
    if policy.native_chunk is not None and horizon > policy.native_chunk:
        raise ValueError(
            f"horizon={horizon} exceeds policy {policy.name!r}'s "
            f"native_chunk={policy.native_chunk}: use horizon <= "
            f"{policy.native_chunk}"
        )
    probe = agent.make_config(
        env, policy, num_envs=PROBE_ROWS, horizon=1, lead=0, tile=PROBE_ROWS, chunk=None
    )
    obs = jax.eval_shape(lambda k: env.reset(k)[0], KEY)
    action = jax.ShapeDtypeStruct(tuple(env.action_shape), env.action_dtype)
    args = abstract(params), obs, action

    def probe_out(params, obs, action, length):
        frames = agent.frames(probe, obs, action)
        windows = {
            name: jax.tree.map(
                lambda f, s=decl.stack: jnp.broadcast_to(f, (PROBE_ROWS, s) + f.shape),
                frames[name],
            )
            for name, decl in agent.windowed(probe)
        }
        rows = lambda tree: jax.tree.map(
            lambda x: jnp.broadcast_to(x, (PROBE_ROWS,) + jnp.shape(x)), tree
        )
        rstate = None if policy.initial_state is None else rows(policy.initial_state())
        keys = jnp.zeros((PROBE_ROWS, 2), jnp.uint32)
        texts = agent.text_zeros(probe, PROBE_ROWS)
        pending = agent.pending_zeros(probe, PROBE_ROWS, length)
        inputs = agent.policy_inputs(probe, windows, texts, pending)
        kw = {} if told is None else {EXECUTION_HORIZON: told}
        out, _ = policy.apply(params, inputs, keys, rstate, **kw)
        return out

    def shape_of(length: int) -> Any:
        # Traced once, for the output's shape and the run's identity.
        fn = lambda p, o, a: probe_out(p, o, a, length)
        closed, out = jax.make_jaxpr(fn, return_shape=True)(*args)
        _program(policy, env, params).digest = identity.program_digest(closed)
        return out

    pending = adapt.pending_inputs(policy.spec)
    out = _probe_pending(policy, env, pending, shape_of) if pending else shape_of(1)
    meant = chunks_asked or bool(pending)
    k = output_chunk(policy, out, env, horizon, PROBE_ROWS, chunk_meant=meant)
    if told is not None and k is not None and k < told:
        raise ValueError(
            f"policy {policy.name!r} returned chunks of {k} actions when told "
            f"execution_horizon={told}; this run executes {told} actions of each "
            "plan: return at least that many"
        )
    return k


def _probe_pending(policy: Policy, env: Any, pending: dict, shape_of: Any) -> Any:
    """The output of a policy with PendingChunk inputs, probed at its length."""
    declared = {d.length for d in pending.values()} - {None}
    if len(declared) > 1:
        raise ValueError(
            f"policy {policy.name!r}: its PendingChunk inputs declare lengths "
            f"{sorted(declared)}; they all show the same tail: give one length"
        )
    guess = next(iter(declared), None) or policy.native_chunk or 1
    names = ", ".join(map(repr, pending))
    try:
        out = shape_of(guess)
    except Exception as exc:
        if not declared:
            exc.add_note(
                f"(jaxmesh called policy {policy.name!r} with its PendingChunk "
                f"input(s) {names} of {guess} action(s) to find its chunk length "
                "K; declare it: PendingChunk(length=K))"
            )
        raise
    a = len(env.action_shape)
    k = out.shape[1] if len(out.shape) == a + 2 else None
    if declared and k != guess:
        raise ValueError(
            f"policy {policy.name!r}: PendingChunk(length={guess}) but the policy "
            f"returns {'single actions' if k is None else f'chunks of K={k}'}; "
            "length must be the chunk length K"
        )
    if k is not None and k != guess:
        out = shape_of(k)
        again = out.shape[1] if len(out.shape) == a + 2 else None
        if again != k:
            raise ValueError(
                f"policy {policy.name!r} returns chunks of {k} actions with a "
                f"PendingChunk of {guess}, and {again} with one of {k}: its chunk "
                "length must not follow the tail's; declare it with "
                "PendingChunk(length=K)"
            )
    return out


def success_at_reset(env: Any, key: str | None) -> bool:
    """Whether a JAX env's ``reset_with_info`` gives ``key`` as one number."""
    reset = getattr(env, "reset_with_info", None)
    if key is None or reset is None:
        return False
    leaf = info_leaves(jax.eval_shape(lambda k: reset(k)[2], KEY)).get(key)
    return leaf is not None and _one_number(leaf)


def _one_number(leaf: Any) -> bool:
    return tuple(leaf.shape) in ((), (1,)) and jnp.dtype(leaf.dtype).kind in "biuf"


def engine_metrics(
    env: Any, asked: Metrics
) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The metrics and success key a JAX env's run keeps, each one number a step."""
    name = getattr(env, "name", type(env).__name__)
    auto = not asked.named and not isinstance(asked.success, str)
    step = getattr(env, "step_with_info", None)
    if auto and (asked.success is False or step is None):
        return (), None  # auto success: only when the info has the key
    if step is None:
        raise ValueError(
            f"metrics={dict(asked.named)!r} / success={asked.success!r}: env "
            f"{name!r} reports no info (it has no step_with_info(key, state, "
            "action) -> (obs, state, reward, terminated, truncated, info)); "
            "gymnax and brax envs have one: add it to your env, or drop "
            "metrics="
        )

    def one_step(key):
        _, state = env.reset(key)
        action = jnp.zeros(tuple(env.action_shape), env.action_dtype)
        return step(key, state, action)[5]

    info = info_leaves(jax.eval_shape(one_step, KEY))
    named, success = resolve_metrics(asked, info, name)
    keys = [n for n, _ in named] + ([success] if success else [])
    for key in keys:
        leaf = info[key]
        if not _one_number(leaf):
            raise ValueError(
                f"metric {key!r} of env {name!r} is {jnp.dtype(leaf.dtype)}"
                f"{list(leaf.shape)} per step; a metric is one number (or bool) per "
                "step: name a scalar info key"
            )
    return named, success


def check_record_keys(env: Any, record: Any) -> None:
    """Checks a ``jaxmesh.Record``'s keys and ``states=True`` against a JAX env."""
    name = getattr(env, "name", type(env).__name__)
    records_states(record, env, f"env {name!r}")
    if record is not None and record.keys is not None:
        obs = jax.eval_shape(lambda k: env.reset(k)[0], KEY)
        observation_leaves(obs, record.keys, f"env {name!r}")


def agent_config(
    policy: Policy, env: Any, plan: RunPlan, settings: Any
) -> agent.AgentConfig:
    """The agent's static configuration for a run's plan and checked settings."""
    ensemble = settings.execution
    pending = adapt.pending_inputs(policy.spec)
    if pending and (ensemble is not None or plan.chunk is None):
        name = next(iter(pending))
        why = (
            f"execution={ensemble!r} plans every step and executes an "
            "average of the chunks, so no chunk's tail is pending: drop execution= "
            "or the PendingChunk input"
            if plan.chunk is not None
            else "the policy returns single actions, so there is no chunk tail: "
            "return chunks of K actions ((K,) + action shape), or drop the input"
        )
        raise ValueError(
            f"policy {policy.name!r}: input {name!r} is a jaxmesh.adapt.PendingChunk "
            f"(the unexecuted tail of the previous chunk), but {why}"
        )
    if ensemble is not None and env.num_actions is not None:
        raise ValueError(
            f"execution={ensemble!r}: env "
            f"{getattr(env, 'name', type(env).__name__)!r} has {env.num_actions} "
            "discrete actions, and an average of discrete actions is no action; "
            "ensembling is for continuous actions: drop execution="
        )
    sizes = {k: getattr(plan, k) for k in ("lead", "tile", "chunk")}
    sizes |= {k: getattr(settings, k) for k in ("delay", "grid", "cell_episodes")}
    cfg = agent.make_config(
        env, policy, num_envs=plan.lanes, horizon=plan.h, ensemble=ensemble, **sizes
    )
    check_frame_limit(policy.spec, env, plan.lanes)
    return cfg


def build_engine(
    policy: Policy,
    env: Any,
    plan: RunPlan,
    settings: Any,
    metrics: tuple[tuple[tuple[str, str], ...], str | None] = ((), None),
    record: Any = None,
    trials: TrialReset | None = None,
) -> Engine:
    """The engine for a probed policy, env, plan and settings (checked ``metrics``,
    ``record``; ``trials``: episodes start from a trial index, not a reset)."""
    name = getattr(env, "name", type(env).__name__)
    config = EngineConfig(
        capacity=plan.capacity,
        max_steps=settings.max_steps,
        agent=agent_config(policy, env, plan, settings),
        metrics=metrics[0],
        success=metrics[1],
        # A trial's reset (initial states, reset_fn) gives no reset info.
        success_at_reset=trials is None and success_at_reset(env, metrics[1]),
        record_slots=0 if record is None else len(record.episodes),
        record_steps=0 if record is None else record.max_steps,
        record_keys=None if record is None else record.keys,
        record_states=records_states(record, env, f"env {name!r}"),
        trials=trials,
    )
    return Engine(policy, env, config)
