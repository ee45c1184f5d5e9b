"""Task suites (``jaxmesh.Suite``) against plain loops, one task at a time.

Every task's episodes are checked against the contract's plain loop over that
task's env (``reference_loop`` for gymnax, ``gym_reference.plain_loop`` for
gymnasium and served envs); the suite's table against figures worked out from
the per-episode values here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from html.parser import HTMLParser

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID, lean, per_step, plain_loop
from gymnasium import spaces
from reference_loop import assert_matches, run_episode

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.remote.server import EnvServer
from jaxmesh.results import stats
from jaxmesh.suite import SuiteResult

SEEDS = [3, 1, 4, 15, 9]
ENV, PARAMS = gymnax.make("CartPole-v1")
#: Two tasks of one gymnax env with other params, and a host-stepped one.
GYMNAX_TASKS = {
    "short": PARAMS.replace(max_steps_in_episode=20),
    "long": PARAMS.replace(max_steps_in_episode=40),
}


_RESET = jax.jit(ENV.reset_env)


@jax.jit
def _step(key, state, action, params):
    obs, state, reward, term, _ = ENV.step_env(key, state, action, params)
    return obs, state, reward, term, ENV.is_truncated(state, params)


@functools.cache
def fns_of(params):
    """(reset, step) over gymnax's own functions (``reference_loop.gymnax_fns``)
    with ``params`` as data: compiled once for every params value."""
    return (
        lambda key: _RESET(key, params),
        lambda key, state, action: _step(key, state, action, params),
    )


@functools.cache
def lean_step():
    return per_step(lean)


def gymnax_refs(params, seeds):
    reset, step = fns_of(params)
    return [run_episode(reset, step, lean_step(), s) for s in seeds]


def gym_refs(seeds, make=lambda: gym.make(ID)):
    env = make()
    try:
        return plain_loop(env, per_step(lean), seeds)
    finally:
        env.close()


@pytest.fixture(scope="module")
def mixed():
    """A suite of two gymnax tasks and a gymnasium one, and its result."""
    suite = jaxmesh.Suite(
        {
            "short": (ENV, GYMNAX_TASKS["short"]),
            "long": jaxmesh.Task((ENV, GYMNAX_TASKS["long"]), seeds=[7, 8, 9]),
            "host": jaxmesh.Task(f"gymnasium:{ID}"),
        },
        seeds=SEEDS,
    )
    return suite, jaxmesh.evaluate(lean, suite, num_envs=2)


def test_every_task_equals_its_plain_loop(mixed):
    _, result = mixed
    assert isinstance(result, SuiteResult)
    assert list(result.tasks) == ["short", "long", "host"]
    assert_matches(result.tasks["short"], gymnax_refs(GYMNAX_TASKS["short"], SEEDS))
    assert_matches(result.tasks["long"], gymnax_refs(GYMNAX_TASKS["long"], [7, 8, 9]))
    assert_matches(result.tasks["host"], gym_refs(SEEDS))
    assert result.tasks["long"].seeds.tolist() == [7, 8, 9]
    assert result["host"] is result.tasks["host"]
    with pytest.raises(KeyError, match="no task 'nope'"):
        result["nope"]


def test_results_do_not_depend_on_lanes_or_task_order(mixed):
    suite, first = mixed
    reordered = jaxmesh.Suite(dict(reversed(list(suite.tasks.items()))), seeds=SEEDS)
    again = jaxmesh.evaluate(lean, reordered, num_envs=3)
    assert list(again.tasks) == ["host", "long", "short"]
    for name, r in first.tasks.items():
        np.testing.assert_array_equal(again.tasks[name].returns, r.returns)
        np.testing.assert_array_equal(again.tasks[name].lengths, r.lengths)


def test_table_figures_by_hand(mixed):
    _, result = mixed
    s = result.stats(resamples=500)
    rows = {row["task"]: row for row in s["tasks"]}
    for name, r in result.tasks.items():
        assert rows[name]["episodes"] == len(r.returns)
        assert rows[name]["mean_return"] == pytest.approx(np.mean(r.returns))
        assert rows[name]["success_rate"] is None  # CartPole has no success signal
    means = [np.mean(r.returns) for r in result.tasks.values()]
    assert s["mean_over_tasks"]["mean_return"] == pytest.approx(np.mean(means))
    pooled = np.concatenate([r.returns for r in result.tasks.values()])
    assert s["pooled"]["episodes"] == pooled.size == 13
    assert s["pooled"]["mean_return"] == pytest.approx(pooled.mean())
    text = result.summary()
    for name in ("short", "long", "host", "mean over tasks", "pooled"):
        assert name in text
    assert "success" not in text.splitlines()[0]  # no task has a signal


def test_round_trip_and_compare(mixed):
    _, result = mixed
    back = SuiteResult.from_dict(json.loads(json.dumps(result.to_dict())))
    for name, r in result.tasks.items():
        np.testing.assert_array_equal(back.tasks[name].returns, r.returns)
    # B = A with each return shifted by a known amount per task.
    shifted = SuiteResult.from_dict(result.to_dict())
    for k, (name, r) in enumerate(shifted.tasks.items()):
        shifted.tasks[name] = dataclasses.replace(r, returns=r.returns + (k + 1.0))
    cmp = jaxmesh.compare(result, shifted, resamples=200)
    assert [c.difference for c in cmp.tasks.values()] == pytest.approx([1.0, 2.0, 3.0])
    assert cmp.pooled.difference == pytest.approx((5 * 1 + 3 * 2 + 5 * 3) / 13)
    assert cmp.pooled.episodes == 13
    assert "pooled verdict" in str(cmp)
    other = SuiteResult({"short": result.tasks["short"]})
    with pytest.raises(ValueError, match="same suite"):
        jaxmesh.compare(result, other)
    with pytest.raises(TypeError, match="suite results"):
        jaxmesh.compare(result, result.tasks["short"])


class SuccessEnv(gym.Env):
    """Episodes of 3 + seed % 3 steps; ``is_success`` is True at the last step
    when the seed is even. Counts the instances alive in ``LIVE``."""

    observation_space = spaces.Box(-1.0, 100.0, (2,), np.float32)
    action_space = spaces.Discrete(2)
    metadata = {"render_modes": []}
    LIVE = [0, 0]  # [now, most at once]

    def __init__(self):
        SuccessEnv.LIVE[0] += 1
        SuccessEnv.LIVE[1] = max(SuccessEnv.LIVE)

    def close(self):
        SuccessEnv.LIVE[0] -= 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = seed, 0
        return np.array([seed % 7, 0], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= 3 + self.seed_ % 3
        info = {"is_success": bool(end and self.seed_ % 2 == 0)}
        return np.array([self.seed_ % 7, self.t], np.float32), 1.0, end, False, info


gym.register("SuiteSuccess-v0", entry_point=SuccessEnv)


def test_host_tasks_are_built_one_task_at_a_time():
    names = [f"t{k}" for k in range(6)]
    suite = jaxmesh.Suite(
        {
            n: jaxmesh.Task("gymnasium:SuiteSuccess-v0", seeds=[k, k + 1, k + 2])
            for k, n in enumerate(names)
        }
    )
    SuccessEnv.LIVE[:] = [0, 0]
    result = jaxmesh.evaluate(lambda obs: jnp.int32(0), suite, num_envs=2)
    assert SuccessEnv.LIVE == [0, 2]  # never more than one task's two lanes
    rows = {row["task"]: row for row in result.stats(resamples=200)["tasks"]}
    for k, n in enumerate(names):
        flags = [(s % 2 == 0) for s in (k, k + 1, k + 2)]
        assert rows[n]["success_rate"] == pytest.approx(np.mean(flags))
        low, high = stats.wilson_interval(sum(flags), 3)
        assert rows[n]["success_interval"] == pytest.approx([low, high])
    every = [(s % 2 == 0) for k in range(6) for s in (k, k + 1, k + 2)]
    pooled = result.stats(resamples=200)["pooled"]
    assert pooled["success_rate"] == pytest.approx(np.mean(every))
    assert "success" in result.summary().splitlines()[0]


def test_tasks_on_their_own_servers():
    # In-process servers: the same EnvServer ``jaxmesh serve-env`` runs.
    with (
        EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=2) as s1,
        EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=2) as s2,
    ):
        suite = jaxmesh.Suite(
            {
                "a": jaxmesh.Task(f"grpc://{s1.address}", seeds=SEEDS),
                "b": jaxmesh.Task(f"grpc://{s2.address}", seeds=[5, 6]),
            }
        )
        result = jaxmesh.evaluate(lean, suite, num_envs=2)
    assert_matches(result.tasks["a"], gym_refs(SEEDS))
    assert_matches(result.tasks["b"], gym_refs([5, 6]))


def test_a_failing_task_keeps_the_finished_ones():
    # Host tasks only: the fixture's agent step serves them (a finished gymnax
    # task resuming is the CLI test's).
    suite = jaxmesh.Suite(
        {"ok": f"gymnasium:{ID}", "bad": "gymnasium:NoSuchEnv-v0"}, seeds=SEEDS
    )
    with pytest.raises(ValueError, match="NoSuchEnv") as err:
        jaxmesh.evaluate(lean, suite, num_envs=2)
    partial = err.value.partial_result
    assert isinstance(partial, SuiteResult) and list(partial.tasks) == ["ok"]
    assert_matches(partial.tasks["ok"], gym_refs(SEEDS))
    # Resuming with a fixed suite runs only the missing task.
    fixed = jaxmesh.Suite(
        {"ok": f"gymnasium:{ID}", "bad": jaxmesh.Task(f"gymnasium:{ID}", seeds=[5, 6])},
        seeds=SEEDS,
    )
    done = jaxmesh.evaluate(lean, fixed, num_envs=2, resume=partial)
    assert_matches(done.tasks["bad"], gym_refs([5, 6]))
    np.testing.assert_array_equal(done.tasks["ok"].returns, partial.tasks["ok"].returns)


def test_bad_suites_are_refused():
    with pytest.raises(ValueError, match="non-empty mapping"):
        jaxmesh.Suite({})
    with pytest.raises(TypeError, match="non-empty string"):
        jaxmesh.Suite({3: "gymnax:CartPole-v1"})
    with pytest.raises(ValueError, match="episodes"):
        jaxmesh.Task("gymnax:CartPole-v1", episodes=0)
    with pytest.raises(TypeError, match="instruction"):
        jaxmesh.Task("gymnax:CartPole-v1", instruction=3)
    suite = jaxmesh.Suite({"a": "gymnax:CartPole-v1"})
    with pytest.raises(ValueError, match="no budget"):
        jaxmesh.evaluate(lean, suite)
    with pytest.raises(TypeError, match="SuiteResult"):
        jaxmesh.evaluate(lean, suite, episodes=2, resume=object())


class _Cells(HTMLParser):
    """The text of each row of the table with id ``tasks-table``."""

    def __init__(self):
        super().__init__()
        self.rows, self._in, self._row = [], False, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._in = attrs.get("id") == "tasks-table"
        elif tag == "tr" and self._in:
            self._row = []
        elif tag == "img":
            self.rows.append(["img", attrs.get("src", "")[:22]])

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None and self._in:
            self.rows.append(self._row)
            self._row = None
        elif tag == "table":
            self._in = False

    def handle_data(self, data):
        if self._row is not None and data.strip():
            self._row.append(data.strip())


def test_cli_tasks_key_writes_the_table_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAXMESH_COMPILE_CACHE", "0")
    out = tmp_path / "suite.json"
    config = tmp_path / "suite.yaml"
    config.write_text(
        "policy: cli_policies:tilt\n"
        "tasks:\n"
        "  short: {env: gymnax:CartPole-v1, env_config: {max_steps_in_episode: 20}}\n"
        f"  host: gymnasium:{ID}\n"
        "seeds: [3, 1, 4]\n"
        "num_envs: 2\n"
        f"output: {out}\n"
    )
    assert main(["eval", str(config), "--no-progress", "--report"]) == 0
    assert "mean over tasks" in capsys.readouterr().out
    saved = SuiteResult.from_dict(json.loads(out.read_text()))
    assert list(saved.tasks) == ["short", "host"]
    refs = gymnax_refs(PARAMS.replace(max_steps_in_episode=20), [3, 1, 4])
    np.testing.assert_array_equal(saved.tasks["short"].returns, [r.ret for r in refs])
    host = [r.ret for r in gym_refs([3, 1, 4])]
    np.testing.assert_array_equal(saved.tasks["host"].returns, host)
    page = _Cells()
    page.feed(out.with_suffix(".html").read_text())
    tasks = [row[0] for row in page.rows if row[0] != "img"]
    assert tasks[1:] == ["short", "host", "mean over tasks", "pooled"]  # after head
    images = [row[1] for row in page.rows if row[0] == "img"]
    # The overview and task host's plots; every episode of task short lasts its
    # 20 steps and returns 20: a line says so instead of a figure.
    assert len(images) == 2 and all(s.startswith("data:image/png") for s in images)
    html = out.with_suffix(".html").read_text()
    assert "Every episode returned 20." in html
    assert "Every episode lasted 20 env steps." in html
    # A partial JSON (one task) resumes: only the missing task runs.
    out.write_text(json.dumps(SuiteResult({"short": saved.tasks["short"]}).to_dict()))
    assert main(["eval", str(config), "--no-progress", "--resume", str(out)]) == 0
    resumed = SuiteResult.from_dict(json.loads(out.read_text()))
    np.testing.assert_array_equal(resumed.tasks["host"].returns, host)
    capsys.readouterr()
    code = main(["eval", str(config), "--set", "env=gymnax:CartPole-v1"])
    assert code == 2 and "tasks" in capsys.readouterr().err


def encode(text: str) -> np.ndarray:
    """An instruction as its first 4 character codes (padded with spaces)."""
    return np.asarray([ord(c) for c in text[:4].ljust(4)], np.int32)


def by_word(inputs):
    """Pushes the way the pole leans, or the other way when told to "flip"."""
    flip = inputs["word"][0] == ord("f")
    lean_right = inputs["obs"][2] > 0
    return jnp.where(flip, ~lean_right, lean_right).astype(jnp.int32)


def test_each_task_gets_its_own_instruction():
    from jaxmesh.adapt import State, Text

    model = jaxmesh.Model(by_word, spec={"obs": State(), "word": Text(encode)})
    said = {"keep": "keep it up", "flip": "flip it over"}
    suite = jaxmesh.Suite(
        {
            "keep": jaxmesh.Task((ENV, PARAMS), instruction=said["keep"]),
            "flip": jaxmesh.Task(f"gymnasium:{ID}", instruction=said["flip"]),
            # keep's env and params: the same program, another instruction
            "default": (ENV, PARAMS),
        },
        seeds=[3, 1],
    )
    result = jaxmesh.evaluate(
        model, suite, num_envs=2, starts=jaxmesh.Starts(instruction="keep going")
    )
    assert result.instructions == {**said, "default": "keep going"}
    reset, step = fns_of(PARAMS)

    def policy(text):
        fn = jax.jit(lambda obs: by_word({"obs": obs, "word": encode(text)}))
        return per_step(fn)

    keep = [run_episode(reset, step, policy(said["keep"]), s) for s in (3, 1)]
    assert_matches(result.tasks["keep"], keep)
    env = gym.make(ID)
    flip = plain_loop(env, policy(said["flip"]), [3, 1])
    env.close()
    assert_matches(result.tasks["flip"], flip)
    default = [run_episode(reset, step, policy("keep going"), s) for s in (3, 1)]
    assert_matches(result.tasks["default"], default)
    assert result.tasks["flip"].instruction == said["flip"]
    shown = str(jaxmesh.explain(model, suite))
    assert "word[keep]: instruction 'keep it up' -> encoded int32 (4,)" in shown
    assert "word[flip]: instruction 'flip it over'" in shown


def test_same_shaped_gymnax_tasks_share_one_program():
    from conftest import compiles

    lengths = {"a": 0.4, "b": 0.7}
    tasks = {n: (ENV, PARAMS.replace(length=x)) for n, x in lengths.items()}
    with compiles() as seen:
        result = jaxmesh.evaluate(
            lambda obs: lean(obs), jaxmesh.Suite(tasks, seeds=SEEDS), num_envs=3
        )
    assert [n for n in seen if "segment" in n] == ["jit(_run_segment)"]
    for name, task in tasks.items():
        assert_matches(result.tasks[name], gymnax_refs(task[1], SEEDS))
        assert result.tasks[name].indices.tolist() == list(range(len(SEEDS)))
        assert result.tasks[name].env_steps == sum(result.tasks[name].lengths)
    # The pole's length changes the episodes: the tasks are not one task.
    assert len({tuple(r.lengths) for r in result.tasks.values()}) > 1
    alone = jaxmesh.Suite(tasks, seeds=SEEDS, together=False)
    with compiles() as seen:
        apart = jaxmesh.evaluate(lambda obs: lean(obs), alone, num_envs=3)
    assert len([n for n in seen if "segment" in n]) == 2
    for name in tasks:
        np.testing.assert_array_equal(
            apart.tasks[name].returns, result.tasks[name].returns
        )


def flagged_run(flags) -> jaxmesh.RunResult:
    """A RunResult of ``len(flags)`` one-step episodes with these success flags."""
    n = len(flags)
    ones = np.ones(n, np.int32)
    return jaxmesh.RunResult(
        indices=np.arange(n),
        seeds=np.arange(n),
        returns=np.asarray(flags, np.float32),
        lengths=ones,
        terminated=ones.astype(bool),
        truncated=~ones.astype(bool),
        predict_calls=ones,
        lanes=np.zeros(n, np.int32),
        env_steps=n,
        policy_rows=n,
        wall_time=1.0,
        compile_time=0.5,
        run_time=0.5,
        num_envs=1,
        horizon=1,
        effective_horizon=1,
        prefetch_lead=0,
        success=np.asarray(flags, dtype=object),
        success_once=np.asarray(flags, dtype=object),
        success_key="is_success",
    )


def test_suite_success_rate_is_pooled_and_the_mean_over_tasks_is_its_own():
    # 1 of 2 and 3 of 4: pooled 4 of 6; the mean of the task rates (0.5 + 0.75) / 2.
    result = SuiteResult(
        {"a": flagged_run([True, False]), "b": flagged_run([True, True, True, False])}
    )
    assert result.success_rate == pytest.approx(4 / 6)
    assert result.task_mean_success_rate == pytest.approx(0.625)
    assert result.mean_return == pytest.approx(4 / 6)
    s = result.stats(resamples=200)
    assert s["pooled"]["success_rate"] == pytest.approx(result.success_rate)
    assert s["mean_over_tasks"]["success_rate"] == pytest.approx(0.625)
    back = SuiteResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.success_rate == pytest.approx(4 / 6)
    # A task without the signal, or an episode without it: no made-up rate.
    no_signal = dataclasses.replace(flagged_run([True, False]), success=None)
    for missing in (no_signal, flagged_run([True, None])):
        part = SuiteResult({"a": flagged_run([True, False]), "b": missing})
        assert part.success_rate is None and part.task_mean_success_rate is None
