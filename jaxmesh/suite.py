"""Task suites: ``jaxmesh.evaluate(policy, suite)`` runs each ``Task`` as its
own run (same-shaped gymnax tasks together) and returns a ``SuiteResult``
(docs/suites.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import time
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmesh.envs import make_env
from jaxmesh.envs.gymnax import GymnaxEnv, task_batch
from jaxmesh.results import report as _report
from jaxmesh.results import stats as _stats
from jaxmesh.results import summary as _summary
from jaxmesh.results.result import RunResult, flag_rate, frozen, select
from jaxmesh.run import checks, stream
from jaxmesh.run.config import RunConfig

__all__ = [
    "Suite",
    "SuitePlan",
    "SuiteComparison",
    "SuiteResult",
    "Task",
    "TaskRun",
    "compare",
    "make_suite",
]


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of a suite.

    Attributes:
      env: what ``jaxmesh.evaluate`` takes as ``env``, or a function of no
        arguments returning one, called when the task starts.
      instruction: the language instruction the policy is given for this task
        (``Starts(instruction=...)``); None: none, or the env's own.
      episodes: this task's budget (seeds ``0..episodes-1``); None: the suite's.
      seeds: this task's seeds, one per episode; overrides ``episodes``.
      trial_index_base: this task's ``trial_index_base``; None: the run's.
    """

    env: Any
    instruction: str | None = None
    episodes: int | None = None
    seeds: Sequence[int] | None = None
    trial_index_base: int | None = None

    def __post_init__(self):
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise TypeError(
                f"Task(instruction={self.instruction!r}): expected a string (the "
                "instruction the policy reads) or None"
            )
        if self.episodes is not None:
            hint = "a Task's (or Suite's) budget, or None for the suite's"
            checks.check_int("episodes", self.episodes, 1, hint)
        if self.seeds is not None:
            object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
            if not self.seeds:
                raise ValueError("Task(seeds=()): expected one seed per episode")
            if self.episodes is not None and self.episodes != len(self.seeds):
                raise ValueError(
                    f"episodes={self.episodes} disagrees with len(seeds)="
                    f"{len(self.seeds)}; give one of them, or make them agree"
                )


class Suite:
    """Named tasks scored together (``jaxmesh.evaluate(policy, suite)``;
    docs/suites.md).

    Args:
      tasks: task name -> ``Task`` (or just an env), in the order they run.
      episodes, seeds: the budget of every task that sets none; None:
        ``evaluate``'s.
      together: run tasks that are one gymnax env with other params of the
        same shapes in one compiled program, the task as data
        (``jaxmesh.envs.gymnax.GymnaxTasks``), each task scoring as its own run
        would. False: every task compiles its own.

    Raises:
      ValueError, TypeError: no tasks, a name that is not a non-empty string,
        or a bad budget.
    """

    def __init__(
        self,
        tasks: Mapping[str, Task | Any],
        *,
        episodes: int | None = None,
        seeds: Sequence[int] | None = None,
        together: bool = True,
    ):
        if not isinstance(together, bool):
            raise TypeError(f"Suite(together={together!r}): expected True or False")
        self.together = together
        if not isinstance(tasks, Mapping) or not tasks:
            raise ValueError(
                f"Suite(tasks={tasks!r}): expected a non-empty mapping of task "
                "name -> jaxmesh.Task (or env)"
            )
        self.tasks: dict[str, Task] = {}
        for name, task in tasks.items():
            if not isinstance(name, str) or not name:
                raise TypeError(
                    f"Suite task name {name!r}: expected a non-empty string"
                )
            self.tasks[name] = task if isinstance(task, Task) else Task(task)
        default = Task(None, episodes=episodes, seeds=seeds)  # checks the budget
        self.episodes, self.seeds = default.episodes, default.seeds

    def __len__(self) -> int:
        return len(self.tasks)

    def __repr__(self) -> str:
        return f"Suite({list(self.tasks)}, episodes={self.episodes!r})"

    def budget(self, name: str, episodes: Any, seeds: Any) -> dict[str, Any]:
        """Task ``name``'s budget: its own, the suite's or the run's."""
        task = self.tasks[name]
        for s, e in ((task.seeds, task.episodes), (self.seeds, self.episodes)):
            if s is not None:
                return {"episodes": None, "seeds": list(s)}
            if e is not None:
                return {"episodes": e, "seeds": None}
        return {"episodes": episodes, "seeds": seeds}


