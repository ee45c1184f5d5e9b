"""``jaxmesh.evaluate`` (the host driver) and ``jaxmesh.make_evaluator``.

``evaluate`` validates its input, builds (or reuses) a jitted engine, then runs
scan segments in a host loop: between segments it streams finished episodes to
hooks and stops as soon as the budget is done. ``make_evaluator`` returns the
same engine as a pure function of the policy params.
"""

from __future__ import annotations

import collections
import numbers
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.core import agent
from jaxmesh.core.engine import DEFAULT_MAX_STEPS, Engine, EngineConfig
from jaxmesh.core.policy import Policy, output_chunk, resolve_policy
from jaxmesh.envs import make_env
from jaxmesh.explain import check_frame_limit
from jaxmesh.results import RunResult, episode_record

#: Rows per policy call, by default ``auto_plan_tile(h)``. Never derived from
#: num_envs, so that a row's floating-point result does not depend on the lane
#: count (CONTRACT 4); the effective horizon h may set it, since results already
#: depend on the horizon.
DEFAULT_PLAN_TILE = None
#: Rows per policy call at h = 1 when plan_tile is left to jaxmesh.
AUTO_TILE_ROWS = 128


PROBE_ROWS = 2  # rows of the shape-only probe of the policy's output


def auto_plan_tile(h: int) -> int:
    """The default tile: ``128 // h`` rows, within [8, 128].

    About N/h lanes plan per step, so shrinking the tile with h keeps the padding
    rows few for chunked policies, while policies that plan every step get large
    tiles and few policy calls per step.
    """
    return max(8, min(AUTO_TILE_ROWS, AUTO_TILE_ROWS // h))


#: Env steps per scan segment between two host visits.
DEFAULT_SEGMENT_STEPS = 256
MAX_SEED = 2**31 - 1


def _check_int(name: str, value: Any, low: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={value!r}: expected an int >= {low}; {hint}")
    if value < low:
        raise ValueError(f"{name}={value!r}: expected an int >= {low}; {hint}")
    return int(value)


def resolve_budget(episodes: Any, seeds: Any) -> np.ndarray:
    """The run's seeds (CONTRACT 1): one per budgeted episode, int32."""
    if episodes is not None:
        episodes = _check_int(
            "episodes", episodes, 0, "the number of episodes to score"
        )
    if seeds is None:
        return np.arange(1 if episodes is None else episodes, dtype=np.int32)
    if isinstance(seeds, str | bytes) or not isinstance(
        seeds, Sequence | np.ndarray | jax.Array
    ):
        raise TypeError(
            f"seeds={seeds!r}: expected a sequence of ints, one per episode"
        )
    arr = np.asarray(seeds)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(
            f"seeds must be a 1-D sequence of ints, got dtype {arr.dtype} shape "
            f"{arr.shape}; pass e.g. seeds=range(100)"
        )
    if arr.size and (arr.min() < 0 or arr.max() > MAX_SEED):
        raise ValueError(
            f"seeds must lie in [0, {MAX_SEED}] (jax.random.PRNGKey on int32), got "
            f"min {arr.min()} max {arr.max()}"
        )
    if episodes is not None and episodes != arr.size:
        raise ValueError(
            f"episodes={episodes} disagrees with len(seeds)={arr.size}; give one of "
            "them, or make them agree"
        )
    return arr.astype(np.int32)


class _Settings(NamedTuple):
    num_envs: int
    horizon: int
    prefetch_lead: int
    max_steps: int
    plan_tile: int | None


def _check_settings(num_envs, horizon, prefetch_lead, max_episode_steps, plan_tile):
    num_envs = _check_int("num_envs", num_envs, 1, "the number of parallel lanes")
    horizon = _check_int(
        "horizon", horizon, 1, "actions of a chunk executed before the next plan"
    )
    lead = _check_int(
        "prefetch_lead", prefetch_lead, 0, "0 is synchronous; L > 0 plans L steps early"
    )
    if max_episode_steps is None:
        cap = DEFAULT_MAX_STEPS
    else:
        cap = _check_int("max_episode_steps", max_episode_steps, 1, "or None")
    tile = None
    if plan_tile is not None:
        tile = _check_int("plan_tile", plan_tile, 1, "rows per policy call, or None")
    return _Settings(num_envs, horizon, lead, cap, tile)


def _prepare(policy, env, episodes, seeds, settings_args, with_params):
    """The checks every entry point runs first: budget, settings, env, policy."""
    seeds_arr = resolve_budget(episodes, seeds)
    settings = _check_settings(*settings_args)
    return (
        seeds_arr,
        settings,
        make_env(env),
        resolve_policy(policy, with_params=with_params),
    )


def _leaf_spec(x: Any) -> jax.ShapeDtypeStruct:
    """Shape and dtype of an array, tracer, abstract value or Python scalar."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), jnp.dtype(x.dtype))
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def _abstract(tree: Any) -> Any:
    return jax.tree.map(_leaf_spec, tree)


def _shapes(tree: Any) -> tuple:
    """Shapes and dtypes of a pytree's leaves (a hashable signature)."""
    return tuple((s.shape, s.dtype) for s in map(_leaf_spec, jax.tree.leaves(tree)))


def build_engine(
    policy: Policy, env: Any, params: Any, settings: _Settings, episodes: int
) -> tuple[Engine, int | None]:
    """Checks the policy against the env (shape only, nothing compiles).

    Returns the engine and the chunk length K (None for single actions).
    """
    if policy.native_chunk is not None and settings.horizon > policy.native_chunk:
        raise ValueError(
            f"horizon={settings.horizon} exceeds policy {policy.name!r}'s "
            f"native_chunk={policy.native_chunk}: use horizon <= "
            f"{policy.native_chunk}"
        )
    key = jax.random.PRNGKey(0)
    obs = jax.eval_shape(lambda k: env.reset(k)[0], key)
    probe = agent.make_config(
        env,
        policy,
        num_envs=PROBE_ROWS,
        horizon=1,
        lead=0,
        tile=PROBE_ROWS,
        chunk=None,
    )
    tile = PROBE_ROWS
    action = jax.ShapeDtypeStruct(tuple(env.action_shape), env.action_dtype)

    def probe_out(params, obs, action):
        frames = agent.frames(probe, obs, action)
        windows = {
            name: jax.tree.map(
                lambda f, s=decl.stack: jnp.broadcast_to(f, (tile, s) + f.shape),
                frames[name],
            )
            for name, decl in probe.spec
        }
        inputs = agent.policy_inputs(probe, windows)
        keys = jnp.zeros((tile, 2), jnp.uint32)
        rstate = None
        if policy.initial_state is not None:
            one = policy.initial_state()
            rstate = jax.tree.map(
                lambda x: jnp.broadcast_to(x, (tile,) + jnp.shape(x)), one
            )
        out, _ = policy.apply(params, inputs, keys, rstate)
        return out

    out = jax.eval_shape(probe_out, _abstract(params), obs, action)
    chunk = output_chunk(policy, out, env, settings.horizon, tile)
    h = min(settings.horizon, chunk) if chunk is not None else 1
    cfg = agent.make_config(
        env,
        policy,
        num_envs=min(settings.num_envs, max(episodes, 1)),
        horizon=settings.horizon,
        lead=settings.prefetch_lead,
        tile=settings.plan_tile or auto_plan_tile(h),
        chunk=chunk,
    )
    check_frame_limit(policy.spec, env, cfg.num_envs)
    config = EngineConfig(episodes=episodes, max_steps=settings.max_steps, agent=cfg)
    return Engine(policy, env, config), chunk


class _Compiled:
    """An engine's compiled executables, kept for calls with the same shapes."""

    def __init__(self, engine: Engine, chunk: int | None, refs: tuple):
        self.engine = engine
        self.chunk = chunk
        self.refs = refs  # keep keyed objects alive so their ids stay valid
        self.executables: dict = {}

    def get_many(self, requests: list[tuple]) -> tuple[list, bool]:
        """Executables for ``(name, jitted_fn, args, static)`` requests.

        ``args`` may be abstract (``jax.ShapeDtypeStruct``). Returns the
        executables and whether anything had to be compiled.
        """
        out, fresh = [], False
        for name, fn, args, static in requests:
            sig = (name, static, jax.tree.structure(args), _shapes(args))
            if sig not in self.executables:
                self.executables[sig] = fn.lower(*args, *static).compile()
                fresh = True
            out.append(self.executables[sig])
        return out, fresh


_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_SIZE = 16


def _env_key(env: Any) -> Any:
    if isinstance(env, str):
        return env
    if isinstance(env, tuple):
        return tuple(id(x) for x in env)
    return id(env)


def _hooks_list(hooks: Any) -> list:
    if hooks is None:
        return []
    if isinstance(hooks, list | tuple):
        return list(hooks)
    return [hooks]


def _call(hooks: list, name: str, *args) -> None:
    for h in hooks:
        fn = getattr(h, name, None)
        if fn is not None:
            fn(*args)


def _to_result(
    seeds, res, env_steps, rows, timing, settings, policy, env, chunk, h, tile
):
    wall, compile_time, run_time = timing
    return RunResult(
        returns=np.asarray(res["returns"], np.float32),
        lengths=np.asarray(res["lengths"], np.int32),
        seeds=np.asarray(seeds, np.int64),
        terminated=np.asarray(res["terminated"], bool),
        truncated=np.asarray(res["truncated"], bool),
        predict_calls=np.asarray(res["predict_calls"], np.int32),
        lanes=np.asarray(res["lane"], np.int32),
        env_steps=int(env_steps),
        policy_rows=int(rows),
        wall_time=wall,
        compile_time=compile_time,
        run_time=run_time,
        num_envs=settings.num_envs,
        horizon=settings.horizon,
        effective_horizon=h,
        prefetch_lead=settings.prefetch_lead,
        policy=policy.name,
        env=getattr(env, "name", type(env).__name__),
        chunk=chunk,
        plan_tile=tile,
    )


def evaluate(
    policy: Any,
    env: Any,
    *,
    horizon: int = 1,
    num_envs: int = 64,
    episodes: int | None = None,
    seeds: Sequence[int] | None = None,
    prefetch_lead: int = 0,
    max_episode_steps: int | None = None,
    hooks: Any = None,
    params: Any = None,
    plan_tile: int | None = DEFAULT_PLAN_TILE,
    segment_steps: int = DEFAULT_SEGMENT_STEPS,
) -> RunResult:
    """Evaluates a policy on a JAX-native env, scoring exactly the budget.

    Args:
      policy: a single-lane callable ``obs -> action`` or ``obs -> chunk`` (or
        ``(obs, key)`` for a stochastic policy), or a ``jaxmesh.Model``.
      env: an id (``"gymnax:CartPole-v1"``, ``"brax:fast"``), a gymnax env, an
        ``(env, env_params)`` tuple or a brax env.
      horizon: H, actions of a chunk executed before the next plan.
      num_envs: N, parallel lanes. Results do not depend on it.
      episodes: the budget; ``seeds`` default to ``range(episodes)``.
      seeds: one seed per episode; episode i is reset with
        ``jax.random.PRNGKey(seeds[i])``.
      prefetch_lead: L; the chunk that starts at step t was planned at
        ``t - min(L, h)`` (simulated asynchronous inference).
      max_episode_steps: a cap on episode length (``truncated`` when hit);
        default: the env's own limit, or 100,000 steps.
      params: policy params passed as a jit argument (new values never
        recompile). With ``params``, a plain function is ``fn(params, obs)`` or
        ``fn(params, obs, key)`` as in ``make_evaluator``; for a Model they
        replace ``model.params`` for this run.
      hooks: an object (or list) with any of ``on_run_start(info)``,
        ``on_episode_end(EpisodeResult)``, ``on_run_end(RunResult)``, called on
        the host between segments.
      plan_tile: rows per policy call; None: ``auto_plan_tile(h)`` (128 // h
        rows, within [8, 128]). Never derived from N, so results never depend
        on N; for a heavy policy on few lanes, set it near ``num_envs``.
      segment_steps: env steps per scan segment between host visits.

    Returns:
      A ``RunResult``.

    Raises:
      ValueError, TypeError: bad input, before anything compiles.

    Example::

      result = jaxmesh.evaluate(policy_fn, "gymnax:CartPole-v1", episodes=100)
    """
    t_start = time.perf_counter()
    with_params = params is not None
    seeds_arr, settings, env_obj, pol = _prepare(
        policy,
        env,
        episodes,
        seeds,
        (num_envs, horizon, prefetch_lead, max_episode_steps, plan_tile),
        with_params,
    )
    segment_steps = _check_int(
        "segment_steps", segment_steps, 1, "env steps per segment"
    )
    params = _placed_params(pol, params if with_params else None)
    hook_list = _hooks_list(hooks)
    e = int(seeds_arr.size)

    cache_key = (id(policy), _env_key(env), settings, e, with_params)
    compiled = _CACHE.get(cache_key)
    if compiled is None:
        engine, chunk = build_engine(pol, env_obj, params, settings, e)
        compiled = _Compiled(engine, chunk, (policy, env))
        _CACHE[cache_key] = compiled
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(cache_key)
    engine, chunk = compiled.engine, compiled.chunk
    h = engine.config.agent.horizon

    _call(
        hook_list,
        "on_run_start",
        {
            "episodes": e,
            "num_envs": settings.num_envs,
            "horizon": settings.horizon,
            "prefetch_lead": settings.prefetch_lead,
            "policy": pol.name,
            "env": getattr(env_obj, "name", ""),
        },
    )
    if e == 0:
        empty = {
            k: np.zeros(0)
            for k in (
                "returns",
                "lengths",
                "terminated",
                "truncated",
                "predict_calls",
                "lane",
            )
        }
        wall = time.perf_counter() - t_start
        result = _to_result(
            seeds_arr,
            empty,
            0,
            0,
            (wall, 0.0, 0.0),
            settings,
            pol,
            env_obj,
            chunk,
            h,
            engine.config.agent.tile,
        )
        _call(hook_list, "on_run_end", result)
        return result

    compile_time = 0.0
    t0 = time.perf_counter()
    seeds_dev = jnp.asarray(seeds_arr)
    carry_shape = jax.eval_shape(engine.init, params, seeds_dev)
    (init, segment), fresh = compiled.get_many(
        [
            ("init", engine.init, (params, seeds_dev), ()),
            ("segment", engine.run_segment, (params, carry_shape), (segment_steps,)),
        ]
    )
    t_init = time.perf_counter()
    carry = jax.block_until_ready(init(params, seeds_dev))
    t_init = time.perf_counter() - t_init  # running init is not compiling
    if fresh:
        compile_time = time.perf_counter() - t0 - t_init

    t_run = time.perf_counter()
    reported = 0
    want_episodes = any(hasattr(hk, "on_episode_end") for hk in hook_list) or (
        pol.model is not None and type(pol.model).on_episode_end is not _base_hook()
    )
    try:
        while True:
            carry = segment(params, carry)
            n_done = int(carry.lanes.n_done)
            if want_episodes:
                reported = _stream(carry, reported, seeds_arr, hook_list, pol)
            if n_done >= e:
                break
    except BaseException as exc:
        # Nothing finished is lost: the episodes done so far ride on the error.
        try:
            exc.partial_result = _partial(carry, seeds_arr)  # type: ignore[attr-defined]
            exc.add_note(
                f"jaxmesh: {int(np.sum(exc.partial_result['done']))} of {e} "
                "episodes had finished; they are on this exception's .partial_result"
            )
        except Exception:  # the carry itself may be unusable
            pass
        raise
    res = jax.device_get(carry.lanes.results)
    t_end = time.perf_counter()
    result = _to_result(
        seeds_arr,
        {
            f: getattr(res, f)
            for f in (
                "returns",
                "lengths",
                "terminated",
                "truncated",
                "predict_calls",
                "lane",
            )
        },
        carry.lanes.env_steps,
        carry.agent.rows,
        (t_end - t_start, compile_time, t_end - t_run),
        settings,
        pol,
        env_obj,
        chunk,
        h,
        engine.config.agent.tile,
    )
    _call(hook_list, "on_run_end", result)
    return result


def _placed_params(pol: Policy, params: Any) -> Any:
    """A Model's params (loaded once, on its ``device``), or ``params`` as given."""
    model = pol.model
    if model is None:
        return params
    if params is None:
        return model.placed_params()
    model._ensure_loaded()
    return model.place(params)


def _base_hook():
    from jaxmesh.model import Model

    return Model.on_episode_end


def _partial(carry, seeds_arr) -> dict:
    res = jax.device_get(carry.lanes.results)
    out = {
        f: np.asarray(getattr(res, f))
        for f in (
            "returns",
            "lengths",
            "terminated",
            "truncated",
            "predict_calls",
            "lane",
            "done",
        )
    }
    out["seeds"] = seeds_arr
    return out


def _stream(carry, cursor: int, seeds_arr, hook_list, pol) -> int:
    """Streams finished episodes to the hooks in episode order.

    Episode i is reported once every episode before it has been: an episode
    that ends early waits for the earlier ones. Returns the next index to report.
    """
    res = jax.device_get(carry.lanes.results)
    done = np.asarray(res.done)
    while cursor < done.size and done[cursor]:
        i = cursor
        ep = episode_record(res, res.lane, seeds_arr, i)
        cursor += 1
        _call(hook_list, "on_episode_end", ep)
        if pol.model is not None:
            pol.model.on_episode_end(i)
    return cursor


class Outcome(NamedTuple):
    """What ``make_evaluator``'s function returns (arrays, episode order)."""

    returns: jax.Array
    lengths: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    predict_calls: jax.Array
    lanes: jax.Array
    env_steps: jax.Array
    policy_rows: jax.Array


def make_evaluator(
    policy: Any,
    env: Any,
    *,
    horizon: int = 1,
    num_envs: int = 64,
    episodes: int | None = None,
    seeds: Sequence[int] | None = None,
    prefetch_lead: int = 0,
    max_episode_steps: int | None = None,
    plan_tile: int | None = DEFAULT_PLAN_TILE,
):
    """The engine as a pure function of policy params.

    ``policy`` is ``fn(params, obs)`` / ``fn(params, obs, key)`` (single lane) or
    a ``jaxmesh.Model`` whose ``params`` the function replaces. The returned
    ``evaluator(params, seeds=None) -> Outcome`` can be jitted, vmapped over a
    population of params, or called inside a jitted training step. ``seeds``
    (int32, one per episode) defaults to the seeds given here.

    Example::

      run = jaxmesh.make_evaluator(apply, "gymnax:CartPole-v1", episodes=16)
      returns = jax.jit(jax.vmap(run))(population).returns  # [P, 16]
    """
    seeds_arr, settings, env_obj, pol = _prepare(
        policy,
        env,
        episodes,
        seeds,
        (num_envs, horizon, prefetch_lead, max_episode_steps, plan_tile),
        True,
    )
    e = int(seeds_arr.size)
    engines: dict = {}

    def evaluator(params: Any, seeds: jax.Array | None = None) -> Outcome:
        sig = jax.tree.structure(params), _shapes(params)
        if sig not in engines:
            engines[sig] = build_engine(pol, env_obj, params, settings, e)[0]
        engine = engines[sig]
        s = jnp.asarray(seeds_arr if seeds is None else seeds, jnp.int32)
        if s.shape != (e,):
            raise ValueError(
                f"seeds must have shape ({e},) (one per budgeted episode), got "
                f"{s.shape}; pass {e} seeds or build the evaluator with another "
                "budget"
            )
        if e == 0:
            z = jnp.zeros((0,))
            return Outcome(
                z,
                z.astype(jnp.int32),
                z.astype(bool),
                z.astype(bool),
                z.astype(jnp.int32),
                z.astype(jnp.int32),
                jnp.int32(0),
                jnp.int32(0),
            )
        carry = engine.run(params, s)
        r = carry.lanes.results
        return Outcome(
            r.returns,
            r.lengths,
            r.terminated,
            r.truncated,
            r.predict_calls,
            r.lane,
            carry.lanes.env_steps,
            carry.agent.rows,
        )

    return evaluator


class Agent(NamedTuple):
    """The jitted agent side alone, for host loops that step envs themselves.

    Attributes:
      config: the static agent configuration (effective horizon, lead, tile).
      params: the policy's own params (a Model's ``params``; None for functions).
      init: ``init(obs, lanes) -> state``; lanes in ``lanes`` begin at ``obs``.
      step: ``step(params, state, obs, started, active, ep_keys, t) -> (state,
        actions)``; see ``jaxmesh.core.agent.host_step``.
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
    plan_tile: int | None = DEFAULT_PLAN_TILE,
) -> Agent:
    """Plan + replay + windows + previous action + masking as jitted functions.

    The scan engine and a host loop over remote simulators drive the same
    functions, so both give the same per-episode results.
    """
    _, settings, env_obj, pol = _prepare(
        policy,
        env,
        None,
        None,
        (num_envs, horizon, prefetch_lead, None, plan_tile),
        False,
    )
    engine, _ = build_engine(
        pol, env_obj, _placed_params(pol, None), settings, settings.num_envs
    )
    cfg = engine.config.agent

    def init(obs, lanes):
        return agent.init(cfg, pol, obs, lanes)

    def step(params, state, obs, started, active, ep_keys, t):
        return agent.host_step(
            cfg, pol, params, state, obs, started, active, ep_keys, t
        )

    params = _placed_params(pol, None)
    return Agent(cfg, params, jax.jit(init), jax.jit(step, donate_argnums=(1,)))
