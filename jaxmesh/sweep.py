"""``jaxmesh.sweep``: a grid of inference delays and horizons in one program.

The cells are data of one compiled program: cell c runs the budget's episodes
``c * E .. (c + 1) * E - 1``, each lane taking its episode's (h, d) as it
begins it. The user's view: docs/evaluation.md, "Sweeps".
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxmesh.core.policy import resolve_policy
from jaxmesh.envs.timing import step_seconds
from jaxmesh.results import report as _report
from jaxmesh.results import stats as _stats
from jaxmesh.results import summary as _summary
from jaxmesh.results.result import RunResult, select
from jaxmesh.run import backend, build, checks, dispatch
from jaxmesh.run.config import RunConfig, from_keywords
from jaxmesh.run.plan import (
    UnfitDelay,
    check_execution,
    default_plan_tile,
    effective_horizon,
)
from jaxmesh.run.resume import records_result
from jaxmesh.run.scan import Evaluator

#: ``evaluate`` arguments a sweep does not take, and why.
REFUSED = {
    "prefetch_lead": "a sweep's stale plans come from its delays",
    "execution": "a sweep varies the delay of replayed chunks; ensembling "
    "plans every step and has no delay",
    "hooks": "a sweep's cells run interleaved in one program (on_cell= hears "
    "of each cell as it finishes)",
    "record": "record episodes with jaxmesh.evaluate on the cell you want",
    "trace": "trace one cell with jaxmesh.evaluate",
    "devices": "a sweep runs on one device",
    "initial_states": "a cell's trial indices would follow the sweep's order",
    "reset_fn": "a cell's trial indices would follow the sweep's order",
    "trial_index_base": "a cell's trial indices would follow the sweep's order",
}


def _refused(name: str) -> ValueError:
    return ValueError(
        f"sweep(..., {name}=...): a sweep does not take {name} "
        f"({REFUSED[name]}); drop it, or use jaxmesh.evaluate"
    )


def _checked_config(config: RunConfig | None, settings: dict) -> RunConfig:
    """The sweep's ``RunConfig`` (ValueError: a ``REFUSED`` setting, or a
    delay or horizon in ``config``: a sweep's own axes)."""
    for name in ("hooks", "record", "trace"):
        if settings.pop(name, None) is not None:
            raise _refused(name)
    config = from_keywords(config, settings, "jaxmesh.sweep")
    c = config.chunking
    for name in REFUSED:  # those set on the config (fields of its groups)
        for group in (c, config.layout, config.starts):
            value = getattr(group, name, None)
            if value is not None and value != 0:
                raise _refused(name)
    if c.delay or c.delay_ms is not None or config.horizon != 1:
        raise ValueError(
            f"sweep(config with horizon={config.horizon}, delay={c.delay}, "
            f"delay_ms={c.delay_ms}): a sweep's horizons and delays are its axes; "
            "give them as sweep(horizon=[...], delay=[...]) or delay_ms=[...]"
        )
    return config


def _axis(name: str, values: Any, low: int | None = None) -> tuple:
    """A sweep axis: one value or distinct ones, ints >= ``low`` (None:
    milliseconds), each checked."""
    ms = low is None
    kind = "numbers of milliseconds" if ms else "ints"
    if isinstance(values, int | float if ms else int) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | range):
        example = "[0, 50, 100, 200]" if ms else "[0, 1, 2, 4]"
        raise TypeError(
            f"{name}={values!r}: expected a list of {kind.split()[-1]}, e.g. "
            f"{name}={example}"
        )
    hint = f"each {name} of the sweep"
    out = tuple(
        checks.check_delay_ms(v) if ms else checks.check_int(name, v, low, hint)
        for v in values
    )
    if not out or len(set(out)) != len(out):
        raise ValueError(
            f"{name}={list(values)!r}: expected a non-empty list of distinct {kind}"
        )
    return out


@dataclasses.dataclass
class _CellStream:
    """The hook that hands each cell of one program to ``on_cell`` as soon as
    its last episode has ended (its times 0: the cells share them)."""

    group: list
    e: int
    on_cell: Any
    info: dict = dataclasses.field(default_factory=dict)
    episodes: dict = dataclasses.field(default_factory=dict)  # cell -> its ended

    def on_run_start(self, info: dict) -> None:
        self.info = dict(info)

    def on_episode_end(self, ep: Any) -> None:
        c, i = divmod(int(ep.index), self.e)
        if not 0 <= c < len(self.group):
            return
        ended = self.episodes.setdefault(c, {})
        ended[i] = dict(ep.to_dict(), index=i)
        if len(ended) == self.e:
            d, big_h, h = self.group[c]
            eps = [ended[k] for k in sorted(self.episodes.pop(c))]
            cell = records_result(
                self.info, eps, horizon=big_h, effective_horizon=h, delay=d
            )
            self.on_cell(d, big_h, cell)