#: Suite ids ``make_suite`` knows: prefix -> the module that builds them.
_SUITE_PREFIXES = {"libero": "jaxmesh.envs.libero"}


def make_suite(
    name: str, tasks: Any = None, episodes: int | None = 50, **options: Any
) -> Suite:
    """A benchmark's suite by id: ``make_suite("libero:libero_spatial")``.

    Args:
      name: ``"libero:<suite>"`` with a suite of ``jaxmesh.envs.libero.SUITES``.
      tasks: the task indices to run (the benchmark's order); None: all.
      episodes: every task's budget; None: ``evaluate``'s.
      **options: every task's env options, as ``jaxmesh.make_env`` takes them.

    Returns:
      A ``Suite`` of the benchmark's tasks and instructions (docs/libero.md).

    Raises:
      ValueError: an unknown prefix, suite or task index (naming the valid
        ones); TypeError: a bad option.
    """
    prefix, sep, rest = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not sep or prefix not in _SUITE_PREFIXES or not rest:
        raise ValueError(
            f"make_suite({name!r}): expected 'PREFIX:SUITE' with PREFIX one of "
            f"{list(_SUITE_PREFIXES)}, e.g. 'libero:libero_spatial'"
        )
    module = importlib.import_module(_SUITE_PREFIXES[prefix])
    members = module.suite_members(rest, tasks=tasks, **options)
    return Suite(
        {name: Task(env, instruction=text) for name, env, text in members},
        episodes=episodes,
    )


@dataclasses.dataclass
class TaskRun:
    """One run of a suite's plan: one task, or several same-shaped gymnax
    tasks in one program (``names``), with its config and ``evaluate``
    arguments (``call``); ``env()`` makes its env."""

    names: list[str]
    config: RunConfig
    call: dict[str, Any]
    task: Task | None = None  # a task run alone
    batch: Any = None  # several tasks: their GymnaxTasks
    envs: list | None = None  # several tasks: each task's GymnaxEnv

    def env(self) -> Any:
        """Its env; a task's factory is called now (not a ``partial`` of an env
        class, as ``make_env("libero:...")`` returns: a per-lane source)."""
        if self.task is None:
            return self.batch
        env = self.task.env
        if isinstance(env, functools.partial) and isinstance(env.func, type):
            return env
        if callable(env) and not hasattr(env, "reset") and not isinstance(env, type):
            return env()
        return env


