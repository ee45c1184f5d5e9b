"""An ``Evaluator`` runs the budget in scan segments from one host loop; ``run``
keeps a few (``cache_info()``): the same policy, env and settings compile once."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmesh.core import tally as core_results
from jaxmesh.core.engine import with_step_events
from jaxmesh.core.policy import resolve_policy
from jaxmesh.core.tally import empty, log_capacity
from jaxmesh.devices import resolve_mesh
from jaxmesh.envs import make_env, playground
from jaxmesh.envs.timing import step_seconds
from jaxmesh.results.record import check_record, check_record_budget
from jaxmesh.results.result import RunResult
from jaxmesh.run import build, checks, host, identity, initial, instructions, stream
from jaxmesh.run.config import RunConfig, from_keywords
from jaxmesh.run.kept import Kept
from jaxmesh.run.plan import RunPlan, plan_run
from jaxmesh.run.scan import placement
from jaxmesh.trace import span


class _RunData(NamedTuple):
    """One run's own checked values."""

    record: Any
    trials: Any  # ``(trial_of, data)``, or None
    texts: Any
    steps: stream.StepStream
    episodes: stream.EpisodeStream


@dataclasses.dataclass
class _Program:
    engine: Any
    plan: RunPlan  # the sizes the engine was built with
    segment: Any = None  # the compiled segment executable


