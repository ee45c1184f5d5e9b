"""``jaxmesh.decide`` on gymnax CartPole: a weak and a strong policy, paired
seeds equal to ``evaluate`` on the same seeds, no compile after the first
batch, no decision between equal policies, trial indices across batches, a
suite stratified by task (resumed too), resume, and bad input."""

from __future__ import annotations

import html
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles
from flax import struct
from gymnax.environments import environment, spaces

import jaxmesh
from jaxmesh.results.sequential import BettingSequence

CARTPOLE = "gymnax:CartPole-v1"
N = 8


def push_left(obs):
    return jnp.int32(0)


def lean(obs):  # push towards the side the pole leans
    return (obs[2] > 0).astype(jnp.int32)


def balance(obs):  # angle and angular velocity: keeps the pole up
    return (obs[2] + obs[3] > 0).astype(jnp.int32)


def first_rejection(values) -> tuple[int, int]:
    """The betting test fed ``values`` (returns' differences, bounds
    -500..500) one by one: the count at which it first rejects, and its
    direction."""
    seq = BettingSequence(-500.0, 500.0)
    for v in values:
        seq.update([v])
        if seq.rejects:
            break
    return seq.n, seq.direction


def test_a_clear_gap_decides_b_in_a_few_batches_on_paired_seeds():
    seen_at: list[int] = []
    with compiles() as seen:

        def later(decision):
            seen_at.append(len(seen))

        d = jaxmesh.decide(
            push_left,
            lean,
            CARTPOLE,
            bounds=(0, 500),
            num_envs=N,
            first_seed=100,
            on_batch=later,
        )
    assert d.winner == "b"
    assert d.batches <= 14 and d.batches == len(seen_at)
    # every batch after the first compiled nothing
    assert seen_at[0] and seen_at[-1] == seen_at[0]
    # batches of 8 lanes: 8 until an eighth of the episodes run is more, then
    # that rounded up to a multiple of 8 (by hand: 72 / 8 = 9 -> 16, 88 / 8
    # = 11 -> 16, 104 -> 16, 120 -> 16, 136 / 8 = 17 -> 24, 160 / 8 = 20 -> 24)
    schedule = [8 * k for k in range(1, 10)] + [88, 104, 120, 136, 160, 184]
    assert [p[0] for p in d.path] == schedule[: d.batches]
    n = d.episodes
    assert n == d.path[-1][0] and d.decided_at <= n
    seeds = list(range(100, 100 + n))
    for policy, run in ((push_left, d.a), (lean, d.b)):
        assert run.indices.tolist() == list(range(n))
        assert run.seeds.tolist() == seeds
        ref = jaxmesh.evaluate(policy, CARTPOLE, num_envs=N, seeds=seeds)
        np.testing.assert_array_equal(run.returns, ref.returns)
        np.testing.assert_array_equal(run.lengths, ref.lengths)
        assert run.env_steps == int(ref.lengths.sum())
    diff = d.b.returns.astype(np.float64) - d.a.returns
    assert d.difference == pytest.approx(diff.mean())
    low, high = d.interval
    assert 0 <= low < diff.mean() < high
    # the decision is the betting test's on those differences, fed one by one
    assert first_rejection(diff) == (d.decided_at, 1)
    assert "B scores more" in str(d)


def test_equal_policies_do_not_decide():
    d = jaxmesh.decide(
        lean, lean, CARTPOLE, bounds=(0, 500), num_envs=N, max_episodes=36
    )
    assert d.winner is None and d.decided_at is None
    assert d.episodes == 36 and d.difference == 0.0
    low, high = d.interval
    assert low < 0 < high
    assert [p[0] for p in d.path] == [8, 16, 24, 32, 36]  # the last one cut
    assert "no decision after 36 episodes" in str(d)
    assert d.to_dict()["winner"] is None