def _resumed(resume: Any, seeds: np.ndarray) -> dict:
    """``sweep(resume=)``'s cells, ``(delay, horizon) -> RunResult``
    (TypeError: not a ``Sweep`` nor such a dict; ValueError: other seeds)."""
    if resume is None:
        return {}
    cells = resume.cells if isinstance(resume, Sweep) else resume
    if not isinstance(cells, dict) or not all(
        isinstance(k, tuple) and len(k) == 2 and isinstance(v, RunResult)
        for k, v in cells.items()
    ):
        raise TypeError(
            f"resume={type(resume).__name__}: expected the Sweep of an earlier "
            "sweep of this policy, env and seeds (or a dict (delay, horizon) -> "
            "RunResult of its finished cells)"
        )
    for (d, big_h), r in cells.items():
        if not np.array_equal(np.asarray(r.seeds), seeds):
            raise ValueError(
                f"resume=: cell delay={d}, horizon={big_h} ran "
                f"{r.num_episodes} episodes on other seeds than this sweep's "
                f"{seeds.size}; a sweep resumes only with the same budget (pass "
                "the same episodes / seeds, or start a new sweep without resume=)"
            )
    return {(int(d), int(big_h)): r for (d, big_h), r in cells.items()}


def sweep(
    policy: Any,
    env: Any,
    config: RunConfig | None = None,
    *,
    delay: Any = (0,),
    horizon: Any = (1,),
    delay_ms: Any = None,
    episodes: int | None = None,
    seeds: Sequence[int] | None = None,
    params: Any = None,
    on_cell: Any = None,
    resume: Any = None,
    **settings: Any,
) -> Sweep:
    """Scores a policy at every (delay, horizon) of a grid, on the same seeds
    (docs/evaluation.md, "Sweeps").

    Args:
      policy, env, episodes, seeds, params: as for ``jaxmesh.evaluate``; every
        cell runs the same budget.
      delay: the inference delays d to sweep (steps).
      horizon: the horizons H to sweep.
      delay_ms: instead of ``delay``, inference times in milliseconds, each
        ``ceil(ms / (1000 * dt))`` steps.
      config: a ``jaxmesh.RunConfig`` for every cell; its ``plan_tile`` serves
        every cell (default: the default tile of the smallest horizon).
      on_cell: ``f(delay, horizon, RunResult)``, called with each cell as
        soon as its episodes have all ended (its times 0).
      resume: the ``Sweep`` of an earlier, stopped sweep of the same policy,
        env and seeds (or a dict ``(delay, horizon) -> RunResult`` of the
        cells ``on_cell`` got): those cells run nothing again.
      **settings: ``RunConfig``'s flat knobs and groups, overriding
        ``config``'s, except those in ``REFUSED``.

    Returns:
      A ``Sweep``; a cell the horizon and chunks cannot serve (``0 < d < h``,
      ``K >= h + d``) is not run (``Sweep.skipped`` says why).

    Raises:
      ValueError, TypeError: bad input, before anything compiles.
    """
    t0 = time.perf_counter()
    delays = _axis("delay", delay, 0)
    horizons = _axis("horizon", horizon, 1)
    times = None if delay_ms is None else _axis("delay_ms", delay_ms)
    if times is not None and delays != (0,):
        raise ValueError(
            f"sweep(delay={list(delays)}, delay_ms={list(times)}): give the "
            "delays once, in steps (delay=) or in milliseconds (delay_ms=)"
        )
    config = _checked_config(config, settings)
    plan_tile = config.layout.plan_tile
    seeds_arr = checks.resolve_budget(episodes, seeds)
    if on_cell is not None and not callable(on_cell):
        raise TypeError(f"on_cell={on_cell!r}: expected a function (d, h, result)")
    done = _resumed(resume, seeds_arr)
    if plan_tile is None and done:  # the tile the earlier cells ran with
        plan_tile = next(iter(done.values())).plan_tile or None
    config = config.replace(plan_tile=plan_tile)
    scan = backend.backend_of(env) == backend.SCAN
    takes, served = params is not None, None
    if scan:
        config.for_backend(backend.Target(env, backend.SCAN))
        cfg = config.replace(horizon=max(horizons))
        probe = Evaluator(policy, env, cfg, takes_params=takes)
        pol, spec = probe.policy, probe.env
        dt, name = step_seconds(spec), probe.env_name
    else:
        target = dispatch.target(env)
        served = config.for_backend(target)
        pol = resolve_policy(policy, with_params=takes)
        # One lane made and closed (of served envs: their handshake).
        lanes = dispatch.route(target).lanes(env, 1, 1, 0, served)
        try:
            spec = lanes.spec
        finally:
            lanes.close()
        dt, name = spec.dt, spec.name
    steps_of = None
    if times is not None:
        steps_of = {ms: checks.delay_steps(ms, dt, name) for ms in times}
        delays = tuple(dict.fromkeys(steps_of.values()))
    p = pol.default_params() if params is None else pol.place(params)
    # A policy that declares ``execution_horizon`` is told the grid's largest
    # h + d, so its chunk fits every cell (each program is then told its own).
    told = max(horizons) + max(delays) if pol.takes_execution_horizon else None
    chunk = build.probe_chunk(pol, spec, p, max(horizons), told)
    cells, skipped = _fit_cells(delays, horizons, chunk)
    if scan and plan_tile is None:
        tile = default_plan_tile(min(h for _, _, h in cells), probe.settings.num_envs)
        config = config.replace(plan_tile=tile)
    # The resumed cells of this grid (others in ``done`` are not swept).
    out = {(d, big_h): done[d, big_h] for d, big_h, _ in cells if (d, big_h) in done}
    todo = [c for c in cells if (c[0], c[1]) not in done]
    programs, compile_time = 0, 0.0
    groups: dict = {}  # a program per h + d told as ``execution_horizon``, else one
    for cell in todo:
        told = cell[0] + cell[2] if pol.takes_execution_horizon else None
        groups.setdefault(told, []).append(cell)
    for group in groups.values():
        cfg = config.replace(horizon=max(big_h for _, big_h, _ in group))
        ran = _run_group(policy, env, cfg, group, seeds_arr, params, on_cell, served)
        out.update(ran[0])
        programs, compile_time = programs + ran[1], compile_time + ran[2]
    return Sweep(
        delays=delays,
        horizons=horizons,
        cells={(d, h): out[d, h] for d in delays for h in horizons if (d, h) in out},
        skipped=skipped,
        programs=programs,
        wall_time=time.perf_counter() - t0,
        compile_time=compile_time,
        delay_steps=steps_of,
    )


