"""How jaxmesh's modules depend on each other, read from the source with ``ast``.

Imports at any depth count (inside functions and ``if TYPE_CHECKING:`` blocks
too): a lazy import hides a circle, it does not break it.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxmesh"

#: Circles still in the tree, each for its file's owner to break. The test
#: fails on any other, so the list only shrinks.
KNOWN_CIRCLES: set[frozenset[str]] = set()


@functools.cache
def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@functools.cache
def imported(name: str) -> frozenset[str]:
    """The modules module ``name`` imports, at any depth; ``from a import b``
    counts as ``a.b`` when that is a module of the package, else as ``a``."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules() else base)
    return frozenset(out)


def jaxmesh_imports(name: str) -> set[str]:
    """The package's own modules that module ``name`` imports."""
    return set(imported(name)) & set(modules())


def test_no_two_modules_import_each_other():
    circles = {
        frozenset({a, b})
        for a in modules()
        for b in jaxmesh_imports(a)
        if a != b and a in jaxmesh_imports(b)
    }
    new = sorted(sorted(c) for c in circles - KNOWN_CIRCLES)
    assert not new, (
        f"modules that import each other: {new}; move what both need into a "
        "module that both import one way"
    )
    # The circles this list once held stay broken.
    for pair in (
        {"jaxmesh.core.policy", "jaxmesh.types"},
        {"jaxmesh.results.report", "jaxmesh.results.result"},
        {"jaxmesh.run.scan.evaluator", "jaxmesh.run.scan.sharded"},
        {"jaxmesh.run.config", "jaxmesh.run.resume"},
    ):
        assert frozenset(pair) not in circles


def test_no_circle_of_any_length():
    # Longer circles too (a -> b -> c -> a), lazy imports included: a table
    # that imports the backends on use while they import it back is one.
    graph = {
        m: {i for i in jaxmesh_imports(m) if i not in (m, "jaxmesh")} for m in modules()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(
            f"an import circle: {' -> '.join(exc.args[1])}; move what the modules "
            "share into one that they all import one way"
        ) from None


def _closure(name: str) -> set[str]:
    """``name`` and the package's modules it imports, transitively (the package
    roots that Python loads on the way are not followed: ``jaxmesh/__init__``
    re-exports the evaluator)."""
    seen, todo = set(), [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo.extend(m for m in jaxmesh_imports(mod) if m != "jaxmesh")
    return seen


def test_the_wire_modules_import_no_jax():
    # The server shares them, and it must run where JAX is not installed.
    jax_like = {"jax", "jaxlib", "flax", "chex", "optax"}
    for name in (
        "jaxmesh.remote.protocol",
        "jaxmesh.remote.codec",
        "jaxmesh.remote.client",
    ):
        third = {
            i.split(".")[0]
            for mod in _closure(name)
            for i in imported(mod)
            if not i.startswith("jaxmesh")
        }
        assert not third & jax_like, (name, sorted(third & jax_like))
    # The protocol's names need nothing beyond the standard library (numpy
    # for type checkers only).
    assert imported("jaxmesh.remote.protocol") <= {"__future__", "typing", "numpy"}


def _module_level_names(path: Path) -> set[str]:
    """Names a file assigns at module level."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def test_each_protocol_constant_is_defined_once():
    from jaxmesh.remote import protocol

    for name, path in modules().items():
        if name == "jaxmesh.remote.protocol":
            continue
        twice = _module_level_names(path) & set(protocol.__all__)
        assert not twice, (
            f"{path.relative_to(ROOT)} defines {sorted(twice)} again; import them "
            "from jaxmesh.remote.protocol"
        )


def test_one_version_string():
    import jaxmesh
    from jaxmesh._version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "jaxmesh._version.__version__"
    assert jaxmesh.__version__ is __version__
    defining = [
        name
        for name, path in modules().items()
        if "__version__" in _module_level_names(path)
    ]
    assert defining == ["jaxmesh._version"]
    # The client (and the JAX-free server) never load the package root for it.
    for name in ("jaxmesh.remote.client", "jaxmesh.remote.server"):
        assert "jaxmesh" not in imported(name), name


def test_the_core_imports_without_the_remote_extra():
    # gRPC is the [remote] extra: evaluate, sweeps, suites and the CLI import
    # without it (a served env then asks for the extra by name).
    import subprocess
    import sys

    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('grpc', 'grpc_health'):\n"
        "            raise ImportError('no ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import jaxmesh.api, jaxmesh.sweep, jaxmesh.suite, jaxmesh.run.dispatch\n"
        "import jaxmesh.cli.eval\n"
        "from jaxmesh.run import backend, dispatch\n"
        "try:\n"
        "    dispatch.route(backend.Target('grpc://127.0.0.1:1', backend.SERVED))\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "served envs need gRPC" in out.stdout, out.stdout
