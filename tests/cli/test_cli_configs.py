"""Every shipped config and every YAML example in the docs is a config that
``jaxmesh eval`` reads: each passes the command line's own check (nothing is
built or run)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from jaxmesh.cli.build import run_config
from jaxmesh.cli.checks import check_run_config
from jaxmesh.cli.config import SCHEMA, load_config, yaml_load
from jaxmesh.run.config import GROUPS, RunConfig
from jaxmesh.suite import make_suite

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
#: A fenced ```yaml block of a Markdown file.
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def doc_blocks() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for m in YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{path.name}:{line}", m.group(1)))
    return out


DOC_BLOCKS = doc_blocks()


@pytest.fixture(autouse=True)
def _gl_unchanged(monkeypatch):
    """Making a LIBERO suite picks a headless OpenGL for this process
    (``MUJOCO_GL``, ``PYOPENGL_PLATFORM``); it stays this test's: a later
    test's worker processes import MuJoCo with the machine's own setting."""
    for name in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):
        # setenv records the value to restore at the end (or that there was
        # none); delenv alone records nothing for an unset variable.
        was = os.environ.get(name)
        monkeypatch.setenv(name, "" if was is None else was)
        if was is None:
            monkeypatch.delenv(name)


def check(config: dict) -> None:
    """``check_run_config``; a ``suite:`` config is skipped where its suite
    cannot be made (LIBERO or its OpenGL library missing): the check expands
    it into its tasks."""
    if config.get("suite") is not None:
        try:
            make_suite("libero:libero_spatial", tasks=[0], episodes=None)
        except (ImportError, RuntimeError) as e:
            pytest.skip(f"a LIBERO suite cannot be made here: {e}")
    run_config(check_run_config(config))  # RunConfig checks metrics, modes...


def test_each_run_key_says_its_fields_default():
    """A key that names a ``RunConfig`` field (flat or in a group) has that
    field's default, or null where the help describes it in words (the help
    is printed without importing ``jaxmesh.run.config``)."""
    fields = [*dataclasses.fields(RunConfig)]
    for cls in GROUPS.values():
        fields += dataclasses.fields(cls)
    named = {f.name: f.default for f in fields if f.name in SCHEMA}
    assert len(named) > 15
    for name, default in named.items():
        assert SCHEMA[name].default in (None, default), name


def test_there_is_something_to_check():
    assert len(CONFIGS) >= 6 and len(DOC_BLOCKS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_file_passes_the_check(path):
    check(load_config(path))


@pytest.mark.parametrize("block", DOC_BLOCKS, ids=lambda b: b[0])
def test_every_yaml_example_in_the_docs_passes_the_check(block):
    where, text = block
    config = yaml_load(text)
    assert isinstance(config, dict), where
    check(config)


def test_every_config_named_in_the_docs_exists():
    named = set()
    for path in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]:
        named |= set(re.findall(r"configs/[\w.-]+\.yaml", path.read_text("utf-8")))
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing
