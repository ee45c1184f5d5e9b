"""What a report says of where its numbers come from, a suite report's episodes
and videos, and the lines that replace plots of one value: checked in the HTML
(parsed) against hand-built results."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from jaxmesh.results import summary  # noqa: E402
from jaxmesh.results.result import RunResult, made_with  # noqa: E402
from jaxmesh.suite import SuiteResult  # noqa: E402

from .test_report import Page, make_result  # noqa: E402

FINGERPRINT = {"env": "e" * 32, "policy": "p" * 32, "jax": "0.4.99"}
PROVENANCE = {
    "date": "2026-01-02T03:04:05+00:00",
    "versions": {"jaxmesh": "9.9.9", "jax": "0.4.99", "jaxlib": "0.4.98"},
}


def test_made_with_names_the_date_and_the_versions():
    made = made_with()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", made["date"])
    assert set(made["versions"]) == {"jaxmesh", "jax", "jaxlib", "numpy", "python"}
    assert made["versions"]["numpy"] == np.__version__


def test_provenance_survives_the_json():
    result = make_result([1.0, 2.0], fingerprint=FINGERPRINT, provenance=PROVENANCE)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["provenance"] == PROVENANCE
    back = RunResult.from_dict(d)
    assert back.provenance == PROVENANCE and back.to_dict() == d
    # A result without one writes none, and reads back as None.
    plain = make_result([1.0, 2.0])
    assert "provenance" not in plain.to_dict()
    assert RunResult.from_dict(plain.to_dict()).provenance is None


def test_report_holds_the_seeds_identity_date_and_versions(tmp_path):
    result = make_result(
        [3.0, 5.0, 4.0, 4.0, 9.0], fingerprint=FINGERPRINT, provenance=PROVENANCE
    )
    page = Page(result.report(tmp_path / "r.html").read_text())
    rows = page.keyed("provenance-table")
    # make_result's seeds are 100, 101, ...: a range, said as one.
    assert rows["seeds"]["cells"][1] == "100 to 104 (5 seeds, in episode order)"
    assert page.value("provenance-table", "seeds") == {
        "count": 5,
        "first_last": [100, 104],
    }
    for key, value in FINGERPRINT.items():
        assert page.value("provenance-table", f"fingerprint.{key}") == value
    assert page.value("provenance-table", "provenance.date") == PROVENANCE["date"]
    for name, version in PROVENANCE["versions"].items():
        assert page.value("provenance-table", f"provenance.versions.{name}") == version
    # The settings the run was given are on the same page.
    assert page.value("settings-table", "horizon") == 4


def test_report_without_provenance_says_so(tmp_path):
    page = Page(make_result([1.0, 2.0]).report(tmp_path / "r.html").read_text())
    rows = page.keyed("provenance-table")
    assert rows["provenance.date"]["cells"][1] == "not recorded"
    assert set(rows) == {"seeds", "provenance.date"}


def test_seeds_text_by_hand():
    assert summary.seeds_text([7]) == "7"
    assert summary.seeds_text([]) == "none"
    assert summary.seeds_text([5, 6, 7]) == "5 to 7 (3 seeds, in episode order)"
    assert summary.seeds_text([1, 3, 2]) == "1, 3, 2"
    assert (
        summary.seeds_text(range(0, 20, 2))
        == "0, 2, 4, 6, 8, 10, 12, 14, ... (10 seeds)"
    )


def test_a_plot_of_one_value_is_one_line(tmp_path):
    # Every length 50, returns varied: no lengths histogram, one line instead.
    result = make_result([1.0, 2.0, 3.0], [50, 50, 50])
    page = Page(result.report(tmp_path / "r.html").read_text())
    text = "".join(page.text)
    assert "Every episode lasted 50 env steps." in text
    (alt,) = [a["alt"] for t, a in page.tags if t == "img"]
    assert alt == "Plots: Returns, Returns CDF"
    # Nothing varies: the lines, and no image at all.
    flat = make_result([500.0] * 4, [500] * 4)
    page = Page(flat.report(tmp_path / "flat.html").read_text())
    text = "".join(page.text)
    assert "Every episode returned 500." in text
    assert "Every episode lasted 500 env steps." in text
    assert not [a for t, a in page.tags if t == "img"]


def test_suite_report_lists_each_tasks_episodes_videos_and_provenance(tmp_path):
    video = tmp_path / "ep0.gif"
    video.write_bytes(b"GIF89a" + bytes(20))  # embedded as it is, never decoded
    a = make_result([1.0, 2.0, 3.0], fingerprint=FINGERPRINT, provenance=PROVENANCE)
    a = dataclasses.replace(a, videos=[video.name])
    b = make_result([4.0, 6.0])
    suite = SuiteResult(tasks={"reach": a, "push": b}, wall_time=2.0)
    path = suite.report(tmp_path / "suite.html")
    page = Page(path.read_text())
    assert page.section_ids() == ["tasks", "plots", "task-0", "task-1", "provenance"]
    # Each task's episodes: every row as the result holds it (seed, return).
    for k, result in enumerate((a, b)):
        rows = page.rows[f"task-{k}-episodes-table"]
        assert [json.loads(r["data-value"])[1:3] for r in rows] == [
            [int(s), float(x)]
            for s, x in zip(result.seeds, result.returns, strict=True)
        ]
    # A relative video path is read from the working directory: from elsewhere
    # it is named as not found; from its folder, task reach's is embedded.
    assert not [a for t, a in page.tags if a.get("data-video")]
    assert "Video: ep0.gif: not found." in "".join(page.text)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        page = Page(suite.report(tmp_path / "suite2.html").read_text())
    videos = [a["data-video"] for t, a in page.tags if a.get("data-video")]
    assert videos == ["ep0.gif"]
    # Each task's settings and provenance.
    assert (
        page.value("task-0-provenance-table", "provenance.date") == (PROVENANCE["date"])
    )
    assert page.value("task-1-provenance-table", "seeds") == {
        "count": 2,
        "first_last": [100, 101],
    }
    assert page.value("task-1-provenance-table", "num_envs") == 16
