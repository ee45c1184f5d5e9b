"""``jaxmesh.evaluate``: the backend chosen once; JAX envs run here, in scan
segments driven by one host loop.

``evaluate`` asks ``backend.backend_of`` once which backend runs the env, checks
the served-only options once (``backend.check_served_options``), and hands a
host-stepped or served env to ``jaxmesh.run.host``. A JAX env runs on an
``Evaluator``: it owns one (policy, env, settings), a placement (one device or
a mesh of devices, ``jaxmesh.run.placement``) and the programs compiled for it,
keyed on everything that changes the program: the params' shapes (and the rows
of a segment's episode log, set by the lanes: never the budget). Each run's
sizes are planned once (``jaxmesh.run.plan``). ``evaluate`` keeps a few evaluators
(``cache_info()``, ``clear_cache()``) so that calling it again with the same
policy object, env and settings compiles nothing.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmesh import suite as suite_mod
from jaxmesh.core import tally as core_results
from jaxmesh.core.engine import with_step_events
from jaxmesh.core.policy import resolve_policy
from jaxmesh.core.tally import empty
from jaxmesh.devices import resolve_mesh
from jaxmesh.envs import make_env, playground
from jaxmesh.envs.timing import step_seconds
from jaxmesh.results.record import check_record, check_record_budget
from jaxmesh.results.result import RunResult
from jaxmesh.run import (
    backend,
    build,
    checks,
    identity,
    initial,
    instructions,
    placement,
    stream,
)
from jaxmesh.run import resume as resume_mod
from jaxmesh.run.placement import (  # noqa: F401 - their old home
    CPU_COMPILER_OPTIONS,
    compiler_options,
)
from jaxmesh.run.plan import RunPlan, plan_run
from jaxmesh.trace import check_trace_path, span, tracing

TRIAL_HINT = (
    "episode i gets trial index trial_index_base + i (a host-stepped env that "
    "declares a trial_index reset option; a JAX env with initial_states= or "
    "reset_fn=)"
)


class _Program(NamedTuple):
    engine: Any
    segment: Any  # the compiled segment executable
    plan: RunPlan  # the sizes the engine was built with


class Evaluator:
    """A policy, an env and settings, with the programs compiled for them.

    Hold one to run several budgets or params without compiling again: every
    budget, and new params of the same shapes, reuse the program.

    Where the lanes run is the evaluator's placement (``self.placement``,
    ``jaxmesh.run.placement``): one device, or with ``devices=`` a mesh of
    devices; the loop is the same for both.

    Args:
      policy: as for ``jaxmesh.evaluate``.
      env: as for ``jaxmesh.evaluate``.
      takes_params: a plain function policy is ``fn(params, obs[, key])``
        (``evaluate(..., params=...)``) rather than ``fn(obs[, key])``.
      horizon, num_envs, prefetch_lead, max_episode_steps, plan_tile,
        segment_steps, metrics, success, success_mode, devices, delay,
        delay_ms, execution: as for
        ``jaxmesh.evaluate``
        (with ``devices``, the evaluator is a ``ShardedEvaluator``: the same
        evaluator on a ``placement.DeviceMesh``).
      record: as for ``jaxmesh.evaluate`` (a ``jaxmesh.Record``); ``run``
        may name other episodes, as many of them (the buffers' size is part
        of the program; which episodes fill them is data).
      initial_states, reset_fn: as for ``jaxmesh.evaluate``; ``run`` may
        pass other ``initial_states`` of the same shapes (their values are
        data) and its own ``trial_index_base``.
      randomize: as for ``jaxmesh.evaluate``.

    Raises:
      ValueError, TypeError: bad settings, env or policy (nothing compiles).

    Example::

      ev = jaxmesh.Evaluator(policy_fn, "gymnax:CartPole-v1", num_envs=64)
      a = ev.run(episodes=100)
      b = ev.run(episodes=300)  # same program: no compile
    """

    def __new__(cls, *args: Any, devices: Any = None, **kwargs: Any):
        # The type names where the lanes run; the placement does the work.
        if devices is not None and cls is Evaluator:
            cls = ShardedEvaluator
        return super().__new__(cls)

    def __init__(
        self,
        policy: Any,
        env: Any,
        *,
        takes_params: bool = False,
        horizon: int = 1,
        num_envs: int = 64,
        prefetch_lead: int = 0,
        max_episode_steps: int | None = None,
        plan_tile: int | None = None,
        segment_steps: int = checks.DEFAULT_SEGMENT_STEPS,
        metrics: Any = None,
        success: Any = None,
        devices: Any = None,
        record: Any = None,
        initial_states: Any = None,
        reset_fn: Any = None,
        delay: int = 0,
        execution: Any = None,
        success_mode: str = checks.DEFAULT_SUCCESS_MODE,
        randomize: Any = None,
        delay_ms: float | None = None,
    ):
        asked = checks.check_metrics(metrics, success)
        self.success_mode = checks.check_success_mode(success_mode)
        trials = initial.resolve(initial_states, reset_fn)
        self.record = check_record(record)
        self.settings = checks.check_settings(
            num_envs,
            horizon,
            prefetch_lead,
            max_episode_steps,
            plan_tile,
            segment_steps,
            delay,
            execution,
            delay_ms,
        )
        self.env = make_env(env)
        if randomize is not None:
            self.env = playground.randomized(self.env, randomize)
        self.settings = checks.resolve_delay_ms(
            self.settings,
            step_seconds(self.env),
            getattr(self.env, "name", type(self.env).__name__),
        )
        self.policy = resolve_policy(policy, with_params=takes_params)
        self.takes_params = takes_params
        self._source = (policy, env, randomize)  # keeps the keyed objects alive
        # (info keys, reductions) and the success key, checked against the
        # env's info by shape (nothing compiles).
        self.metrics = build.engine_metrics(self.env, asked)
        build.check_record_keys(self.env, self.record)
        # Episodes from a trial index: checked against the env's reset by shape.
        self.trials = trials
        self._trial_reset = None if trials is None else trials.engine_reset(self.env)
        self.placement = placement.placement_for(
            devices, self.settings.num_envs, self.policy, self.record
        )
        self._chunks: dict = {}  # params signature -> chunk length K
        self._programs: dict = {}  # (params signature, capacity) -> _Program

    @property
    def device(self) -> Any:
        """The device the policy asked for (None: JAX's default)."""
        return self.policy.device

    @property
    def supports_step_hooks(self) -> bool:
        """Whether ``on_step`` hooks can run (a mesh refuses them)."""
        return self.placement.supports_step_hooks

    def programs(self) -> list[tuple]:
        """The (params signature, capacity) of every program compiled so far;
        a program with step events (an ``on_step`` hook) adds ``"on_step"``."""
        return [k for k, p in self._programs.items() if p.segment is not None]

    def _chunk(self, params: Any, sig: tuple) -> int | None:
        if sig not in self._chunks:
            self._chunks[sig] = build.probe_chunk(
                self.policy,
                self.env,
                params,
                self.settings.horizon,
                build.told_horizon(self.policy, self.settings),
                chunks_asked=build.asks_chunks(self.settings),
            )
        return self._chunks[sig]

    def plan(self, params: Any, episodes: int) -> RunPlan:
        """The sizes a run of ``episodes`` with these params is built with.

        The chunk length comes from a shape-only probe of the policy (once per
        params signature); the lanes and the capacity from the placement; the
        default tile is sized for all N lanes, also when they are split over
        devices (so that a sharded run's episodes match the one-device run's).

        Raises:
          ValueError, TypeError: the policy's output does not fit the env.
        """
        s = self.settings
        chunk = self._chunk(params, build.signature(params))
        return plan_run(
            s,
            chunk,
            capacity=self.placement.capacity(episodes, s.num_envs),
            lanes=self.placement.lanes(s.num_envs),
        )

    @staticmethod
    def _key(params: Any, plan: RunPlan, steps: bool) -> tuple:
        return (build.signature(params), plan.capacity) + (
            ("on_step",) if steps else ()
        )

    def _program(self, params: Any, plan: RunPlan, steps: bool = False) -> _Program:
        """The program for these params' shapes and this plan, built (every
        check: probe, frame limit) but not necessarily compiled.

        ``steps``: the program with step events (``on_step`` hooks), a program
        of its own (keyed with ``"on_step"``); without, no callback is in it.
        """
        key = self._key(params, plan, steps)
        if key not in self._programs:
            engine = build.build_engine(
                self.policy,
                self.env,
                plan,
                self.settings.max_steps,
                self.metrics,
                self.record,
                self._trial_reset,
            )
            if steps:
                engine = with_step_events(engine)
            self._programs[key] = _Program(engine, None, plan)
        return self._programs[key]

    def _compiled(
        self, params: Any, plan: RunPlan, steps: bool = False
    ) -> tuple[_Program, bool]:
        """The program with its segment compiled; whether it compiled now."""
        program = self._program(params, plan, steps)
        if program.segment is not None:
            return program, False
        segment = self.placement.compile(
            program.engine, params, self.settings.segment_steps
        )
        program = program._replace(segment=segment)
        self._programs[self._key(params, plan, steps)] = program
        return program, True

    def run(
        self,
        *,
        episodes: int | None = None,
        seeds: Sequence[int] | None = None,
        params: Any = None,
        hooks: Any = None,
        record: Any = None,
        trial_index_base: int = 0,
        initial_states: Any = None,
        success_mode: str | None = None,
        instruction: str | None = None,
    ) -> RunResult:
        """Scores a budget; see ``jaxmesh.evaluate`` for the arguments.

        ``record`` (None: the evaluator's own) names other episodes to record,
        as many as the evaluator's ``Record`` with its ``max_steps`` and
        ``keys``: the same program runs. ``initial_states`` (None: the
        evaluator's own) of the evaluator's shapes run on the same program.
        ``success_mode`` (None: the evaluator's own) names the result's
        headline success; the program does not depend on it.

        Raises:
          ValueError, TypeError: bad input, before anything compiles.
          jaxmesh.BadValueError: a bad action or reward met while running.
          Any exception from a hook, with the finished episodes on
          ``exc.partial_result``.
        """
        t_start = time.perf_counter()
        pol, s = self.policy, self.settings
        if success_mode is None:
            success_mode = self.success_mode
        success_mode = checks.check_success_mode(success_mode)
        seeds_arr = checks.resolve_budget(episodes, seeds, self.device)
        hook_list = stream.hooks_list(hooks)
        self._run_record = self._check_run_record(record, int(seeds_arr.size))
        trial_index_base = checks.check_int(
            "trial_index_base", trial_index_base, 0, TRIAL_HINT
        )
        self._run_trials = initial.run_trials(
            self.trials, initial_states, trial_index_base, int(seeds_arr.size)
        )
        if self.takes_params and params is None:
            raise TypeError(
                "this Evaluator was built with takes_params=True: pass params="
            )
        params = pol.default_params() if params is None else pol.place(params)
        env_name = getattr(self.env, "name", type(self.env).__name__)
        instruction = instructions.check_instruction(instruction)
        # Encoded before the probe: the program is built for their shapes.
        encoded = instructions.check_sources(pol.spec, instruction, env_name, False)
        e = int(seeds_arr.size)
        plan = self.plan(params, e)
        self._run_texts = instructions.run_level(pol.spec, encoded, plan.lanes)
        run_fields = {
            "num_envs": s.num_envs,
            "horizon": s.horizon,
            "effective_horizon": plan.h,
            "prefetch_lead": s.prefetch_lead,
            **checks.execution_fields(s),
            "policy": pol.name,
            "env": getattr(self.env, "name", type(self.env).__name__),
            "chunk": plan.chunk,
            "plan_tile": plan.tile,
            "metric_reductions": dict(self.metrics[0]),
            "success_key": self.metrics[1],
            "trial_index_base": trial_index_base,
            "success_mode": success_mode,
            "instruction": instruction,
            # What resume= compares: digests of the env, the policy's program
            # (kept by the probe of self.plan) and the params.
            "fingerprint": identity.run_identity(
                identity.env_digest(self.env),
                build.policy_digest(
                    pol, self.env, params, s.horizon, build.told_horizon(pol, s)
                ),
            ),
        }
        steps = stream.StepStream(hook_list, plan.h, plan.lead)
        self._run_steps = steps
        if steps and not self.supports_step_hooks:
            raise ValueError(
                f"hooks: an on_step hook with devices= ({type(self).__name__}): "
                "step events are sent from one device's program; drop devices= "
                "for a run with on_step hooks, or keep on_episode_end only"
            )
        if e:  # every check runs before a hook hears of the run
            self._program(params, plan, bool(steps))
        info = {"episodes": e, **run_fields}
        stream.call(hook_list, "on_run_start", info)
        episodes_out = stream.EpisodeStream(
            hook_list, seeds_arr, pol.on_episode_end, run_fields
        )
        compiled: list = []

        def compile_program() -> float:
            if e == 0:
                return 0.0
            t0 = time.perf_counter()
            program, fresh = self._compiled(params, plan, bool(steps))
            compiled.append(program)
            return time.perf_counter() - t0 if fresh else 0.0

        def loop() -> Any:
            if e == 0:
                named, key = self.metrics
                return empty(0, 0, np, metrics=named, success=key is not None)
            engine = compiled[0].engine
            engine.step_sink = steps.emit_masked if steps else None
            try:
                return self._loop(compiled[0], params, seeds_arr, episodes_out)
            finally:
                engine.step_sink = None

        return stream.drive(episodes_out, t_start, compile_program, loop)

    def _check_run_record(self, record: Any, episodes: int) -> Any:
        """The ``Record`` of a run: the evaluator's, or one of the same shape.

        Raises:
          ValueError: another number of episodes, ``max_steps``, ``keys`` or
            ``states`` than the evaluator was built with, or episodes outside
            the budget.
        """
        record = check_record(record)
        own = self.record
        if record is None:
            record = own
        elif own is None or record_shape(record) != record_shape(own):
            raise ValueError(
                f"run(record={record!r}): this Evaluator was built with "
                f"record={own!r}; a run may name other episodes, as many, with "
                "the same max_steps, keys and states. Build an Evaluator with "
                "this record"
            )
        check_record_budget(record, episodes)
        return record

    def _loop(self, program: _Program, params, seeds_arr, episodes_out) -> Any:
        """Runs segments until the budget is done; returns the host ``Results``.

        The placement puts the carry, each segment's seed window and the params
        where the program reads them and reads each segment's log back; the
        host copies the log's rows into its own arrays, indexed by episode
        (``core.results.write``). What a segment carries and the host reads is
        sized by the lanes, never by the budget. The loop is the same on one
        device and on a mesh.
        """
        place, plan, rec = self.placement, program.plan, self._run_record
        place.check_same_everywhere(seeds_arr, params)
        with span("init", "run"):
            state, res = place.first_carry(
                program.engine,
                seeds_arr,
                None if rec is None else rec.episodes,
                self._run_trials,
                self._run_texts,
            )
            params = place.put_params(params)
        e = seeds_arr.size
        book, base = None, 0  # the first carry's window starts at episode 0
        k = 0
        while True:
            # A segment's span runs from its dispatch to the sync that reads its
            # log (the device's work lies in between).
            with span("segment", "run", index=k):
                state, res = program.segment(params, state, res)
                log, n_done, next_episode = place.drain(state, res, plan)
            with span("host sync", "run"):
                book = core_results.write(
                    core_results.book(log, e) if book is None else book, log
                )
            # What a failure from here on keeps (the recording still on the
            # device: the results passed to a segment are not donated).
            episodes_out.latest = book
            self._run_steps.raise_error()  # an on_step hook raised: it ends
            k += 1
            finished = n_done >= e
            if episodes_out.wants_episodes or finished or np.any(book.fault.kind):
                with span("hooks", "run"):
                    episodes_out.update(book)
                episodes_out.check_fault(book)
                if finished:
                    place.keep(program.engine, state)
                    return jax.device_get(book)
            state, base = place.put_window(
                program.engine, state, base, seeds_arr, next_episode, self._run_trials
            )


class ShardedEvaluator(Evaluator):
    """An ``Evaluator`` whose lanes are split over the devices of a mesh.

    What ``jaxmesh.Evaluator(..., devices=...)`` (and ``evaluate``) builds: the
    same evaluator and loop on a ``placement.DeviceMesh``; this type only names
    it and shows the split. ``num_envs`` must be a multiple of the number of
    devices D; each device runs ``num_envs / D`` lanes and every D-th episode.
    Results equal a one-device run's episode for episode (the ``lanes`` field
    aside); ``plan_tile`` defaults to the one-device run's.

    Under ``jax.distributed`` every process builds the same evaluator and
    makes the same calls; each drives its own devices of the mesh and returns
    the whole result (docs/scale.md, "Many hosts").

    Raises:
      ValueError: ``num_envs`` not a multiple of D, a policy pinned to one
        device (``jaxmesh.Model(device=...)``), or a mesh with no device of this
        process.
    """

    @property
    def mesh(self) -> Any:
        """The one-axis ``jax.sharding.Mesh`` the lanes are split over."""
        return self.placement.mesh

    @property
    def num_devices(self) -> int:
        """D, the devices of the mesh."""
        return self.placement.num_devices

    @property
    def lanes_per_device(self) -> int:
        """N / D."""
        return self.placement.lanes_per_device


def _trace_settings(args: dict) -> dict:
    """The settings a timeline records: the plain values among ``evaluate``'s
    arguments (policies, envs and params are named, not dumped)."""
    out = {}
    for k, v in args.items():
        if v is None or isinstance(v, bool | int | float | str):
            out[k] = v
        elif k == "seeds":
            out[k] = f"{len(v)} seeds"
        else:
            out[k] = getattr(v, "name", None) or type(v).__name__
    return out


_EVALUATORS: collections.OrderedDict = collections.OrderedDict()
CACHE_SIZE = 16


def _env_key(env: Any) -> Any:
    if isinstance(env, str):
        return env
    if isinstance(env, tuple):
        return tuple(id(x) for x in env)
    return id(env)


def cache_info() -> list[dict]:
    """What ``evaluate`` keeps: one entry per cached ``Evaluator``."""
    return [
        {
            "policy": ev.policy.name,
            "env": getattr(ev.env, "name", ""),
            "settings": ev.settings._asdict(),
            "device": None if ev.device is None else str(ev.device),
            "programs": len(ev.programs()),
        }
        for ev in _EVALUATORS.values()
    ]


def clear_cache() -> None:
    """Drops every evaluator and host agent (and compiled program) ``evaluate``
    keeps."""
    from jaxmesh.run import host

    _EVALUATORS.clear()
    host.clear_cache()


@suite_mod.runs_suites
@resume_mod.resumable
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
    plan_tile: int | None = None,
    segment_steps: int = checks.DEFAULT_SEGMENT_STEPS,
    max_episode_seconds: float | None = None,
    token: str | None = None,
    lane_groups: int | None = None,
    credentials: Any = None,
    reply_timeout: float | str | None = "auto",
    on_server_loss: str | None = None,
    transport: str = "auto",
    metrics: Any = None,
    success: Any = None,
    devices: Any = None,
    record: Any = None,
    trace: Any = None,
    resume: RunResult | None = None,
    check_seeds: bool = False,
    trial_index_base: int = 0,
    initial_states: Any = None,
    reset_fn: Any = None,
    delay: int = 0,
    execution: Any = None,
    success_mode: str = checks.DEFAULT_SUCCESS_MODE,
    instruction: str | None = None,
    randomize: Any = None,
    delay_ms: float | None = None,
    workers: int | None = None,
) -> RunResult:
    """Evaluates a policy on a JAX-native env, scoring exactly the budget.

    The backend is chosen here, once (``jaxmesh.run.backend.backend_of``): a
    host-stepped gymnasium env (a ``gymnasium.Env``, a list of them, a
    ``VectorEnv`` in ``AutoresetMode.DISABLED``, or ``"gymnasium:<id>"``) runs
    in ``jaxmesh.run.host.evaluate`` under the same contract, and so do served
    envs: ``"grpc://host:port"`` (a ``jaxmesh.EnvServer`` or ``jaxmesh
    serve-env``) or a list of such addresses (lanes dealt over the servers).
    ``token``, ``credentials``, ``reply_timeout`` and ``lane_groups`` are for
    served envs only, checked once (``backend.ServedOptions``).

    Args:
      policy: a single-lane callable ``obs -> action`` or ``obs -> chunk`` (or
        ``(obs, key)`` for a stochastic policy), or a ``jaxmesh.Model``.
      env: an id (``"gymnax:CartPole-v1"``, ``"brax:fast"``), a gymnax env, an
        ``(env, env_params)`` tuple, a brax env, or an object following
        ``jaxmesh.types.Env``. A ``jaxmesh.Suite`` runs each of its tasks and
        returns a ``jaxmesh.SuiteResult`` (``jaxmesh.suite``, docs/suites.md).
        ``env_config={...}`` (a keyword) makes an id with those options,
        ``jaxmesh.make_env(env, **env_config)`` (e.g. a ``"libero:"`` task's
        ``camera_size``; docs/libero.md).
      horizon: H, actions of a chunk executed before the next plan.
      num_envs: N, parallel lanes.
      episodes: the budget; ``seeds`` default to ``range(episodes)``.
      seeds: one seed per episode; episode i is reset with
        ``jax.random.PRNGKey(seeds[i])``.
      prefetch_lead: L; the chunk that starts at step t was planned at
        ``t - min(L, h)`` (simulated asynchronous inference).
      delay: d steps of inference delay (0 < d < h, chunks of K >= h + d):
        the next chunk is planned when the playing one has d actions left and
        plays its actions ``d .. d+h-1`` once the playing one is exhausted
        (docs/contract.md, "How a chunk is executed"); not with
        ``prefetch_lead``.
      delay_ms: the delay as an inference time in milliseconds instead of
        ``delay``: ``d = ceil(delay_ms / (1000 * dt))`` steps, ``dt`` the
        env's seconds per step (its ``dt``, or ``tau`` for CartPole; a served
        env's server sends it), since the first step at or after the chunk's
        arrival is the first that can play it. An env without a step time
        refuses it; ``result.delay`` holds the steps, ``result.delay_ms``
        the milliseconds.
      execution: None (each plan's chunk replays its first h actions) or a
        ``jaxmesh.Ensemble``: a chunk planned every step and the chunks that
        cover a step averaged (temporal ensembling; continuous actions; not
        with ``horizon``, ``delay`` or ``prefetch_lead``).
      max_episode_steps: a cap on episode length (``truncated`` when hit);
        default: the env's own limit, or 100,000 steps.
      hooks: an object (or list) with any of ``on_run_start(info)``,
        ``on_episode_end(EpisodeResult)``, ``on_run_end(RunResult)``, called on
        the host between segments; episodes arrive in episode order. And
        ``on_step(jaxmesh.StepEvent)``, every executed step in step order (on a
        JAX env a program of its own with a host callback per step: much slower;
        docs/evaluation.md, "Step hooks"; refused with ``devices=``). And
        ``on_fault(info)``: served envs, a server lost and its unfinished
        episodes run again (``on_server_loss``).
      params: policy params passed as a jit argument (new values never
        recompile). With ``params``, a plain function is ``fn(params, obs)`` or
        ``fn(params, obs, key)`` as in ``make_evaluator``; for a Model they
        replace ``model.params`` for this run.
      plan_tile: rows per policy call; None: ``build.default_plan_tile`` (128 //
        h rows, fewer for fewer lanes; see docs/evaluation.md for what it
        promises about invariance).
      segment_steps: env steps per scan segment between host visits.
      max_episode_seconds: a wall-clock cap on an episode, host-stepped envs
        only (a JAX env refuses it: use ``max_episode_steps``).
      token: served envs: the servers' token (default: the ``JAXMESH_TOKEN``
        environment variable).
      credentials: served envs at ``"grpcs://host:port"``: the
        ``grpc.ChannelCredentials`` that check the servers' certificates (e.g.
        ``grpc.ssl_channel_credentials(root_certificates=pem)``); None: gRPC's
        default roots.
      reply_timeout: served envs: seconds a reply may take before the server
        is dropped (``on_server_loss``) or the run fails with
        ``jaxmesh.RemoteConnectionError`` (an env that hangs without dying).
        ``"auto"`` (the default): over several servers, one that owes a reply
        and answers nothing for 10 times the slowest reply of the run (at least
        10 s) is dropped and its episodes run on the others; with one server,
        no limit. None: as long as the env takes (a dead server is detected
        anyway, docs/remote.md).
      lane_groups: served envs: lanes in this many groups, so that the device
        plans for one group while the servers step another; None: the default
        (``jaxmesh.run.served.default_lane_groups``).
      on_server_loss: served envs over several servers: ``"rerun"`` (None,
        the default): a server that dies or stops answering (``reply_timeout``)
        is dropped and the episodes it had not finished run again, from their
        seeds, on the other servers' lanes, so the result is that of a run
        without the loss (``result.server_losses`` and ``on_fault`` hooks say
        what happened); with no server left the run raises. ``"raise"``: the
        first loss ends the run with ``jaxmesh.RemoteConnectionError``
        (finished episodes on ``exc.partial_result``).
      transport: served envs: ``"auto"`` (the default: shared memory with a
        server on this host run by this user, else gRPC), ``"grpc"`` or
        ``"shm"`` (shared memory or an error); see docs/remote.md.
      metrics: env info keys kept per episode (``result.metrics``): a key, a
        list of keys (each its last value), or a dict key -> reduction over the
        episode, one of ``last``, ``sum``, ``max``, ``mean``, ``any``. Sources:
        gymnax's ``info``, brax's ``state.metrics``, gymnasium's ``info``.
      success: the info key that is an episode's success signal; None:
        ``success`` or ``is_success`` when the env's info has one; False: none.
        Per episode the result keeps ``success_once`` (true at any executed
        step), ``success_at_end`` (true at its last step) and
        ``success_at_reset`` (true in the reset's info; None where the reset
        gives no info, as on gymnax).
      success_mode: which of them is the headline, ``result.success`` and
        ``result.success_rate`` (and the summary's and report's): ``"once"``
        (the default, as LIBERO, MetaWorld and ManiSkill count a task
        achieved) or ``"end"`` (stricter); docs/evaluation.md, "Success".
      devices: JAX envs: split the lanes over devices (``placement.DeviceMesh``,
        ``jaxmesh/run/sharded.py``, docs/scale.md). None: one device;
        ``"all"``: every device; an int D: the first D; a list of devices; or
        a one-axis ``jax.sharding.Mesh``.
        ``num_envs`` must be a multiple of the device count; results equal the
        one-device run's episode for episode.
      record: a ``jaxmesh.Record(episodes=[...], keys=None, max_steps=1000)``:
        keep those episodes' observations, actions, rewards and ends step by
        step (``result.trajectories``; ``jaxmesh.render`` makes a video).
        Not with ``devices=``.
      trace: a file path: the run's timeline as Chrome-trace / Perfetto JSON
        (compile, init, segments, host syncs, hooks; per call on host-stepped
        envs: plan, encode, the call and the server's step, decode), written
        when the run ends, also when it fails (``jaxmesh.trace``; open it at
        https://ui.perfetto.dev).
      resume: an earlier ``RunResult`` of this run (an exception's
        ``partial_result``, ``RunResult.from_dict`` of its JSON, or
        ``jaxmesh.load_episode_log(path)``): only the episodes it lacks run, in
        its plan tile, and the result holds the whole budget, each episode as
        an uninterrupted run gives it (``jaxmesh.run.resume``). A result of
        another budget, policy, params, env or settings is refused, naming
        what differs; not with ``record=``.
      check_seeds: host-stepped envs in this process: before the run,
        ``jaxmesh.check_seeds`` on the first lane's env (two resets with seed
        0 and one with seed 1, a few steps each); a ``ValueError`` naming the
        env and what differed when it is not reproducible from its seed
        (docs/evaluation.md, "Envs that ignore their seed"). A served env
        refuses it (check a server before the run: ``jaxmesh check-env
        grpc://host:port``); a JAX env is reproducible by construction (a
        function of ``jax.random.PRNGKey(seed)``), so nothing is checked.
      trial_index_base: host-stepped and served envs that list
        ``"trial_index"`` in ``metadata["reset_options"]``: episode i is reset
        with ``options={"trial_index": trial_index_base + i}`` (CONTRACT 6),
        whatever lane runs it; an env that does not declare it never sees it.
        A JAX env: episode i starts from trial ``trial_index_base + i`` of
        ``initial_states`` or ``reset_fn``; without them a base other than 0
        is refused.
      initial_states: JAX envs: T initial states in the form the env's reset
        returns them, ``(obs, state)`` with a leading axis T on every leaf
        (what ``jax.vmap(env.reset)(keys)`` returns for ``env =
        jaxmesh.make_env(...)``), or a list of T such pairs. Episode i starts
        from entry ``trial_index_base + i``, whatever lane runs it; a budget
        that needs an entry past T is refused (never wrapped). The values are
        data: other states of the same shapes compile nothing.
        docs/evaluation.md, "Initial states".
      reset_fn: JAX envs, instead of ``initial_states``: ``reset_fn(key,
        trial) -> (obs, state)`` of one lane, traced in the compiled program;
        episode i's reset is ``reset_fn(PRNGKey(seeds[i]), trial_index_base +
        i)`` (``trial`` an int32 scalar). Its output must have the env
        reset's structure, shapes and dtypes (checked by shape first).
      instruction: the language instruction of every episode, for a policy
        with a ``jaxmesh.adapt.Text`` input: encoded once on the host by the
        Text's ``encode``; the encoding is data, so another string of the same
        shapes compiles nothing. Without it, on a gymnasium or served env, a
        ``Text(info_key=...)`` reads each episode's instruction from its reset
        info; a JAX env needs it (docs/models.md, "Language instructions").
      randomize: MuJoCo Playground envs: ``fn(mjx_model, key) -> mjx_model``,
        domain randomization drawn at every reset from the episode's own key,
        ``fold_in(PRNGKey(seed), jaxmesh.envs.playground.RANDOMIZE_STREAM)``,
        inside the compiled program (the fields it replaces are held per
        lane), so episode i's physics depends on its seed only. The drawn
        values are info keys ``"model/<field>/<index>"`` for ``metrics=``.
        Another env refuses it (TypeError).

    Returns:
      A ``RunResult``.

    Raises:
      ValueError, TypeError: bad input, before anything compiles.
      jaxmesh.BadValueError: a discrete action out of range, a NaN action or a
        NaN reward, after the segment that met it.

    Example::

      result = jaxmesh.evaluate(policy_fn, "gymnax:CartPole-v1", episodes=100)
    """
    path = check_trace_path(trace)
    if path is not None:
        args = {k: v for k, v in locals().items() if k not in ("trace", "path")}
        with tracing(path, _trace_settings(args)):
            return evaluate(**args)
    settings = checks.check_settings(
        num_envs,
        horizon,
        prefetch_lead,
        max_episode_steps,
        plan_tile,
        segment_steps,
        delay,
        execution,
        delay_ms,
    )
    success_mode = checks.check_success_mode(success_mode)
    if not isinstance(check_seeds, bool):
        raise TypeError(f"check_seeds={check_seeds!r}: expected True or False")
    instruction = instructions.check_instruction(instruction)
    trial_index_base = checks.check_int(
        "trial_index_base", trial_index_base, 0, TRIAL_HINT
    )
    # The one place that chooses the backend; the served-only options are
    # checked here once, for every kind of env.
    kind = backend.backend_of(env)
    served = backend.check_served_options(
        backend.ServedOptions(
            token, credentials, reply_timeout, lane_groups, on_server_loss, transport
        ),
        kind,
        env,
    )
    from jaxmesh.run import host

    workers = host.check_workers(workers)
    if workers and kind != backend.HOST:
        raise ValueError(
            f"workers={workers}: worker processes step a gymnasium env's lanes "
            f"('gymnasium:<id>' or an env factory); env {env!r} is "
            + (
                "served: start its server with `jaxmesh serve-env ... --workers N`"
                if kind == backend.SERVED
                else "a JAX env, stepped inside the jitted loop: drop workers="
            )
        )
    if kind != backend.SCAN:
        if randomize is not None:
            raise TypeError(playground.not_playground(env))
        if devices is not None:
            raise ValueError(
                f"devices={devices!r}: lanes are split over devices for JAX envs "
                f"only; env {env!r} is stepped by the host, so drop devices="
            )
        initial.refuse_host(initial_states, reset_fn, env)
        return host.evaluate(
            policy,
            env,
            settings,
            episodes=episodes,
            seeds=seeds,
            hooks=hooks,
            params=params,
            max_episode_seconds=max_episode_seconds,
            served=served,
            metrics=metrics,
            success=success,
            record=record,
            check_seeds=check_seeds,
            trial_index_base=trial_index_base,
            success_mode=success_mode,
            instruction=instruction,
            workers=workers,
        )
    if max_episode_seconds is not None:
        raise ValueError(
            f"max_episode_seconds={max_episode_seconds!r}: a wall-clock cap applies "
            "to host-stepped (gymnasium) envs only; a JAX env's episodes run inside "
            "one compiled program, so cap them with max_episode_steps instead"
        )
    with_params = params is not None
    pol = resolve_policy(policy, with_params=with_params)
    asked = checks.check_metrics(metrics, success)
    mesh = resolve_mesh(devices)
    key = (id(policy), _env_key(env), settings, with_params, str(pol.device), asked)
    record = check_record(record)
    if mesh is not None:
        placement.refuse_mesh_record(devices, record)
    trials = initial.resolve(initial_states, reset_fn)
    states = None if trials is None else trials.states
    # The recorded episodes and the initial states' values are data: runs that
    # record as many, from states of the same shapes, share a program.
    key += (mesh, None if record is None else record_shape(record), randomize)
    key += (None if trials is None else trials.key,)
    ev = _EVALUATORS.get(key)
    if ev is None:
        ev = Evaluator(
            policy,
            env,
            takes_params=with_params,
            horizon=horizon,
            num_envs=num_envs,
            prefetch_lead=prefetch_lead,
            max_episode_steps=max_episode_steps,
            plan_tile=plan_tile,
            segment_steps=segment_steps,
            metrics=metrics,
            success=success,
            devices=mesh,
            record=record,
            initial_states=states,
            reset_fn=reset_fn,
            delay=delay,
            execution=execution,
            randomize=randomize,
            delay_ms=delay_ms,
        )
        _EVALUATORS[key] = ev
        while len(_EVALUATORS) > CACHE_SIZE:
            _EVALUATORS.popitem(last=False)
    _EVALUATORS.move_to_end(key)
    return ev.run(
        episodes=episodes,
        seeds=seeds,
        params=params,
        hooks=hooks,
        record=record,
        trial_index_base=trial_index_base,
        initial_states=states,
        success_mode=success_mode,
        instruction=instruction,
    )


def record_shape(record: Any) -> tuple:
    """What of a ``Record`` the compiled program depends on."""
    return (len(record.episodes), record.max_steps, record.keys, record.states)