def test_success_metric_and_the_winner_a():
    # Success: surviving to the cap (the discount is still 1 at the last step).
    scoring = jaxmesh.Scoring(success="discount", success_mode="end")
    d = jaxmesh.decide(
        balance,
        push_left,
        CARTPOLE,
        metric="success",
        num_envs=N,
        max_episode_steps=100,
        scoring=scoring,
    )
    ref_a = jaxmesh.evaluate(
        balance,
        CARTPOLE,
        num_envs=N,
        max_episode_steps=100,
        scoring=scoring,
        seeds=range(d.episodes),
    )
    assert d.a.success.tolist() == ref_a.success.tolist()
    assert d.a.success.all() and not d.b.success.any()
    # every difference is -1: x = 0 against m = 1/2, bets capped at 1, so
    # K- = 1.5^t and 0.5 * 1.5^t reaches 20 at t = 10 (by hand)
    assert d.winner == "a" and d.decided_at == 10
    assert d.difference == -1.0 and d.bounds == (0.0, 1.0)


def test_resume_goes_on_from_an_undecided_run():
    first = jaxmesh.decide(
        push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N, max_episodes=24
    )
    assert first.winner is None and first.episodes == 24
    whole = jaxmesh.decide(push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N)
    again = jaxmesh.decide(
        push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N, resume=first
    )
    # the test runs over the same episodes: it stops at the same pair
    assert again.winner == whole.winner == "b"
    assert again.decided_at == whole.decided_at
    k = min(again.episodes, whole.episodes)
    np.testing.assert_array_equal(again.b.returns[:k], whole.b.returns[:k])
    np.testing.assert_array_equal(again.a.returns[:24], first.a.returns)
    assert again.path[0] == first.path[-1]
    # another policy's episodes are refused
    with pytest.raises(ValueError, match="resume"):
        jaxmesh.decide(
            push_left, balance, CARTPOLE, bounds=(0, 500), num_envs=N, resume=first
        )
    with pytest.raises(ValueError, match="first_seed"):
        jaxmesh.decide(
            push_left,
            lean,
            CARTPOLE,
            bounds=(0, 500),
            num_envs=N,
            resume=first,
            first_seed=5,
        )


def test_returns_outside_the_bounds_are_refused():
    with pytest.raises(ValueError, match=r"policy b's episode \d+ \(seed \d+\)"):
        jaxmesh.decide(push_left, lean, CARTPOLE, bounds=(0, 20), num_envs=N)


def test_no_success_signal_is_refused():
    with pytest.raises(ValueError, match="no success signal"):
        jaxmesh.decide(push_left, lean, CARTPOLE, metric="success", num_envs=N)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, r"needs bounds=\(lo, hi\)"),
        ({"bounds": (5, 5)}, ValueError, "lo < hi"),
        ({"bounds": "wide"}, TypeError, "two numbers"),
        ({"metric": "length", "bounds": (0, 1)}, ValueError, "metric="),
        ({"metric": "success", "bounds": (0, 500)}, ValueError, "leave bounds out"),
        ({"alpha": 0.0, "bounds": (0, 500)}, ValueError, "alpha"),
        ({"max_episodes": 0, "bounds": (0, 500)}, ValueError, "max_episodes"),
        ({"first_seed": -1, "bounds": (0, 500)}, ValueError, "first_seed"),
        ({"batch": 0, "bounds": (0, 500)}, ValueError, "batch"),
        ({"episodes": 10, "bounds": (0, 500)}, TypeError, "first_seed="),
        ({"seeds": [1], "bounds": (0, 500)}, TypeError, "max_episodes="),
        ({"prefetch_lead": 2, "bounds": (0, 500)}, TypeError, "Chunking"),
        ({"resume": 3, "bounds": (0, 500)}, TypeError, "Decision"),
        ({"arm_hooks": [1], "bounds": (0, 500)}, TypeError, "hooks_a, hooks_b"),
    ],
)
def test_bad_input_is_refused_before_compiling(no_compile, kwargs, error, match):
    with pytest.raises(error, match=match):
        jaxmesh.decide(push_left, lean, CARTPOLE, num_envs=N, **kwargs)


