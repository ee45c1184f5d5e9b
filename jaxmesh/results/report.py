"""A run's plots, and one self-contained HTML page that a person can read.

``plot(result)`` draws a matplotlib ``Figure``; ``write_report(result, path)``
writes the page (what each section holds, and why the page stands alone:
docs/evaluation.md, "Plots and the HTML report"). Its summary, settings,
totals and provenance tables print the rows of ``jaxmesh.results.summary.rows``,
the same rows as ``result.summary()``. matplotlib (the ``[report]`` extra) is
imported on the first call that draws; figures are Agg ``Figure`` objects made
without ``matplotlib.pyplot`` (no global figure list, the user's backend left
alone). Every string from a result is escaped with ``html.escape``.

The page is ``SECTIONS``: functions of a ``Page`` that each return a
``Section``, or None (left out, with its contents entry).
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

#: A ``jaxmesh.RunResult``, read by attribute. This module never imports the class:
#: ``RunResult.plot()`` and ``RunResult.report()`` call into it, so the dependency
#: runs one way (``jaxmesh.results.result`` -> ``jaxmesh.results.report``, inside
#: those two methods).
Result = Any

#: Episodes shown in the page's per-episode table (the JSON holds them all).
EPISODE_ROWS = 1000
#: The resolution of the embedded plots.
DPI = 100
#: A table value longer than this many characters may wrap.
LONG_VALUE = 32
#: Characters per line of a task's name beside its bars.
SUITE_LABEL_CHARS = 34
#: What to install when matplotlib is missing.
INSTALL = "pip install 'jaxmesh[report]'"


# Plots -------------------------------------------------------------------------
def _matplotlib() -> tuple[type, type]:
    """``(Figure, FigureCanvasAgg)``, imported on first use.

    Raises:
      ImportError: matplotlib is not installed, naming the extra to install.
    """
    try:
        # The package first: with matplotlib blocked or missing this fails even
        # when a submodule is still in sys.modules.
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            f"jaxmesh's plots and HTML report need matplotlib, which cannot be "
            f"imported ({e}); install it with: {INSTALL}"
        ) from e
    return Figure, FigureCanvasAgg


def _constant(values: np.ndarray) -> bool:
    """Whether every episode has the same value (a plot of it would be one bar
    or one step: a line of text says it better)."""
    return values.size > 0 and bool(values.min() == values.max())


def constant_lines(result: Any) -> list[str]:
    """One line for each plot left out because every episode has the same
    value (``plot`` draws no panel for it), e.g. "Every episode lasted 50 env
    steps."."""
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


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _histogram(ax: Any, values: np.ndarray, title: str, xlabel: str) -> None:
    ax.set_title(title)
    if not values.size:
        _empty(ax, "episodes")
        return
    ax.hist(values, bins="auto", color="#4c72b0", edgecolor="white", linewidth=0.5)
    ax.axvline(float(values.mean()), color="#c44e52", linestyle="--", label="mean")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episodes")
    ax.legend(loc="best", frameon=False)


def _cdf(ax: Any, returns: np.ndarray) -> None:
    ax.set_title("Returns CDF")
    if not returns.size:
        _empty(ax, "episodes")
        return
    ax.ecdf(returns, color="#4c72b0")
    ax.set_xlabel("return")
    ax.set_ylabel("share of episodes with return <= x")
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)


