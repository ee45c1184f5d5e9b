"""The command line's help, version and hints: fast, readable, complete.

``--help`` and ``--version`` run in a fresh process and must not import JAX
(nor anything else heavy): ``jaxmesh`` resolves its public names on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.cli.config import SCHEMA

COMMANDS = ("eval", "sweep", "explain", "describe", "compare", "report")
COMMANDS += ("check-env", "serve-env", "serve-policy")

#: What a fresh process prints after running ``main(argv)``: the modules it
#: imported that the help must not need.
PROBE = """
import json, sys
from jaxmesh.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = ("jax", "jaxlib", "numpy", "gymnasium", "grpc", "matplotlib", "tqdm")
print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""


def imported_by(*argv: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("--version",), *[(c, "--help") for c in COMMANDS]],
    ids=lambda a: " ".join(a),
)
def test_help_and_version_import_nothing_heavy(argv):
    assert imported_by(*argv) == []


def test_import_jaxmesh_imports_no_jax_until_a_name_is_used():
    code = (
        "import sys, jaxmesh\n"
        "print('jax' in sys.modules)\n"
        "jaxmesh.evaluate\n"
        "print('jax' in sys.modules)\n"
        "print(jaxmesh.model.Model is jaxmesh.Model)\n"  # a submodule, on demand
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True", "True"]


def test_every_public_name_resolves_to_its_module_s_object():
    import importlib

    table = {**jaxmesh._NAMES, **{n: f"jaxmesh.{n}" for n in jaxmesh._SUBMODULES}}
    assert sorted(table) == sorted(
        n for n in jaxmesh.__all__ if n not in jaxmesh._REMOTE
    )
    assert set(jaxmesh.__all__) <= set(dir(jaxmesh))
    for name, module in table.items():
        got = getattr(jaxmesh, name)
        mod = importlib.import_module(module)
        want = mod if name in jaxmesh._SUBMODULES else getattr(mod, name)
        assert got is want, name
        namespace: dict = {}
        exec(f"from jaxmesh import {name}", namespace)
        assert namespace[name] is want, name
    with pytest.raises(AttributeError, match="no attribute 'evalute'"):
        jaxmesh.evalute  # noqa: B018


def test_a_submodule_named_like_a_function_leaves_the_function():
    # ``jaxmesh/sweep.py`` and ``jaxmesh/explain.py`` are modules whose main
    # function is the public name; importing them (after ``jaxmesh.types``,
    # whose name shadows nothing) keeps the function there.
    code = (
        "import jaxmesh.types, jaxmesh.explain, jaxmesh.sweep, jaxmesh, sys\n"
        "print(jaxmesh.sweep is sys.modules['jaxmesh.sweep'].sweep)\n"
        "print(jaxmesh.explain is sys.modules['jaxmesh.explain'].explain)\n"
        "print(jaxmesh.types is sys.modules['jaxmesh.types'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "True", "True"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"jaxmesh {jaxmesh.__version__}"


def test_eval_help_lists_every_key_on_its_own_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["eval", "--help"]) == 0
    text = capsys.readouterr().out
    listing = text[text.index("config keys") :].splitlines()[1:]
    starts = [line.split()[0] for line in listing if not line.startswith("    ")]
    assert starts == list(SCHEMA)
    assert all(len(line) <= 100 for line in listing)
    line = next(x for x in listing if x.split()[0] == "num_envs")
    assert line.split() == ["num_envs", "int:", "parallel", "lanes", "(default:", "64)"]


#: Every kind of env id, as a user writes it (the hint must name each).
EVERY_PREFIX = (
    "gymnax:",
    "brax:",
    "playground:",
    "libero:",
    "gymnasium:",
    "grpc://",
)


def test_an_id_without_a_prefix_lists_every_prefix(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("env: CartPole-v1\npolicy: jaxmesh.zoo.cartpole:CartPoleMLP\n")
    assert main(["eval", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxmesh eval: error: ") and len(err.splitlines()) == 1
    assert "has no prefix" in err and "'gymnax:CartPole-v1'" in err
    for prefix in EVERY_PREFIX:
        assert prefix in err, prefix
