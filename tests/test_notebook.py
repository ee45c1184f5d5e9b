"""The notebooks run top to bottom (their cells assert what they show).

``quickstart.ipynb``: JAX envs. ``tpu.ipynb``: lanes over 8 forced CPU devices
(run by tests/run/scan/test_sharded.py). ``remote.ipynb``: a ``jaxmesh serve-env`` child
serving HalfCheetah-v5 (started and stopped by the notebook itself).
``robot.ipynb``: a suite of Fetch tasks, one of them also served.

The notebooks run one after another in one kernel (starting a process with JAX
and jaxmesh costs seconds each): before each one, a first cell empties the
kernel's namespace (``%reset -f``: a name another notebook defined or imported
is gone), drops jaxmesh's cached programs and moves to the notebook's own
folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbclient
import nbformat
import pytest
from conftest import jupyter_kernel

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["quickstart.ipynb", "remote.ipynb", "robot.ipynb"]
#: Executed elsewhere: ``tpu.ipynb`` needs 8 forced CPU devices, set before JAX
#: starts (tests/run/scan/test_sharded.py runs it in such a kernel).
ELSEWHERE = ["tpu.ipynb"]
#: A kernel name of our own, so no kernelspec installed elsewhere can shadow it.
KERNEL = "jaxmesh-tests"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory):
    """One kernel of a kernelspec that runs this very interpreter (the venv
    pytest runs in), shared by the notebooks of this file."""
    with jupyter_kernel(tmp_path_factory.mktemp("kernel"), KERNEL) as km:
        yield km


#: The first cell of each run: no name, cached program or folder of another run.
CLEAN = """\
import os as _os
import jaxmesh as _jaxmesh
_os.chdir({workdir!r})
_jaxmesh.clear_cache()
get_ipython().run_line_magic("reset", "-f")
"""


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(
        NAMES + ELSEWHERE
    )


@pytest.mark.parametrize("name", NAMES + ELSEWHERE)
def test_notebook_is_stored_without_outputs(name: str):
    notebook = NOTEBOOKS / name
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{notebook} has no code cells"
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count]
    assert not dirty, f"code cells {dirty} of {notebook} keep outputs: clear them"


# A kernel and every cell of three notebooks (1.5 minutes on 2 cores): make test
# checks what they call (evaluate, sweep, stats, reports, videos) in process.
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name: str, kernel, tmp_path: Path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    workdir = tmp_path / "run"
    workdir.mkdir()
    # One extra cell first (a clean namespace in workdir), one last: which
    # interpreter the kernel ran, and that it ran in workdir.
    nb.cells.insert(0, nbformat.v4.new_code_cell(CLEAN.format(workdir=str(workdir))))
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import os, sys; print(sys.executable); print(os.getcwd())"
        )
    )
    client = nbclient.NotebookClient(nb, km=kernel, timeout=300)
    client.execute()  # raises CellExecutionError, naming the cell, if one fails
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in ran)
    assert nb.cells[-1].outputs[0]["text"].split() == [
        sys.executable,
        str(workdir.resolve()),
    ]