def test_a_suite_is_decided_over_its_tasks_stratified():
    # Two tasks: CartPole capped at 30 steps, and CartPole-v1. Every batch runs
    # both tasks on its seeds; the test is on the per-index mean over tasks.
    # Two gymnax tasks of one shape, which evaluate would run in one program.
    short = jaxmesh.make_env(CARTPOLE, max_steps_in_episode=30)
    tasks = {"short": jaxmesh.Task(short), "long": jaxmesh.make_env(CARTPOLE)}
    the_suite = jaxmesh.Suite(tasks)
    seen_at: list[int] = []
    with compiles() as seen:
        d = jaxmesh.decide(
            push_left,
            lean,
            the_suite,
            bounds=(0, 500),
            num_envs=N,
            on_batch=lambda _: seen_at.append(len(seen)),
        )
    assert d.winner == "b" and seen_at[0] and seen_at[-1] == seen_at[0]
    n = d.episodes
    assert isinstance(d.a, jaxmesh.SuiteResult) and list(d.a.tasks) == ["short", "long"]
    diffs = []
    for env, task in ((short, "short"), (CARTPOLE, "long")):
        for policy, run in ((push_left, d.a), (lean, d.b)):
            ref = jaxmesh.evaluate(policy, env, num_envs=N, seeds=range(n))
            np.testing.assert_array_equal(run.tasks[task].returns, ref.returns)
            assert run.tasks[task].seeds.tolist() == list(range(n))
        diffs.append(
            d.b.tasks[task].returns.astype(np.float64) - d.a.tasks[task].returns
        )
    rounds = (diffs[0] + diffs[1]) / 2  # each task weighs the same
    assert d.difference == pytest.approx(rounds.mean())
    assert first_rejection(rounds) == (d.decided_at, 1)
    assert "a suite of 2 tasks (short, long)" in str(d)
    assert "episodes per task and arm" in str(d)
    # An undecided suite decision goes on, task by task, from its episodes.
    first = jaxmesh.decide(
        push_left, lean, the_suite, bounds=(0, 500), num_envs=N, max_episodes=N
    )
    assert first.winner is None and first.a.tasks["long"].num_episodes == N
    again = jaxmesh.decide(
        push_left, lean, the_suite, bounds=(0, 500), num_envs=N, resume=first
    )
    assert (again.winner, again.decided_at, again.episodes) == ("b", d.decided_at, n)
    assert again.path[0] == first.path[-1]
    for task in ("short", "long"):
        for run, before in ((again.a, first.a), (again.b, first.b)):
            np.testing.assert_array_equal(
                run.tasks[task].returns[:N], before.tasks[task].returns
            )
        np.testing.assert_array_equal(
            again.b.tasks[task].returns, d.b.tasks[task].returns
        )
    with pytest.raises(ValueError, match=r"a holds tasks \['short'\] and b"):
        jaxmesh.decide(
            push_left,
            lean,
            the_suite,
            bounds=(0, 500),
            resume=(jaxmesh.SuiteResult({"short": first.a.tasks["short"]}), first.b),
        )


def test_a_suite_with_a_budget_or_arm_hooks_is_refused(no_compile):
    with pytest.raises(ValueError, match="the Suite set a budget"):
        jaxmesh.decide(
            push_left,
            lean,
            jaxmesh.Suite({"long": CARTPOLE}, episodes=5),
            bounds=(0, 500),
        )
    with pytest.raises(ValueError, match=r"tasks \['long'\] set a budget"):
        jaxmesh.decide(
            push_left,
            lean,
            jaxmesh.Suite({"long": jaxmesh.Task(CARTPOLE, episodes=3)}),
            bounds=(0, 500),
        )
    with pytest.raises(TypeError, match="arm_hooks= with a Suite"):
        jaxmesh.decide(
            push_left,
            lean,
            jaxmesh.Suite({"long": CARTPOLE}),
            bounds=(0, 500),
            arm_hooks=([], [object()]),
        )