def _run_group(
    policy: Any,
    env: Any,
    cfg: RunConfig,
    group: list,
    seeds_arr: np.ndarray,
    params: Any,
    on_cell: Any,
    served: Any,
) -> tuple[dict, int, float]:
    """One run of a group's cells ``(d, H, h)``, each cell the seeds once:
    ``(d, H) -> RunResult``, the programs it compiled and its compile time."""
    e = int(seeds_arr.size)
    grid = (tuple((h, d) for d, _, h in group), max(e, 1))
    streams = [_CellStream(group, e, on_cell)] if on_cell and e else None
    kw = {"seeds": np.tile(seeds_arr, len(group)), "params": params}
    if backend.backend_of(env) == backend.SCAN:
        ev = Evaluator(policy, env, cfg, takes_params=params is not None)
        # The settings carry the cells (``Settings.grid``).
        ev.settings = ev.settings._replace(grid=grid[0], cell_episodes=grid[1])
        whole, programs = ev.run(hooks=streams, **kw), len(ev.programs())
    else:
        kw.update(episodes=None, hooks=streams, served=served, grid=grid)
        whole = dispatch.evaluate_host(policy, env, cfg, **kw)
        programs = 1  # one agent step (HostAgent) per grid
    cells = {}
    for c, (d, big_h, h) in enumerate(group):
        at = slice(c * e, (c + 1) * e)
        cells[(d, big_h)] = select(
            whole,
            at,
            indices=np.arange(e),
            env_steps=int(np.sum(whole.lengths[at])),
            policy_rows=int(np.sum(whole.predict_calls[at])),
            horizon=big_h,
            effective_horizon=h,
            delay=d,
        )
    return cells, programs, whole.compile_time


