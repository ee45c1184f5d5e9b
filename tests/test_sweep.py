"""``jaxmesh.sweep``: a delay x horizon grid in one program.

Every cell is checked against a plain loop written here from the delay rule
(docs/contract.md, item 23; d = 0 is the plain replay of item 10) over
gymnax's own reset and step (a JAX env) or gymnasium's (in process), and
cells against a separate ``jaxmesh.evaluate`` bit for bit; a served env's
cells (a real ``jaxmesh.EnvServer``) equal the in-process ones. The chunks'
entries differ per step, so a cell that ran another cell's h or d gives other
returns.
"""

from __future__ import annotations

import functools
import json

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import fold, gymnax_fns

import jaxmesh

K = 12  # chunk length: serves h + d up to 12
CAP = 13  # steps per episode (not a multiple of any horizon here)
SEEDS = [5, 2, 7, 11]
ENV = "gymnax:Pendulum-v1"
DELAYS, HORIZONS = [0, 1, 2, 4], [4, 8]
KW = {"num_envs": 3, "max_episode_steps": CAP, "layout": jaxmesh.Layout(plan_tile=8)}


def chunk_policy(obs):
    """K actions, each step's differing from the last by 0.3."""
    base = jnp.tanh(jnp.dot(obs, jnp.asarray([0.7, -1.3, 0.4], obs.dtype)))
    return (base + 0.3 * jnp.arange(K, dtype=jnp.float32) - 1.0)[:, None]


@functools.cache
def _gymnax_pendulum():
    """gymnax's own Pendulum reset and step, jitted once for every reference."""
    import gymnax

    return gymnax_fns(*gymnax.make("Pendulum-v1"))


@functools.cache
def reference(h, d, kind="gymnax", told=None):
    """Per seed (return, plans) of the delay rule: the first chunk plays
    chunk[0:h]; with d > 0, when d actions are left the next chunk is planned
    and plays new[d : d + h]; with d = 0 a chunk is planned when one is done.
    ``kind``: gymnax's own reset and step, or gymnasium's (``env.reset(seed=)``,
    CONTRACT 6). ``told``: plan with ``told_policy`` told that many actions run.
    Computed once per (h, d, kind, told): several tests read it."""
    if kind == "gymnax":
        reset, step = _gymnax_pendulum()
    else:
        env = gym.make("Pendulum-v1")

        def reset(key, seed=None):
            return env.reset(seed=seed)[0], None

        def step(key, state, action):
            obs, r, _, _, _ = env.step(np.asarray(action, np.float32))
            return obs, None, r, None, None

    if told is None:
        plan = jax.jit(chunk_policy)
    else:
        plan = jax.jit(functools.partial(told_policy, execution_horizon=told))
    out = []
    for seed in SEEDS:
        key = jax.random.PRNGKey(seed)
        obs, state = reset(key) if kind == "gymnax" else reset(key, seed)
        ret, calls, pos, offset, playing, nxt = 0.0, 0, h, 0, None, None
        for t in range(CAP):
            if t == 0 or (pos == h and d == 0):
                playing, offset, pos = np.asarray(plan(obs)), 0, 0
                calls += 1
            elif pos == h:
                playing, offset, pos = nxt, d, 0
            if d and pos == h - d:
                nxt = np.asarray(plan(obs))
                calls += 1
            action = jnp.asarray(playing[offset + pos])
            pos += 1
            obs, state, r, _, _ = step(fold(key, 0, t), state, action)
            ret += float(r)
        out.append((ret, calls))
    return tuple(out)


@pytest.fixture(scope="module")
def grid():
    return jaxmesh.sweep(
        chunk_policy, ENV, delay=DELAYS, horizon=HORIZONS, seeds=SEEDS, **KW
    )


def test_one_program_every_cell_against_the_rule(grid):
    assert grid.programs == 1
    assert sorted(grid.cells) == sorted(
        (d, h) for d in DELAYS for h in HORIZONS if (d, h) != (4, 4)
    )
    assert_cells_follow_the_rule(grid, "gymnax")


