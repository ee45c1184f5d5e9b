"""The report's figures with LIBERO's long task names, measured in matplotlib's
own renderer: every label inside the figure, no two tick labels overlapping,
the title whole, episode ticks whole numbers, and no layout warning.

The suite is synthetic (LIBERO's real task names and ids, two episodes a task),
so the test needs matplotlib only; ``test_report_browser`` renders the same
suite's page in Chromium at 1280 px.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest

from jaxmesh.results import report
from jaxmesh.results.result import RunResult
from jaxmesh.results.summary import short_env
from jaxmesh.suite import SuiteResult

pytest.importorskip("matplotlib")

#: LIBERO-Spatial's first three task names (``libero.libero.benchmark``).
LIBERO_NAMES = [
    "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate",
    "pick_up_the_black_bowl_next_to_the_ramekin_and_place_it_on_the_plate",
    "pick_up_the_black_bowl_from_table_center_and_place_it_on_the_plate",
]


def libero_run(k: int, flags=(True, False), videos=()) -> RunResult:
    """Task k of libero_spatial as a run of ``len(flags)`` episodes."""
    flags = np.asarray(flags, bool)
    n = flags.size
    return RunResult(
        indices=np.arange(n),
        seeds=np.arange(n),
        returns=flags.astype(np.float32),
        lengths=np.arange(n) * 100 + 120,
        terminated=flags,
        truncated=~flags,
        predict_calls=np.arange(n) * 20 + 24,
        lanes=np.arange(n) % 2,
        env_steps=int(n * 170),
        policy_rows=n * 34,
        wall_time=30.0,
        compile_time=5.0,
        run_time=25.0,
        num_envs=2,
        horizon=5,
        effective_horizon=5,
        prefetch_lead=0,
        policy="chunk",
        env=f"gymnasium:libero:libero_spatial/{k}",
        chunk=5,
        success=flags.astype(object),
        success_once=flags.astype(object),
        success_at_end=flags.astype(object),
        success_key="success",
        instruction=LIBERO_NAMES[k % 3].replace("_", " "),
        telemetry={
            "predict": {
                "count": 68,
                "mean": 0.01,
                "p50": 0.01,
                "p95": 0.02,
                "p99": 0.03,
            },
            "transport_shm": {"count": 1, "mean": 1.0, "p50": 1, "p95": 1, "p99": 1},
        },
        videos=[str(v) for v in videos],
    )


def libero_suite(tasks: int = 2, video_dir: Path | None = None) -> SuiteResult:
    """A synthetic libero_spatial suite; with ``video_dir``, each task has a
    64 x 64 mp4 (LIBERO's camera at a small ``camera_size``)."""
    runs, said = {}, {}
    for k in range(tasks):
        name = LIBERO_NAMES[k % 3] + ("" if k < 3 else f"_{k}")
        videos = []
        if video_dir is not None:
            from jaxmesh.results.video import write_video

            frames = [np.full((64, 64, 3), 12 * t, np.uint8) for t in range(16)]
            videos = [write_video(frames, video_dir / f"task{k}.mp4", fps=8)]
        runs[name] = libero_run(k, videos=videos)
        said[name] = name.replace("_", " ")
    return SuiteResult(runs, said, 60.0)


def drawn(fig):
    """``fig`` drawn, with warnings (constrained layout's) as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.canvas.draw()
    return fig.canvas.get_renderer()


def tick_labels(axis):
    """An axis's tick labels that are drawn (their tick inside the view)."""
    low, high = sorted(axis.get_view_interval())
    return [
        tick.label1
        for tick in axis.get_major_ticks()
        if tick.label1.get_visible() and low - 1e-9 <= tick.get_loc() <= high + 1e-9
    ]


def boxes(fig, renderer, texts):
    return [t.get_window_extent(renderer) for t in texts if t.get_text()]


def inside(fig, box) -> bool:
    return (
        box.x0 >= -0.5
        and box.y0 >= -0.5
        and box.x1 <= fig.bbox.width + 0.5
        and box.y1 <= fig.bbox.height + 0.5
    )


@pytest.mark.parametrize("tasks", [2, 10])
def test_suite_plot_labels_are_whole_and_apart(tasks):
    suite = libero_suite(tasks)
    fig = report.suite_plot(suite, suite.stats(resamples=200))
    renderer = drawn(fig)
    texts = [t for ax in fig.axes for t in tick_labels(ax.yaxis)]
    texts += [t for ax in fig.axes for t in tick_labels(ax.xaxis)]
    texts += [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    for box in boxes(fig, renderer, texts):
        assert inside(fig, box), box
    names = [t for t in tick_labels(fig.axes[0].yaxis) if t.get_text()]
    assert len(names) == tasks
    shown = [t.get_text().replace("\n", "") for t in names]
    assert shown == list(suite.tasks)  # every name whole, in order
    ys = boxes(fig, renderer, names)
    for a in range(len(ys)):
        for b in range(a + 1, len(ys)):
            assert not ys[a].overlaps(ys[b]), (shown[a], shown[b])


def test_a_task_s_plot_title_is_whole_and_episodes_are_counted_whole():
    result = libero_run(0)
    fig = report.plot(result)
    renderer = drawn(fig)
    title = fig._suptitle
    assert title.get_text().replace("\n", " ") == (
        "chunk on libero:libero_spatial/0: 2 episodes"
    )
    assert inside(fig, title.get_window_extent(renderer))
    # A LIBERO task's own name as the title (the suite report's): wrapped, whole.
    fig = report.plot(result, f"{LIBERO_NAMES[0]}: 2 episodes")
    renderer = drawn(fig)
    assert fig._suptitle.get_text().replace("\n", "").replace(" ", "") == (
        f"{LIBERO_NAMES[0]}:2episodes"
    )
    assert inside(fig, fig._suptitle.get_window_extent(renderer))
    [success] = [ax for ax in fig.axes if ax.get_title() == "Success over episodes"]
    shown = [label.get_text() for label in tick_labels(success.xaxis)]
    assert shown == ["0", "1"]  # two episodes: two whole ticks


def test_short_env_by_hand():
    assert short_env("gymnasium:libero:libero_spatial/0") == "libero:libero_spatial/0"
    assert short_env("gymnasium:CartPole-v1") == "gymnasium:CartPole-v1"
    assert short_env("gymnax:CartPole-v1") == "gymnax:CartPole-v1"
    assert short_env("") == ""


def test_suite_title_names_the_benchmark_suite():
    suite = libero_suite(2)
    assert report.suite_name(suite) == "libero:libero_spatial (2 tasks)"
    html = report.suite_report_html(suite, resamples=200)
    assert "<h1>chunk on libero:libero_spatial (2 tasks)</h1>" in html
    other = dataclasses.replace(libero_run(1), env="gymnax:CartPole-v1")
    assert report.suite_name(SuiteResult({"a": libero_run(0), "b": other})) == (
        "a suite of 2 tasks"
    )
    assert report.suite_name(SuiteResult({"a": libero_run(0)})) == (
        "libero:libero_spatial (1 task)"
    )


def test_the_progress_bar_names_a_libero_task_by_its_own_id():
    import io

    from jaxmesh.cli.hooks import Progress

    out = io.StringIO()
    bar = Progress(stream=out)
    info = {"policy": "chunk", "env": "gymnasium:libero:libero_spatial/0"}
    bar.on_run_start({**info, "episodes": 2})
    bar.bar.close()
    assert "chunk on libero:libero_spatial/0" in out.getvalue()
    assert "gymnasium:libero" not in out.getvalue()