def _success(ax: Any, indices: np.ndarray, flags: np.ndarray) -> None:
    ax.set_title("Success over episodes")
    if not flags.size:
        _empty(ax, "episodes")
        return
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
    after ``_``, ``/`` or ``:`` (a task name such as ``pick_up_the_black_bowl_...``
    has no space); a piece longer than ``width`` is cut."""
    lines = [""]
    for piece in re.split(r"(?<=[_/:])|(?= )", str(text)):
        while len(piece.lstrip()) > width:
            head, piece = piece.lstrip()[:width], piece.lstrip()[width:]
            lines += [head, ""]
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece.lstrip() if not lines[-1] else piece
    return "\n".join(line for line in lines if line)


def _title_chars(fig: Any, size: float = 12.0) -> int:
    """Characters of a ``size``-point title that fit across ``fig``."""
    inches = fig.get_figwidth()
    return max(20, int(inches * 72 / (0.6 * size)) - 2)


def plot(result: Result, title: str | None = None) -> Figure:
    """The run's plots as one matplotlib figure.

    Panels "Returns", "Returns CDF", "Episode lengths" and, when every episode
    has a success signal, "Success over episodes"; a value every episode
    shares gets no panel but a line of ``constant_lines`` (docs/evaluation.md,
    "Plots and the HTML report"). The title is wrapped, never cut.

    Args:
      result: a ``RunResult`` (``jaxmesh.evaluate``'s, or
        ``RunResult.from_dict`` of the JSON ``jaxmesh eval`` wrote).
      title: the figure's title; None: ``policy on env: N episodes``.

    Returns:
      A ``matplotlib.figure.Figure`` on an Agg canvas, not registered with
      pyplot: save it with ``fig.savefig("plots.png")``; a notebook shows it as
      a cell's value once its inline backend is on (``%matplotlib inline``).

    Raises:
      ImportError: matplotlib is missing (``pip install 'jaxmesh[report]'``).
    """
    Figure, FigureCanvasAgg = _matplotlib()
    returns = np.asarray(result.returns, np.float64)
    # Integers stay integers: numpy's "auto" bins of integers are at least 1 wide.
    lengths = np.asarray(result.lengths, np.int64)
    flags = _stats.success_flags(result.success, len(result.returns))
    panels: list[Callable[[Any], None]] = []
    if not _constant(returns):
        panels.append(
            lambda ax: _histogram(ax, returns, "Returns", "return (sum of rewards)")
        )
        panels.append(lambda ax: _cdf(ax, returns))
    if not _constant(lengths):
        panels.append(
            lambda ax: _histogram(ax, lengths, "Episode lengths", "length (env steps)")
        )
    if flags is not None:
        panels.append(lambda ax: _success(ax, np.asarray(result.indices), flags))
    rows, cols = (2, 2) if len(panels) == 4 else (1, max(len(panels), 1))
    fig = Figure(figsize=(4.4 * cols, 3.6 * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, draw in zip(axes, panels, strict=False):
        draw(ax)
    if not panels:  # every figure is one value: say so instead of drawing it
        axes[0].set_axis_off()
        axes[0].text(
            0.5, 0.5, "\n".join(constant_lines(result)), ha="center", va="center"
        )
    if title is None:
        name = f"{result.policy or 'policy'} on {_summary.short_env(result.env)}"
        title = f"{name}: {len(returns):,} episodes"
    # parse_math=False: a "$" in a policy's name is text, not TeX.
    fig.suptitle(wrap(title, _title_chars(fig)), parse_math=False)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg, ``DPI`` dots per inch)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def png_data_uri(png: bytes) -> str:
    """A ``data:image/png;base64,...`` URI of PNG bytes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# HTML helpers ------------------------------------------------------------------
def esc(value: Any) -> str:
    """``str(value)`` escaped for HTML text and quoted attributes."""
    return html.escape(str(value), quote=True)


def _row(key: str, label: str, value: Any, text: str, note: str = "") -> str:
    """A table row whose ``data-key`` and ``data-value`` (JSON) carry the datum.

    A reader sees ``text``; a program reads the exact value back with
    ``json.loads(data-value)``.
    """
    note_cell = f"<td class='note'>{esc(note)}</td>" if note else "<td></td>"
    # A long value (an instruction, a digest, a path) wraps; a number does not.
    kind = "value long" if len(str(text)) > LONG_VALUE else "value"
    return (
        f"<tr data-key='{esc(key)}' data-value='{esc(json.dumps(value))}'>"
        f"<th scope='row'>{esc(label)}</th><td class='{kind}'>{esc(text)}</td>"
        f"{note_cell}</tr>"
    )


def breakable(name: str) -> str:
    """``name`` escaped, with a line-break opportunity (``<wbr>``) after each
    ``_``, ``/`` and ``:``: a long task name wraps in its cell instead of
    widening the table past the page."""
    return "<wbr>".join(esc(part) for part in re.split(r"(?<=[_/:])", str(name)))


