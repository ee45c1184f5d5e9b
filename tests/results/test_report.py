"""Plots and the HTML report (issue 8 item 6).

The plots are read back from their artists and checked against numpy's own
histogram and hand-worked values; the page is parsed with the standard library's
``html.parser`` (no headless browser installs on the CI machines) and its
figures are checked against ``RunResult.stats()``, the values the test gave, and
a plain gymnasium loop for a real ``jaxmesh eval`` run in a subprocess.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml
from gym_reference import tilt_episodes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from jaxmesh.cli import main
from jaxmesh.cli.cache import CACHE_SWITCH_ENV
from jaxmesh.results.report import constant_lines
from jaxmesh.results.result import RunResult

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Elements with no end tag in HTML.
VOID = {"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr"}
SEEDS = [3, 1, 4, 15, 9, 2, 6, 5]


def make_result(returns, lengths=None, **fields) -> RunResult:
    """A ``RunResult`` from given per-episode values (seeds 100, 101, ...)."""
    returns = np.asarray(returns, np.float32)
    n = returns.size
    lengths = np.arange(1, n + 1) if lengths is None else np.asarray(lengths)
    run = {
        "env_steps": int(np.sum(lengths)),
        "policy_rows": 2 * n,
        "wall_time": 3.25,
        "compile_time": 1.5,
        "run_time": 1.75,
        "num_envs": 16,
        "horizon": 4,
        "effective_horizon": 2,
        "prefetch_lead": 0,
        "policy": "tilt",
        "env": "gymnax:CartPole-v1",
        "chunk": 2,
        "plan_tile": 32,
        **fields,
    }
    return RunResult(
        indices=np.arange(n),
        seeds=np.arange(100, 100 + n),
        returns=returns,
        lengths=lengths,
        terminated=np.arange(n) % 3 != 0,
        truncated=np.arange(n) % 3 == 0,
        predict_calls=np.arange(n) + 7,
        lanes=np.arange(n) % 16,
        **run,
    )


class Page(HTMLParser):
    """A parsed report: tables' rows, images, links, text; checks nesting."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.rows: dict[str, list[dict]] = {}  # table id -> its body rows
        self.text: list[str] = []
        self.table: str | None = None
        self.row: dict | None = None
        self.in_tbody = False
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed elements {self.stack}"

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "table":
            self.table = attrs.get("id")
            self.rows[self.table] = []
        elif tag == "tbody":
            self.in_tbody = True
        elif tag == "tr" and self.in_tbody:
            self.row = {**attrs, "cells": []}
            self.rows[self.table].append(self.row)
        elif tag in ("td", "th") and self.row is not None:
            self.row["cells"].append("")

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack)
        self.stack.pop()
        if tag == "tbody":
            self.in_tbody = False
        elif tag == "tr":
            self.row = None

    def handle_data(self, data):
        self.text.append(data)
        if (
            self.row is not None
            and self.row["cells"]
            and self.stack[-1]
            in (
                "td",
                "th",
            )
        ):
            self.row["cells"][-1] += data

    def keyed(self, table: str) -> dict[str, dict]:
        """The rows of a table by their ``data-key``."""
        return {r["data-key"]: r for r in self.rows[table]}

    def value(self, table: str, key: str):
        return json.loads(self.keyed(table)[key]["data-value"])

    def section_ids(self) -> list[str]:
        return [a["id"] for t, a in self.tags if t == "section"]


def lookup(stats: dict, dotted: str):
    node = stats
    for part in dotted.split("."):
        node = node[part]
    return node


def check_self_contained(text: str, page: Page) -> list[bytes]:
    """No network reference; every image a PNG data URI. Returns the PNGs."""
    assert "http://" not in text and "https://" not in text
    for _, attrs in page.tags:
        for name in ("src", "href"):
            if name in attrs:
                assert attrs[name].startswith(("data:", "#")), attrs[name]
    pngs = []
    for tag, attrs in page.tags:
        if tag == "img":
            head, _, data = attrs["src"].partition(",")
            assert head == "data:image/png;base64", head
            png = base64.b64decode(data, validate=True)
            assert png.startswith(PNG_SIGNATURE)
            pngs.append(png)
    assert pngs, "the report embeds no image"
    return pngs


# Plots -----------------------------------------------------------------------
def axes_by_title(fig: Figure) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def bars(ax) -> tuple[np.ndarray, np.ndarray]:
    """The heights and the edges of a histogram's bars."""
    rects = [p for p in ax.patches if isinstance(p, Rectangle)]
    heights = np.array([r.get_height() for r in rects])
    edges = np.array(
        [r.get_x() for r in rects] + [rects[-1].get_x() + rects[-1].get_width()]
    )
    return heights, edges


