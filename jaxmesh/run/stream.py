"""What both drivers (``jaxmesh.run.scan``, ``jaxmesh.run.host``) share: hooks,
episodes streamed in order, and a failure's finished episodes on
``exc.partial_result`` (CONTRACT 16, 20).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxmesh.core import tally as core_results
from jaxmesh.errors import BadValueError, HostPolicyError, callback_error
from jaxmesh.results.result import RunResult, StepEvent, episode_at
from jaxmesh.trace import span

#: ``on_task_end``: suites only (jaxmesh.suite), with (task name, RunResult).
HOOK_NAMES = ("on_run_start", "on_episode_end", "on_run_end", "on_step", "on_fault")
HOOK_NAMES += ("on_task_end",)


def drive(
    episodes_out: EpisodeStream,
    t_start: float,
    compile_program: Callable[[], float],
    loop: Callable[[], Any],
) -> RunResult:
    """Compiles (``compile_program`` returns its seconds), runs ``loop`` (which
    returns the host ``Results``) and reports; what it raises carries the
    finished episodes, and a host callback's error is raised as itself."""
    timing = {"wall_time": 0.0, "compile_time": 0.0, "run_time": 0.0}
    try:
        with span("compile", "run"):
            timing["compile_time"] = compile_program()
        t_run = time.perf_counter()
        res = loop()
        timing["run_time"] = time.perf_counter() - t_run
        timing["wall_time"] = time.perf_counter() - t_start
        result = episodes_out.result(res, timing)
        call(episodes_out.hooks, "on_run_end", result)
    except BaseException as exc:
        timing["wall_time"] = time.perf_counter() - t_start
        own = callback_error(exc)
        if isinstance(own, HostPolicyError):  # it names its episodes' seeds
            own = own.named(episodes_out.seeds)
        episodes_out.fail(own, timing)
        if own is exc:
            raise
        raise own from own.__cause__  # the callback's own error, not JAX's
    return result


def run_fields(settings: Any, *, metrics: dict, **fields: Any) -> dict:
    """A run's ``RunResult`` fields beside its episodes and totals: the
    settings', the ``metrics`` fields, and ``fields`` (its sizes, names and
    identity, and a backend's own)."""
    execution = settings.execution
    return {
        "horizon": settings.horizon,
        "prefetch_lead": settings.prefetch_lead,
        "delay": settings.delay,
        "delay_ms": settings.delay_ms,
        "execution": None if execution is None else execution.describe(),
        **metrics,
        **fields,
    }


def hooks_list(hooks: Any) -> list:
    """``hooks`` (None, one object, or a list) as a list, each checked."""
    if hooks is None:
        return []
    out = list(hooks) if isinstance(hooks, list | tuple) else [hooks]
    for h in out:
        if not any(callable(getattr(h, name, None)) for name in HOOK_NAMES):
            raise TypeError(
                f"hooks: {h!r} has none of the methods {list(HOOK_NAMES)}; pass an "
                "object that defines at least one of them"
            )
    return out


def call(hooks: list, name: str, *args: Any) -> None:
    for h in hooks:
        fn = getattr(h, name, None)
        if fn is not None:
            fn(*args)


