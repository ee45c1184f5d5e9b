"""A run's plan computed once, the placement, and the backend chosen once.

Pure host-side checks (nothing compiles): ``jaxmesh.run.plan``,
``jaxmesh.run.backend`` and the import graph of ``jaxmesh.run``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jaxmesh
from jaxmesh.run import backend, checks, dispatch
from jaxmesh.run.host import served
from jaxmesh.run.plan import default_plan_tile, effective_horizon, plan_run

RUN = Path(jaxmesh.__file__).resolve().parent / "run"


def settings(num_envs=64, horizon=1, lead=0, tile=None):
    return checks.check_settings(num_envs, horizon, lead, None, tile)


@pytest.mark.parametrize(
    ("horizon", "chunk", "h"), [(1, None, 1), (8, None, 1), (8, 4, 4), (3, 16, 3)]
)
def test_effective_horizon_is_min_of_horizon_and_chunk(horizon, chunk, h):
    assert effective_horizon(horizon, chunk) == h
    plan = plan_run(settings(horizon=horizon, lead=5), chunk, capacity=4096)
    assert (plan.h, plan.lead, plan.chunk, plan.horizon) == (
        h,
        min(5, h),
        chunk,
        horizon,
    )


def test_the_tile_is_sized_for_h_not_the_asked_horizon():
    # H = 64 over chunks of 4: 4 actions a plan, so 32 rows, not 128 // 64 = 8.
    plan = plan_run(settings(num_envs=256, horizon=64), 4, capacity=4096)
    assert plan.tile == default_plan_tile(4, 256) == 32


def test_lanes_capacity_and_tile_lanes():
    s = settings(num_envs=64)
    # A mesh of 4: 16 lanes a device, the tile of all 64 lanes.
    plan = plan_run(s, None, capacity=4096, lanes=16)
    assert (plan.lanes, plan.tile) == (16, default_plan_tile(1, 64))
    # A budget smaller than the lanes (make_evaluator: capacity = episodes).
    assert plan_run(s, None, capacity=3).lanes == 3
    # A served lane group of 8 lanes plans alone.
    assert plan_run(s, None, capacity=64, tile_lanes=8).tile == 8
    # A given tile wins.
    assert plan_run(settings(tile=5), None, capacity=64, tile_lanes=8).tile == 5


class _Info:
    capabilities = ()


class _Session:
    info = _Info()
    lockstep = False


def test_served_lane_groups_size_the_tile_for_one_group():
    lanes = object.__new__(served.ServedLanes)
    lanes.sessions, lanes.num_lanes = [_Session()], 32
    assert lanes.group(settings(num_envs=32), 4) == 8 and lanes.lane_groups == 4
    assert lanes.group(settings(num_envs=32), 1) is None
    assert lanes.group(settings(num_envs=32, tile=16), 4) is None


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ("gymnax:CartPole-v1", backend.SCAN),
        ("brax:fast", backend.SCAN),
        ("gymnasium:CartPole-v1", backend.HOST),
        ("grpc://127.0.0.1:5555", backend.SERVED),
        (["grpc://a:1", "grpcs://b:2"], backend.SERVED),
    ],
)
def test_backend_of(env, kind):
    assert backend.backend_of(env) == kind


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("token", "abc", "a token is for served envs"),
        ("credentials", object(), "credentials is for served envs"),
        ("reply_timeout", 1.0, "reply_timeout is for served envs"),
        ("lane_groups", 2, "lane groups pipeline calls to env servers"),
    ],
)
@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "gymnasium:CartPole-v1"])
def test_served_options_are_refused_by_name_for_other_envs(env, name, value, message):
    config = jaxmesh.RunConfig(served=jaxmesh.Served(**{name: value}))
    with pytest.raises(ValueError, match=message) as e:
        config.for_backend(dispatch.target(env))
    assert f"drop {name}=" in str(e.value) and repr(env) in str(e.value)


def test_the_served_options_are_one_checked_served():
    """A served env's options reach its backend as the ``jaxmesh.Served`` given
    (its values checked when built), or ``Served()``'s defaults; any other env
    gets none."""
    address = "grpc://127.0.0.1:5555"
    given = jaxmesh.Served(token="t", reply_timeout=2, lane_groups=3)
    assert (given.reply_timeout, given.lane_groups) == (2.0, 3)
    assert isinstance(given.reply_timeout, float)
    got = jaxmesh.RunConfig(served=given).for_backend(dispatch.target(address))
    assert got is given
    default = jaxmesh.RunConfig().for_backend(dispatch.target(address))
    assert default == jaxmesh.Served()
    assert (default.reply_timeout, default.transport) == ("auto", "auto")
    assert (default.token, default.lane_groups, default.on_server_loss) == (
        None,
        None,
        None,
    )
    assert (
        jaxmesh.RunConfig().for_backend(dispatch.target("gymnax:CartPole-v1")) is None
    )
    with pytest.raises(ValueError, match="lane_groups=0"):
        jaxmesh.Served(lane_groups=0)
    assert not hasattr(backend, "ServedOptions")  # one class holds the six fields


def _path(module: str) -> Path:
    """The file of a ``jaxmesh.run`` module (a package's ``__init__.py``)."""
    rel = RUN.joinpath(*module.split(".")[2:])
    return (
        rel.with_suffix(".py")
        if rel.with_suffix(".py").is_file()
        else rel / "__init__.py"
    )


def _imports(module: str) -> set[str]:
    """The ``jaxmesh.run`` modules that ``module`` imports (``from a import b``
    counts as ``a.b`` when that is a module)."""
    out = set()
    for node in ast.walk(ast.parse(_path(module).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if not node.module.startswith("jaxmesh.run"):
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = _path(sub).is_file() if sub.count(".") >= 2 else False
                out.add(sub if is_module else node.module)
    return out - {"jaxmesh.run"}


@pytest.mark.parametrize(
    "mine",
    [
        "jaxmesh.run.scan.evaluator",
        "jaxmesh.run.scan.sharded",
        "jaxmesh.run.scan.placement",
        "jaxmesh.run.plan",
        "jaxmesh.run.backend",
        "jaxmesh.run.config",
    ],
)
def test_the_evaluator_modules_import_no_module_that_imports_them(mine):
    for other in _imports(mine):
        back = _imports(other)
        assert mine not in back, f"{mine} and {other} import each other"
