"""A run's plots, and one self-contained HTML page (docs/evaluation.md,
"Plots and the HTML report"): ``SECTIONS``, functions of a ``Page`` that each
return a ``Section`` or None (left out). Every string from a result is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from jaxmesh._version import __version__
from jaxmesh.results import stats as _stats
from jaxmesh.results import summary as _summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: A ``jaxmesh.RunResult``, read by attribute (never imported: the dependency
#: runs from ``jaxmesh.results.result`` to here).
Result = Any

#: Episodes shown in the page's per-episode table (the JSON holds them all).
EPISODE_ROWS = 1000
#: The resolution of the embedded plots.
DPI = 100


# Plots -------------------------------------------------------------------------
def _new_figure(size: tuple[float, float], **kwargs: Any) -> Figure:
    """An empty ``Figure`` of ``size`` inches on an Agg canvas, not pyplot's; an
    ImportError names the extra."""
    try:
        # The package first: it fails even when a submodule is still imported.
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            f"jaxmesh's plots and HTML report need matplotlib, which cannot be "
            f"imported ({e}); install it with: pip install 'jaxmesh[report]'"
        ) from e
    fig = Figure(figsize=size, dpi=DPI, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def _constant(values: np.ndarray) -> bool:
    """Whether every episode has the same value (a line says it better)."""
    return values.size > 0 and bool(values.min() == values.max())


def constant_lines(result: Any) -> list[str]:
    """A line for each plot left out because every episode has the same value,
    e.g. "Every episode lasted 50 env steps."."""
    n = len(result.returns)
    every = "The one episode" if n == 1 else "Every episode"
    out = []
    returns = np.asarray(result.returns, np.float64)
    if _constant(returns):
        out.append(f"{every} returned {returns[0]:g}.")
    lengths = np.asarray(result.lengths, np.int64)
    if _constant(lengths):
        out.append(f"{every} lasted {lengths[0]:,} env steps.")
    return out


def _histogram(ax: Any, values: np.ndarray, xlabel: str) -> None:
    ax.hist(values, bins="auto", color="#4c72b0", edgecolor="white", linewidth=0.5)
    ax.axvline(float(values.mean()), color="#c44e52", linestyle="--", label="mean")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episodes")
    ax.legend(loc="best", frameon=False)


def _cdf(ax: Any, returns: np.ndarray) -> None:
    ax.ecdf(returns, color="#4c72b0")
    ax.set_xlabel("return")
    ax.set_ylabel("share of episodes with return <= x")
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)


def _success(ax: Any, flags: np.ndarray, indices: np.ndarray) -> None:
    from matplotlib.ticker import MaxNLocator

    running = np.cumsum(flags) / np.arange(1, flags.size + 1)
    ax.plot(indices, flags.astype(float), "|", color="#55a868", alpha=0.6, ms=6)
    ax.plot(indices, running, color="#4c72b0", label="success rate so far")
    ax.set_xlabel("episode index")
    # Episode indices are whole numbers: no tick at 0.2 of an episode.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if flags.size == 1:
        ax.set_xlim(indices[0] - 1, indices[0] + 1)
    ax.set_ylabel("success rate (ticks: episodes)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="center right", frameon=False)
    ax.grid(alpha=0.3)


def wrap(text: str, width: int) -> str:
    """``text`` in lines of at most ``width`` characters, broken at spaces and
    after ``_``, ``/`` or ``:`` (task names have no spaces); longer pieces cut."""
    lines = [""]
    for piece in re.split(r"(?<=[_/:])|(?= )", str(text)):
        while len(piece.lstrip()) > width:
            head, piece = piece.lstrip()[:width], piece.lstrip()[width:]
            lines += [head, ""]
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece.lstrip() if not lines[-1] else piece
    return "\n".join(line for line in lines if line)


def plot(result: Result, title: str | None = None) -> Figure:
    """A ``RunResult``'s plots as one matplotlib ``Figure`` on an Agg canvas,
    not registered with pyplot (docs/evaluation.md, "Plots and the HTML
    report"); ``title`` None: ``policy on env: N episodes``. An ImportError
    names the extra when matplotlib is missing.
    """
    returns = np.asarray(result.returns, np.float64)
    # Integers stay integers: numpy's "auto" bins of integers are at least 1 wide.
    lengths = np.asarray(result.lengths, np.int64)
    flags = _stats.success_flags(result.success, len(result.returns))
    panels: list[tuple] = []  # (title, draw, its arguments after the axes)
    if not _constant(returns):
        panels.append(("Returns", _histogram, returns, "return (sum of rewards)"))
        panels.append(("Returns CDF", _cdf, returns))
    if not _constant(lengths):
        panels.append(("Episode lengths", _histogram, lengths, "length (env steps)"))
    if flags is not None:
        indices = np.asarray(result.indices)
        panels.append(("Success over episodes", _success, flags, indices))
    rows, cols = (2, 2) if len(panels) == 4 else (1, max(len(panels), 1))
    fig = _new_figure((4.4 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (panel_title, draw, values, *args) in zip(axes, panels, strict=False):
        ax.set_title(panel_title)
        if values.size:
            draw(ax, values, *args)
        else:
            centre = {"ha": "center", "va": "center", "transform": ax.transAxes}
            ax.text(0.5, 0.5, "no episodes", **centre)
            ax.set(xticks=[], yticks=[])
    if not panels:  # every figure is one value: say so instead of drawing it
        axes[0].set_axis_off()
        axes[0].text(
            0.5, 0.5, "\n".join(constant_lines(result)), ha="center", va="center"
        )
    if title is None:
        name = f"{result.policy or 'policy'} on {_summary.short_env(result.env)}"
        title = f"{name}: {len(returns):,} episodes"
    # The characters of a 12-point title that fit across; a "$" is not TeX.
    chars = max(20, int(fig.get_figwidth() * 72 / (0.6 * 12.0)) - 2)
    fig.suptitle(wrap(title, chars), parse_math=False)
    return fig


# HTML helpers ------------------------------------------------------------------
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _tr(key: str, value: Any, label: str, cells: str) -> str:
    """A table row headed ``label``; ``data-value`` holds the value as JSON."""
    return (
        f"<tr data-key='{esc(key)}' data-value='{esc(json.dumps(value))}'>"
        f"<th scope='row'>{esc(label)}</th>{cells}</tr>"
    )


def _row(key: str, label: str, value: Any, text: str, note: str = "") -> str:
    """A row showing ``text``, and ``note`` when given."""
    note_cell = f"<td class='note'>{esc(note)}</td>" if note else "<td></td>"
    # A long value (an instruction, a digest, a path) wraps; a number does not.
    kind = "value long" if len(str(text)) > 32 else "value"
    return _tr(key, value, label, f"<td class='{kind}'>{esc(text)}</td>{note_cell}")


def _html_rows(rows: Sequence[_summary.Row]) -> list[str]:
    return [_row(r.key, r.label, r.value, r.text, r.note) for r in rows]


def _table(rows: Sequence[str], table_id: str, head: Sequence[str]) -> str:
    cells = "".join(f"<th scope='col'>{esc(h)}</th>" for h in head)
    return (
        f"<div class='wide'><table id='{esc(table_id)}'><thead><tr>{cells}</tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


class Section(NamedTuple):
    """One part of the page (``body``: HTML, every string escaped)."""

    id: str
    title: str
    body: str


class Page(NamedTuple):
    """What every section reads (``base``: the folder relative video paths
    are read from; None: the working directory)."""

    result: Result
    stats: dict[str, Any]
    episode_rows: int = EPISODE_ROWS
    base: str | Path | None = None


# Sections ----------------------------------------------------------------------
def _rows(page: Page, table: str, head: Sequence[str]) -> str:
    """The table ``<table>-table`` of the ``summary.rows`` of ``table``."""
    rows = _summary.rows(page.result, page.stats)
    html_rows = _html_rows([r for r in rows if r.table == table])
    return _table(html_rows, f"{table}-table", head)


def summary_section(page: Page) -> Section:
    """The statistics of ``result.stats()`` (``data-key``: each one's path)."""
    body = _rows(page, "summary", ("statistic", "value", "how"))
    return Section("summary", "Summary", body)


def plots_section(page: Page, title: str | None = None) -> Section:
    """``plot(result, title)`` as one embedded PNG, with ``constant_lines``."""
    lines = constant_lines(page.result)
    body = "".join(f"<p class='constant'>{esc(line)}</p>" for line in lines)
    fig = plot(page.result, title)
    captions = {
        "Returns": "Returns: how many episodes scored each return (dashed: the mean).",
        "Returns CDF": "Returns CDF: the share of episodes that scored at most a "
        "return; a curve further right is a better policy.",
        "Episode lengths": "Episode lengths: how many env steps the episodes lasted.",
        "Success over episodes": "Success over episodes: the success rate of the "
        "episodes so far, in episode order (it settles as episodes add up); "
        "ticks mark each episode's outcome.",
    }
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    if titles:  # else nothing varies: the lines say it all
        body += _figure(fig, " ".join(captions[t] for t in titles))
    return Section("plots", "Plots", body)


def _figure(fig: Figure, caption: str) -> str:
    """``fig`` as an embedded PNG, its panels' titles as its ``alt``."""
    titles = ", ".join(ax.get_title() for ax in fig.axes if ax.get_title())
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    uri = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    return (
        f"<figure><img src='{esc(uri)}' alt='{esc('Plots: ' + titles)}'>"
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def settings_section(page: Page) -> Section:
    """The run's settings and totals (``data-key``: the ``RunResult`` field)."""
    body = _rows(page, "settings", ("setting", "value", "note"))
    body += "<h3>Totals</h3>" + _rows(page, "totals", ("total", "value", "note"))
    return Section("settings", "Settings", body)


def provenance_section(page: Page) -> Section:
    """The seeds, the run's identity and when and with what it was made."""
    note = (
        "What made these numbers. The settings above and these rows are in the "
        "results JSON too (RunResult.to_dict()); a rerun with the same settings, "
        "seeds and versions gives the same episodes."
    )
    body = f"<p>{esc(note)}</p>" + _rows(page, "provenance", ("what", "value", "note"))
    return Section("provenance", "Provenance", body)


def telemetry_section(page: Page) -> Section | None:
    """Per-call timings of a host-stepped run; None for a JAX env."""
    result = page.result
    if not result.telemetry:
        return None
    rows = []
    for name, s in result.telemetry.items():
        cells = "".join(f"<td>{esc(c)}</td>" for c in _summary.telemetry_cells(name, s))
        rows.append(_tr(name, s, name, cells))
    note = (
        "One sample per call of the host loop: predict is one jitted agent step, "
        "env_step the env's own stepping time; served envs add encode and decode "
        "(building and reading a message), wire (a round trip less the server's "
        "env time) and queue (how long a reply waited), and message sizes; "
        "transport_shm is a flag per served session (yes: shared memory), and "
        "worker_lost / server_lost count events."
    )
    body = f"<p>{esc(note)}</p>" + _table(
        rows, "telemetry-table", ("series", *_summary.STAT_NAMES)
    )
    return Section("telemetry", "Telemetry", body)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def episodes_section(page: Page) -> Section:
    """The first ``page.episode_rows`` episodes, one row each."""
    body = episodes_table(page.result, page.episode_rows, "episodes")
    return Section("episodes", "Episodes", body)


def episodes_table(result: Result, episode_rows: int, table_id: str) -> str:
    """A note and the table of ``result``'s first ``episode_rows`` episodes
    (ids ``<table_id>-note`` and ``<table_id>-table``)."""
    n = len(result.returns)
    shown = min(n, episode_rows)
    flags = _stats.success_flags(result.success, len(result.returns))
    head = ["episode", "seed", "return", "length", "terminated", "truncated"]
    head += ["plans", "lane"] + ([] if flags is None else ["success"])
    rows = []
    for i in range(shown):
        # EpisodeResult's first eight fields: index to lane.
        cells = [*result.episode(i)[:8], *([] if flags is None else [bool(flags[i])])]
        rows.append(
            f"<tr data-value='{esc(json.dumps(cells))}'>"
            + "".join(f"<td>{esc(_cell(c))}</td>" for c in cells)
            + "</tr>"
        )
    note = f"All {n:,} episodes."
    if shown < n:
        note = (
            f"Showing the first {shown:,} of {n:,} episodes; every episode is in "
            "the results JSON (RunResult.to_dict())."
        )
    return f"<p id='{esc(table_id)}-note'>{esc(note)}</p>" + _table(
        rows, f"{table_id}-table", head
    )


#: ``data:`` URI media types of the video files the report embeds.
VIDEO_TYPES = {".gif": "image/gif", ".mp4": "video/mp4", ".webm": "video/webm"}


def videos_section(page: Page) -> Section | None:
    """``result.videos`` embedded from ``data:`` URIs (a GIF as an ``<img>``,
    else a ``<video controls>``); a missing file or another type is named."""
    videos = page.result.videos
    if not videos:
        return None
    items = []
    for name in videos:
        path = Path(page.base or "", name)  # an absolute name stays as it is
        kind = VIDEO_TYPES.get(path.suffix.lower())
        label = f"Video: {Path(name).name}"
        why = "unreadable" if path.exists() else "not found"
        if kind is None:
            why = f"not embedded (a {path.suffix or 'typeless'} file)"
        if kind is None or not path.is_file():
            items.append(f"<p class='notice'>{esc(f'{label}: {why}.')}</p>")
            continue
        uri = f"data:{kind};base64," + base64.b64encode(path.read_bytes()).decode()
        if kind == "image/gif":
            media = f"<img src='{esc(uri)}' alt='{esc(label)}'>"
        else:
            media = (
                f"<video controls loop muted playsinline src='{esc(uri)}' "
                f"aria-label='{esc(label)}'></video>"
            )
        items.append(
            f"<figure data-video='{esc(Path(name).name)}'>{media}"
            f"<figcaption>{esc(label)}</figcaption></figure>"
        )
    note = (
        "Recorded episodes (evaluate(record=...)), rendered with jaxmesh.render: "
        "what the policy did, step by step."
    )
    grid = f"<div class='videos'>{''.join(items)}</div>"
    return Section("videos", "Videos", f"<p>{esc(note)}</p>" + grid)


#: The page's sections, in order.
SECTIONS: tuple[Callable[[Page], Section | None], ...] = (
    summary_section,
    plots_section,
    videos_section,
    settings_section,
    provenance_section,
    telemetry_section,
    episodes_section,
)

_CSS = """
:root { color-scheme: light; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: #1f2328; max-width: 1100px; margin: 0 auto; padding: 1.5rem; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: 0.2rem;
  margin-top: 2rem; }
h3 { font-size: 1rem; }
.lede { color: #59636e; margin-top: 0; }
.notice { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px;
  padding: 0.5rem 0.8rem; }
nav ul { list-style: none; padding: 0; display: flex; gap: 1rem; flex-wrap: wrap; }
nav a { color: #0969da; text-decoration: none; }
table { border-collapse: collapse; margin: 0.5rem 0;
  font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d7de; padding: 0.25rem 0.6rem; text-align: left; }
thead th { background: #f6f8fa; }
td.value { text-align: right; white-space: nowrap; }
td.value.long { text-align: left; white-space: normal; overflow-wrap: anywhere;
  min-width: 12rem; }
td.note { color: #59636e; }
#episodes-table td, #telemetry-table td { text-align: right; }
#tasks-table th[scope=row] { min-width: 10rem; }
.wide { max-width: 100%; overflow-x: auto; }
figure { margin: 0; }
img { max-width: 100%; height: auto; }
.videos { display: flex; flex-wrap: wrap; gap: 1rem; }
.videos video, .videos img { width: 384px; max-width: 100%; height: auto;
  image-rendering: pixelated; background: #000; }
figcaption { color: #59636e; margin-top: 0.3rem; }
footer { color: #59636e; margin-top: 2rem; font-size: 0.85rem; }
"""


def _notices(result: Result) -> list[str]:
    """Warnings a reader must see first."""
    out = []
    if result.asynchronous:
        out.append(
            f"Asynchronous run (prefetch_lead={result.prefetch_lead}): each chunk "
            "was planned from an observation up to that many steps old; its score "
            "is not comparable to a synchronous one."
        )
    if result.max_episode_seconds is not None:
        out.append(
            f"Episodes were capped at {result.max_episode_seconds:g} s of wall "
            "clock: which episodes were truncated depends on timing, and a rerun "
            "may differ."
        )
    if not len(result.returns):
        out.append("This result holds no episodes.")
    return out


def report_html(
    result: Result,
    *,
    resamples: int | None = None,
    episode_rows: int = EPISODE_ROWS,
    base: str | Path | None = None,
) -> str:
    """The report page of ``result``: an HTML5 document that refers to nothing
    outside itself.

    Args:
      result: the run's ``RunResult``.
      resamples: bootstrap resamples; None: as ``result.summary()``.
      episode_rows: episodes shown in the per-episode table.
      base: the folder relative ``result.videos`` paths are read from (None:
        the working directory).
    """
    if resamples is None:  # the summary's rule
        resamples = _stats.summary_resamples(len(result.returns))
    stats = result.stats(resamples=resamples)
    page = Page(result, stats, episode_rows, base)
    parts = [part for part in (fn(page) for fn in SECTIONS) if part is not None]
    name = f"{result.policy or 'policy'} on {_summary.short_env(result.env) or 'env'}"
    lede = (
        f"{len(result.returns):,} episodes on {result.num_envs:,} lanes, "
        f"{result.env_steps:,} env steps in {result.wall_time:.2f} s"
    )
    return _document(name, lede, _notices(result), parts)


def _document(
    name: str, lede: str, notices: Sequence[str], parts: Sequence[Section]
) -> str:
    """A complete page, its CSS inline."""
    nav = "".join(f"<li><a href='#{esc(p.id)}'>{esc(p.title)}</a></li>" for p in parts)
    notices = "".join(f"<p class='notice'>{esc(t)}</p>" for t in notices)
    body = "".join(
        f"<section id='{esc(p.id)}'><h2>{esc(p.title)}</h2>{p.body}</section>"
        for p in parts
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<meta name='generator' content='jaxmesh {esc(__version__)}'>"
        f"<title>{esc(f'jaxmesh report: {name}')}</title>"
        f"<style>{_CSS}</style></head>\n<body>"
        f"<header><h1>{esc(name)}</h1><p class='lede'>{esc(lede)}</p></header>"
        f"{notices}<nav><ul>{nav}</ul></nav>\n{body}\n"
        f"<footer>{esc(f'Written by jaxmesh {__version__} (jaxmesh report).')}"
        "</footer></body></html>\n"
    )


def write_report(
    result: Result,
    path: str | Path,
    *,
    resamples: int | None = None,
    episode_rows: int = EPISODE_ROWS,
    base: str | Path | None = None,
) -> Path:
    """Writes ``report_html(result, ...)`` (of a ``SuiteResult``:
    ``suite_report_html``) to ``path`` (parents made) and returns it; an
    ImportError names the extra when matplotlib is missing."""
    html_of = suite_report_html if hasattr(result, "tasks") else report_html
    page = html_of(result, resamples=resamples, episode_rows=episode_rows, base=base)
    return _write(path, page)


def _write(path: str | Path, page: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


# Suites -------------------------------------------------------------------------
def _errorbars(values: Sequence[float], intervals: Sequence[Any]) -> np.ndarray:
    """matplotlib's ``yerr`` (distances below and above) of intervals."""
    low = [v - i[0] if i else 0.0 for v, i in zip(values, intervals, strict=True)]
    high = [i[1] - v if i else 0.0 for v, i in zip(values, intervals, strict=True)]
    return np.maximum(np.array([low, high], np.float64), 0.0)


def suite_plot(suite: Any, stats: dict | None = None) -> Figure:
    """A suite's figure: horizontal bars per task, its name wrapped beside
    them, of the success rate (when every task has a signal) and the mean
    return, with their intervals as whiskers."""
    s = suite.stats() if stats is None else stats
    rows = s["tasks"]
    names = [wrap(row["task"], 34) for row in rows]
    rated = all(row["success_rate"] is not None for row in rows)
    lines = sum(name.count("\n") + 1 for name in names)
    height = max(2.4, 1.2 + 0.2 * lines + 0.12 * len(names))
    fig = _new_figure((11.0, height), layout="constrained")
    axes = fig.subplots(1, 2 if rated else 1, squeeze=False, sharey=True)[0]
    y = np.arange(len(names))

    panels = [  # (axes, key, interval, color, title, label)
        (axes[-1], "mean_return", "return_interval", "#4c72b0")
        + ("Mean return per task", "mean return (whiskers: interval)")
    ]
    if rated:
        panels.append(
            (axes[0], "success_rate", "success_interval", "#55a868")
            + ("Success rate per task", "success rate (whiskers: Wilson interval)")
        )
    for ax, key, interval, color, title, label in panels:
        values = [row[key] or 0.0 for row in rows]
        ax.barh(y, values, color=color)
        xerr = _errorbars(values, [row[interval] for row in rows])
        ax.errorbar(values, y, xerr=xerr, fmt="none", ecolor="#1f2328", capsize=4)
        ax.set_title(title)
        ax.set_xlabel(label)
    if rated:
        axes[0].set_xlim(0.0, 1.05)
    axes[0].set_yticks(y, names, fontsize=8)
    axes[0].invert_yaxis()  # the first task on top, as in the table
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    return fig


def tasks_section(suite: Any, stats: dict) -> Section:
    """The per-task table (``SuiteResult.table``; ``data-task``: the task)."""
    cells = suite.table(stats)
    rows = []
    for row in cells[1:]:
        # A <wbr> after each _, / and : lets a long task name wrap in its cell.
        name = "<wbr>".join(map(esc, re.split(r"(?<=[_/:])", str(row[0]))))
        values = "".join(f"<td class='value'>{esc(c)}</td>" for c in row[1:])
        head = f"<tr data-task='{esc(row[0])}'><th scope='row'>{name}</th>"
        rows.append(f"{head}{values}</tr>")
    level = f"{stats['confidence']:.0%}"
    note = (
        f"Per task: the success rate with its {level} Wilson interval and the mean "
        f"return with its {level} percentile bootstrap interval "
        f"({stats['resamples']:,} resamples). The mean over tasks counts every "
        "task once; pooled counts every episode once."
    )
    body = f"<p>{esc(note)}</p>" + _table(rows, "tasks-table", cells[0])
    instructions = getattr(suite, "instructions", {}) or {}
    if any(v is not None for v in instructions.values()):
        said = [
            f"<tr><th scope='row'>{esc(k)}</th><td>{esc(v or 'none')}</td></tr>"
            for k, v in instructions.items()
        ]
        body += "<h3>Instructions</h3>" + _table(
            said, "instructions-table", ("task", "instruction")
        )
    return Section("tasks", "Tasks", body)


def suite_provenance_section(suite: Any) -> Section:
    """Each task's setting and provenance rows."""
    body, head = "", ("what", "value", "note")
    for k, (name, result) in enumerate(suite.tasks.items()):
        made = _summary.setting_rows(result) + _summary.provenance_rows(result)
        table = _table(_html_rows(made), f"task-{k}-provenance-table", head)
        body += f"<h3>{esc(f'Task {name}')}</h3>" + table
    return Section("provenance", "Provenance", body)


def suite_report_html(
    suite: Any,
    *,
    resamples: int | None = None,
    episode_rows: int = EPISODE_ROWS,
    base: str | Path | None = None,
) -> str:
    """A ``SuiteResult``'s page: the tasks table and figure, each task's
    plots, videos and episodes, and the provenance (arguments as
    ``report_html``'s)."""
    if resamples is None:
        resamples = _stats.summary_resamples(suite.num_episodes)
    stats = suite.stats(resamples=resamples)
    caption = "Bars: each task; whiskers: the intervals of the Tasks table."
    overview = _figure(suite_plot(suite, stats), caption)
    parts = [tasks_section(suite, stats), Section("plots", "Plots", overview)]
    for k, (name, result) in enumerate(suite.tasks.items()):
        page = Page(result, {}, episode_rows, base)
        env = _summary.short_env(result.env)
        body = f"<p>{esc(f'{result.num_episodes:,} episodes of {env}')}</p>"
        body += plots_section(page, f"{name}: {result.num_episodes:,} episodes").body
        shown = videos_section(page)
        if shown is not None:  # the task's recorded episodes
            body += shown.body
        table = episodes_table(result, episode_rows, f"task-{k}-episodes")
        body += "<h3>Episodes</h3>" + table
        parts.append(Section(f"task-{k}", f"Task {name}", body))
    parts.append(suite_provenance_section(suite))
    rs = list(suite.tasks.values())
    policy = rs[0].policy if rs else "policy"
    name = f"{policy or 'policy'} on {suite_name(suite)}"
    lede = (
        f"{suite.num_episodes:,} episodes over {len(rs)} tasks in "
        f"{suite.wall_time:.2f} s"
    )
    notices = [t for r in rs[:1] for t in _notices(r) if "holds no" not in t]
    return _document(name, lede, notices, parts)


def suite_name(suite: Any) -> str:
    """``libero:libero_spatial (2 tasks)`` when every task is of one
    benchmark suite (``<family>:<suite>/<i>`` ids), else ``a suite of N tasks``."""
    envs = [_summary.short_env(r.env) for r in suite.tasks.values()]
    heads = {env.rpartition("/")[0] for env in envs}
    n = len(envs)
    count = f"{n} task" + ("" if n == 1 else "s")
    if len(heads) == 1 and ":" in next(iter(heads)):
        return f"{heads.pop()} ({count})"
    return f"a suite of {count}"


write_suite_report = write_report
