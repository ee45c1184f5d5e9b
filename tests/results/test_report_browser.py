"""The HTML report as a real browser renders it (headless Chromium).

A small gymnax CartPole run (a success signal: ``discount``, 0 exactly when the
pole fell) is written as a report twice, with and without its success signal,
and each page is loaded in headless Chromium (``tests/browser.py``). The DOM the
browser built is read with ``test_report.Page``: the summary table and the
per-episode table hold the figures of a plain loop over gymnax's own functions
(``reference_loop``), and every plot is a PNG the browser decoded, of the size
its panels make (4.4 x 3.6 inches each at 100 dpi: 1 x 3 panels, or 2 x 2 with
"Success over episodes"). Every request the page made is recorded: the page's
own URL is the only one. The same is checked without a browser on the HTML
source, and both checks are shown to catch a page that loads an outside image,
stylesheet, script or CSS background.

Without Chromium the tests skip (install: ``apt-get install chromium``); with
``JAXMESH_CI`` set (``.ci/run``) they fail instead.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import gymnax
import jax.numpy as jnp
import numpy as np
import pytest
from browser import (
    Rendered,
    data_uri_bytes,
    outside_references,
    render,
    require_chromium,
)
from PIL import Image
from reference_loop import gymnax_fns, run_episode

import jaxmesh

from .test_report import PNG_SIGNATURE, Page

SEEDS = list(range(10, 22))
CAP = 50  # episodes the pole survives are truncated here: a success
HORIZON = 4
#: Pixels of one plot panel (4.4 x 3.6 inches at 100 dpi).
PANEL = (440, 360)


def wobble(obs):
    """A chunk of 4 actions around "push towards the tilt": some episodes fall."""
    a = (obs[2] > 0).astype(jnp.int32)
    return jnp.stack([a, a, 1 - a, a])


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_chromium()


@pytest.fixture(scope="module")
def run():
    """(the run's result, the plain loop's episodes)."""
    result = jaxmesh.evaluate(
        wobble,
        "gymnax:CartPole-v1",
        num_envs=4,
        horizon=HORIZON,
        seeds=SEEDS,
        max_episode_steps=CAP,
        scoring=jaxmesh.Scoring(success="discount", success_mode="end"),
        # the last step's discount: 0 when the pole fell
    )
    reset, step = gymnax_fns(*gymnax.make("CartPole-v1"))
    refs = [
        run_episode(reset, step, lambda x, k: wobble(x), s, horizon=HORIZON, cap=CAP)
        for s in SEEDS
    ]
    wins = [not r.terminated for r in refs]
    assert 0 < sum(wins) < len(wins)  # both outcomes: the success panel has both
    return result, refs


def rendered_report(result, path: Path) -> tuple[Rendered, Page]:
    """Writes ``result``'s report to ``path``, renders it in Chromium and checks
    the page is self-contained (no outside request, no outside reference in the
    source). Returns the rendering and the browser's DOM, parsed."""
    result.report(path)
    source = path.read_text(encoding="utf-8")
    assert outside_references(source) == []
    rendered = render(path)
    assert rendered.requests and rendered.requests[0] == rendered.url  # it listens
    assert rendered.outside == []
    return rendered, Page(rendered.dom)


@pytest.fixture(scope="module", params=["success", "no success"])
def report(request, chromium, run, tmp_path_factory):
    """(with a success signal?, result, refs, rendering, parsed DOM)."""
    result, refs = run
    with_success = request.param == "success"
    if not with_success:
        result = dataclasses.replace(result, success=None, success_key=None)
    path = tmp_path_factory.mktemp("report") / "report.html"
    rendered, page = rendered_report(result, path)
    return with_success, result, refs, rendered, page


def test_summary_and_episodes_tables_hold_the_plain_loop_figures(report):
    with_success, _, refs, _, page = report
    assert page.section_ids()[:2] == ["summary", "plots"]
    assert page.value("summary-table", "episodes") == len(SEEDS)
    mean = sum(r.ret for r in refs) / len(refs)
    assert page.value("summary-table", "returns.mean") == pytest.approx(mean)
    assert page.value("summary-table", "lengths.mean") == pytest.approx(
        sum(r.length for r in refs) / len(refs)
    )
    terminated = sum(r.terminated for r in refs)
    assert page.value("summary-table", "terminated") == terminated
    truncated = sum(r.truncated for r in refs)
    assert page.value("summary-table", "truncated") == truncated
    if with_success:
        wins = sum(not r.terminated for r in refs)
        assert page.value("summary-table", "success_rate") == pytest.approx(
            wins / len(refs)
        )
        low, high = page.value("summary-table", "success_interval")
        assert low < wins / len(refs) < high
    else:
        assert "success_rate" not in page.keyed("summary-table")
    rows = [json.loads(r["data-value"]) for r in page.rows["episodes-table"]]
    assert [r[1] for r in rows] == SEEDS
    assert [(r[2], r[3]) for r in rows] == [(r.ret, r.length) for r in refs]
    # Every row reads as text too (the browser's DOM, not only data attributes).
    assert all(len(r["cells"]) == 3 for r in page.rows["summary-table"])


