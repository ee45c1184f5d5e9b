"""The one table of a run's summary rows (``rows``), which both ``text``
(``result.summary()``) and the HTML report print, so that a figure added here
shows in both (docs/evaluation.md, "Plots and the HTML report").
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from jaxmesh import text as _text
from jaxmesh.results import stats as _stats

#: The columns of a telemetry series (``RunResult.telemetry``), in order.
STAT_NAMES = ("count", "mean", "p50", "p95", "p99")


class Row(NamedTuple):
    """One figure: ``key``, its dotted path in ``result.stats()`` or the
    field; ``value``, plain data (the report's ``data-value``); ``note``, how
    it was computed; ``table``, ``summary``, ``settings``, ``totals`` or
    ``provenance``."""

    key: str
    label: str
    value: Any
    text: str
    note: str = ""
    table: str = "summary"


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _at(stats: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        stats = stats[part]
    return stats


def _stat_rows(result: Any, stats: dict[str, Any]) -> list[Row]:
    """The statistics."""
    episodes = stats["episodes"]
    out = [Row("episodes", "episodes", episodes, f"{episodes:,}")]
    if not episodes:
        return out
    level, n, seed = f"{stats['confidence']:.0%}", stats["resamples"], stats["seed"]
    how = f"percentile bootstrap, {n:,} resamples, seed {seed}"

    def num(key: str, label: str, note: str = "", digits: int = 3) -> Row:
        return Row(key, label, _at(stats, key), _num(_at(stats, key), digits), note)

    def span(key: str, label: str) -> Row:
        v = _at(stats, key)
        text = _span(v, ".3f") or "n/a (one episode)"
        return Row(key, f"{label}, {level} interval", v, text, how)

    error, at_most = "std / sqrt(episodes)", "of the episodes return at most this"
    middle = "interquartile mean: the mean of the middle half of the returns"
    std = "sample standard deviation (ddof = 1)"
    resamples = f"{n:,} (percentile bootstrap, seed {seed})"
    few = "fewer for a very large run, so that the summary takes seconds"
    quantiles = [
        num(f"returns.quantiles.{k}", f"return {k}", f"{k[1:]}% {at_most}")
        for k in stats["returns"]["quantiles"]
    ]
    out += [
        num("returns.mean", "mean return"),
        num("returns.std", "std of the returns", std),
        num("returns.standard_error", "standard error of the mean", error),
        span("returns.mean_interval", "mean return"),
        num("returns.iqm", "IQM return", middle),
        span("returns.iqm_interval", "IQM return"),
        Row("resamples", "bootstrap resamples", n, resamples, few),
        *quantiles,
        num("returns.min", "min return"),
        num("returns.max", "max return"),
        num("lengths.mean", "mean length", "env steps per episode", 1),
        *_success_rows(stats),
    ]
    for name, m in (stats.get("metrics") or {}).items():
        text = "n/a (no value)" if m["mean"] is None else f"{m['mean']:.4g}"
        label = f"metric {name} ({m['reduction']}), mean"
        note = "over the episodes that have a value"
        out.append(Row(f"metrics.{name}.mean", label, m["mean"], text, note))
    for key, note in (
        ("terminated", "episodes the env ended (a failure or a goal)"),
        ("truncated", "episodes cut by a step or time limit"),
    ):
        count = int(np.sum(getattr(result, key)))
        out.append(Row(key, key, count, f"{count:,}", note))
    return out


def _success_rows(stats: dict[str, Any]) -> list[Row]:
    """The success rates (none without a success key)."""
    out: list[Row] = []
    n, level = stats["episodes"], f"{stats['confidence']:.0%}"
    mode, key = stats.get("success_mode"), stats.get("success_key")
    named = {"once": "success once", "end": "success at end"}.get(mode)
    label = "success rate" + (f" ({named}, the headline)" if named else "")
    rate = stats["success_rate"]
    if rate is not None:
        pair = stats["success_interval"]
        wilson = f"success rate, {level} Wilson interval"
        text = _span(pair, ".1%")
        out += [
            Row("success_rate", label, rate, f"{rate:.1%}", f"success_mode={mode!r}"),
            Row("success_interval", wilson, pair, text, "Wilson score interval"),
        ]
    elif key is not None:
        why = f"n/a (some episodes had no {key!r} in their info)"
        out.append(Row("success_rate", label, None, why))
    if key is None:
        return out
    for name, label, note in (
        ("success_once_rate", "success once", "any step of the episode"),
        ("success_at_end_rate", "success at end", "the episode's last step"),
    ):
        value = stats.get(name)
        note = f"the success signal was true at {note}"
        out.append(Row(name, label, value, _pct(value), note))
    at_reset = stats.get("successes_at_reset")
    if at_reset is None:
        text, note = "unknown", "the env's reset gives no success signal"
    else:
        text = f"{at_reset:,} of {n:,} episodes"
        note = "episodes whose success signal was already true at reset"
    out.append(Row("successes_at_reset", "successful at reset", at_reset, text, note))
    return out


def setting_rows(result: Any) -> list[Row]:
    """What ran."""
    cap, chunk = result.max_episode_seconds, result.chunk

    def field(key: str, label: str, text: str | None = None, note: str = "") -> Row:
        value = getattr(result, key)
        return Row(key, label, value, str(value) if text is None else text, note)

    rows = [
        field("policy", "policy", result.policy or "n/a"),
        field("env", "env", short_env(result.env) or "n/a"),
    ]
    if result.instruction is not None:
        rows.append(field("instruction", "instruction"))
    capped = "s (wall clock: results depend on timing and may differ between runs)"
    cap = "none" if cap is None else f"{cap:g} {capped}"
    chunks = "one action per plan" if chunk is None else f"chunks of {chunk} actions"
    horizon = "actions of a chunk executed before the next plan"
    effective = "min(horizon, chunk length)"
    lead = "steps a chunk is planned before it plays"
    # How chunks were played (synchronous, asynchronous, delayed, ensembled).
    mode = (
        f"asynchronous (prefetch_lead={result.prefetch_lead}; not comparable to "
        "a synchronous score)"
        if result.asynchronous
        else "synchronous"
    )
    if result.delay:
        mode = (
            f"inference delay of {result.delay} steps (each chunk planned "
            f"{result.delay} steps before it plays, its first {result.delay} "
            "actions skipped)"
        )
        if result.delay_ms is not None:
            mode += f", from delay_ms={result.delay_ms:g}"
    elif result.delay_ms is not None:
        mode += " (delay_ms=0: no delay)"
    if result.execution is not None:
        mode += f", temporal ensembling: {result.execution}"
    rows += [
        field("num_envs", "lanes (num_envs)", f"{result.num_envs:,}"),
        field("horizon", "horizon", None, horizon),
        field("effective_horizon", "effective horizon", None, effective),
        field("chunk", "chunk length", chunks, "actions a plan returns"),
        field("prefetch_lead", "prefetch lead", None, lead),
        Row("mode", "mode", mode, mode),
        field("plan_tile", "plan tile", None, "rows per policy call"),
        field("max_episode_seconds", "max episode seconds", cap),
    ]
    for i, loss in enumerate(result.server_losses):
        back = loss.get("rejoined_at_seconds")
        text = (
            f"{loss.get('server')} at {loss.get('at_seconds', 0):.1f} s: "
            f"{loss.get('lanes')} lanes out, {loss.get('episodes_rerun')} unfinished "
            f"episodes run again ({loss.get('error')})"
            + ("" if back is None else f"; rejoined at {back:.1f} s")
        )
        rows.append(Row(f"server_losses.{i}", "server lost", loss, text))
    lost = (getattr(result, "telemetry", None) or {}).get("worker_lost")
    if lost:  # a worker process died (a crash, the OOM killer) and was replaced
        n = int(lost["count"])
        text = (
            f"{n} worker process{'es' if n > 1 else ''} lost and replaced; "
            "the episodes they were running ran again from their seeds"
        )
        note = "worker processes that died during the run"
        rows.append(Row("telemetry.worker_lost.count", "workers lost", n, text, note))
    return [row._replace(table="settings") for row in rows]


def _total_rows(result: Any) -> list[Row]:
    """What it cost."""
    r = result
    resumed = getattr(r, "resumed_part", None)
    rate = "the resumed part's env steps / its run time" if resumed else ""
    per_step = f"{r.rows_per_step:.3f} ({r.plan_tile} rows per call)"
    padding = "rows the policy computed, padding included"
    rate = rate or "env steps / run time"
    rows = [  # (field, label, text, note)
        ("env_steps", "env steps", f"{r.env_steps:,}", ""),
        ("policy_rows", "policy rows", f"{r.policy_rows:,}", padding),
        ("rows_per_step", "policy rows per env step", per_step, "ideal: 1 / horizon"),
        ("steps_per_second", "env steps / s", f"{r.steps_per_second:,.0f}", rate),
        ("wall_time", "wall time", f"{r.wall_time:.2f} s", "the whole call"),
        ("compile_time", "compile time", f"{r.compile_time:.2f} s", ""),
        ("run_time", "run time", f"{r.run_time:.2f} s", ""),
    ]
    return [
        Row(k, label, getattr(r, k), text, note, "totals")
        for k, label, text, note in rows
    ]


def seeds_text(seeds: Any) -> str:
    """A run's seeds in a few words: a range when they are consecutive."""
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    n = seeds.size
    if not n:
        return "none"
    if n > 1 and np.array_equal(seeds, np.arange(seeds[0], seeds[0] + n)):
        return f"{seeds[0]} to {seeds[-1]} ({n:,} seeds, in episode order)"
    shown = ", ".join(str(s) for s in seeds[:8])
    return shown + (f", ... ({n:,} seeds)" if n > 8 else "")


def provenance_rows(result: Any) -> list[Row]:
    """The seeds, the run's identity and when and with what it was made."""
    seeds = np.asarray(result.seeds, np.int64).reshape(-1)
    span = None if not seeds.size else [int(seeds[0]), int(seeds[-1])]
    value = {"count": int(seeds.size), "first_last": span}
    rows = [Row("seeds", "seeds", value, seeds_text(seeds))]
    for key, value in sorted((result.fingerprint or {}).items()):
        rows.append(
            Row(f"fingerprint.{key}", f"{key} (run identity)", value, f"{value}")
        )
    made = result.provenance or {}
    date = made.get("date")
    rows.append(Row("provenance.date", "date (UTC)", date, date or "not recorded"))
    for name, v in (made.get("versions") or {}).items():
        rows.append(Row(f"provenance.versions.{name}", name, v, v or "not installed"))
    if not made:
        note = "the result does not say when or with which versions it was made"
        rows[-1] = rows[-1]._replace(note=note)
    return [row._replace(table="provenance") for row in rows]


def rows(result: Any, stats: dict[str, Any]) -> list[Row]:
    """Every row: the settings, the statistics (``stats``:
    ``result.stats()``), the totals and the provenance (not in the text)."""
    return (
        setting_rows(result)
        + _stat_rows(result, stats)
        + _total_rows(result)
        + provenance_rows(result)
    )


def text(result: Any) -> str:
    """``result``'s summary as text, a line per row (``summary_resamples``)."""
    stats = result.stats(resamples=_stats.summary_resamples(len(result.returns)))
    table = [row for row in rows(result, stats) if row.table != "provenance"]
    width = max(len(row.label) for row in table)
    return "\n".join(f"{row.label:<{width}}  {row.text}" for row in table)


def short_env(env: str) -> str:
    """The env's id as a reader knows it: ``gymnasium:libero:...`` (a LIBERO
    task run as a gymnasium env) as ``libero:...``; other ids as they are."""
    env = str(env or "")
    rest = env.removeprefix("gymnasium:")
    return rest if rest != env and rest.startswith("libero:") else env


#: The telemetry series that are neither times nor sizes (``_bytes``): a flag
#: prints as the share of samples that were 1, an event as its count.
UNITS = {
    "transport_shm": "flag",
    "worker_lost": "count",
    "server_lost": "count",
    "server_rejoined": "count",
}


def telemetry_cells(name: str, s: dict[str, float]) -> list[str]:
    """One telemetry series' cells under ``STAT_NAMES`` (times in ms, sizes in
    bytes, ``UNITS``' flags as a share and events as a count)."""
    name = str(name)
    kind = UNITS.get(name, "bytes" if name.endswith("_bytes") else "s")
    count = f"{int(s['count']):,}"
    if kind == "flag":
        return [count, f"{s['mean']:.0%} yes", "", "", ""]
    if kind == "count":
        return [count, "", "", "", ""]
    if kind == "bytes":
        return [count, *(f"{s[k]:,.0f} B" for k in STAT_NAMES[1:])]
    return [count, *(f"{1000 * s[k]:.3f} ms" for k in STAT_NAMES[1:])]


def telemetry_text(telemetry: dict[str, dict[str, float]] | None) -> str:
    """A telemetry table of ``telemetry_cells``."""
    if not telemetry:
        return "no telemetry (recorded for host-stepped envs only)"
    table = [("series", *STAT_NAMES)]
    table += [(name, *telemetry_cells(name, s)) for name, s in telemetry.items()]
    return "\n".join(line.rstrip() for line in _text.aligned(table))


def text_table(rows: list[list[str]], rule_before_last: int = 0) -> list[str]:
    """``text.aligned`` lines with a rule under the header and, with
    ``rule_before_last``, one above that many last rows."""
    lines = _text.aligned(rows)
    rule = "  ".join("-" * w for w in _text.widths(rows))
    lines.insert(1, rule)
    if rule_before_last:
        lines.insert(len(lines) - rule_before_last, rule)
    return lines


def _span(pair: Any, fmt: str) -> str:
    return "" if pair is None else f"[{pair[0]:{fmt}}, {pair[1]:{fmt}}]"


def suite_table(s: dict[str, Any]) -> list[list[str]]:
    """A suite's table as text cells (``s``: ``SuiteResult.stats()``): a
    header, a row per task, the mean over tasks and the pooled row (success
    columns only when a task has a signal)."""
    mode = s.get("success_mode")
    other = {"once": "success_at_end_rate", "end": "success_once_rate"}.get(mode)
    other_name = {"once": "at end", "end": "once"}.get(mode, "")
    head = ["task", "episodes", f"success ({mode or 'n/a'})", "interval"]
    head += [other_name, "at reset", "mean return", "interval"]

    def row_of(name: str, row: dict, interval: bool = True) -> list[str]:
        at_reset = row.get("successes_at_reset")
        return [
            name,
            str(row["episodes"]),
            _pct(row["success_rate"]),
            _span(row["success_interval"], ".1%") if interval else "",
            _pct(row.get(other)) if other else "n/a",
            "n/a" if at_reset is None else str(at_reset),
            "n/a" if row["mean_return"] is None else f"{row['mean_return']:.3f}",
            _span(row["return_interval"], ".3f") if interval else "",
        ]

    out = [head] + [row_of(row["task"], row) for row in s["tasks"]]
    over, pooled = s["mean_over_tasks"], s["pooled"]
    rates = [row.get(other) for row in s["tasks"]] if other else [None]
    mean_row = {
        "episodes": sum(row["episodes"] for row in s["tasks"]),
        "success_rate": over["success_rate"],
        "success_interval": None,
        other or "": _stats.mean_if_all(rates),
        "successes_at_reset": pooled.get("successes_at_reset"),
        "mean_return": over["mean_return"],
        "return_interval": None,
    }
    out.append(row_of("mean over tasks", mean_row, interval=False))
    out.append(row_of("pooled", pooled))
    if all(row["success_rate"] is None for row in s["tasks"]):
        out = [row[:2] + row[6:] for row in out]  # no task has a signal
    return out


def suite_text(suite: Any) -> str:
    """``SuiteResult.summary()``: ``suite_table`` and how it was computed."""
    resamples = _stats.summary_resamples(max(suite.num_episodes, 1))
    lines = text_table(suite.table(), rule_before_last=2)
    mode = suite.success_mode
    if mode is not None:
        lines.append(
            f"(success {mode}: the headline, success_mode={mode!r}; once: the "
            "success signal was true at some step; at end: at the last step; at "
            "reset: episodes already successful at reset)"
        )
    lines.append(
        f"({_stats.CONFIDENCE:.0%} intervals: Wilson for success rates, "
        f"percentile bootstrap with {resamples:,} resamples for mean returns; "
        f"{len(suite.tasks)} tasks in {suite.wall_time:.2f} s)"
    )
    return "\n".join(lines)