def test_plot_draws_the_histograms_and_the_cdf():
    rng = np.random.default_rng(7)
    returns = rng.normal(50.0, 12.0, 300).round(1)
    lengths = rng.integers(10, 500, 300)
    result = make_result(returns, lengths)
    fig = result.plot()
    assert isinstance(fig, Figure)
    ax = axes_by_title(fig)
    assert list(ax) == ["Returns", "Returns CDF", "Episode lengths"]
    # Bars against numpy's histogram of the same values, float32 as stored.
    for title, values in (
        ("Returns", returns.astype(np.float32).astype(np.float64)),
        ("Episode lengths", lengths),
    ):
        counts, edges = np.histogram(values, bins="auto")
        heights, bar_edges = bars(ax[title])
        np.testing.assert_array_equal(heights, counts)
        np.testing.assert_allclose(bar_edges, edges)
        assert heights.sum() == 300
    # The CDF steps through the sorted returns, 1/n at a time.
    (line,) = ax["Returns CDF"].lines
    x = np.sort(returns.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(line.get_xdata()[1:], x)
    np.testing.assert_allclose(line.get_ydata(), np.arange(301) / 300)
    assert "300 episodes" in fig.get_suptitle()
    # Not registered with pyplot: a loop of plots leaks no figures.
    assert plt.get_fignums() == []


def test_histogram_of_hand_worked_returns():
    # Returns 0, 1, 1, 2, 2, 2 and numpy's "auto" rule, the narrower of two
    # widths: Sturges 2 / (log2(6) + 1) = 0.558, Freedman-Diaconis 2 * IQR / 6^(1/3)
    # = 2 * 1 / 1.817 = 1.10. So ceil(2 / 0.558) = 4 bins of 0.5 over [0, 2]
    # (the last one closed): 0 | none | 1, 1 | 2, 2, 2.
    fig = make_result([0.0, 1.0, 1.0, 2.0, 2.0, 2.0]).plot()
    heights, edges = bars(axes_by_title(fig)["Returns"])
    np.testing.assert_array_equal(heights, [1, 0, 2, 3])
    np.testing.assert_allclose(edges, [0, 0.5, 1, 1.5, 2])
    # One value: no panel of one bar, a line says it (lengths 1..4 still vary).
    result = make_result([500.0] * 4)
    assert list(axes_by_title(result.plot())) == ["Episode lengths"]
    assert constant_lines(result) == ["Every episode returned 500."]
    both = make_result([7.0] * 3, [50] * 3)
    assert constant_lines(both) == [
        "Every episode returned 7.",
        "Every episode lasted 50 env steps.",
    ]
    (ax,) = both.plot().axes  # nothing to draw: the figure holds the lines
    assert [t.get_text() for t in ax.texts] == [
        "Every episode returned 7.\nEvery episode lasted 50 env steps."
    ]


def test_success_panel_shows_the_running_rate():
    result = make_result([1.0, 0.0, 1.0, 1.0, 0.0])
    result = dataclasses.replace(
        result, success=np.array([True, False, True, True, False])
    )
    ax = axes_by_title(result.plot())
    assert list(ax) == [
        "Returns",
        "Returns CDF",
        "Episode lengths",
        "Success over episodes",
    ]
    ticks, running = ax["Success over episodes"].lines
    np.testing.assert_allclose(running.get_ydata(), [1, 1 / 2, 2 / 3, 3 / 4, 3 / 5])
    np.testing.assert_array_equal(running.get_xdata(), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(ticks.get_ydata(), [1, 0, 1, 1, 0])


@pytest.mark.parametrize("success", [None, np.array([True, None, False], object)])
def test_no_success_panel_without_a_signal(success):
    result = dataclasses.replace(make_result([1.0, 2.0, 3.0]), success=success)
    assert len(result.plot().axes) == 3


def test_empty_result_plots_and_reports(tmp_path):
    result = make_result([])
    fig = result.plot()
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts == ["no episodes"] * 3
    text = result.report(tmp_path / "empty.html").read_text()
    page = Page(text)
    assert page.value("summary-table", "episodes") == 0
    assert page.rows["episodes-table"] == []
    assert "This result holds no episodes." in "".join(page.text)


def test_import_is_lazy_and_a_missing_matplotlib_names_the_extra(
    monkeypatch, tmp_path, capsys
):
    code = (
        "import sys, jaxmesh, jaxmesh.results.report, jaxmesh.results.result\n"
        "assert 'matplotlib' not in sys.modules, 'imported on import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" fails
    result = make_result([1.0, 2.0])
    with pytest.raises(ImportError, match=r"pip install 'jaxmesh\[report\]'"):
        result.plot()
    with pytest.raises(ImportError, match=r"pip install 'jaxmesh\[report\]'"):
        result.report(tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result.to_dict()))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'jaxmesh[report]'" in err[0], err


# The HTML page -------------------------------------------------------------------
TELEMETRY = {
    "predict": {"count": 40, "mean": 0.0015, "p50": 0.001, "p95": 0.004, "p99": 0.0125},
    "request_bytes": {
        "count": 40,
        "mean": 2048.0,
        "p50": 2048.0,
        "p95": 4096.0,
        "p99": 4096.0,
    },
}


def test_report_page_holds_the_stats_settings_telemetry_and_episodes(tmp_path):
    rng = np.random.default_rng(3)
    n = 1200
    returns = rng.normal(200.0, 40.0, n).round(2)
    flags = rng.random(n) < 0.6
    result = make_result(
        returns,
        rng.integers(5, 300, n),
        policy="<script>alert('x')</script> & co",
        env='gymnasium:"Odd"<Env>',
        prefetch_lead=1,
        max_episode_seconds=2.5,
        telemetry=TELEMETRY,
    )
    result = dataclasses.replace(result, success=flags)
    path = result.report(tmp_path / "sub" / "report.html")
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    check_self_contained(text, page)
    # Escaped: the policy's name is text, never markup.
    assert "script" not in [t for t, _ in page.tags]
    assert "<script>alert('x')</script> & co" in "".join(page.text)
    assert page.section_ids() == [
        "summary",
        "plots",
        "settings",
        "provenance",
        "telemetry",
        "episodes",
    ]

    # Every summary row carries its stats() value exactly; the text shows it.
    # 1,200 episodes: as result.summary(), 10**7 // 1200 = 8,333 resamples.
    stats = result.stats(resamples=8_333)
    assert "8,333 resamples" in "".join(page.text)
    rows = page.keyed("summary-table")
    stat_keys = [k for k in rows if k not in ("terminated", "truncated")]
    assert {"returns.mean", "returns.iqm_interval", "returns.quantiles.p95"} <= set(
        rows
    )
    for key in stat_keys:
        assert page.value("summary-table", key) == lookup(stats, key), key
    mean = float(np.mean(returns.astype(np.float32).astype(np.float64)))
    assert page.value("summary-table", "returns.mean") == pytest.approx(mean)
    assert rows["returns.mean"]["cells"][1] == f"{mean:.3f}"
    low, high = stats["returns"]["mean_interval"]
    assert rows["returns.mean_interval"]["cells"][1] == f"[{low:.3f}, {high:.3f}]"
    assert page.value("summary-table", "success_rate") == flags.mean()
    assert rows["success_rate"]["cells"][1] == f"{flags.mean():.1%}"
    assert page.value("summary-table", "terminated") == int(
        np.sum(np.arange(n) % 3 != 0)
    )
    assert page.value("summary-table", "truncated") == 400

    # The settings and totals the result was given.
    given = {
        "policy": "<script>alert('x')</script> & co",
        "env": 'gymnasium:"Odd"<Env>',
        "num_envs": 16,
        "horizon": 4,
        "effective_horizon": 2,
        "chunk": 2,
        "prefetch_lead": 1,
        "plan_tile": 32,
        "max_episode_seconds": 2.5,
    }
    assert {k: page.value("settings-table", k) for k in given} == given
    assert page.value("totals-table", "wall_time") == 3.25
    assert page.value("totals-table", "policy_rows") == 2 * n
    notices = [a for t, a in page.tags if a.get("class") == "notice"]
    assert len(notices) == 2  # asynchronous, and a wall-clock cap

    # Telemetry: milliseconds and bytes, as format_telemetry prints them.
    tel = page.keyed("telemetry-table")
    assert tel["predict"]["cells"] == [
        "predict",
        "40",
        "1.500 ms",
        "1.000 ms",
        "4.000 ms",
        "12.500 ms",
    ]
    assert tel["request_bytes"]["cells"][2:] == [
        "2,048 B",
        "2,048 B",
        "4,096 B",
        "4,096 B",
    ]

    # The first 1,000 episodes, and a note that there are more.
    episodes = page.rows["episodes-table"]
    assert len(episodes) == 1000
    assert "first 1,000 of 1,200 episodes" in "".join(page.text)
    for i in (0, 1, 998, 999):
        expected = [
            i,
            100 + i,
            float(np.float32(returns[i])),
            int(result.lengths[i]),
            i % 3 != 0,
            i % 3 == 0,
            i + 7,
            i % 16,
            bool(flags[i]),
        ]
        assert json.loads(episodes[i]["data-value"]) == expected
        assert episodes[i]["cells"][2] == f"{np.float32(returns[i]):.3f}"
        assert episodes[i]["cells"][8] == ("yes" if flags[i] else "no")


def test_small_report_leaves_out_what_it_lacks(tmp_path):
    result = make_result([3.0, 5.0, 4.0, 4.0, 9.0])
    first = result.report(tmp_path / "a.html").read_bytes()
    page = Page(first.decode())
    assert page.section_ids() == [
        "summary",
        "plots",
        "settings",
        "provenance",
        "episodes",
    ]
    assert "success_rate" not in page.keyed("summary-table")
    assert page.value("summary-table", "returns.mean") == 5.0  # by hand
    assert page.value("summary-table", "returns.iqm") == pytest.approx(
        13 / 3
    )  # 4, 4, 5
    assert "All 5 episodes." in "".join(page.text)
    assert len(page.rows["episodes-table"]) == 5
    assert not [a for t, a in page.tags if a.get("class") == "notice"]
    assert page.value("settings-table", "max_episode_seconds") is None
    # The same result gives the same bytes (no timestamp).
    assert result.report(tmp_path / "b.html").read_bytes() == first


# The command line ----------------------------------------------------------------
@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A real ``jaxmesh eval --report`` process: (its JSON, its report)."""
    where = tmp_path_factory.mktemp("eval")
    config = where / "run.yaml"
    output = where / "out" / "r.json"
    config.write_text(
        yaml.safe_dump(
            {
                "env": "gymnasium:CartPole-v1",
                "policy": "cli_policies:tilt",
                "seeds": SEEDS,
                "num_envs": 3,
                "output": str(output),
            }
        )
    )
    path = os.pathsep.join(
        p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, "-m", "jaxmesh.cli", "eval", str(config), "--no-progress"]
        + ["--report"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    html = output.with_suffix(".html")  # --report alone: next to the JSON
    assert f"wrote {html}" in proc.stdout
    return output, html


def test_eval_report_matches_a_plain_gymnasium_loop(evaluated):
    _, html = evaluated
    text = html.read_text(encoding="utf-8")
    page = Page(text)
    check_self_contained(text, page)
    reference = tilt_episodes(SEEDS)
    rows = [json.loads(r["data-value"]) for r in page.rows["episodes-table"]]
    assert [r[1] for r in rows] == SEEDS
    assert [(r[2], r[3]) for r in rows] == reference
    mean = sum(ret for ret, _ in reference) / len(SEEDS)
    assert page.value("summary-table", "returns.mean") == pytest.approx(mean)
    assert page.value("settings-table", "num_envs") == 3
    assert page.value("settings-table", "env") == "gymnasium:CartPole-v1"
    # An in-process gymnasium run records telemetry: the page shows it.
    assert {"predict", "env_step"} <= set(page.keyed("telemetry-table"))


def test_report_command_rewrites_the_same_page(evaluated, tmp_path, capsys):
    output, html = evaluated
    out = tmp_path / "again.html"
    assert main(["report", str(output), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    # From the JSON, the page the run wrote, byte for byte.
    assert out.read_bytes() == html.read_bytes()


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"jaxmesh {command}: error: "), lines[0]
    return lines[0]


def test_report_bad_input_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert "not found" in one_error_line(capsys, "report")
    text = tmp_path / "text.json"
    text.write_text("not json at all")
    assert main(["report", str(text)]) == 2
    assert "not valid JSON" in one_error_line(capsys, "report")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"returns": [1, 2]}))
    assert main(["report", str(other), "-o", str(tmp_path / "o.html")]) == 2
    assert "lacks" in one_error_line(capsys, "report")
    assert not (tmp_path / "o.html").exists()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(make_result([1.0, 2.0]).to_dict()))
    assert main(["report", str(good), "-o", str(good)]) == 2
    assert "results file itself" in one_error_line(capsys, "report")
    assert json.loads(good.read_text())["totals"]["episodes"] == 2  # untouched


def test_eval_report_refuses_to_overwrite_its_config(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"env": "gymnax:CartPole-v1", "policy": "cli_policies:tilt"})
    )
    before = config.read_text()
    assert main(["eval", str(config), "--report", str(config)]) == 2
    assert "would overwrite" in one_error_line(capsys, "eval")
    assert config.read_text() == before