class SuitePlan:
    """``evaluate(policy, suite, ...)`` as ``runs`` (``TaskRun``), made one by
    one by ``run``; every budget and ``resume=`` is checked first
    (docs/suites.md)."""

    def __init__(self, suite: Suite, config: RunConfig, call: dict[str, Any]):
        call = dict(call)
        resume = call.pop("resume", None)
        if resume is not None:
            if not isinstance(resume, SuiteResult):
                raise TypeError(
                    f"resume={type(resume).__name__}: a suite resumes from the "
                    "SuiteResult of an earlier run of the same suite (or an "
                    "exception's partial_result)"
                )
            extra = sorted(set(resume.tasks) - set(suite.tasks))
            if extra:
                raise ValueError(
                    f"resume= holds tasks {extra} that this suite does not have "
                    f"(its tasks: {list(suite.tasks)}); resume with the same suite"
                )
        episodes, seeds = call.pop("episodes", None), call.pop("seeds", None)
        trace = call.pop("trace", None)
        self.hooks = stream.hooks_list(call.get("hooks"))
        self.instructions: dict[str, str | None] = {}
        self.done: dict[str, RunResult] = {}
        self.start = time.perf_counter()
        self.seeds: dict[str, np.ndarray] = {}  # each task's, resolved
        plans: dict[str, dict[str, Any]] = {}
        for name, task in suite.tasks.items():
            args = dict(call, **suite.budget(name, episodes, seeds))
            if args["episodes"] is None and args["seeds"] is None:
                raise ValueError(
                    f"task {name!r} has no budget: give Task(episodes=...), "
                    "Suite(..., episodes=...) or evaluate(..., episodes=...)"
                )
            try:
                self.seeds[name] = checks.resolve_budget(
                    args["episodes"], args["seeds"]
                )
            except (ValueError, TypeError) as e:
                raise type(e)(f"task {name!r}: {e}") from None
            said, tib = task.instruction, task.trial_index_base
            said = config.starts.instruction if said is None else said
            tib = config.starts.trial_index_base if tib is None else tib
            self.instructions[name] = said
            args["config"] = config.replace(instruction=said, trial_index_base=tib)
            args["resume"] = None if resume is None else resume.tasks.get(name)
            args["trace"] = None
            if trace is not None:  # run.json -> run.<task>.json
                path = Path(trace)
                args["trace"] = path.with_name(f"{path.stem}.{name}{path.suffix}")
            plans[name] = args
        self.runs = _runs(suite, plans, self.seeds)

    def run(self, run_one: Callable[[TaskRun], RunResult]) -> SuiteResult:
        """Every run made with ``run_one``, each task's result told to
        ``on_task_end``; a failure's ``partial_result`` becomes the
        ``SuiteResult`` of the tasks finished so far and that run's part."""
        for run in self.runs:
            try:
                result = run_one(run)
            except BaseException as exc:
                partial = getattr(exc, "partial_result", None)
                if isinstance(partial, RunResult):
                    self.done.update(self._per_task(run, partial))
                exc.partial_result = self._result()
                raise
            for name, one in self._per_task(run, result).items():
                self.done[name] = one
                stream.call(self.hooks, "on_task_end", name, one)
        return self._result()

    def _result(self) -> SuiteResult:
        elapsed = time.perf_counter() - self.start
        return SuiteResult(dict(self.done), self.instructions, elapsed)

    def _per_task(self, run: TaskRun, result: RunResult) -> dict[str, RunResult]:
        if len(run.names) == 1:
            return {run.names[0]: result}
        return _split(result, run.names, self.seeds, run.envs)


#: A run's arguments, and its config's ``Starts`` fields, under which a task
#: always runs on its own.
_ALONE = ("resume", "trace", "record")
_ALONE_STARTS = ("initial_states", "reset_fn", "trial_index_base")


def _gymnax_env(task: Task) -> Any:
    """The task's env as a ``GymnaxEnv`` when it is a gymnax one, else None."""
    env = task.env
    is_id = isinstance(env, str) and env.startswith("gymnax:")
    if not (is_id or isinstance(env, tuple | GymnaxEnv)):
        return None
    try:
        made = make_env(env)
    except (TypeError, ValueError, ImportError):
        return None  # its own run says what is wrong with it
    return made if isinstance(made, GymnaxEnv) else None


def _runs(suite: Suite, plans: dict[str, dict], seeds_of: dict) -> list[TaskRun]:
    """The suite's tasks as runs in order: gymnax tasks of one env class,
    instruction and shape together (``_together``), every other task alone."""
    groups: list[list[str]] = []
    together: dict[Any, list[str]] = {}
    envs: dict[str, Any] = {}  # the GymnaxEnv of each task that may run with others
    for name, task in suite.tasks.items():
        args = plans[name]
        starts = args["config"].starts
        alone = not suite.together or any(args.get(k) for k in _ALONE)
        alone = alone or any(getattr(starts, k) for k in _ALONE_STARTS)
        env = None if alone else _gymnax_env(task)
        if env is None:
            groups.append([name])
            continue
        envs[name] = env
        key = (type(env.env), starts.instruction)
        if key not in together:
            groups.append(together.setdefault(key, []))
        together[key].append(name)
    runs = []
    for group in groups:
        run = _together(group, plans, seeds_of, envs) if len(group) > 1 else None
        if run is not None:
            runs.append(run)
            continue
        for name in group:  # alone, or not one shape: one by one
            args = dict(plans[name])
            task = suite.tasks[name]
            runs.append(TaskRun([name], args.pop("config"), args, task=task))
    return runs