class Evaluator:
    """A policy, an env and settings, with the programs compiled for them:
    every budget, and new params of the same shapes, reuse the program.

    Args:
      policy, env: as for ``jaxmesh.evaluate``.
      config: a ``jaxmesh.RunConfig`` (None: the defaults).
      takes_params: a plain function policy is ``fn(params, obs[, key])``
        (``evaluate(..., params=...)``) rather than ``fn(obs[, key])``.
      record: as for ``jaxmesh.evaluate``; ``run`` may name other episodes,
        as many.
      **settings: ``RunConfig``'s flat knobs and groups, overriding
        ``config``'s (``num_envs=64``, ``chunking=jaxmesh.Chunking(...)``).

    Raises:
      ValueError, TypeError: bad settings, env or policy (nothing compiles).

    Example::

      ev = jaxmesh.Evaluator(policy_fn, "gymnax:CartPole-v1", num_envs=64)
      a = ev.run(episodes=100)
      b = ev.run(episodes=300)  # same program: no compile
    """

    def __init__(
        self,
        policy: Any,
        env: Any,
        config: RunConfig | None = None,
        *,
        takes_params: bool = False,
        record: Any = None,
        _checked: tuple | None = None,
        **settings: Any,
    ):
        # _checked: what run checked, (policy, record, trials, mesh).
        self.config = config = from_keywords(config, settings, "jaxmesh.Evaluator")
        starts, randomize = config.starts, config.starts.randomize
        pol, self.record, self.trials, devices = _checked or (
            None,  # the policy, resolved after the env
            check_record(record),
            initial.resolve(starts.initial_states, starts.reset_fn),
            config.layout.devices,
        )
        self.env = make_env(env)
        if randomize is not None:
            self.env = playground.randomized(self.env, randomize)
        self.env_name = getattr(self.env, "name", type(self.env).__name__)
        self.settings = checks.resolve_delay_ms(
            config.settings, step_seconds(self.env), self.env_name
        )
        self.policy = pol or resolve_policy(policy, with_params=takes_params)
        self.takes_params = takes_params
        self._source = (policy, env, randomize)  # keeps the keyed objects alive
        self.metrics = build.engine_metrics(self.env, config.scoring.asked)
        build.check_record_keys(self.env, self.record)
        self._trial_reset = self.trials and self.trials.engine_reset(self.env)
        self.placement = placement.placement_for(
            devices, self.settings.num_envs, self.policy, self.record
        )
        self._sink = stream.StepSink()  # where step events go
        self._chunks: dict = {}  # params signature -> chunk length K
        self._programs: dict = {}  # (params signature, capacity) -> _Program
        #: The current run's env built from its seeds (an EnvPool pool).
        self._bound: Any = None

    @property
    def device(self) -> Any:
        """The device the policy asked for (None: JAX's default)."""
        return self.policy.device

    def programs(self) -> list[tuple]:
        """The (params signature, capacity[, "on_step"]) of each compiled program."""
        return [k for k, p in self._programs.items() if p.segment is not None]

    def plan(self, params: Any, episodes: int) -> RunPlan:
        """The sizes a run of ``episodes`` with these params is built with."""
        s, sig = self.settings, build.signature(params)
        if sig not in self._chunks:  # the probe runs once per params signature
            self._chunks[sig] = build.run_chunk(self.policy, self.env, params, s)
        lanes = self.placement.lanes_per_device
        return plan_run(s, self._chunks[sig], capacity=log_capacity(lanes), lanes=lanes)

    def _program(
        self, params: Any, plan: RunPlan, steps: bool = False, compile: bool = False
    ) -> _Program:
        """The program for these params' shapes and this plan, ``steps`` events."""
        key = (build.signature(params), plan.capacity) + (("on_step",) if steps else ())
        if key not in self._programs:
            engine = build.build_engine(
                self.policy,
                self.env if self._bound is None else self._bound,
                plan,
                self.settings,
                self.metrics,
                self.record,
                self._trial_reset,
            )
            if steps:
                engine = with_step_events(engine, self._sink)
            self._programs[key] = _Program(engine, plan)
        program = self._programs[key]
        if compile and program.segment is None:
            program.segment = self.placement.compile(
                program.engine, params, self.settings.segment_steps
            )
        return program

    def run(
        self,
        *,
        episodes: int | None = None,
        seeds: Sequence[int] | None = None,
        params: Any = None,
        hooks: Any = None,
        record: Any = None,
        trial_index_base: int | None = None,
        initial_states: Any = None,
        success_mode: str | None = None,
        instruction: str | None = None,
        _checked: bool = False,  # the config's values, checked by run
    ) -> RunResult:
        """Scores a budget; see ``jaxmesh.evaluate`` for the arguments. Those
        that are data (None: the evaluator's own) run the same program.

        Raises:
          ValueError, TypeError: bad input, before anything compiles.
          jaxmesh.BadValueError: a bad action or reward met while running.
          Any exception from a hook, with the finished episodes on
          ``exc.partial_result``.
        """
        t_start, starts = time.perf_counter(), self.config.starts
        if not _checked:
            record = check_record(record)
            if trial_index_base is None:
                trial_index_base = starts.trial_index_base
            trial_index_base = checks.check_trial_index_base(trial_index_base)
            if success_mode is None:
                success_mode = self.config.scoring.success_mode
            success_mode = checks.check_success_mode(success_mode)
            if instruction is None:
                instruction = starts.instruction
            instruction = instructions.check_instruction(instruction)
        pol, s, (named, success_key) = self.policy, self.settings, self.metrics
        seeds_arr = checks.resolve_budget(episodes, seeds, self.device)
        e = int(seeds_arr.size)
        hook_list = stream.hooks_list(hooks)
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
        check_record_budget(record, e)
        trials = initial.run_trials(self.trials, initial_states, trial_index_base, e)
        if self.takes_params and params is None:
            raise TypeError(
                "this Evaluator was built with takes_params=True: pass params="
            )
        params = pol.default_params() if params is None else pol.place(params)
        # Encoded before the probe: the program is built for their shapes.
        encoded = instructions.check_sources(
            pol.spec, instruction, self.env_name, False
        )
        plan = self.plan(params, e)
        texts = {k: instructions.lanes_of(v, plan.lanes) for k, v in encoded.items()}
        if e and callable(getattr(self.env, "bind", None)):
            self._bind(seeds_arr[: self.env.pool_episodes], plan.lanes)
        # What resume= compares: the env's, policy's and params' digests.
        told = build.told_horizon(pol, s)
        run_fields = stream.run_fields(
            s,
            num_envs=s.num_envs,
            effective_horizon=plan.h,
            chunk=plan.chunk,
            plan_tile=plan.tile,
            policy=pol.name,
            env=self.env_name,
            metrics={"metric_reductions": dict(named), "success_key": success_key},
            trial_index_base=trial_index_base,
            instruction=instruction,
            success_mode=success_mode,
            fingerprint=identity.run_identity(
                identity.env_digest(self.env),
                build.policy_digest(pol, self.env, params, s.horizon, told),
            ),
        )
        steps = stream.StepStream(hook_list, plan.h, plan.lead)
        if steps and not self.placement.supports_step_hooks:
            raise ValueError(
                "hooks: an on_step hook with devices= (lanes split over a mesh): "
                "step events are sent from one device's program; drop devices= "
                "for a run with on_step hooks, or keep on_episode_end only"
            )
        # Every check runs before a hook hears of the run.
        program = self._program(params, plan, bool(steps)) if e else None
        stream.call(hook_list, "on_run_start", {"episodes": e, **run_fields})
        episodes_out = stream.EpisodeStream(
            hook_list, seeds_arr, pol.on_episode_end, run_fields
        )
        run = _RunData(record, trials, texts, steps, episodes_out)

        def compile_program() -> float:
            nonlocal program
            if program is None:
                return 0.0
            t0, fresh = time.perf_counter(), program.segment is None
            program = self._program(params, plan, bool(steps), compile=True)
            return time.perf_counter() - t0 if fresh else 0.0

        def loop() -> Any:
            if program is None:
                return empty(0, 0, np, metrics=named, success=success_key is not None)
            with self._sink.listen(steps):
                return self._loop(program, params, seeds_arr, run)

        return stream.drive(episodes_out, t_start, compile_program, loop)

    def _bind(self, seeds: np.ndarray, lanes: int) -> None:
        """Builds the run's env (an EnvPool pool) from its seeds."""
        if isinstance(self.placement, placement.DeviceMesh):
            raise ValueError(
                f"{self.env.name} with devices=: its pool runs on the host's CPU "
                "threads, one batch for all lanes; drop devices="
            )
        device = self.device or jax.devices()[0]
        if device.platform != "cpu":
            raise ValueError(
                f"{self.env.name} with the policy on {device}: EnvPool's XLA calls "
                "run on the CPU only; put the policy there (jaxmesh.Model(fn, "
                "device='cpu')) or run with JAX_PLATFORMS=cpu"
            )
        if self._trial_reset is not None:
            raise ValueError(
                f"{self.env.name}: initial_states= / reset_fn=: an EnvPool env "
                "starts each episode from its own seeded env; drop them"
            )
        self._programs.clear()
        self._bound = None  # the last pool is freed before the next is built
        self._bound = self.env.bind(seeds, lanes)

    def _loop(self, program: _Program, params, seeds_arr, run: _RunData) -> Any:
        """Runs segments until the budget is done; returns the host ``Results``."""
        place, plan = self.placement, program.plan
        place.check_same_everywhere(seeds_arr, params)
        e = seeds_arr.size
        book = None
        steps = program.engine.config.step_events
        # One piece, but for a pool bound per run: ``pool_episodes`` each.
        size = e if self._bound is None else max(1, self.env.pool_episodes)
        pieces = [(a, min(a + size, e)) for a in range(0, max(e, 1), size)]
        recorded = None  # the recorded episodes of the pieces run so far
        for a, b in pieces:
            if a:  # the next piece's pool, and the program that calls it
                self._bind(seeds_arr[a:b], plan.lanes)
                program = self._program(params, plan, steps, compile=True)
            state, book = self._run_piece(
                program, params, seeds_arr[a:b], a, e, book, run
            )
            if run.record is not None and len(pieces) > 1:
                recorded = _merge_recording(
                    recorded, book.recording, run.record.episodes, a, b
                )
                book = book.replace(recording=recorded)
        book = jax.device_get(book)
        if self._bound is None:
            place.keep(program.engine, state)
        else:  # a pool serves one run (its envs are spent): free it now
            self._programs.clear()
            self._bound = None
        return book

    def _run_piece(self, program, params, seeds, offset, e, book, run) -> tuple:
        """Runs ``seeds`` (from ``offset``) into ``book``; returns (state, book)."""
        place, plan, rec = self.placement, program.plan, run.record
        if rec is not None:  # the piece's recorded episodes (-1: another piece's)
            local = np.asarray(rec.episodes, np.int32) - offset
            rec = np.where((local >= 0) & (local < seeds.size), local, -1)
        with span("init", "run"):  # a piece's first carry, and the params
            state, res = place.first_carry(
                program.engine, seeds, rec, run.trials, run.texts
            )
            params = place.put_params(params)
        before = (0, 0) if book is None else (book.env_steps, book.policy_rows)
        base = 0  # the first carry's window starts at episode 0
        for k in itertools.count():
            # From the dispatch to the sync that reads the log.
            with span("segment", "run", index=k):
                state, res = program.segment(params, state, res)
                log, n_done, next_episode = place.drain(state, res, plan)
            if offset:  # a later piece: its episodes' indices in the budget
                log = _shifted(log, offset, before)
            with span("host sync", "run"):
                book = core_results.write(
                    core_results.book(log, e) if book is None else book, log
                )
            # What a failure from here on keeps (results are never donated).
            run.episodes.latest = book
            run.steps.raise_error()  # an on_step hook raised: it ends
            finished = n_done >= seeds.size
            if run.episodes.wants_episodes or finished or np.any(book.fault.kind):
                with span("hooks", "run"):
                    run.episodes.update(book)
                run.episodes.check_fault(book)
                if finished:
                    return state, book
            state, base = place.put_window(
                program.engine, state, base, seeds, next_episode, run.trials
            )