def _fit_cells(delays: tuple, horizons: tuple, chunk: int | None) -> tuple:
    """The cells ``(d, H, h)`` that chunks of K = ``chunk`` serve, and the
    skipped ones (``(d, H) -> why``); ValueError: none can run, or single
    actions with a horizon or delay to sweep."""
    if chunk is None and (horizons != (1,) or delays != (0,)):
        raise ValueError(
            f"sweep(delay={list(delays)}, horizon={list(horizons)}): the policy "
            "returns one action per call (not a chunk of actions), so the horizon "
            "h and the delay d do not apply to it: every cell would run h = 1 "
            "with no delay. Sweep a policy that returns chunks, or score this one "
            "with jaxmesh.evaluate"
        )
    cells, skipped = [], {}
    for d in delays:
        for big_h in horizons:
            h = effective_horizon(big_h, chunk)
            try:
                setting = types.SimpleNamespace(delay=d, execution=None, horizon=big_h)
                check_execution(setting, chunk, h)
            except UnfitDelay as e:
                skipped[(d, big_h)] = str(e)
                continue
            cells.append((d, big_h, h))
    if not cells:
        raise ValueError(
            f"sweep(delay={list(delays)}, horizon={list(horizons)}): no cell can "
            f"run with chunks of K={chunk}: {next(iter(skipped.values()))}"
        )
    return cells, skipped


