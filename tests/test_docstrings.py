"""Every module path the package's docstrings and comments name exists.

A docstring that says where something lives (``jaxmesh.core.tally.write``) is
a link a reader follows; after a move or a rename it silently points nowhere.
Each ``jaxmesh.<a>.<b>...`` written in ``jaxmesh/**/*.py`` (generated gRPC code
aside) must import as a module, its remaining names found with ``getattr``;
and the engine's results module, ``jaxmesh/core/tally.py``, is never called by
its old name ``core.results``.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxmesh"

#: ``jaxmesh`` followed by at least one dotted name.
DOTTED = re.compile(r"\bjaxmesh(?:\.[A-Za-z_][A-Za-z0-9_]*)+")

#: A path written from a subpackage, in double backticks (``core.tally.write``):
#: resolved as ``jaxmesh.<it>``. A file name (``run.json``) is none.
SHORT = re.compile(
    r"``((?:core|run|envs|remote|results|serve|cli|zoo)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)"
)
FILE_SUFFIXES = ("py", "json", "yaml", "yml", "npz", "txt", "html", "proto")

#: The gRPC packages of the wire protocol (``package jaxmesh.env.v1;`` in
#: jaxmesh_env.proto): service and message names, not Python modules.
PROTO_PACKAGES = ("jaxmesh.env.v1", "jaxmesh.policy.v1")


def sources() -> list[Path]:
    """The package's Python files, generated protobuf and gRPC code left out."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "_pb2" not in p.name)


def paths_in(line: str) -> list[str]:
    """The dotted ``jaxmesh.`` paths one line names, a short one (``SHORT``)
    under its full name. A path followed by ``*``
    (``jaxmesh.core.agent.STREAM_*``) names every attribute with that prefix;
    it is kept with its ``*``."""
    out = []
    for m in DOTTED.finditer(line):
        name = m.group(0)
        if line[m.end() : m.end() + 1] == "*":
            name += "*"
        if not name.startswith(PROTO_PACKAGES):
            out.append(name)
    for m in SHORT.finditer(line):
        if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
            out.append(f"jaxmesh.{m.group(1)}")
    return out


def named_paths() -> dict[str, list[str]]:
    """Each path the sources name (``paths_in``) -> where (``file:line``)."""
    found: dict[str, list[str]] = {}
    for path in sources():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for name in paths_in(line):
                where = f"{path.relative_to(PACKAGE.parent)}:{lineno}"
                found.setdefault(name, []).append(where)
    return found


