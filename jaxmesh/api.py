"""``jaxmesh.evaluate``, the one way in: the config built and checked once, the
env told its backend once (``jaxmesh.run.dispatch``), a suite planned as runs,
each resumed, traced and fingerprinted, then run by its backend
(docs/evaluation.md, "The engine").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxmesh import suite
from jaxmesh.results.result import RunResult
from jaxmesh.run import backend, dispatch
from jaxmesh.run import resume as resume_mod
from jaxmesh.run.config import FLAT, GROUPS, RunConfig, from_keywords
from jaxmesh.trace import check_trace_path, tracing

#: The flat knobs' defaults, as ``RunConfig`` holds them (shown in signatures).
_UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<from config>"})()
_FLAT = (*FLAT, *GROUPS)
_CALL = ("episodes", "seeds", "params", "hooks", "record", "trace", "resume")


def evaluate(
    policy: Any,
    env: Any,
    config: RunConfig | None = None,
    *,
    episodes: int | None = None,
    seeds: Sequence[int] | None = None,
    num_envs: int = _UNSET,
    horizon: int = _UNSET,
    max_episode_steps: int | None = _UNSET,
    max_episode_seconds: float | None = _UNSET,
    workers: int | None = _UNSET,
    chunking: Any = _UNSET,
    starts: Any = _UNSET,
    scoring: Any = _UNSET,
    served: Any = _UNSET,
    layout: Any = _UNSET,
    params: Any = None,
    hooks: Any = None,
    record: Any = None,
    trace: Any = None,
    resume: Any = None,
    env_config: Mapping | None = None,
    **unknown: Any,
) -> Any:
    """Evaluates a policy on an env, scoring exactly the budget.

    Episode i runs with seed ``seeds[i]`` (``episodes=E``: seeds 0..E-1), is
    scored once, and comes out the same whatever the lane count, tile or
    backend (docs/contract.md). docs/evaluation.md ("What evaluate takes")
    says what each argument accepts.

    Args:
      policy: a single-lane callable ``obs -> action`` or ``obs -> chunk``
        (``(obs, key)`` for a stochastic one), or a ``jaxmesh.Model``.
      env: an env id (``"gymnax:CartPole-v1"``, ``"gymnasium:Hopper-v5"``,
        ...), a served env (``"grpc://host:port"`` or a list of addresses), a
        JAX env object, a gymnasium ``Env``, a list of them or a ``VectorEnv``,
        or a ``jaxmesh.Suite``.
      config: a ``jaxmesh.RunConfig`` (None: the defaults); the keywords
        below override its fields.
      episodes, seeds: the budget: E episodes, or one episode per seed.
      num_envs, horizon, max_episode_steps, max_episode_seconds, workers:
        ``RunConfig``'s flat knobs.
      chunking, starts, scoring, served, layout: its groups
        (``jaxmesh.Chunking``, ``Starts``, ``Scoring``, ``Served``, ``Layout``).
      params: policy params as a jit argument (new values never recompile): a
        plain function is then ``fn(params, obs)``; a Model's are replaced.
      hooks: an object (or list) with any of ``on_run_start(info)``,
        ``on_episode_end(EpisodeResult)``, ``on_run_end(RunResult)``,
        ``on_step(jaxmesh.StepEvent)`` and ``on_fault(info)``.
      record: a ``jaxmesh.Record``: those episodes step by step
        (``result.trajectories``).
      trace: a file path: the run's timeline as Chrome-trace / Perfetto JSON,
        written also when the run fails.
      resume: an earlier ``RunResult`` of this run (an exception's
        ``partial_result``, ``RunResult.from_dict`` of its JSON, or
        ``jaxmesh.load_episode_log(path)``): only the episodes it lacks run;
        another run's is refused, naming what differs.
      env_config: an id's options, ``jaxmesh.make_env(env, **env_config)``.
      **unknown: refused with a ``TypeError``; a grouped field given flat
        (``prefetch_lead=2``) names its group and the spelling to use.

    Returns:
      A ``jaxmesh.RunResult`` (a ``jaxmesh.SuiteResult`` for a suite).

    Raises:
      ValueError, TypeError: bad input, before anything compiles.
      jaxmesh.BadValueError: a bad action or reward, after the segment that
        met it. Any exception of a run carries the finished episodes on
        ``exc.partial_result``.

    Example::

      result = jaxmesh.evaluate(policy_fn, "gymnax:CartPole-v1", episodes=100)
    """
    args = dict(locals())  # the parameters, before any other name is bound
    given = {k: args[k] for k in _FLAT if args[k] is not _UNSET}
    config = from_keywords(config, {**given, **unknown})
    call = {k: args[k] for k in _CALL}
    if isinstance(env, suite.Suite):
        return run_suite(policy, env, config, env_config, **call)
    return run_one(policy, dispatch.target(env, env_config), config, **call)


def run_suite(
    policy: Any,
    the_suite: suite.Suite,
    config: RunConfig,
    env_config: Mapping | None = None,
    **call: Any,
) -> suite.SuiteResult:
    """Every task of a suite, in the runs its plan groups them into
    (``jaxmesh.suite.SuitePlan``): a failure's ``partial_result`` keeps the
    tasks finished before it. TypeError: ``env_config`` given."""
    if env_config:
        raise TypeError(
            "env_config= with a Suite: give each task's env its options "
            "(jaxmesh.make_suite(..., **options), or Task(make_env(id, ...)))"
        )
    return suite.SuitePlan(the_suite, config, call).run(
        lambda run: run_one(policy, dispatch.target(run.env()), run.config, **run.call)
    )


def run_one(
    policy: Any,
    target: backend.Target,
    config: RunConfig,
    *,
    trace: Any,
    resume: Any,
    **call: Any,
) -> RunResult:
    """One run of one env (``target``: it and its backend), resumed, traced,
    run by its backend and its result (or ``partial_result``) fingerprinted;
    ``call``: ``evaluate``'s budget, params, hooks, record."""
    if isinstance(resume, suite.SuiteResult):
        raise TypeError(
            "resume= is a SuiteResult, but env is not a Suite: resume a suite "
            "with the same Suite, or a single run with its RunResult"
        )
    path = check_trace_path(trace)
    settings = None
    if path:  # the policy's and env's names, the config, the seeds counted
        settings = {
            k: v if isinstance(v, str) else getattr(v, "name", None) or type(v).__name__
            for k, v in (("policy", policy), ("env", target.env))
        }
        settings.update(config.to_dict(), episodes=call["episodes"])
        if call["seeds"] is not None:
            settings["seeds"] = f"{len(call['seeds'])} seeds"
    with tracing(path, settings):
        todo = resume_mod.Resumption(resume, policy, target, config, call)
        config, call = todo.config, todo.call
        with todo.running(), resume_mod.fingerprinting(policy, config, call) as stamp:
            # The backend refuses (ValueError, TypeError) a setting it does not
            # take; a served env's options go to it.
            served = config.for_backend(target)
            given = call if served is None else {**call, "served": served}
            run = dispatch.route(target).evaluate
            new = stamp(run(policy, target.env, config, **given))
        return todo.merged(new)