@dataclasses.dataclass
class Sweep:
    """The results of ``jaxmesh.sweep``: one ``RunResult`` per (delay, horizon).

    Attributes:
      delays, horizons: the swept values, in the order given.
      cells: ``(delay, horizon) -> RunResult`` of every cell that ran.
      skipped: ``(delay, horizon) -> why`` of every cell that could not run.
      programs: how many programs compiled for the sweep.
      wall_time, compile_time: seconds for the whole call and of it compiling.
      delay_steps: a ``delay_ms`` sweep's milliseconds -> steps (else None).
    """

    delays: tuple[int, ...]
    horizons: tuple[int, ...]
    cells: dict
    skipped: dict
    programs: int
    wall_time: float
    compile_time: float
    delay_steps: dict | None = None

    def get(
        self, *, horizon: int, delay: int | None = None, delay_ms: float | None = None
    ) -> RunResult:
        """The cell ``(delay, horizon)``, or ``delay_ms``'s steps' (KeyError:
        not swept, or skipped, saying why)."""
        if (delay is None) == (delay_ms is None):
            raise TypeError("Sweep.get: give delay= (steps) or delay_ms=, not both")
        if delay_ms is not None:
            steps = self.delay_steps or {}
            if float(delay_ms) not in steps:
                raise KeyError(
                    f"sweep cell delay_ms={delay_ms} was not swept: the sweep has "
                    f"delay_ms in {list(steps) or None}"
                )
            delay = steps[float(delay_ms)]
        key = (delay, horizon)
        if key in self.cells:
            return self.cells[key]
        if key in self.skipped:
            raise KeyError(
                f"sweep cell delay={delay}, horizon={horizon} was skipped: "
                f"{self.skipped[key]}"
            )
        raise KeyError(
            f"sweep cell delay={delay}, horizon={horizon} was not swept: the "
            f"sweep has delay in {list(self.delays)} and horizon in "
            f"{list(self.horizons)}"
        )

    @property
    def has_success(self) -> bool:
        """Whether every cell has a success signal (the plot draws it)."""
        return bool(self.cells) and all(
            r.success_rate is not None for r in self.cells.values()
        )

    def table(self) -> list[dict]:
        """One row per swept cell (a row per time with ``delay_ms``), delays
        outer: ``delay``, ``delay_ms``, ``horizon``, ``effective_horizon``,
        ``episodes``, ``success_rate`` and ``success_interval`` (None without
        a success signal), ``mean_return`` and ``mean_interval`` (95%),
        ``skipped`` (None, or why)."""
        rows = []
        axis = [(None, d) for d in self.delays]
        if self.delay_steps is not None:
            axis = list(self.delay_steps.items())
        for ms, d in axis:
            for h in self.horizons:
                row = {"delay": d, "horizon": h, "skipped": self.skipped.get((d, h))}
                if ms is not None:
                    row["delay_ms"] = ms
                result = self.cells.get((d, h))
                if result is not None:
                    n = result.num_episodes
                    s = result.stats(resamples=_stats.summary_resamples(n))
                    row.update(
                        effective_horizon=result.effective_horizon,
                        episodes=n,
                        success_rate=s["success_rate"],
                        success_interval=s["success_interval"],
                        mean_return=s["returns"]["mean"],
                        mean_interval=s["returns"]["mean_interval"],
                    )
                rows.append(row)
        return rows

    def summary(self) -> str:
        """The table as text, with how many programs compiled and the time."""
        head = ("delay", "horizon", "episodes", "success", "95% CI", "mean return")
        span = lambda pair: _summary._span(pair, ".3f") or "-"
        lines = []
        for row in self.table():
            delay = str(row["delay"])
            if "delay_ms" in row:
                delay = f"{row['delay_ms']:g} ms ({row['delay']})"
            line = [delay, str(row["horizon"])]
            if row["skipped"] is not None:
                lines.append([*line, "skipped"])
                continue
            rate, mean = row["success_rate"], row["mean_return"]
            line += [str(row["episodes"]), "-" if rate is None else f"{rate:.3f}"]
            line.append(span(row["success_interval"]))
            if mean is not None:
                mean = f"{mean:.3f} {span(row['mean_interval'])}"
            lines.append([*line, mean or "-"])
        widths = [
            max(len(r[i]) for r in [head, *lines] if i < len(r)) for i in range(6)
        ]
        fmt = lambda r: "  ".join(f"{v:<{widths[i]}}" for i, v in enumerate(r)).rstrip()
        text = [fmt(head), *map(fmt, lines)]
        text.append(
            f"{len(self.cells)} cells, {self.programs} program(s) compiled, "
            f"{self.wall_time:.2f} s ({self.compile_time:.2f} s compiling)"
        )
        if self.skipped:
            text.append("skipped: a delay needs 0 < d < h and chunks of K >= h + d")
        return "\n".join(text)

    __str__ = summary

    def plot(self) -> Any:
        """Success rate (else mean return) against the delay, a line per
        horizon, with 95% intervals: a matplotlib ``Figure`` on an Agg canvas."""
        fig = _report._new_figure((6, 4), layout="tight")
        ax = fig.add_subplot(1, 1, 1)
        success = self.has_success
        value = "success_rate" if success else "mean_return"
        interval = "success_interval" if success else "mean_interval"
        rows = [r for r in self.table() if r["skipped"] is None]
        for h in self.horizons:
            line = [r for r in rows if r["horizon"] == h and r[value] is not None]
            if not line:
                continue
            x = [r.get("delay_ms", r["delay"]) for r in line]
            y = [r[value] for r in line]
            yerr = _report._errorbars(y, [r[interval] for r in line])
            ax.errorbar(x, y, yerr=yerr, marker="o", capsize=3, label=f"H={h}")
        ms = self.delay_steps is not None
        ax.set_xlabel(f"inference delay ({'ms' if ms else 'steps'})")
        ax.set_ylabel("success rate" if success else "mean return")
        ax.set_xticks(list(self.delay_steps) if ms else list(self.delays))
        ax.legend(title="horizon")
        ax.grid(alpha=0.3)
        return fig

    def to_dict(self) -> dict:
        """A JSON-serialisable dict: axes, cells, skipped cells, totals."""
        ms = self.delay_steps
        return {
            "sweep": {
                "delay": list(self.delays),
                "horizon": list(self.horizons),
                "delay_ms": None if ms is None else [list(x) for x in ms.items()],
            },
            "cells": [
                {"delay": d, "horizon": h, "result": r.to_dict()}
                for (d, h), r in self.cells.items()
            ],
            "skipped": [
                {"delay": d, "horizon": h, "reason": why}
                for (d, h), why in self.skipped.items()
            ],
            "programs": self.programs,
            "wall_time": self.wall_time,
            "compile_time": self.compile_time,
            "table": self.table(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Sweep:
        """The sweep ``to_dict`` wrote (ValueError: another dict, saying why)."""
        if not isinstance(d, dict) or "sweep" not in d or "cells" not in d:
            got = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise ValueError(
                f"a sweep dict was expected (Sweep.to_dict(), the JSON of jaxmesh "
                f"sweep), with keys sweep and cells; got {got}"
            )
        try:
            ms = d["sweep"].get("delay_ms")
            key = lambda c: (int(c["delay"]), int(c["horizon"]))
            return cls(
                delays=tuple(map(int, d["sweep"]["delay"])),
                horizons=tuple(map(int, d["sweep"]["horizon"])),
                cells={key(c): RunResult.from_dict(c["result"]) for c in d["cells"]},
                skipped={key(c): str(c["reason"]) for c in d.get("skipped", [])},
                programs=int(d.get("programs", 0)),
                wall_time=float(d.get("wall_time", math.nan)),
                compile_time=float(d.get("compile_time", math.nan)),
                delay_steps=None if ms is None else {float(m): int(n) for m, n in ms},
            )
        except (KeyError, TypeError) as e:
            raise ValueError(
                f"the sweep dict is malformed ({type(e).__name__}: {e}); expected "
                "what Sweep.to_dict() writes"
            ) from e


__all__ = ["sweep", "Sweep", "REFUSED"]
