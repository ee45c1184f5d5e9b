"""The test suite's warning filters (pyproject.toml's ``filterwarnings``): a
``DeprecationWarning`` a jaxmesh module issues fails the test that meets it,
while a third-party one stays at pytest's default (shown in the summary, the
test passing). Checked by running pytest, as ``make test`` does, on a file of
two tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import warnings


def test_jaxmesh_deprecation():
    warnings.warn_explicit("old", DeprecationWarning, "m.py", 1, module="jaxmesh.run.m")


def test_third_party_deprecation():
    warnings.warn_explicit("old", DeprecationWarning, "m.py", 1, module="numpy.m")
"""


def test_jaxmeshs_own_deprecations_fail_and_third_party_ones_do_not(tmp_path):
    (tmp_path / "test_deprecations.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml")]
        + ["--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-o", "addopts="]
        + ["-rA", "test_deprecations.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "FAILED test_deprecations.py::test_jaxmesh_deprecation" in out, out
    assert "DeprecationWarning: old" in out, out
    assert "PASSED test_deprecations.py::test_third_party_deprecation" in out, out
    assert "1 failed, 1 passed, 1 warning" in out, out