def _merge_recording(kept: Any, piece: Any, episodes: Any, a: int, b: int) -> Any:
    """The host recording ``kept`` so far with piece ``[a, b)``'s slots."""
    piece = jax.device_get(piece)
    if kept is None:
        kept = jax.tree.map(np.array, piece)
    episodes = np.asarray(episodes, np.int32)
    mine = (episodes >= a) & (episodes < b)
    for k, p in zip(jax.tree.leaves(kept), jax.tree.leaves(piece), strict=True):
        k[mine] = np.asarray(p)[mine]
    return kept.replace(episodes=episodes)


def _shifted(log: Any, offset: int, before: tuple) -> Any:
    """A later piece's host log as the budget's (earlier totals ``before``)."""
    fault = log.fault.replace(episode=np.asarray(log.fault.episode) + offset)
    rec = log.recording
    if rec is not None:
        local = np.asarray(rec.episodes)
        rec = rec.replace(episodes=np.where(local >= 0, local + offset, -1))
    return log.replace(
        index=np.asarray(log.index) + offset,
        env_steps=np.asarray(log.env_steps) + before[0],
        policy_rows=np.asarray(log.policy_rows) + before[1],
        fault=fault,
        recording=rec,
    )


_EVALUATORS = Kept()


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
        for ev in _EVALUATORS
    ]