def test_worker_processes_serve_every_batch_of_both_arms(tmp_path):
    # Each env the workers build appends its process id to a file: four
    # batches of two arms on 4 lanes in 2 worker processes build 4 envs.
    import functools

    import gymnasium as gym
    from worker_envs import counted_cartpole

    made = tmp_path / "made"
    source = functools.partial(counted_cartpole, str(made))
    d = jaxmesh.decide(
        push_left, lean, source, bounds=(0, 500), num_envs=4, workers=2, max_episodes=16
    )
    assert (d.winner, d.episodes, d.batches) == (None, 16, 4)
    pids = made.read_text().split()
    assert len(pids) == 4 and len(set(pids)) == 2
    env = gym.make("CartPole-v1")  # the plain loop, episode i with seed i
    for act, run in ((lambda o: 0, d.a), (lambda o: int(o[2] > 0), d.b)):
        returns = []
        for seed in range(16):
            obs, _ = env.reset(seed=seed)
            total, done = 0.0, False
            while not done:
                obs, reward, term, trunc, _ = env.step(act(obs))
                total, done = total + reward, term or trunc
            returns.append(total)
        np.testing.assert_array_equal(run.returns, returns)


def test_compare_says_it_is_a_fixed_sample_test():
    a = jaxmesh.evaluate(push_left, CARTPOLE, num_envs=N, seeds=range(8))
    b = jaxmesh.evaluate(lean, CARTPOLE, num_envs=N, seeds=range(8))
    cmp = jaxmesh.compare(a, b)
    assert cmp.test.startswith("fixed-sample paired percentile bootstrap")
    assert "jaxmesh.decide" in cmp.test
    assert cmp.to_dict()["test"] == cmp.test
    assert jaxmesh.compare(a, b, unpaired=True).test.startswith("fixed-sample unpaired")


def test_the_docs_example_prints_what_the_docs_show(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "statistics.md").read_text()
    section = text.split("## Deciding between two policies", 1)[1]
    code, shown = re.findall(r"```(?:python)?\n(.*?)```", section, re.S)[:2]
    exec(compile(code, "docs/statistics.md", "exec"), {})
    assert capsys.readouterr().out == shown


def test_episodes_of_later_batches_get_their_own_trial_index():
    # Episode i starts from reset_fn(PRNGKey(seed_i), i): the pole leans by an
    # amount that follows i. A later batch's episodes keep their index in the
    # whole run, as in one evaluate of every episode.
    import gymnax

    env, params = gymnax.make("CartPole-v1")

    def reset_fn(key, trial):
        _, state = env.reset_env(key, params)
        t = jnp.asarray(trial, jnp.float32)
        state = state.replace(theta=0.02 * (jnp.mod(t, 9.0) - 4.0))
        return env.get_obs(state), state

    starts = jaxmesh.Starts(reset_fn=reset_fn)
    d = jaxmesh.decide(
        push_left,
        lean,
        (env, params),
        bounds=(0, 500),
        num_envs=N,
        max_episodes=24,
        starts=starts,
    )
    assert d.batches == 3
    for policy, run in ((push_left, d.a), (lean, d.b)):
        ref = jaxmesh.evaluate(
            policy, (env, params), num_envs=N, seeds=range(24), starts=starts
        )
        np.testing.assert_array_equal(run.returns, ref.returns)
        np.testing.assert_array_equal(run.lengths, ref.lengths)


class Heard:
    """Records what an arm hook hears."""

    def __init__(self):
        self.starts, self.episodes, self.ends = 0, [], []

    def on_run_start(self, info):
        self.starts += 1

    def on_episode_end(self, ep):
        self.episodes.append((ep.index, ep.seed, ep.return_))

    def on_run_end(self, result):
        self.ends.append(result.num_episodes)