def _together(
    group: list[str], plans: dict[str, dict], seeds_of: dict, envs: dict[str, Any]
) -> TaskRun | None:
    """Gymnax tasks of one shape as one run (else None), each episode reset
    with its task's params (``reset_fn`` of its trial index)."""
    members = [envs[n] for n in group]
    batch = task_batch(members)
    if batch is None:
        return None
    seeds = [seeds_of[n] for n in group]
    task_of = jnp.asarray(np.repeat(np.arange(len(group)), [s.size for s in seeds]))

    def reset_fn(key, trial):
        return batch.reset_task(key, task_of[trial])

    args = dict(plans[group[0]])
    args.update(episodes=None, seeds=np.concatenate(seeds).tolist())
    config = args.pop("config").replace(reset_fn=reset_fn)
    return TaskRun(list(group), config, args, batch=batch, envs=members)


def _split(
    result: RunResult, group: list[str], seeds_of: dict, envs: list
) -> dict[str, RunResult]:
    """A run of several tasks (``_together``) as one result per task, its
    episodes renumbered from 0; policy rows and times, shared by the program,
    split in proportion to the task's env steps."""
    sizes = [seeds_of[n].size for n in group]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    idx = np.asarray(result.indices)
    total = max(int(np.sum(result.lengths)), 1)
    out = {}
    for k, name in enumerate(group):
        keep = (idx >= offsets[k]) & (idx < offsets[k + 1])
        steps = int(np.sum(np.asarray(result.lengths)[keep]))
        share = steps / total
        out[name] = select(
            result,
            keep,
            indices=idx[keep] - offsets[k],
            env_steps=steps,
            policy_rows=round(result.policy_rows * share),
            wall_time=result.wall_time * share,
            compile_time=result.compile_time * share,
            run_time=result.run_time * share,
            env=envs[k].name,
        )
    return out


def _task_row(name: str, env: str, stats: dict) -> dict[str, Any]:
    ret, rates = stats["returns"], ("success_once_rate", "success_at_end_rate")
    return {
        "task": name,
        **{k: stats[k] for k in ("episodes", "success_rate", "success_interval")},
        **{k: stats.get(k) for k in (*rates, "successes_at_reset")},
        "mean_return": ret["mean"],
        "return_interval": ret["mean_interval"],
        "mean_length": stats["lengths"]["mean"],
        "env": env,
    }