def chunk_position(
    t: np.ndarray, horizon: int, lead: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per step index ``t`` in its episode: whether its action starts a chunk
    (CONTRACT 10), and the chunk's lag, 0 for the first chunk (CONTRACT 12)."""
    t = np.asarray(t)
    planned = t % horizon == 0
    stale = np.where((t < horizon) | (lead == 0), 0, lead)
    return planned, stale


class StepStream:
    """Hands executed steps to the ``on_step`` hooks as ``StepEvent``s, lanes
    in ascending order; the first exception a hook raises stops the events and
    is kept in ``error`` for the driver to raise (``raise_error``)."""

    def __init__(self, hooks: list, horizon: int, lead: int):
        self.fns = [h.on_step for h in hooks if callable(getattr(h, "on_step", None))]
        self.horizon, self.lead = horizon, lead
        self.error: BaseException | None = None

    def __bool__(self) -> bool:
        return bool(self.fns)

    def emit(
        self,
        lanes: Any,
        episodes: Any,
        t: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
    ) -> bool:
        """One event per lane (aligned arrays); False once a hook has raised."""
        if self.error is not None:
            return False
        t = np.asarray(t)
        planned, stale = chunk_position(t, self.horizon, self.lead)
        actions = np.asarray(actions)
        rewards = np.asarray(rewards, np.float32)
        columns = (lanes, episodes, t, rewards, terminated, truncated, planned, stale)
        rows = zip(*(np.asarray(c).tolist() for c in columns), strict=True)
        try:
            for q, (j, i, k, r, te, tr, p, st) in enumerate(rows):
                event = StepEvent(j, i, k, actions[q], r, te, tr, p, st)
                for fn in self.fns:
                    fn(event)
        except BaseException as exc:  # raised again by the driver, after the step
            self.error = exc
            return False
        return True

    def emit_masked(self, stepped: np.ndarray, *values: np.ndarray) -> bool:
        """``emit`` for the lanes in ``stepped`` of per-lane arrays (the scan's)."""
        js = np.flatnonzero(stepped)
        if not js.size:
            return self.error is None
        return self.emit(js, *(v[js] for v in values))

    def raise_error(self) -> None:
        if self.error is not None:
            exc, self.error = self.error, None
            raise exc


class StepSink:
    """Where a compiled program's step events go (``Engine``'s ``on_step``):
    the run that ``listen``s points it at its ``StepStream`` while it runs."""

    def __init__(self):
        self.stream: StepStream | None = None

    def __call__(self, stepped: np.ndarray, *values: np.ndarray) -> bool:
        stream = self.stream
        if stream is None:  # no run listens (never the case under Evaluator)
            return True
        return stream.emit_masked(stepped, *values)

    @contextlib.contextmanager
    def listen(self, stream: StepStream | None):
        self.stream = stream if stream else None
        try:
            yield
        finally:
            self.stream = None


class EpisodeStream:
    """Hands finished episodes to ``on_episode_end`` hooks (and a Model's own)
    in episode order; ``run_fields``: ``RunResult``'s fields but the totals."""

    def __init__(
        self,
        hooks: list,
        seeds: np.ndarray,
        on_episode_end: Callable[[int], None] | None,
        run_fields: dict,
    ):
        self.hooks, self.seeds, self.run_fields = hooks, seeds, run_fields
        self.policy_hook = on_episode_end
        self.cursor = 0
        #: The newest ``Results``; on a failure the finished episodes are read from it.
        self.latest: Any = None
        self.wants_episodes = on_episode_end is not None or any(
            hasattr(h, "on_episode_end") for h in hooks
        )
        #: The run's ``on_step`` deliveries (a host loop sets it).
        self.steps = StepStream([], 1, 0)

    def update(self, res: Any) -> None:
        """Takes the newest host ``Results``; reports what finished."""
        self.latest = res
        done = np.asarray(res.done)
        e = self.seeds.size
        while self.cursor < e and done[self.cursor]:
            i = self.cursor
            self.cursor += 1
            if self.hooks:
                mode = self.run_fields.get("success_mode")
                ep = episode_at(res, i, i, self.seeds[i], mode)
                call(self.hooks, "on_episode_end", ep)
            if self.policy_hook is not None:
                self.policy_hook(i)

    def result(self, res: Any, timing: dict, keep: Any = None) -> RunResult:
        return RunResult.from_results(
            res, self.seeds, keep, **self.run_fields, **timing
        )

    def fail(self, exc: BaseException, timing: dict) -> None:
        """Puts the finished episodes of the newest results on
        ``exc.partial_result`` (None if none were read), with a note."""
        with contextlib.suppress(Exception):  # the results may be unusable
            partial = None
            if self.latest is not None:
                res = jax.device_get(self.latest)
                partial = self.result(res, timing, np.asarray(res.done))
            exc.partial_result = partial  # type: ignore[attr-defined]
            n = 0 if partial is None else partial.num_episodes
            exc.add_note(
                f"jaxmesh: {n} of {self.seeds.size} episodes had finished; they are "
                "on this exception's .partial_result (a RunResult; .indices names "
                "them)"
            )

    def check_fault(self, res: Any) -> None:
        """Raises ``BadValueError`` if the device flagged a bad value."""
        fault = res.fault.first()
        if fault is None:
            return
        kind, episode, value = fault["kind"], fault["episode"], fault["value"]
        seed = int(self.seeds[episode])
        fix = {
            core_results.ACTION_OUT_OF_RANGE: "return actions in [0, num_actions)",
            core_results.ACTION_NOT_FINITE: "check the policy's output for NaN/inf",
            core_results.REWARD_NOT_FINITE: "check the env (its state may have "
            "diverged under this action)",
        }[kind]
        raise BadValueError(
            f"{core_results.FAULT_NAMES[kind]}: {value!r} at episode {episode} "
            f"(seed {seed}), step {fault['step']}, lane {fault['lane']}; the run "
            f"stopped there. {fix}",
            seed=seed,
            **{k: fault[k] for k in ("episode", "step", "lane", "value", "kind")},
        )