def test_arm_hooks_hear_their_arm_with_indices_in_the_whole_decide(tmp_path):
    heard = {"a": Heard(), "b": Heard()}
    logs = [jaxmesh.EpisodeLog(tmp_path / f"{x}.jsonl") for x in "ab"]
    d = jaxmesh.decide(
        push_left,
        lean,
        CARTPOLE,
        bounds=(0, 500),
        num_envs=N,
        first_seed=3,
        arm_hooks=([heard["a"], logs[0]], (heard["b"], logs[1])),
    )
    assert d.batches > 1
    for name, result in (("a", d.a), ("b", d.b)):
        h = heard[name]
        assert h.starts == d.batches
        assert h.ends == [p[0] for p in d.path]  # the arm so far, per batch
        assert sorted(h.episodes) == [
            (i, 3 + i, r) for i, r in enumerate(result.returns.tolist())
        ]
        loaded = jaxmesh.load_episode_log(tmp_path / f"{name}.jsonl")
        np.testing.assert_array_equal(loaded.returns, result.returns)
        np.testing.assert_array_equal(loaded.seeds, result.seeds)
        assert loaded.env_steps == result.env_steps


def test_plot_draws_the_interval_narrowing():
    pytest.importorskip("matplotlib")
    d = jaxmesh.decide(push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N)
    fig = d.plot()
    (ax,) = fig.axes
    assert ax.get_title() == d.verdict
    assert ax.get_xlabel() == "episodes per arm"
    # the mean difference after each batch, one point per batch
    (line,) = [x for x in ax.get_lines() if x.get_label() == "difference B - A"]
    xs, ys = line.get_data()
    assert list(xs) == [p[0] for p in d.path]
    diff = d.b.returns.astype(np.float64) - d.a.returns
    assert ys[-1] == pytest.approx(diff.mean())
    assert [x.get_xdata()[0] for x in ax.get_lines() if x.get_label() == "decided"] == [
        d.decided_at
    ]


@pytest.fixture(scope="module")
def decided_page(tmp_path_factory):
    pytest.importorskip("matplotlib")
    d = jaxmesh.decide(push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N)
    path = d.report(tmp_path_factory.mktemp("decide") / "page" / "decision.html")
    return d, path


def row_value(text, key):
    """The JSON value of the page's row ``data-key=key``."""
    found = re.search(rf"data-key='{key}' data-value='([^']*)'", text)
    return json.loads(html.unescape(found.group(1)))


def test_the_report_page_shows_the_decision(decided_page):
    from browser import data_uri_bytes, outside_references

    d, path = decided_page
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert outside_references(text) == [] and "http" not in text
    assert d.verdict in text and "B scores more" in text
    assert row_value(text, "interval") == list(d.interval)
    low, high = d.interval
    assert f"({low:.3f}, {high:.3f})" in text
    assert row_value(text, "difference") == d.difference
    assert row_value(text, "means") == pytest.approx(
        [d.a.returns.mean(), d.b.returns.mean()]
    )
    assert row_value(text, "episodes") == d.episodes
    assert row_value(text, "decided_at") == d.decided_at
    assert row_value(text, "verdict") == "b" == d.winner
    assert row_value(text, "policy_a") == "push_left"
    assert "Waudby-Smith and Ramdas" in text and "arXiv:2010.09686" in text
    # the interval after each batch, and the plot of it
    path_rows = re.findall(r"<tr data-value='([^']*)'><td>", text)
    assert [tuple(json.loads(html.unescape(r))) for r in path_rows] == list(d.path)
    (src,) = re.findall(r"<img src='([^']*)'", text)
    kind, png = data_uri_bytes(html.unescape(src))
    assert kind == "image/png" and png.startswith(b"\x89PNG")


