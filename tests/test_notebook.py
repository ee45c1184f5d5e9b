"""The notebooks run top to bottom (their cells assert what they show).

``quickstart.ipynb``: JAX envs. ``tpu.ipynb``: lanes over 8 forced CPU devices
(run by tests/test_sharded.py). ``remote.ipynb``: a ``jaxmesh serve-env`` child
serving HalfCheetah-v5 (started and stopped by the notebook itself).
``robot.ipynb``: a suite of Fetch tasks, one of them also served.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["quickstart.ipynb", "remote.ipynb", "robot.ipynb"]
#: Executed elsewhere: ``tpu.ipynb`` needs 8 forced CPU devices, set before JAX
#: starts (tests/test_sharded.py runs it in such a kernel).
ELSEWHERE = ["tpu.ipynb"]
#: A kernel name of our own, so no kernelspec installed elsewhere can shadow it.
KERNEL = "jaxmesh-tests"


@pytest.fixture
def kernel_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec that runs this very interpreter (the venv pytest runs in)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


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


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name: str, kernel_name: str, tmp_path: Path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # One extra cell last: which interpreter the kernel ran.
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    workdir = tmp_path / "run"
    workdir.mkdir()
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=300,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, if one fails
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in ran)
    assert nb.cells[-1].outputs[0]["text"].strip() == sys.executable
