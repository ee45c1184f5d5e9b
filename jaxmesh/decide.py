"""``jaxmesh.decide``: which of two policies is better, with as few episodes as
the gap allows: both run the same seeds batch by batch, and the paired
differences ``b - a`` feed an anytime-valid confidence sequence
(``jaxmesh.results.sequential.BettingSequence``) until its interval leaves 0
(docs/statistics.md, "Deciding between two policies").
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxmesh import suite
from jaxmesh.api import evaluate
from jaxmesh.results import report as rp
from jaxmesh.results.result import RunResult
from jaxmesh.results.sequential import GRID, BettingSequence, _check_alpha
from jaxmesh.results.stats import success_flags
from jaxmesh.run import identity
from jaxmesh.run.checks import check_int
from jaxmesh.run.config import RunConfig, from_keywords
from jaxmesh.run.kept import kept_processes
from jaxmesh.run.resume import _Renumbered, merge
from jaxmesh.run.stream import hooks_list

#: What decide reads from an episode.
METRICS = ("return", "success")
#: ``evaluate`` keywords decide sets itself (or does not take).
_OWN = ("episodes", "seeds", "resume", "record")
#: ``evaluate`` keywords that are not settings of the run's config.
_CALL = ("params", "hooks", "trace", "env_config")
#: The default cap on a batch, as a multiple of the first.
BATCH_GROWTH_CAP = 16
#: Each batch after the first: this share of the episodes run so far (an
#: eighth: on success rates 0.45 / 0.70 the last batch runs about 5 pairs past
#: the decision on average, against 10 with a quarter; benchmarks/decide.py).
GROWTH = 0.125


def next_batch(done: int, first: int, cap: int) -> int:
    """Episodes per arm of the batch after ``done`` episodes: ``GROWTH *
    done`` rounded up to a multiple of ``first``, at least ``first`` and at
    most ``cap`` (8 lanes: nine batches of 8, then 16, 16, 16, 16, 24, ...)."""
    return min(max(first, math.ceil(GROWTH * done / first) * first), cap)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``jaxmesh.decide`` found (docs/statistics.md, "Deciding between two
    policies").

    Attributes:
      winner: ``"a"`` or ``"b"`` (the larger mean metric at level ``alpha``),
        or None: undecided after ``max_episodes``.
      episodes: paired episodes run per arm (of a suite: per task), in whole
        batches.
      difference: the mean of ``b - a`` over them.
      interval: the open anytime-valid interval of the mean difference.
      a, b: each policy's ``RunResult`` (of a suite: ``SuiteResult``).
      path: per batch, ``(episodes, low, high)``.
      alpha, metric, bounds, first_seed: as decided with (``bounds`` ``(0, 1)``
        for success).
      decided_at: the pairs at which the test first rejected (None: never).
      capital: the e-value against "equal means" at the stop (rejecting at
        ``1 / alpha``; ``inf`` past the largest float); ``log_capital`` its log.
    """

    winner: str | None
    episodes: int
    difference: float
    interval: tuple[float, float]
    a: RunResult
    b: RunResult
    path: tuple[tuple[int, float, float], ...]
    alpha: float
    metric: str
    bounds: tuple[float, float]
    decided_at: int | None
    capital: float
    log_capital: float
    first_seed: int = 0

    @property
    def batches(self) -> int:
        """Batches run (pairs of calls, one per arm)."""
        return len(self.path)

    @property
    def verdict(self) -> str:
        """One line: who won, or that no difference was shown."""
        level = f"alpha = {self.alpha:g}"
        if self.winner is None:
            return (
                f"no decision after {self.episodes} episodes per arm (the interval "
                f"holds 0 at {level})"
            )
        return (
            f"{self.winner.upper()} scores more ({level}; decided at "
            f"{self.decided_at} episodes per arm)"
        )

    def plot(self) -> Any:
        """The interval narrowing over the episodes (``_CAPTION``): a matplotlib
        ``Figure`` on an Agg canvas (needs ``jaxmesh[report]``)."""
        fig = rp._new_figure((7.0, 3.6), layout="tight")
        ax = fig.add_subplot()
        n, low, high = (np.array(x, np.float64) for x in zip(*self.path, strict=True))
        d = _stratified(self.b, self.metric) - _stratified(self.a, self.metric)
        running = np.cumsum(d) / np.arange(1, d.size + 1)
        # Each batch's band spans the episodes that narrowed it to that.
        ax.fill_between(
            np.concatenate([[0.0], n]),
            np.concatenate([low[:1], low]),
            np.concatenate([high[:1], high]),
            step="pre",
            alpha=0.3,
            label="interval",
        )
        ax.plot(n, running[n.astype(int) - 1], marker="o", label="difference B - A")
        ax.axhline(0.0, color="black", linewidth=0.8)
        if self.decided_at is not None:
            ax.axvline(self.decided_at, linestyle=":", color="gray", label="decided")
        ax.set_xlabel("episodes per arm")
        ax.set_ylabel(f"{self.metric} difference (B - A)")
        ax.set_title(self.verdict, fontsize=9, wrap=True)
        ax.legend(loc="best", fontsize=8)
        return fig

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the decision."""
        fields = [f.name for f in dataclasses.fields(self) if f.name not in ("a", "b")]
        out = {k: getattr(self, k) for k in fields}
        out.update(
            interval=list(self.interval),
            path=[list(p) for p in self.path],
            bounds=list(self.bounds),
            capital=self.capital if math.isfinite(self.capital) else None,
            a=self.a.to_dict(),
            b=self.b.to_dict(),
        )
        return out

    def rows(self) -> list[tuple[str, str, Any, str]]:
        """The summary as ``(key, label, value, text)`` rows: what ``str(d)``
        prints (label and text) and ``report`` shows (the value as JSON)."""
        low, high = self.interval
        what = "mean return" if self.metric == "return" else "success rate"
        ma, mb = (float(_stratified(r, self.metric).mean()) for r in (self.a, self.b))
        seeds = f"{self.first_seed}..{self.first_seed + self.episodes - 1}"
        first_a, first_b = _first_run(self.a), _first_run(self.b)
        if isinstance(self.a, suite.SuiteResult):
            env = f"a suite of {len(self.a.tasks)} tasks ({', '.join(self.a.tasks)})"
            per = "episodes per task and arm"
            what += " (mean over tasks)"
        else:
            env, per = self.a.env or "?", "episodes per arm"
        lo, hi = self.bounds
        batches = f"{self.episodes} (same seeds {seeds}), {self.batches} batches"
        interval = (
            f"({low:.3f}, {high:.3f}) at alpha {self.alpha:g} (betting confidence "
            f"sequence, bounds {lo:g}..{hi:g})"
        )
        diff = self.difference
        return [
            ("policy_a", "A", first_a.policy, first_a.policy or "A"),
            ("policy_b", "B", first_b.policy, first_b.policy or "B"),
            ("env", "env", env, env),
            ("episodes", per, self.episodes, batches),
            ("means", f"{what} A / B", [ma, mb], f"{ma:.3f} / {mb:.3f}"),
            ("difference", "difference (B - A)", diff, f"{diff:.3f}"),
            ("interval", "anytime-valid interval", [low, high], interval),
            ("verdict", "verdict", self.winner, self.verdict),
        ]

    def __str__(self) -> str:
        rows = [(label, text) for _, label, _, text in self.rows()]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def report(self, path: Any) -> Any:
        """Writes the decision as one self-contained HTML page
        (``decision_html``), making missing folders.

        Returns:
          The path written (a ``pathlib.Path``).

        Raises:
          ImportError: matplotlib is missing (``pip install 'jaxmesh[report]'``).
          OSError: the file cannot be written.
        """
        return rp._write(path, decision_html(self))


#: The test, and where it is from, as the report page names them.
TEST_NAME = (
    "two-sided anytime-valid test of equal means: a betting confidence "
    "sequence of the mean paired difference B - A, the average capital of a "
    "grid of constant bets"
)
CITATION = (
    'Waudby-Smith and Ramdas, "Estimating means of bounded random variables by '
    'betting", Journal of the Royal Statistical Society, Series B 86(1), 2024 '
    "(arXiv:2010.09686)"
)
_CAPTION = (
    "Band: the anytime-valid interval after each batch; line: the mean "
    "difference B - A so far; dotted: the pair at which the test decided."
)


def decision_html(d: Decision) -> str:
    """A decision's report page (``jaxmesh.results.report``'s, loading nothing
    from outside itself): the summary, the plot and the interval per batch."""
    capital = d.capital if math.isfinite(d.capital) else None
    lo, hi = d.bounds
    rows = [rp._row(k, label, v, text) for k, label, v, text in d.rows()] + [
        rp._row("alpha", "alpha", d.alpha, f"{d.alpha:g}"),
        rp._row("metric", "metric", d.metric, d.metric),
        rp._row("bounds", "bounds", list(d.bounds), f"{lo:g}..{hi:g}"),
        rp._row("decided_at", "decided at", d.decided_at, f"{d.decided_at or 'never'}"),
        rp._row("capital", "capital (e-value)", capital, f"{d.capital:.4g}"),
        rp._row("test", "test", TEST_NAME, TEST_NAME),
        rp._row("citation", "citation", CITATION, CITATION),
    ]
    summary = rp._table(rows, "summary-table", ("what", "value", "note"))
    plot = rp._figure(d.plot(), _CAPTION)
    path = [
        f"<tr data-value='{rp.esc(json.dumps(list(p)))}'><td>{k + 1}</td>"
        f"<td>{p[0]}</td><td>{p[1]:.4g}</td><td>{p[2]:.4g}</td></tr>"
        for k, p in enumerate(d.path)
    ]
    head = ("batch", "episodes per arm", "low", "high")
    parts = [
        rp.Section("summary", "Summary", summary),
        rp.Section("interval", "Interval", plot + rp._table(path, "path-table", head)),
    ]
    facts = {key: text for key, _, _, text in d.rows()}
    name = f"{facts['policy_a']} vs {facts['policy_b']} on {facts['env']}"
    return rp._document(name, f"jaxmesh decide: {d.verdict}", [], parts)


def _runs_of(result: Any) -> dict[str, RunResult]:
    """Task name -> run (``{"": result}`` for a single run)."""
    if isinstance(result, suite.SuiteResult):
        return dict(result.tasks)
    return {"": result}


def _first_run(result: Any) -> RunResult:
    return next(iter(_runs_of(result).values()))


def _stratified(result: Any, metric: str) -> np.ndarray:
    """Per episode index the metric (of a suite: the mean over its tasks)."""
    return np.mean([_values(r, metric) for r in _runs_of(result).values()], axis=0)


def _values(result: RunResult, metric: str) -> np.ndarray:
    """Per episode of ``result`` the metric, as floats (success: 0 or 1)."""
    if metric == "return":
        return np.asarray(result.returns, np.float64)
    flags = success_flags(result.success, result.num_episodes)
    if flags is None:
        raise ValueError(
            f"metric='success', but the run of {result.policy or 'a policy'} on "
            f"{result.env or 'this env'} has no success signal for every episode "
            "(the env's info has no 'success' or 'is_success'); name the info key "
            "with scoring=jaxmesh.Scoring(success='KEY'), or decide on "
            "metric='return' with bounds=(lo, hi)"
        )
    return flags.astype(np.float64)


def _check_bounds(metric: str, bounds: Any) -> tuple[float, float]:
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}: expected 'return' or 'success'")
    if metric == "success":
        if bounds is not None and tuple(bounds) != (0, 1):
            raise ValueError(
                f"bounds={bounds!r} with metric='success': a success is 0 or 1; "
                "leave bounds out (they are for metric='return')"
            )
        return 0.0, 1.0
    if bounds is None:
        raise ValueError(
            "metric='return' needs bounds=(lo, hi): the smallest and largest return "
            "an episode can score (e.g. bounds=(0, 500) for CartPole-v1 capped at "
            "500 steps), since the test's guarantee rests on them; or decide on "
            "metric='success'"
        )
    try:
        lo, hi = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise TypeError(
            f"bounds={bounds!r}: expected two numbers (lo, hi), e.g. (0, 500)"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"bounds={bounds!r}: expected finite lo < hi, e.g. (0, 500)")
    return lo, hi


def check_settings(
    alpha: Any, metric: Any, bounds: Any, max_episodes: Any, first_seed: Any
) -> tuple[float, tuple[float, float], int, int]:
    """``decide``'s own settings, checked (the command line checks them before
    it builds the policies): ``(alpha, bounds, max_episodes, first_seed)``,
    bounds ``(0, 1)`` for ``metric="success"``; TypeError or ValueError naming
    the setting and what to pass."""
    return (
        _check_alpha(alpha),
        _check_bounds(metric, bounds),
        check_int("max_episodes", max_episodes, 1, "e.g. 2000"),
        check_int("first_seed", first_seed, 0, "e.g. 0"),
    )


def _held(result: Any) -> int:
    """The paired episodes per arm a run (or each task of a suite's) holds."""
    return 0 if result is None else _first_run(result).num_episodes


def _joined(done: Any, new: Any, start: int) -> Any:
    """``done``'s episodes ``0..start-1`` and ``new``'s (its episode k is
    episode ``start + k``), as one result (of a suite: task by task)."""
    if done is None:
        return new
    if isinstance(new, suite.SuiteResult):
        tasks = {
            name: _joined(done.tasks[name], r, start) for name, r in new.tasks.items()
        }
        wall_time = done.wall_time + new.wall_time
        return dataclasses.replace(new, tasks=tasks, wall_time=wall_time)
    indices = start + np.arange(new.num_episodes, dtype=np.int64)
    return dataclasses.replace(merge(done, new, indices), resumed_part=None)


def decide(
    policy_a: Any,
    policy_b: Any,
    env: Any,
    config: RunConfig | None = None,
    *,
    alpha: float = 0.05,
    metric: str = "return",
    bounds: tuple[float, float] | None = None,
    max_episodes: int = 10_000,
    first_seed: int = 0,
    batch: int | None = None,
    max_batch: int | None = None,
    on_batch: Callable[[Decision], None] | None = None,
    resume: Any = None,
    grid: int = GRID,
    arm_hooks: Any = None,
    **kwargs: Any,
) -> Decision:
    """Runs two policies on the same seeds until an anytime-valid test says
    which scores more, or ``max_episodes`` pairs have run.

    Args:
      policy_a, policy_b: the two policies (anything ``evaluate`` takes).
      env: the env both run, or a ``jaxmesh.Suite`` setting no budget (the
        test is then on the mean over tasks of episode i's differences).
      config: a ``jaxmesh.RunConfig`` for both runs (the keywords override it).
      alpha: the level: with equal means, the probability of naming a winner.
      metric: ``"return"`` (needs ``bounds``) or ``"success"``.
      bounds: ``(lo, hi)``, the smallest and largest return an episode can
        score; a return outside them is an error.
      max_episodes: the most episodes per arm.
      first_seed: episode i of both arms runs seed ``first_seed + i``.
      batch: episodes per arm in the first batch (default ``num_envs``); the
        next ones grow (``next_batch``) up to ``max_batch`` (default 16 times).
      on_batch: called after each batch with the ``Decision`` so far.
      resume: an earlier ``Decision`` (or its ``(a, b)``) of these policies,
        env and ``first_seed``, whose episodes are not run again.
      grid: candidate means of the interval (``BettingSequence``).
      arm_hooks: ``(hooks_a, hooks_b)``: each arm's hooks, episodes indexed in
        the whole decide, ``on_run_end`` after each batch (not with a Suite).
      **kwargs: ``evaluate``'s keywords, for both runs; ``hooks`` hear each
        batch of each policy as a run of its own.

    Returns:
      A ``jaxmesh.Decision``.

    Raises:
      TypeError, ValueError: bad input, before anything compiles (a return
        outside ``bounds``, or a missing success signal, once seen). An
        exception while the batches run carries the ``Decision`` so far on
        ``exc.partial_decision`` (when a batch finished): ``resume=`` it.
    """
    alpha, bounds, max_episodes, first_seed = check_settings(
        alpha, metric, bounds, max_episodes, first_seed
    )
    _check_own(kwargs)
    arms = _arm_hooks(arm_hooks, env)
    if isinstance(env, suite.Suite):
        env = _unbudgeted(env)
    call = {k: kwargs.pop(k) for k in _CALL if k in kwargs}
    config = from_keywords(config, kwargs, caller="jaxmesh.decide")
    first, cap = _batch_sizes(config, batch, max_batch)
    if on_batch is not None and not callable(on_batch):
        raise TypeError(f"on_batch={on_batch!r}: expected a callable(Decision)")
    lo, hi = bounds
    width = hi - lo  # differences lie in [-width, width]
    seq = BettingSequence(-width, width, alpha=alpha, null=0.0, grid=grid)
    runs: dict[str, Any] = {"a": None, "b": None}
    policies = {"a": policy_a, "b": policy_b}
    path: list[tuple[int, float, float]] = []

    def run(name: str, start: int, count: int, **kw: Any) -> None:
        """Episodes ``start..start+count`` of arm ``name``, joined into ``runs``."""
        seeds = list(range(first_seed + start, first_seed + start + count))
        new = evaluate(policies[name], env, config, seeds=seeds, **kw)
        runs[name] = _joined(runs[name], new, start)

    def decision(runs: dict) -> Decision:
        return _decision(seq, runs, path, alpha, metric, bounds, first_seed)

    def update(start: int) -> None:
        """The differences of episodes ``start..`` into the test, checked."""
        seq.update(_differences(runs, metric, bounds, start))
        path.append((seq.n, *seq.interval))

    with kept_processes():  # one set of worker processes for every batch
        if resume is not None:
            _resumed(run, runs, resume, first_seed, max_episodes, call)
            if _held(runs["a"]):
                update(0)
        kept = dict(runs)  # both arms after the last whole batch
        try:
            while seq.n < max_episodes and not seq.rejects:
                start = seq.n
                count = min(next_batch(start, first, cap), max_episodes - start)
                # Each episode keeps its index in the whole decide: an env's trial
                # index is trial_index_base + it, as in one evaluate; an arm's
                # hooks see episode k of the batch as episode start + k.
                with identity.resumed_indices(np.arange(start, start + count)):
                    for name in ("a", "b"):
                        _run_arm(run, name, arms[name], call, start, count, runs)
                update(start)
                kept = dict(runs)
                if on_batch is not None:
                    on_batch(decision(kept))
        except BaseException as exc:
            # What the batches finished before it hold (resume= goes on from it).
            if seq.n and kept["a"] is not None:
                exc.partial_decision = decision(kept)
            raise
        return decision(runs)


def _check_own(kwargs: dict) -> None:
    """Refuses ``evaluate`` keywords that choose the episodes (decide does)."""
    own = sorted(k for k in kwargs if k in _OWN)
    if own:
        raise TypeError(
            f"{', '.join(own)}=: decide chooses the episodes itself (episode i of "
            "both arms with seed first_seed + i, up to max_episodes); pass "
            "first_seed= and max_episodes="
        )


def _arm_hooks(arm_hooks: Any, env: Any) -> dict[str, list]:
    """Each arm's hooks of ``arm_hooks`` (a pair, or None: none), checked."""
    if arm_hooks is None:
        return {"a": [], "b": []}
    if not (isinstance(arm_hooks, list | tuple) and len(arm_hooks) == 2):
        raise TypeError(
            f"arm_hooks={arm_hooks!r}: expected a pair (hooks_a, hooks_b), each "
            "a hook, a list of hooks or None"
        )
    if isinstance(env, suite.Suite) and any(arm_hooks):
        raise TypeError("arm_hooks= with a Suite: not supported; pass hooks=")
    return {"a": hooks_list(arm_hooks[0]), "b": hooks_list(arm_hooks[1])}


def _unbudgeted(env: suite.Suite) -> suite.Suite:
    """``env`` with each task in a run of its own (a run of several gymnax tasks
    together reads a batch's resumed_indices as each episode's task), refused
    if it sets a budget."""
    own = [n for n, t in env.tasks.items() if (t.episodes, t.seeds) != (None, None)]
    if env.episodes is not None or env.seeds is not None or own:
        where = f"tasks {own}" if own else "the Suite"
        raise ValueError(
            f"{where} set a budget (episodes= or seeds=); decide gives every "
            "task the seeds first_seed + i, i = 0, 1, ...: leave the budgets out"
        )
    return suite.Suite(env.tasks, together=False)


def _batch_sizes(config: RunConfig, batch: Any, max_batch: Any) -> tuple[int, int]:
    """The first batch's episodes per arm and the largest batch's, checked."""
    first = config.num_envs if batch is None else batch
    first = check_int("batch", first, 1, "e.g. num_envs")
    cap = BATCH_GROWTH_CAP * first if max_batch is None else max_batch
    return first, check_int("max_batch", cap, first, f"e.g. {BATCH_GROWTH_CAP * first}")


def _decision(
    seq: BettingSequence,
    runs: dict,
    path: list,
    alpha: float,
    metric: str,
    bounds: tuple[float, float],
    first_seed: int,
) -> Decision:
    """The ``Decision`` of the test ``seq`` over both arms' ``runs`` so far."""
    return Decision(
        winner={1: "b", -1: "a", 0: None}[seq.direction],
        episodes=seq.n,
        difference=seq.mean,
        interval=seq.interval,
        a=runs["a"],
        b=runs["b"],
        path=tuple(path),
        alpha=alpha,
        metric=metric,
        bounds=bounds,
        decided_at=seq.decided_at,
        capital=seq.capital,
        log_capital=seq.log_capital,
        first_seed=first_seed,
    )


def _differences(
    runs: dict, metric: str, bounds: tuple[float, float], start: int
) -> np.ndarray:
    """b - a of the paired episodes ``start..``, each value checked to lie in
    ``bounds``."""
    lo, hi = bounds
    values = {}
    for name in ("a", "b"):
        for task, r in _runs_of(runs[name]).items():  # (a success is within)
            v = _values(r, metric)
            out = start + np.flatnonzero(~((v[start:] >= lo) & (v[start:] <= hi)))
            if out.size:
                k, label = int(out[0]), f"{name} (task {task!r})" if task else name
                raise ValueError(
                    f"policy {label}'s episode {int(r.indices[k])} (seed "
                    f"{int(r.seeds[k])}) returned {v[k]!r}, outside bounds=({lo:g}"
                    f", {hi:g}) ({out.size} episodes out of them); the test's "
                    "guarantee needs every return within the bounds: pass bounds "
                    "that hold every return the env can give"
                )
        values[name] = _stratified(runs[name], metric)[start:]
    return values["b"] - values["a"]


def _run_arm(
    run: Callable,
    name: str,
    hooks: list,
    call: dict,
    start: int,
    count: int,
    runs: dict,
) -> None:
    """Arm ``name``'s episodes ``start..start+count``; its own ``hooks`` see
    episode k of the batch as episode ``start + k`` (its index in the whole
    decide), and hear ``on_run_end`` with the arm's joined result."""
    indices = np.arange(start, start + count)
    shifted = [_Renumbered(h, indices, start + count) for h in hooks]
    all_hooks = [*hooks_list(call.get("hooks")), *shifted]
    run(name, start, count, **({**call, "hooks": all_hooks} if shifted else call))
    for h in hooks:
        end = getattr(h, "on_run_end", None)
        if callable(end):
            end(runs[name])


def _resumed(
    run: Callable,
    runs: dict,
    resume: Any,
    first_seed: int,
    max_episodes: int,
    call: dict,
) -> None:
    """Both arms' ``runs`` of ``resume``'s episodes (a ``Decision`` or ``(a, b)``),
    checked to be the paired episodes ``0..n-1`` of ``first_seed`` in every
    task, ``evaluate(..., resume=)`` checking their policy, env and settings."""
    if isinstance(resume, Decision):
        resume = (resume.a, resume.b)
    kinds = (RunResult, suite.SuiteResult)
    if not (
        isinstance(resume, tuple | list)
        and len(resume) == 2
        and all(isinstance(r, kinds) for r in resume)
        and isinstance(resume[0], RunResult) == isinstance(resume[1], RunResult)
    ):
        raise TypeError(
            f"resume={type(resume).__name__}: expected a jaxmesh.Decision or a pair "
            "(a, b) of RunResults (or SuiteResults) of an earlier decide"
        )
    a, b = resume
    if list(_runs_of(a)) != list(_runs_of(b)):
        raise ValueError(
            f"resume=: a holds tasks {list(_runs_of(a))} and b "
            f"{list(_runs_of(b))}; a decide's two runs hold the same tasks"
        )
    sizes = {}
    for name, result in (("a", a), ("b", b)):
        for task, r in _runs_of(result).items():
            n = r.num_episodes
            if not (
                np.array_equal(r.indices, np.arange(n))
                and np.array_equal(r.seeds, first_seed + np.arange(n))
            ):
                where = f"run {name}" + (f" (task {task!r})" if task else "")
                raise ValueError(
                    f"resume=: {where} does not hold episodes 0..{n - 1} with seeds "
                    f"{first_seed}..{first_seed + n - 1} (first_seed={first_seed}); "
                    "resume with the first_seed the earlier decide used"
                )
            sizes[(name, task)] = n
    if len(set(sizes.values())) > 1:
        counts = ", ".join(
            f"{name}{f' {task!r}' if task else ''}: {n}"
            for (name, task), n in sizes.items()
        )
        raise ValueError(
            f"resume=: the runs hold different numbers of episodes ({counts}); a "
            "decide's runs hold the same episodes"
        )
    for name, r in (("a", a), ("b", b)):
        if _held(r):
            run(name, 0, _held(r), resume=r, **call)
    held = _held(runs["a"])
    if held > max_episodes:
        raise ValueError(
            f"resume= holds {held} episodes per arm, more than "
            f"max_episodes={max_episodes}; pass a larger max_episodes"
        )