def test_the_report_page_renders_in_a_browser(decided_page):
    from browser import render, require_chromium

    require_chromium()
    _, path = decided_page
    rendered = render(path)
    assert rendered.outside == []
    (image,) = rendered.images
    assert image["complete"] and image["width"] == 700  # 7 inches at 100 dpi
    assert "anytime-valid interval" in rendered.dom


# One-step Bernoulli episodes, as a JAX env ------------------------------------
@struct.dataclass
class CoinState(environment.EnvState):
    time: int


@struct.dataclass
class CoinParams(environment.EnvParams):
    p_heads: tuple = (0.5, 0.5)  # success chance of action 0 and of action 1
    max_steps_in_episode: int = 1


class Coin(environment.Environment):
    """One step: the reward is 1 with chance ``p_heads[action]``, drawn from the
    step's key folded with the action (so the two actions' outcomes on one
    seed are independent), else 0."""

    @property
    def default_params(self) -> CoinParams:
        return CoinParams()

    def reset_env(self, key, params):
        state = CoinState(time=0)
        return self.get_obs(state), state

    def step_env(self, key, state, action, params):
        p = jnp.asarray(params.p_heads)[action]
        heads = jax.random.bernoulli(jax.random.fold_in(key, action), p)
        state = CoinState(time=state.time + 1)
        return self.get_obs(state), state, heads.astype(float), True, {}

    def get_obs(self, state, params=None, key=None):
        return jnp.zeros((1,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)

    @property
    def name(self) -> str:
        return "Coin-test"


def heads_0(obs):
    return jnp.int32(0)


def heads_1(obs):
    return jnp.int32(1)


def test_equal_arms_are_rarely_called_different_however_decide_stops():
    # CONTRACT 36 end to end: independent one-step Bernoulli episodes of equal
    # mean (0.3), each decide on its own seeds, looking after every batch.
    runs = 150
    env = (Coin(), CoinParams(p_heads=(0.3, 0.3)))
    wrong = 0
    for r in range(runs):
        d = jaxmesh.decide(
            heads_0,
            heads_1,
            env,
            bounds=(0, 1),
            num_envs=N,
            max_episodes=160,
            first_seed=1000 * r,
        )
        wrong += d.winner is not None
    print(f"decide, equal arms: {wrong} false decisions in {runs} runs")
    # the 99.9% quantile of Binomial(150, 0.05), summed exactly
    total, upper = 0.0, 0
    while total < 0.999:
        total += math.comb(runs, upper) * 0.05**upper * 0.95 ** (runs - upper)
        upper += 1
    assert wrong <= upper - 1, (wrong, upper - 1)


def test_coin_arms_of_045_and_070_are_told_apart():
    env = (Coin(), CoinParams(p_heads=(0.45, 0.70)))
    d = jaxmesh.decide(heads_0, heads_1, env, bounds=(0, 1), num_envs=N)
    assert d.winner == "b"
    assert set(np.unique(d.a.returns)) <= {0.0, 1.0}
    assert abs(d.a.returns.mean() - 0.45) < 0.2 and abs(d.b.returns.mean() - 0.7) < 0.2


def test_an_interrupted_decide_keeps_its_finished_batches():
    def stop_after_two(d):
        if d.batches == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        jaxmesh.decide(
            push_left,
            lean,
            CARTPOLE,
            bounds=(0, 500),
            num_envs=N,
            on_batch=stop_after_two,
        )
    partial = info.value.partial_decision
    assert partial.episodes == 16 and partial.batches == 2
    assert partial.a.num_episodes == partial.b.num_episodes == 16
    whole = jaxmesh.decide(push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N)
    again = jaxmesh.decide(
        push_left, lean, CARTPOLE, bounds=(0, 500), num_envs=N, resume=partial
    )
    assert (again.winner, again.decided_at) == (whole.winner, whole.decided_at)