@frozen
class SuiteResult:
    """The result of ``jaxmesh.evaluate(policy, suite)``.

    Attributes:
      tasks: task name -> its ``RunResult``, in the suite's order.
      instructions: task name -> the instruction its policy was given (None:
        none).
      wall_time: seconds for the whole suite, every task's compile included.
    """

    tasks: dict[str, RunResult]
    instructions: dict[str, str | None] = dataclasses.field(default_factory=dict)
    wall_time: float = 0.0

    def __getitem__(self, name: str) -> RunResult:
        if name not in self.tasks:
            raise KeyError(
                f"no task {name!r}; the suite's tasks are {list(self.tasks)}"
            )
        return self.tasks[name]

    @property
    def num_episodes(self) -> int:
        return sum(r.num_episodes for r in self.tasks.values())

    @property
    def success_rate(self) -> float | None:
        """The **pooled** success rate over every episode of every task (None
        unless every task has a success signal)."""
        return flag_rate(self._pooled("success", None))

    @property
    def task_mean_success_rate(self) -> float | None:
        """The unweighted mean of the tasks' success rates (None unless every
        task has a success signal)."""
        return _stats.mean_if_all([r.success_rate for r in self.tasks.values()])

    @property
    def mean_return(self) -> float | None:
        """The pooled mean return (None for no episodes)."""
        returns = self._pooled("returns", np.float64)
        return float(returns.mean()) if returns is not None and returns.size else None

    def _pooled(self, kind: str, dtype: Any = bool) -> np.ndarray | None:
        """Every task's ``kind`` values concatenated (None unless all have)."""
        values = [getattr(r, kind, None) for r in self.tasks.values()]
        if not values or any(v is None for v in values):
            return None
        return np.concatenate([np.asarray(v, dtype) for v in values])

    @property
    def success_mode(self) -> str | None:
        """The headline success of the tasks (``"once"`` or ``"end"``; None
        when the tasks differ or have no success signal)."""
        modes = {r.success_mode for r in self.tasks.values() if r.success is not None}
        return modes.pop() if len(modes) == 1 else None

    def stats(
        self,
        *,
        confidence: float = _stats.CONFIDENCE,
        resamples: int = _stats.RESAMPLES,
        seed: int = _stats.SEED,
    ) -> dict[str, Any]:
        """The suite's figures as plain data (``jaxmesh.results.stats``
        conventions; docs/suites.md, "The result").

        Returns:
          ``{"tasks": [row, ...], "mean_over_tasks": {...}, "pooled": {...},
          ...}``: a row per task (success rate and mean return with their
          intervals, mean length, env), the unweighted mean of the tasks'
          success rates and mean returns, and the figures over every episode.
          A success figure is None unless every task has a success signal.
        """
        opts = {"confidence": confidence, "resamples": resamples, "seed": seed}
        rows = [
            _task_row(name, r.env, r.stats(**opts)) for name, r in self.tasks.items()
        ]
        over = {"tasks": len(rows)} | {
            key: _stats.mean_if_all([row[key] for row in rows])
            for key in ("success_rate", "mean_return")
        }
        r, lengths = self._pooled("returns", np.float64), self._pooled("lengths", None)
        success = self._pooled("success", None)
        pooled = _task_row("pooled", "", _stats.describe(r, lengths, success, **opts))
        for kind in ("success_once", "success_at_end"):
            pooled[f"{kind}_rate"] = flag_rate(self._pooled(kind))
        at_reset = [row["successes_at_reset"] for row in rows]
        pooled["successes_at_reset"] = (
            None if any(v is None for v in at_reset) else int(sum(at_reset))
        )
        return {
            "success_mode": self.success_mode,
            "tasks": rows,
            "mean_over_tasks": over,
            "pooled": pooled,
            **opts,
        }

    def table(self, stats: dict | None = None) -> list[list[str]]:
        """The per-task table as text cells."""
        if stats is None:
            n = max(self.num_episodes, 1)
            stats = self.stats(resamples=_stats.summary_resamples(n))
        return _summary.suite_table(stats)

    def summary(self) -> str:
        """The per-task table, the mean over tasks and the pooled figures
        (``jaxmesh.results.summary.suite_text``)."""
        return _summary.suite_text(self)

    __str__ = summary

    def plot(self) -> Any:
        """The per-task figure as a matplotlib ``Figure``."""
        return _report.suite_plot(self)

    def report(self, path: str | Path) -> Path:
        """Writes the suite's HTML report."""
        return _report.write_suite_report(self, path)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict: every task's ``RunResult.to_dict()``."""
        return {
            "suite": True,
            "tasks": {name: r.to_dict() for name, r in self.tasks.items()},
            "instructions": dict(self.instructions),
            "wall_time": self.wall_time,
        }

    @classmethod
    def from_dict(cls, d: dict) -> SuiteResult:
        """The inverse of ``to_dict`` (e.g. of a results JSON file)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("tasks"), Mapping):
            raise ValueError(
                "expected a suite result's dict (with a 'tasks' mapping, as "
                "SuiteResult.to_dict() writes)"
            )
        return cls(
            {name: RunResult.from_dict(r) for name, r in d["tasks"].items()},
            dict(d.get("instructions") or {}),
            float(d.get("wall_time") or 0.0),
        )


@dataclasses.dataclass(frozen=True)
class SuiteComparison:
    """Suite B against suite A, paired by task and seed.

    Attributes:
      tasks: task name -> its ``jaxmesh.Comparison`` (returns paired by seed).
      pooled: the ``Comparison`` over every (task, seed) pair.
      success: task name -> (A's success rate, B's), None where a task has no
        success signal.
    """

    tasks: dict[str, _stats.Comparison]
    pooled: _stats.Comparison
    success: dict[str, tuple[float, float] | None]

    def __str__(self) -> str:
        p = self.pooled
        rows = [["task", "A return", "B return", "B - A", "interval", "B wins"]]
        rows[0] += ["A success", "B success"]
        for name, c in [*self.tasks.items(), ("pooled", self.pooled)]:
            low, high = c.interval
            pair = self.success.get(name) or ()
            rates = [f"{x:.1%}" for x in pair] or ["n/a", "n/a"]
            means = [f"{c.mean_a:.3f}", f"{c.mean_b:.3f}", f"{c.difference:+.3f}"]
            interval = f"[{low:+.3f}, {high:+.3f}]"
            rows.append([name, *means, interval, f"{c.wins:.1%}", *rates])
        unpaired = "(UNPAIRED: not the same episodes; each run resampled on its own)"
        lines = [f"A: {p.label_a}", f"B: {p.label_b}"]
        lines.append("(paired by task and seed)" if p.paired else unpaired)
        lines += _summary.text_table(rows)
        lines.append(f"pooled verdict: {p.verdict}")
        return "\n".join(lines)


def _as_pairs(s: SuiteResult) -> Any:
    """The (task, seed) pairs of a suite as one run for ``compare``, with each
    label setting every task shares (``jaxmesh.results.stats.LABEL_SETTINGS``)."""
    rs = list(s.tasks.values())
    returns = s._pooled("returns", np.float64)
    shared = {}
    for name in _stats.LABEL_SETTINGS:
        values = {repr(getattr(r, name, None)) for r in rs}
        shared[name] = getattr(rs[0], name, None) if len(values) == 1 else None
    return types.SimpleNamespace(
        indices=np.arange(returns.size),
        seeds=s._pooled("seeds", np.int64),
        returns=returns,
        policy=rs[0].policy if rs else "",
        env=f"a suite of {len(rs)} tasks",
        **shared,
    )


def compare(a: Any, b: Any, **kw: Any) -> _stats.Comparison | SuiteComparison:
    """``jaxmesh.compare``: two ``RunResult`` paired by seed, or two
    ``SuiteResult`` task by task and pooled; keywords as
    ``jaxmesh.results.stats.compare`` (``resamples``, ``seed``, ``confidence``).

    Raises:
      TypeError: one is a suite result and the other is not.
      ValueError: the runs cannot be paired, naming what differs (and the
        task); suites of other tasks.
    """
    suites = isinstance(a, SuiteResult), isinstance(b, SuiteResult)
    if not any(suites):
        return _stats.compare(a, b, **kw)
    if not all(suites):
        raise TypeError(
            f"a is a {type(a).__name__} and b a {type(b).__name__}: compare two "
            "suite results (task by task) or two run results"
        )
    if list(a.tasks) != list(b.tasks):
        raise ValueError(
            f"cannot compare these suites: a has tasks {list(a.tasks)} and b "
            f"{list(b.tasks)}; compare runs of the same suite"
        )
    per: dict[str, _stats.Comparison] = {}
    success: dict[str, tuple[float, float] | None] = {}
    for name in a.tasks:
        ra, rb = a.tasks[name], b.tasks[name]
        try:
            per[name] = _stats.compare(ra, rb, **kw)
        except ValueError as e:
            raise ValueError(f"task {name!r}: {e}") from None
        rates = (ra.success_rate, rb.success_rate)
        success[name] = None if None in rates else rates
    pooled = _stats.compare(_as_pairs(a), _as_pairs(b), **kw)
    return SuiteComparison(per, pooled, success)