def module_file(module_name: str) -> Path | None:
    """The source of a ``jaxmesh`` module, or None when there is none."""
    path = PACKAGE.parent.joinpath(*module_name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined_names(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body defines: defs, classes, assignments
    and imports (``import a.b`` defines ``a``)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING, optional imports
            names |= defined_names(node.body)
            for handler in getattr(node, "handlers", []):
                names |= defined_names(handler.body)
            names |= defined_names(node.orelse)
    return names


def resolve_statically(source: Path, rest: list[str], prefix: bool) -> str | None:
    """``resolve`` for a module that does not import here (an extra it needs
    is not installed): its names are read from its source, a class's from its
    body; deeper names are taken on trust."""
    body = ast.parse(source.read_text()).body
    for j, attr in enumerate(rest):
        names = defined_names(body)
        if j == len(rest) - 1 and prefix:
            return (
                None
                if any(n.startswith(attr) for n in names)
                else (f"{source} defines no name {attr}*")
            )
        if attr not in names:
            return f"{source} defines no name {attr!r}"
        node = next(
            (n for n in body if isinstance(n, ast.ClassDef) and n.name == attr), None
        )
        if node is None:
            return None
        body = node.body
    return None


def resolve(dotted: str) -> str | None:
    """None when ``dotted`` names a module or an attribute of one, else why not.

    The longest prefix that imports is the module; every name after it must
    be an attribute of the one before (a trailing ``*``: some attribute starts
    with the last name). A module that needs an extra not installed here is
    read from its source instead (``resolve_statically``).
    """
    prefix = dotted.endswith("*")
    parts = dotted.rstrip("*").split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if missing.startswith("jaxmesh"):
                continue  # not a module: a shorter prefix may be
            source = module_file(module_name)
            if source is None:
                return f"importing {module_name} failed: {e}"
            return resolve_statically(source, parts[i:], prefix)
        rest = parts[i:]
        for j, attr in enumerate(rest):
            last = j == len(rest) - 1
            if last and prefix:
                if not any(a.startswith(attr) for a in dir(obj)):
                    return f"{'.'.join(parts[: i + j])} has no attribute {attr}*"
            elif not hasattr(obj, attr):
                return f"{'.'.join(parts[: i + j])} has no attribute {attr!r}"
            else:
                obj = getattr(obj, attr)
        return None
    return "no prefix of it is a module"


def test_the_proto_packages_skipped_are_the_wire_protocols_own():
    proto = (PACKAGE / "remote" / "proto" / "jaxmesh_env.proto").read_text()
    declared = re.findall(r"^package\s+([\w.]+);", proto, re.M)
    assert declared and all(p in PROTO_PACKAGES for p in declared), declared


def test_the_scan_finds_the_paths_it_should():
    """The scan itself: what it reads in a line, that it sees a path known to
    be written in a docstring (``core/engine.py`` cites
    ``jaxmesh.envs.envpool``), and that a made-up path does not resolve."""
    line = (
        "see ``jaxmesh.core.tally.write``, ``core.rules.due``, "
        "jaxmesh.core.agent.STREAM_*, jaxmesh.env.v1.StepRequest and ``run.json``."
    )
    assert paths_in(line) == [
        "jaxmesh.core.tally.write",
        "jaxmesh.core.agent.STREAM_*",
        "jaxmesh.core.rules.due",
    ]
    assert "jaxmesh.envs.envpool" in named_paths()
    assert resolve("jaxmesh.core.tally.write") is None
    assert resolve("jaxmesh.core.agent.STREAM_*") is None
    assert resolve("jaxmesh.core.results") is not None
    assert resolve("jaxmesh.core.tally.no_such_name") is not None
    assert resolve("jaxmesh.core.agent.NO_SUCH_*") is not None


def test_a_module_whose_extra_is_missing_is_read_from_its_source(monkeypatch):
    """Where an extra is not installed, its modules' names are still checked:
    ``jaxmesh.core.tally`` read as if importing it failed for lack of a
    third-party package."""

    def no_extra(name):
        if name == "jaxmesh.core.tally":
            raise ModuleNotFoundError("No module named 'somextra'", name="somextra")
        return real(name)

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", no_extra)
    assert resolve("jaxmesh.core.tally") is None
    assert resolve("jaxmesh.core.tally.write") is None
    assert resolve("jaxmesh.core.tally.Results.returns") is None
    assert resolve("jaxmesh.core.tally.REDUC*") is None
    assert resolve("jaxmesh.core.tally.no_such_name") is not None
    assert resolve("jaxmesh.core.tally.Results.no_such_field") is not None


def test_every_dotted_path_in_the_package_resolves():
    broken = {}
    for name, where in sorted(named_paths().items()):
        why = resolve(name)
        if why is not None:
            broken[name] = (why, where)
    assert not broken, "\n".join(
        f"{name}: {why} (named at {', '.join(where)}); point it at where the "
        "thing lives now"
        for name, (why, where) in broken.items()
    )


def test_the_results_module_is_called_by_its_name():
    """The engine's results pytree lives in ``jaxmesh/core/tally.py``."""
    stale = "core.results"
    hits = [
        f"{p.relative_to(PACKAGE.parent)}:{n}"
        for p in sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if stale in line
    ]
    assert not hits, f"{stale!r} (the module is jaxmesh.core.tally) at: {hits}"
