"""The repository's own wiring: Makefile targets, the Python floor, dependencies.

Each check reads the files a newcomer's ``make`` and ``pip install`` read
(``Makefile``, ``pyproject.toml``) and compares them with what exists: the
modules and files the Makefile runs, and the imports of ``jaxmesh/``, ``tests/``
and ``benchmarks/`` (parsed with ``ast``, so nothing is imported to check it).
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = ROOT / "Makefile"
PYPROJECT = ROOT / "pyproject.toml"
#: The declared floor, as (major, minor); ``test_python_floor_is_one_number``
#: checks that pyproject, ruff and the Makefile agree on it.
FLOOR = (3, 11)
#: Extras for code outside the package; ``jaxmesh/`` may not rely on them.
NOT_FOR_THE_PACKAGE = {"test", "dev", "bench", "peer", "torch"}
#: Extras that tests/ imports, beside [test] (make test-torch installs [torch]).
FOR_THE_TESTS = {"torch"}
#: Declared but never imported by name, and why.
NOT_IMPORTED = {
    "six": "gymnax 1.0.1 imports it without declaring it",
    "mujoco": "[robot] caps it below 3.12, where gymnasium-robotics' Fetch breaks",
}


def pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def _name(requirement: str) -> tuple[str, set[str]]:
    """A requirement string's normalized distribution name and its extras."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    assert m, f"cannot read the requirement {requirement!r} in {PYPROJECT}"
    extras = {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    return normalize(m.group(1)), extras


def normalize(name: str) -> str:
    """The PEP 503 form of a distribution name (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(*extras: str, core: bool = True) -> set[str]:
    """The distributions installed with ``jaxmesh[extras]`` (core deps if ``core``).

    ``jaxmesh[...]`` inside an extra is expanded, as pip does.
    """
    project = pyproject()["project"]
    optional = project.get("optional-dependencies", {})
    found: set[str] = set()
    todo = list(project["dependencies"]) if core else []
    seen: set[str] = set()
    pending = list(extras)
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        assert extra in optional, (
            f"extra [{extra}] is not in {PYPROJECT} (it has {sorted(optional)})"
        )
        todo.extend(optional[extra])
    while todo:
        name, sub = _name(todo.pop())
        if name == "jaxmesh":
            for extra in sub - seen:
                seen.add(extra)
                todo.extend(optional[extra])
        else:
            found.add(name)
    return found


def imports(folder: Path) -> dict[str, list[str]]:
    """Top-level third-party modules imported under ``folder`` -> the files.

    The standard library, ``jaxmesh`` itself and the folder's own modules
    (``tests/reference_loop.py``, ``benchmarks/common.py``) are left out.
    """
    local = {"jaxmesh", "__future__"}
    if not (folder / "__init__.py").exists():
        # Scripts import their neighbours by bare name (their folder is on
        # sys.path), and its test packages by theirs (``run.test_check_env``);
        # a package's own modules are imported as jaxmesh.*.
        local |= {p.stem for p in folder.glob("*.py")}
        local |= {p.parent.name for p in folder.glob("*/__init__.py")}
    found: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in local or top in sys.stdlib_module_names:
                    continue
                found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str, allowed: set[str]) -> set[str]:
    """The installed distributions providing ``module``.

    A module that is not installed here (``rlmesh``, say, without the ``[peer]``
    extra) counts as its namesake distribution when one is declared.
    """
    dists = _installed().get(module)
    if dists:
        return {normalize(d) for d in dists}
    return {normalize(module)} & allowed


def undeclared(folder: str, allowed: set[str]) -> list[str]:
    problems = []
    for module, files in sorted(imports(ROOT / folder).items()):
        dists = distributions(module, allowed)
        if not dists & allowed:
            problems.append(
                f"{module} (imported by {sorted(set(files))}; "
                f"distribution {sorted(dists) or 'not installed'})"
            )
    return problems


def package_extras() -> list[str]:
    optional = pyproject()["project"].get("optional-dependencies", {})
    return sorted(set(optional) - NOT_FOR_THE_PACKAGE)


def test_package_imports_only_declared_distributions():
    allowed = declared(*package_extras())
    bad = undeclared("jaxmesh", allowed)
    assert not bad, (
        f"jaxmesh/ imports modules whose distributions {PYPROJECT.name} does not "
        f"declare (in dependencies or extras {package_extras()}): {bad}; add each "
        "to dependencies (imported when jaxmesh is) or to an extra (imported on use)"
    )


def installed_without_deps() -> set[str]:
    """What the Makefile installs with ``pip install --no-deps`` (a
    distribution whose pins [test] cannot hold, its deps declared there)."""
    found = set()
    for _, _, spec in _commands(r"pip install --no-deps '([^']+)'"):
        found.add(_name(spec)[0])
    return found


def test_tests_and_benchmarks_import_only_their_extras():
    bad = undeclared(
        "tests", declared("test", *FOR_THE_TESTS) | installed_without_deps()
    )
    bad += undeclared("benchmarks", declared("peer"))
    assert not bad, (
        f"tests/ or benchmarks/ import modules that [test] (tests) or [peer] "
        f"(benchmarks, with [bench]) in {PYPROJECT.name} do not install: {bad}"
    )


def test_every_declared_distribution_is_imported():
    # The other direction: nothing is declared that no code imports (chex and
    # gymnasium once were), save what NOT_IMPORTED explains.
    project = pyproject()["project"]
    optional = project.get("optional-dependencies", {})
    used = {
        folder: {d for m in imports(ROOT / folder) for d in distributions(m, {m})}
        for folder in ("jaxmesh", "benchmarks", "tests")
    }
    # Each group's own entries (its jaxmesh[...] parts are checked under their
    # own names), against the code that group serves. [test] and [dev] hold
    # tools (pytest plugins, ruff, the notebook kernel), not imports.
    groups = {"dependencies": (project["dependencies"], "jaxmesh")}
    for extra in sorted(set(optional) - {"test", "dev"}):
        folder = "benchmarks" if extra in NOT_FOR_THE_PACKAGE else "jaxmesh"
        folder = "tests" if extra in FOR_THE_TESTS else folder
        groups[f"[{extra}]"] = (optional[extra], folder)
    unused = {}
    for group, (requirements, folder) in groups.items():
        names = {_name(r)[0] for r in requirements} - {"jaxmesh"}
        idle = sorted(names - used[folder] - set(NOT_IMPORTED))
        if idle:
            unused[group] = f"{idle} (not imported by {folder}/)"
    assert not unused, (
        f"{PYPROJECT.name} declares distributions that no code imports: "
        f"{unused}; remove them, or say in NOT_IMPORTED why they are needed"
    )


def test_declared_reads_a_known_layout():
    # The helpers above against a hand-written pyproject: pip's expansion of
    # jaxmesh[...] inside an extra, and PEP 503 names.
    assert _name("PyYAML>=6") == ("pyyaml", set())
    assert _name("rlmesh[numpy, gymnasium]==0.1.0") == (
        "rlmesh",
        {"numpy", "gymnasium"},
    )
    assert normalize("orbax_checkpoint") == "orbax-checkpoint"
    assert "optax" in declared("dev") and "six" in declared("train")
    assert "optax" not in declared()


def recipes() -> list[tuple[str, str]]:
    """(target, command) for every recipe line of the Makefile.

    Backslash continuations are joined into one command.
    """
    found: list[tuple[str, str]] = []
    target = None
    lines = iter(MAKEFILE.read_text().splitlines())
    for line in lines:
        if line.startswith("\t") and target is not None:
            command = line.strip()
            while command.endswith("\\"):
                command = command[:-1] + " " + next(lines).strip()
            found.append((target, command))
        elif m := re.match(r"^([^\s:=#][^:=]*):(?!=)", line):
            target = m.group(1).strip()
        elif line.strip() and not line.startswith("#"):
            target = None
    assert found, f"no recipe lines found in {MAKEFILE}"
    return found


def _commands(pattern: str) -> Iterable[tuple[str, str, str]]:
    for target, command in recipes():
        for m in re.finditer(pattern, command):
            yield target, command, m.group(1)


def module_exists(name: str) -> bool:
    """Whether ``python -m name`` would find the module, importing nothing.

    ``importlib.util.find_spec("a.b")`` imports ``a``; here each package's
    search path is walked instead, so a package that fails to import still
    shows whether the module file exists.
    """
    head, *rest = name.split(".")
    spec = importlib.util.find_spec(head)
    for i in range(len(rest)):
        locations = spec.submodule_search_locations if spec else None
        if not locations:
            return False
        full = ".".join([head, *rest[: i + 1]])
        spec = importlib.machinery.PathFinder.find_spec(full, list(locations))
    return spec is not None


def test_makefile_python_modules_exist():
    checked = []
    for target, command, module in _commands(r"python -m ([\w.]+)"):
        checked.append(module)
        assert module_exists(module), (
            f"make {target} runs `{command}`, but there is no module {module!r}; "
            "fix the module path in the Makefile"
        )
    assert "jaxmesh.zoo.train_cartpole" in checked, checked
    # The check itself: the path `make train` once ran is refused.
    assert not module_exists("jaxmesh.train_cartpole")


def test_makefile_files_exist():
    # Scripts and files named in recipes (benchmarks/run_all.py,
    # configs/cartpole.yaml), relative to the repository root.
    pattern = r"(?:^|\s)((?:[\w.-]+/)+[\w.-]+\.(?:py|yaml|yml|json|toml))(?=\s|$)"
    checked = []
    for target, command, path in _commands(pattern):
        checked.append(path)
        assert (ROOT / path).is_file(), (
            f"make {target} runs `{command}`, but {path} does not exist in the "
            "repository"
        )
    assert "configs/cartpole.yaml" in checked, checked


def test_makefile_extras_and_programs_are_declared():
    project = pyproject()["project"]
    optional = project.get("optional-dependencies", {})
    for target, _, extras in _commands(r"pip install -e '\.\[([\w,]+)\]'"):
        for extra in extras.split(","):
            assert extra in optional, (
                f"make {target} installs extra [{extra}], which {PYPROJECT.name} "
                f"does not define (it has {sorted(optional)})"
            )
    everything = declared(*optional)
    for target, _, program in _commands(r"\$\(BIN\)/([\w-]+)"):
        if program in ("python", "pip"):
            continue
        if program in project.get("scripts", {}):
            module = project["scripts"][program].split(":")[0]
            assert module_exists(module), (
                f"make {target} runs {program}, whose entry point module "
                f"{module!r} does not exist"
            )
        else:
            assert normalize(program) in everything, (
                f"make {target} runs {program}, which is neither a script of "
                f"this project nor a declared dependency"
            )


def test_python_floor_is_one_number():
    # exc.add_note (3.11) is used: pyproject, ruff's target and the Makefile's
    # guard must all say 3.11, and this interpreter must meet it.
    config = pyproject()
    major, minor = FLOOR
    assert config["project"]["requires-python"] == f">={major}.{minor}"
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert f"sys.version_info < ({major}, {minor})" in MAKEFILE.read_text(), (
        f"{MAKEFILE} should refuse interpreters older than {major}.{minor}"
    )
    assert sys.version_info >= FLOOR


@pytest.mark.parametrize(
    "where",
    ["README.md", "Makefile", "pyproject.toml", "jaxmesh", "tests", "benchmarks"]
    + ["docs", "notebooks", "configs", ".ci"],
)
def test_no_path_outside_the_repository(where):
    # A clone anywhere must work: no link to, or read from, a sibling folder or
    # one machine's paths (the anchors and the contract once lived there).
    # Spelled in pieces so that this file does not match itself.
    sibling, machine = re.escape("../" + "shared"), re.escape("/" + "work/")
    anchors = re.escape("shared" + "/anchors")
    outside = re.compile(rf"{sibling}|{machine}|(?<![\w.]){anchors}")
    top = ROOT / where
    paths = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in paths
        if p.suffix not in (".npz", ".pyc")
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert not hits, f"paths outside the repository at {hits}"


def test_trainer_names_its_extra_when_optax_is_missing(monkeypatch):
    # optax is declared in [train] only, so a plain install must say what to do.
    monkeypatch.setitem(sys.modules, "optax", None)  # None: "import optax" fails
    monkeypatch.delitem(sys.modules, "jaxmesh.zoo.train_cartpole", raising=False)
    monkeypatch.delitem(sys.modules, "jaxmesh.zoo.es", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'jaxmesh\[train\]'"):
        importlib.import_module("jaxmesh.zoo.train_cartpole")


def test_rlmesh_peer_installs_nothing_and_names_its_extra(monkeypatch, capsys):
    # The benchmark once pip-installed rlmesh into a throwaway venv at run time;
    # now rlmesh is the [peer] extra, and without it the script says so.
    source = (ROOT / "benchmarks" / "rlmesh_peer.py").read_text()
    tree = ast.parse(source)
    imported = {
        a.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
    }
    assert "subprocess" not in imported and "pip" not in imported
    assert "rlmesh" in declared("peer", core=False)
    monkeypatch.setitem(sys.modules, "rlmesh", None)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delitem(sys.modules, "rlmesh_peer", raising=False)
    peer = importlib.import_module("rlmesh_peer")
    assert peer.main(["--quick"]) == []
    out = capsys.readouterr().out
    assert "rlmesh not measured" in out and "pip install 'jaxmesh[peer]'" in out, out


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def markdown_sources() -> list[tuple[Path, str]]:
    """(file, Markdown text) of every doc a reader follows links in."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "benchmarks").glob("*.md"))
    files += sorted((ROOT / "tests" / "data").rglob("*.md"))
    found = [(p, p.read_text()) for p in files]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        text = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
        )
        found.append((nb, text))
    return found


def test_relative_links_resolve_inside_the_repository():
    # docs/contract.md replaced a link to a file outside the repository; every
    # relative link (and its #anchor) must point at something a clone has.
    broken = []
    for path, text in markdown_sources():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)} -> {target}"
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{where} (no such file in the repository)")
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+\s+(.*)$", dest.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{where} (no heading with that anchor)")
    assert not broken, f"broken links: {broken}"