def assert_cells_follow_the_rule(sweep, kind):
    for (d, h), cell in sweep.cells.items():
        ref = reference(h, d, kind)
        np.testing.assert_allclose(cell.returns, [r[0] for r in ref], rtol=2e-5)
        np.testing.assert_array_equal(cell.predict_calls, [r[1] for r in ref])
        np.testing.assert_array_equal(cell.lengths, [CAP] * len(SEEDS))
        np.testing.assert_array_equal(cell.seeds, SEEDS)
        assert (cell.delay, cell.horizon, cell.effective_horizon) == (d, h, h)
        assert cell.env_steps == CAP * len(SEEDS)
    # The cells differ from each other: a cell that ran another's setting fails.
    returns = {k: tuple(v.returns) for k, v in sweep.cells.items()}
    assert len(set(returns.values())) == len(returns)


@pytest.mark.parametrize("cell", [(0, 8), (2, 4)])
def test_cell_equals_a_separate_evaluate(grid, cell):
    assert_cell_is_its_evaluate(grid, ENV, *cell)


def assert_cell_is_its_evaluate(sweep, env, d, h):
    alone = jaxmesh.evaluate(
        chunk_policy,
        env,
        chunking=jaxmesh.Chunking(delay=d),
        horizon=h,
        seeds=SEEDS,
        **KW,
    )
    got = sweep.get(delay=d, horizon=h)
    for field in ("returns", "lengths", "terminated", "truncated", "predict_calls"):
        np.testing.assert_array_equal(getattr(got, field), getattr(alone, field))
    assert got.plan_tile == alone.plan_tile == KW["layout"].plan_tile


def test_skipped_cell_and_get(grid):
    assert (4, 4) in grid.skipped and "0 < d < h" in grid.skipped[(4, 4)]
    with pytest.raises(KeyError, match="skipped"):
        grid.get(delay=4, horizon=4)
    with pytest.raises(KeyError, match="not swept"):
        grid.get(delay=3, horizon=4)


def test_table_summary_plot_and_json(grid):
    rows = grid.table()
    assert [(r["delay"], r["horizon"]) for r in rows] == [
        (d, h) for d in DELAYS for h in HORIZONS
    ]
    row = rows[0]
    cell = grid.get(delay=0, horizon=4)
    assert row["mean_return"] == pytest.approx(float(np.mean(cell.returns)))
    low, high = row["mean_interval"]
    assert low <= row["mean_return"] <= high
    assert row["success_rate"] is None  # Pendulum gives no success signal
    text = grid.summary()
    assert "1 program(s) compiled" in text and "skipped" in text
    fig = grid.plot()
    ax = fig.axes[0]
    assert ax.get_ylabel() == "mean return"  # no success signal: the return
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["H=4", "H=8"]
    d = json.loads(json.dumps(grid.to_dict()))
    back = jaxmesh.Sweep.from_dict(d)
    assert back.to_dict() == d
    np.testing.assert_array_equal(
        back.get(delay=2, horizon=8).returns, grid.get(delay=2, horizon=8).returns
    )
    with pytest.raises(ValueError, match="sweep dict"):
        jaxmesh.Sweep.from_dict({"cells": []})


def test_bad_input_is_refused_before_compiling():
    with pytest.raises(TypeError, match="delay="):
        jaxmesh.sweep(chunk_policy, ENV, delay="1")
    with pytest.raises(ValueError, match="distinct"):
        jaxmesh.sweep(chunk_policy, ENV, horizon=[4, 4])
    with pytest.raises(ValueError, match="delay"):
        jaxmesh.sweep(chunk_policy, ENV, delay=[-1])
    with pytest.raises(ValueError, match="prefetch_lead"):
        jaxmesh.sweep(chunk_policy, ENV, chunking=jaxmesh.Chunking(prefetch_lead=1))
    with pytest.raises(ValueError, match="no cell can run"):
        jaxmesh.sweep(chunk_policy, ENV, delay=[4], horizon=[4])