def test_every_plot_is_an_image_the_browser_decoded(report):
    with_success, _, _, rendered, page = report
    images = [a for tag, a in page.tags if tag == "img"]
    assert len(images) == 1  # the plots, one figure
    kind, png = data_uri_bytes(images[0]["src"])
    assert kind == "image/png" and png.startswith(PNG_SIGNATURE)
    cols, rows = (2, 2) if with_success else (3, 1)
    size = (PANEL[0] * cols, PANEL[1] * rows)
    assert Image.open(io.BytesIO(png)).size == size
    titles = ["Returns", "Returns CDF", "Episode lengths"]
    titles += ["Success over episodes"] if with_success else []
    assert images[0]["alt"] == "Plots: " + ", ".join(titles)
    # The browser decoded it to the same size.
    [decoded] = rendered.images
    assert decoded["complete"] and (decoded["width"], decoded["height"]) == size
    assert decoded["src"] == images[0]["src"]


def test_the_checks_catch_outside_resources(chromium, run, tmp_path):
    """A report with an outside image, stylesheet, script and CSS background:
    the browser requests each (nothing leaves the machine) and the static check
    names each."""
    result, _ = run
    path = tmp_path / "leaky.html"
    result.report(path)
    outside = {
        "https://example.com/x.png": "<img src='https://example.com/x.png'>",
        "http://192.0.2.1/style.css": (
            "<link rel='stylesheet' href='http://192.0.2.1/style.css'>"
        ),
        "script.js": "<script src='script.js'></script>",
        "https://example.com/bg.png": (
            "<div style='background: url(\"https://example.com/bg.png\")'>x</div>"
        ),
    }
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("</body>", "".join(outside.values()) + "</body>"))
    assert sorted(outside_references(path.read_text())) == sorted(outside)
    rendered = render(path)
    absolute = {u if "//" in u else (tmp_path / u).as_uri() for u in outside}
    assert set(rendered.outside) == absolute
    assert np.sum([u == rendered.url for u in rendered.requests]) == 1


def test_suite_report_shows_the_per_task_table_and_plots(chromium, run, tmp_path):
    """A suite of two tasks (this run, and it with its first episodes dropped):
    the browser's tasks table has a row per task, the mean over tasks and the
    pooled row, with the success rates of the plain loop; every plot decodes."""
    from jaxmesh.suite import SuiteResult

    result, refs = run
    keep = np.arange(len(SEEDS)) >= 4
    fewer = dataclasses.replace(
        result,
        **{
            f.name: getattr(result, f.name)[keep]
            for f in dataclasses.fields(result)
            if isinstance(getattr(result, f.name), np.ndarray)
            and getattr(result, f.name).shape[:1] == (len(SEEDS),)
        },
    )
    suite = SuiteResult({"all": result, "later": fewer}, {"all": None, "later": None})
    path = tmp_path / "suite.html"
    suite.report(path)
    assert outside_references(path.read_text(encoding="utf-8")) == []
    rendered = render(path)
    assert rendered.outside == []
    page = Page(rendered.dom)
    rows = page.rows["tasks-table"]
    assert [r["data-task"] for r in rows] == [
        "all",
        "later",
        "mean over tasks",
        "pooled",
    ]
    wins = np.array([not r.terminated for r in refs])
    for row, flags in zip(rows[:2], (wins, wins[keep]), strict=True):
        assert row["cells"][1] == str(flags.size)
        assert row["cells"][2] == f"{flags.mean():.1%}"
    assert rows[3]["cells"][2] == f"{np.concatenate([wins, wins[keep]]).mean():.1%}"
    images = [img for img in rendered.images if img["src"].startswith("data:")]
    assert len(images) == 3  # the per-task figure and each task's plots
    assert all(img["complete"] and img["width"] > 0 for img in images)


def test_libero_suite_report_fits_1280_px_with_watchable_videos(chromium, tmp_path):
    """A LIBERO suite's report (LIBERO's 80-character task names and
    instructions, ids ``gymnasium:libero:...``, 64 x 64 px videos) in a window
    1280 px wide: the page does not scroll sideways, no element reaches past
    the right edge, each video shows at least 256 px wide with its controls,
    and the title and text name the suite and tasks by LIBERO's own ids."""
    from .test_report_layout import libero_suite

    suite = libero_suite(2, video_dir=tmp_path)
    path = tmp_path / "suite.html"
    suite.report(path)
    rendered = render(path, width=1280)
    assert rendered.outside == []
    layout = rendered.layout
    assert layout["scrollWidth"] <= layout["viewport"] <= 1280, layout
    assert layout["past"] == [], layout["past"][:5]
    assert len(layout["videos"]) == 2
    for video in layout["videos"]:
        assert video["natural"] == [64, 64]  # it decoded
        assert video["width"] >= 256 and video["controls"], video
    page = Page(rendered.dom)
    text = " ".join(page.text)
    assert "chunk on libero:libero_spatial (2 tasks)" in text
    assert "gymnasium:libero" not in text
    rows = page.rows["tasks-table"]
    assert [r["data-task"] for r in rows][:2] == list(suite.tasks)


def test_a_libero_task_s_own_report_fits_1280_px(chromium, tmp_path):
    """One LIBERO task's report (``result.report``): the same checks."""
    from jaxmesh.results.video import write_video

    from .test_report_layout import libero_run

    frames = [np.full((64, 64, 3), 12 * t, np.uint8) for t in range(16)]
    video = write_video(frames, tmp_path / "ep0.mp4", fps=8)
    path = tmp_path / "task.html"
    libero_run(0, videos=[video]).report(path)
    rendered = render(path, width=1280)
    layout = rendered.layout
    assert layout["scrollWidth"] <= layout["viewport"] <= 1280, layout
    assert layout["past"] == [], layout["past"][:5]
    [video] = layout["videos"]
    assert video["natural"] == [64, 64] and video["width"] >= 256
    text = " ".join(Page(rendered.dom).text)
    assert "chunk on libero:libero_spatial/0" in text
    assert "gymnasium:libero" not in text