def _table(rows: Sequence[str], table_id: str, head: Sequence[str]) -> str:
    cells = "".join(f"<th scope='col'>{esc(h)}</th>" for h in head)
    return (
        f"<div class='wide'><table id='{esc(table_id)}'><thead><tr>{cells}</tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


class Section(NamedTuple):
    """One part of the page: ``body`` is HTML in which every string is escaped."""

    id: str
    title: str
    body: str


class Page(NamedTuple):
    """What every section reads: the result, its statistics, the page's options."""

    result: Result
    stats: dict[str, Any]
    episode_rows: int = EPISODE_ROWS
    #: The folder relative video paths (``result.videos``) are read from
    #: (None: the working directory; ``jaxmesh report``: the JSON's folder).
    base: Path | None = None


#: A section: ``Page -> Section``, or None when there is nothing to show (the
#: section and its contents entry are then left out).
SectionFn = Callable[[Page], Section | None]


# Sections ----------------------------------------------------------------------
def _rows(page: Page, table: str) -> list[str]:
    """The rows of ``summary.rows`` in ``table``, as HTML (``data-key``: the
    row's key; ``data-value``: its value as JSON)."""
    rows = _summary.rows(page.result, page.stats)
    return _html_rows([r for r in rows if r.table == table])


def summary_section(page: Page) -> Section:
    """The statistics of ``result.stats()``, one row each (``data-key``: its path)."""
    body = _table(
        _rows(page, "summary"), "summary-table", ("statistic", "value", "how")
    )
    return Section("summary", "Summary", body)


def plots_section(page: Page, title: str | None = None) -> Section:
    """``plot(result)`` as one embedded PNG, and a line instead of each plot
    whose values are all the same (``constant_lines``); ``title``: the
    figure's (None: ``plot``'s)."""
    result = page.result
    lines = constant_lines(result)
    body = "".join(f"<p class='constant'>{esc(line)}</p>" for line in lines)
    fig = plot(result, title)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    if not titles:  # nothing varies: the lines say it all
        return Section("plots", "Plots", body)
    uri = png_data_uri(png_bytes(fig))
    alt = "Plots: " + ", ".join(titles)
    captions = {
        "Returns": "Returns: how many episodes scored each return (dashed: the mean).",
        "Returns CDF": "Returns CDF: the share of episodes that scored at most a "
        "return; a curve further right is a better policy.",
        "Episode lengths": "Episode lengths: how many env steps the episodes lasted.",
        "Success over episodes": "Success over episodes: the success rate of the "
        "episodes so far, in episode order (it settles as episodes add up); "
        "ticks mark each episode's outcome.",
    }
    caption = " ".join(captions[t] for t in titles if t in captions)
    body += (
        f"<figure><img src='{esc(uri)}' alt='{esc(alt)}'>"
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )
    return Section("plots", "Plots", body)


def settings_section(page: Page) -> Section:
    """The run's settings and totals (``data-key``: the ``RunResult`` field)."""
    body = _table(
        _rows(page, "settings"), "settings-table", ("setting", "value", "note")
    )
    body += "<h3>Totals</h3>" + _table(
        _rows(page, "totals"), "totals-table", ("total", "value", "note")
    )
    return Section("settings", "Settings", body)


def provenance_section(page: Page) -> Section:
    """Where the result comes from: its seeds, the run's identity (digests of
    the policy, its params and the env, as ``resume=`` compares them) and when
    and with which versions it was made (``data-key``: the field's path)."""
    note = (
        "What made these numbers. The settings above and these rows are in the "
        "results JSON too (RunResult.to_dict()); a rerun with the same settings, "
        "seeds and versions gives the same episodes."
    )
    body = f"<p>{esc(note)}</p>" + _table(
        _rows(page, "provenance"), "provenance-table", ("what", "value", "note")
    )
    return Section("provenance", "Provenance", body)


def telemetry_section(page: Page) -> Section | None:
    """Per-call timings of a host-stepped run; None for a JAX env."""
    result = page.result
    if not result.telemetry:
        return None
    rows = []
    for name, s in result.telemetry.items():
        cells = [f"<td>{esc(c)}</td>" for c in _summary.telemetry_cells(name, s)]
        rows.append(
            f"<tr data-key='{esc(name)}' data-value='{esc(json.dumps(s))}'>"
            f"<th scope='row'>{esc(name)}</th>{''.join(cells)}</tr>"
        )
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
    """The first ``page.episode_rows`` episodes, one row each, in episode order."""
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
        # EpisodeResult's first eight fields: index, seed, return_, length,
        # terminated, truncated, predict_calls, lane.
        cells = [*result.episode(i)[:8], *([] if flags is None else [bool(flags[i])])]
        rows.append(
            f"<tr data-value='{esc(json.dumps(cells))}'>"
            + "".join(f"<td>{esc(_cell(c))}</td>" for c in cells)
            + "</tr>"
        )
    if shown < n:
        note = (
            f"Showing the first {shown:,} of {n:,} episodes; every episode is in "
            "the results JSON (RunResult.to_dict())."
        )
    else:
        note = f"All {n:,} episodes."
    return f"<p id='{esc(table_id)}-note'>{esc(note)}</p>" + _table(
        rows, f"{table_id}-table", head
    )


#: ``data:`` URI media types of the video files the report embeds.
VIDEO_TYPES = {".gif": "image/gif", ".mp4": "video/mp4", ".webm": "video/webm"}


def videos_section(page: Page) -> Section | None:
    """The videos of recorded episodes (``result.videos``), embedded.

    A GIF is an ``<img>``, an MP4 or WebM a ``<video controls>``, each from a
    ``data:`` URI, so the page stays one file. A listed file that is missing
    or of another type is named, not embedded. None without videos.
    """
    videos = page.result.videos
    if not videos:
        return None
    items = []
    for name in videos:
        path = Path(name)
        if not path.is_absolute() and page.base is not None:
            path = page.base / path
        kind = VIDEO_TYPES.get(path.suffix.lower())
        label = f"Video: {Path(name).name}"
        if kind is None or not path.is_file():
            why = "not found" if kind is None or not path.exists() else "unreadable"
            if kind is None:
                why = f"not embedded (a {path.suffix or 'typeless'} file)"
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


#: The page's sections, in order. A timeline section (a trace file) belongs
#: after "telemetry".
SECTIONS: tuple[SectionFn, ...] = (
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
    """Warnings a reader must see before any figure."""
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
    sections: Sequence[SectionFn] | None = None,
    base: str | Path | None = None,
) -> str:
    """The report page of ``result`` as an HTML string.

    Args:
      result: the run's ``RunResult``.
      resamples: bootstrap resamples of the intervals; None: as
        ``result.summary()`` (10,000, fewer for a very large run so that the
        page takes seconds; the page says how many).
      episode_rows: episodes shown in the per-episode table.
      sections: the sections to render (default: ``SECTIONS``).
      base: the folder relative ``result.videos`` paths are read from (None:
        the working directory).

    Returns:
      A complete HTML5 document that refers to nothing outside itself.
    """
    if resamples is None:  # the summary's rule
        resamples = _stats.summary_resamples(len(result.returns))
    page = Page(
        result,
        result.stats(resamples=resamples),
        episode_rows,
        None if base is None else Path(base),
    )
    made = (fn(page) for fn in (SECTIONS if sections is None else sections))
    parts = [part for part in made if part is not None]
    name = f"{result.policy or 'policy'} on {_summary.short_env(result.env) or 'env'}"
    lede = (
        f"{len(result.returns):,} episodes on {result.num_envs:,} lanes, "
        f"{result.env_steps:,} env steps in {result.wall_time:.2f} s"
    )
    return _document(name, lede, _notices(result), parts)


def _document(
    name: str, lede: str, notices: Sequence[str], parts: Sequence[Section]
) -> str:
    """A complete page: the title, the lede, the notices, a contents list and
    the sections, with the CSS inline (nothing outside the page is loaded)."""
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
    """Writes ``result``'s report as one self-contained HTML file
    (``report_html``; its sections: docs/evaluation.md).

    Args:
      path: the HTML file to write; missing parent folders are created.
      result, resamples, episode_rows, base: as for ``report_html``.

    Returns:
      The path written.

    Raises:
      ImportError: matplotlib is missing (``pip install 'jaxmesh[report]'``).
      OSError: the file cannot be written.

    Example:
      >>> result = jaxmesh.evaluate(policy, "gymnax:CartPole-v1", episodes=100)
      >>> write_report(result, "report.html")   # or result.report("report.html")
    """
    page = report_html(
        result, resamples=resamples, episode_rows=episode_rows, base=base
    )
    return _write(path, page)


def _write(path: str | Path, page: str) -> Path:
    """Writes ``page`` to ``path`` (UTF-8), creating missing parent folders."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


# Suites -------------------------------------------------------------------------
def _errorbars(values: Sequence[float], intervals: Sequence[Any]) -> np.ndarray:
    """matplotlib's ``yerr`` (2 x n, distances below and above) from intervals
    (None: no bar)."""
    low = [v - i[0] if i else 0.0 for v, i in zip(values, intervals, strict=True)]
    high = [i[1] - v if i else 0.0 for v, i in zip(values, intervals, strict=True)]
    return np.maximum(np.array([low, high], np.float64), 0.0)


def suite_plot(suite: Any, stats: dict | None = None) -> Figure:
    """A suite's per-task figure: the success rate of each task with its Wilson
    interval ("Success rate per task", when every task has a success signal)
    and the mean return of each task with its bootstrap interval ("Mean return
    per task").

    Bars are horizontal, one row per task in the suite's order, the task's
    name beside it wrapped at ``_`` (LIBERO's names run to 80 characters),
    so that no two names overlap; the figure grows with the tasks."""
    figure_cls, canvas_cls = _matplotlib()
    s = suite.stats() if stats is None else stats
    rows = s["tasks"]
    names = [wrap(row["task"], SUITE_LABEL_CHARS) for row in rows]
    rated = all(row["success_rate"] is not None for row in rows)
    lines = sum(name.count("\n") + 1 for name in names)
    height = max(2.4, 1.2 + 0.2 * lines + 0.12 * len(names))
    fig = figure_cls(figsize=(11.0, height), dpi=DPI, layout="constrained")
    canvas_cls(fig)
    axes = fig.subplots(1, 2 if rated else 1, squeeze=False, sharey=True)[0]
    y = np.arange(len(names))

    panels = [  # (axes, key, interval, color, title, label)
        (axes[-1], "mean_return", "return_interval", "#4c72b0")
        + ("Mean return per task", "mean return (whiskers: interval)"),
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
    """The per-task table (``SuiteResult.table``): one row per task, the mean
    over tasks and the pooled figures; ``data-task`` names each row's task."""
    cells = suite.table(stats)
    rows = []
    for row in cells[1:]:
        tds = "".join(f"<td class='value'>{esc(c)}</td>" for c in row[1:])
        rows.append(
            f"<tr data-task='{esc(row[0])}'><th scope='row'>{breakable(row[0])}</th>"
            f"{tds}</tr>"
        )
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


def _html_rows(rows: Sequence[_summary.Row]) -> list[str]:
    return [_row(r.key, r.label, r.value, r.text, r.note) for r in rows]


def suite_provenance_section(suite: Any) -> Section:
    """Each task's settings and provenance (``summary.setting_rows`` and
    ``summary.provenance_rows``): what ran, on which seeds, with what."""
    body = ""
    for k, (name, result) in enumerate(suite.tasks.items()):
        body += f"<h3>{esc(f'Task {name}')}</h3>" + _table(
            _html_rows(
                _summary.setting_rows(result) + _summary.provenance_rows(result)
            ),
            f"task-{k}-provenance-table",
            ("what", "value", "note"),
        )
    return Section("provenance", "Provenance", body)


def suite_report_html(
    suite: Any,
    *,
    resamples: int | None = None,
    episode_rows: int = EPISODE_ROWS,
    base: str | Path | None = None,
) -> str:
    """A suite's report page: the per-task table, the per-task figure, and for
    each task its plots (``plot``), its videos and its episodes, then the
    provenance, as one self-contained HTML document (``suite``: a
    ``SuiteResult``; the other arguments as ``report_html``'s, per task).
    """
    n = max(suite.num_episodes, 1)
    resamples = _stats.summary_resamples(n) if resamples is None else resamples
    stats = suite.stats(resamples=resamples)
    fig = suite_plot(suite, stats)
    titles = ", ".join(ax.get_title() for ax in fig.axes if ax.get_title())
    overview = (
        f"<figure><img src='{esc(png_data_uri(png_bytes(fig)))}' "
        f"alt='{esc('Plots: ' + titles)}'><figcaption>"
        f"{esc('Bars: each task; whiskers: the intervals of the Tasks table.')}"
        "</figcaption></figure>"
    )
    parts = [tasks_section(suite, stats), Section("plots", "Plots", overview)]
    for k, (name, result) in enumerate(suite.tasks.items()):
        page = Page(result, {}, episode_rows, None if base is None else Path(base))
        env = _summary.short_env(result.env)
        body = f"<p>{esc(f'{result.num_episodes:,} episodes of {env}')}</p>"
        body += plots_section(page, f"{name}: {result.num_episodes:,} episodes").body
        shown = videos_section(page)
        if shown is not None:  # the task's recorded episodes
            body += shown.body
        body += "<h3>Episodes</h3>" + episodes_table(
            result, episode_rows, f"task-{k}-episodes"
        )
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
    """What the suite is, for a title: ``libero:libero_spatial (2 tasks)`` when
    every task is one benchmark suite's (``<family>:<suite>/<i>`` ids), else
    ``a suite of N tasks``."""
    envs = [_summary.short_env(r.env) for r in suite.tasks.values()]
    heads = {env.rpartition("/")[0] for env in envs}
    n = len(envs)
    count = f"{n} task" + ("" if n == 1 else "s")
    if len(heads) == 1 and ":" in next(iter(heads)):
        return f"{heads.pop()} ({count})"
    return f"a suite of {count}"


def write_suite_report(
    suite: Any,
    path: str | Path,
    *,
    resamples: int | None = None,
    base: str | Path | None = None,
) -> Path:
    """Writes a ``SuiteResult``'s report as one self-contained HTML file (see
    ``suite_report_html``)."""
    return _write(path, suite_report_html(suite, resamples=resamples, base=base))


__all__ = [
    "EPISODE_ROWS",
    "SECTIONS",
    "Section",
    "videos_section",
    "plot",
    "report_html",
    "suite_plot",
    "suite_report_html",
    "write_report",
    "write_suite_report",
]