def test_cli_sweep_over_milliseconds_is_the_sweep_over_their_steps(
    grid, tmp_path, capsys
):
    """delay_ms = [0, 40, 50, 100] on Pendulum (dt = 0.05 s), from the command
    line, is the delays [0, 1, 1, 2] steps: the cells equal the step grid's bit
    for bit, 40 and 50 ms share one, and the table, JSON and plot are in
    milliseconds."""
    from jaxmesh.cli import main

    out = tmp_path / "run.sweep.json"  # the sweep's own file, next to the output
    config = tmp_path / "run.yaml"
    config.write_text(
        f"env: {ENV}\npolicy: test_sweep:chunk_policy\nseeds: {SEEDS}\n"
        f"num_envs: 3\nmax_episode_steps: {CAP}\nplan_tile: 8\n"
        f"output: {tmp_path / 'run.json'}\n"
    )
    args = ["sweep", str(config), "--set", "delay_ms=[0,40,50,100]"]
    assert main([*args, "--set", "horizon=4"]) == 0
    text = capsys.readouterr().out
    assert "1 program(s) compiled" in text and f"wrote {out}" in text
    assert "100 ms (2)" in text
    ms = jaxmesh.Sweep.from_dict(json.loads(out.read_text()))
    assert ms.delay_steps == {0.0: 0, 40.0: 1, 50.0: 1, 100.0: 2}
    assert ms.delays == (0, 1, 2) and len(ms.cells) == 3
    for d in (0, 1, 2):
        got = ms.get(delay_ms={0: 0, 1: 50, 2: 100}[d], horizon=4)
        want = grid.get(delay=d, horizon=4)
        for field in ("returns", "lengths", "predict_calls", "seeds"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    assert ms.get(delay_ms=40, horizon=4) is ms.get(delay=1, horizon=4)
    rows = ms.table()
    assert [(r["delay_ms"], r["delay"]) for r in rows] == [
        (0.0, 0),
        (40.0, 1),
        (50.0, 1),
        (100.0, 2),
    ]
    assert "100 ms (2)" in ms.summary()
    back = jaxmesh.Sweep.from_dict(json.loads(json.dumps(ms.to_dict())))
    assert back.delay_steps == ms.delay_steps
    assert ms.plot().axes[0].get_xlabel() == "inference delay (ms)"
    with pytest.raises(KeyError, match="delay_ms=70"):
        ms.get(delay_ms=70, horizon=4)
    assert main(["sweep", str(config), "--set", "prefetch_lead=1"]) == 2
    assert main(["eval", str(config), "--set", "delay_ms=-1"]) == 2
    bad = ["eval", str(config), "--set", "execution={ensemble: {m: -1}}"]
    assert main(bad) == 2
    assert "execution.ensemble" in capsys.readouterr().err


def test_resume_refuses_another_delay(grid):
    done = grid.get(delay=2, horizon=4)
    assert "inference delay of 2 steps" in done.summary()
    with pytest.raises(ValueError, match="delay"):
        jaxmesh.evaluate(
            chunk_policy,
            ENV,
            horizon=4,
            chunking=jaxmesh.Chunking(delay=1),
            seeds=SEEDS,
            resume=done,
            **KW,
        )


# Host-stepped and served envs -----------------------------------------------------
HOST = "gymnasium:Pendulum-v1"
TRACES = {"sweep": 0, "one": 0}


def counted(name):
    """``chunk_policy`` counting its traces (one per compile of a plan)."""

    def policy(obs):
        TRACES[name] += 1
        return chunk_policy(obs)

    return policy


#: The host sweeps' policy: the in-process sweep's and the served one's (the same
#: agent step; only the env step moves).
SWEEP_POLICY = counted("sweep")


@pytest.fixture(scope="module")
def host_grid():
    grid = jaxmesh.sweep(
        SWEEP_POLICY, HOST, delay=DELAYS, horizon=HORIZONS, seeds=SEEDS, **KW
    )
    TRACES["after sweep"] = TRACES["sweep"]  # before any later run reuses it
    return grid


def test_host_sweep_compiles_one_agent_step_for_every_cell(host_grid):
    assert host_grid.programs == 1
    assert "1 program(s) compiled" in host_grid.summary()
    assert sorted(host_grid.cells) == sorted(
        (d, h) for d in DELAYS for h in HORIZONS if (d, h) != (4, 4)
    )
    # A separate delayed run traces its plans once (and probes the chunk
    # length once); the sweep as often, plus its own probe: not once per cell.
    alone = counted("one")
    one = jaxmesh.evaluate(
        alone, HOST, chunking=jaxmesh.Chunking(delay=2), horizon=4, seeds=SEEDS, **KW
    )
    assert TRACES["after sweep"] == TRACES["one"] + 1
    # And that run is the sweep's cell bit for bit (as the cells below).
    got = host_grid.get(delay=2, horizon=4)
    for field in ("returns", "lengths", "terminated", "truncated", "predict_calls"):
        np.testing.assert_array_equal(getattr(got, field), getattr(one, field))
    assert got.plan_tile == one.plan_tile == KW["layout"].plan_tile


def test_host_sweep_every_cell_against_the_rule(host_grid):
    assert_cells_follow_the_rule(host_grid, "gymnasium")


# d = 0 and d = h / 2 = K - h; (2, 4) is test_host_sweep_compiles_...'s run; every
# cell follows the rule (test_host_sweep_every_cell_against_the_rule).
@pytest.mark.parametrize("cell", [(0, 4), (4, 8)])
def test_host_cell_equals_a_separate_evaluate(host_grid, cell):
    assert_cell_is_its_evaluate(host_grid, HOST, *cell)


def test_served_sweep_equals_the_in_process_one(host_grid):
    """One served run over the tiled seeds: a lane's segments (the actions the
    server replays) follow its episode's h and d, so every cell equals the
    in-process sweep's (the same agent step; only the env step moves)."""
    from jaxmesh.remote.server import EnvServer

    # In process: the EnvServer ``jaxmesh serve-env`` runs.
    with EnvServer(HOST, "127.0.0.1:0", lanes=3) as server:
        served = jaxmesh.sweep(
            SWEEP_POLICY,
            f"grpc://{server.address}",
            delay=DELAYS,
            horizon=HORIZONS,
            seeds=SEEDS,
            **KW,
        )
    assert served.programs == 1
    assert sorted(served.cells) == sorted(host_grid.cells)
    assert served.skipped.keys() == host_grid.skipped.keys()
    for key, here in host_grid.cells.items():
        there = served.cells[key]
        for field in ("returns", "lengths", "predict_calls", "seeds"):
            np.testing.assert_array_equal(getattr(there, field), getattr(here, field))


def told_policy(obs, execution_horizon=K):
    """A chunk corner told how many actions a plan executes (CONTRACT 24): its
    chunk's entries depend on it, so a cell told another value differs."""
    return chunk_policy(obs)[:execution_horizon] + 0.01 * execution_horizon


def test_host_sweep_tells_each_program_its_h_plus_d():
    s = jaxmesh.sweep(told_policy, HOST, delay=[0, 2], horizon=[4], seeds=SEEDS, **KW)
    assert s.programs == 2  # h + d = 4 and 6: one static value each
    for d in (0, 2):
        got = s.get(delay=d, horizon=4)
        ref = reference(4, d, "gymnasium", told=4 + d)
        np.testing.assert_allclose(got.returns, [r[0] for r in ref], rtol=2e-5)
        np.testing.assert_array_equal(got.predict_calls, [r[1] for r in ref])
        # Told another value (the chunk's K, or the other cell's h + d where it
        # covers h + d actions): other returns, so a cell told wrong fails.
        for wrong in sorted({K, 6} - {4 + d}):
            other = reference(4, d, "gymnasium", told=wrong)
            assert not np.allclose(got.returns, [r[0] for r in other], rtol=1e-4)


def test_host_sweep_refuses_what_a_jax_env_takes_only():
    with pytest.raises(TypeError, match="is for MuJoCo Playground envs"):
        jaxmesh.sweep(
            chunk_policy,
            HOST,
            starts=jaxmesh.Starts(randomize=lambda m, k: m),
            seeds=SEEDS,
        )


def test_a_sweep_over_milliseconds_refuses_bad_input():
    """A live sweep over milliseconds is the command line's (above)."""
    with pytest.raises(ValueError, match="give the delays once"):
        jaxmesh.sweep(chunk_policy, ENV, delay=[1], delay_ms=[50], horizon=[4])
    with pytest.raises(ValueError, match="has no step time"):
        jaxmesh.sweep(
            chunk_policy, "gymnax:MountainCarContinuous-v0", delay_ms=[50], horizon=[4]
        )
