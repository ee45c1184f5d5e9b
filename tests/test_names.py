"""One name per thing: a class name is defined in one module of ``jaxmesh/``,
and only the host loop's kinds of lanes end in ``Lanes``.

The classes are read with ``ast`` from the source (nothing is imported), so the
check covers the optional extras' modules too.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxmesh"
#: The host loop's lanes: in-process Envs, a VectorEnv, worker processes and
#: env servers. Everything else that holds lanes is named by its own role
#: (a stepper, a pool, an adapter).
MOST_LANES = 4


def _classes() -> dict[str, list[str]]:
    """Every class name in ``jaxmesh/`` (generated gRPC code left out) and the
    modules that define it."""
    where = collections.defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and rel not in where[node.name]:
                where[node.name].append(rel)
    return where


def test_reads_the_package():
    where = _classes()
    # A few classes any layout of the package has, each in its one module.
    assert where["RunConfig"] == ["jaxmesh/run/config.py"]
    assert where["EnvServer"] == ["jaxmesh/remote/server/service.py"]


def test_no_class_name_in_two_modules():
    twice = {name: mods for name, mods in _classes().items() if len(mods) > 1}
    assert not twice, (
        f"class names defined in more than one module: {twice}; give each a name "
        "that says its role (a reader should find a class by its name alone)"
    )


def test_at_most_four_lanes_classes():
    lanes = sorted(
        f"{mods[0]}:{name}"
        for name, mods in _classes().items()
        if name.endswith("Lanes")
    )
    assert len(lanes) <= MOST_LANES, (
        f"{len(lanes)} classes end in 'Lanes' ({', '.join(lanes)}), expected at "
        f"most {MOST_LANES} (the host loop's kinds of lanes); name the others by "
        "their role"
    )