def clear_cache() -> None:
    """Drops every evaluator and host agent ``evaluate`` keeps."""
    _EVALUATORS.clear()
    host.clear_agents()


def run(
    policy: Any,
    env: Any,
    config: RunConfig,
    *,
    episodes: int | None,
    seeds: Sequence[int] | None,
    params: Any,
    hooks: Any,
    record: Any,
) -> RunResult:
    """A JAX env's run, on a kept ``Evaluator`` (``cache_info``) or a new one."""
    with_params = params is not None
    pol = resolve_policy(policy, with_params=with_params)
    scoring, starts, devices = config.scoring, config.starts, config.layout.devices
    mesh = resolve_mesh(devices)
    record = check_record(record)
    placement.refuse_mesh_record(devices, mesh, record)
    trials = initial.resolve(starts.initial_states, starts.reset_fn)
    key = (id(policy), _env_key(env), config.settings, with_params, str(pol.device))
    # Recorded episodes and initial states are data: same shapes, one program.
    key += (scoring.asked, mesh, starts.randomize)
    key += (None if record is None else record_shape(record),)
    key += (None if trials is None else trials.key,)
    checked = (pol, record, trials, mesh)
    ev = _EVALUATORS.get(
        key,
        lambda: Evaluator(
            policy, env, config, takes_params=with_params, _checked=checked
        ),
    )
    return ev.run(
        episodes=episodes,
        seeds=seeds,
        params=params,
        hooks=hooks,
        record=record,
        trial_index_base=starts.trial_index_base,
        # Given states go as resolved: a kept evaluator may hold other values.
        initial_states=None if trials is None or trials.states is None else trials,
        success_mode=scoring.success_mode,
        instruction=starts.instruction,
        _checked=True,
    )


def record_shape(record: Any) -> tuple:
    """What of a ``Record`` the compiled program depends on."""
    return (len(record.episodes), record.max_steps, record.keys, record.states)
