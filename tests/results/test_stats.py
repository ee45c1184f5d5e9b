"""jaxmesh.stats, RunResult.stats / from_dict and jaxmesh compare, against values
worked by hand, closed forms, and scipy (scipy.stats.bootstrap, trim_mean: the
definition rliable's IQM uses)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import jax
import numpy as np
import pytest
import scipy.stats

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.results import stats
from jaxmesh.results.result import RunResult
from jaxmesh.zoo import cartpole

pytestmark = pytest.mark.usefixtures("no_compile_cache")

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cartpole.yaml"


def synthetic(returns, seeds=None, indices=None, policy="p", env="e") -> RunResult:
    """A RunResult holding ``returns`` (as if each episode ran one step)."""
    returns = np.asarray(returns, np.float32)
    n = returns.size
    ones = np.ones(n, np.int32)
    return RunResult(
        indices=np.arange(n) if indices is None else np.asarray(indices),
        seeds=np.arange(n) if seeds is None else np.asarray(seeds),
        returns=returns,
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
        policy=policy,
        env=env,
    )


# Closed forms -----------------------------------------------------------------
@pytest.mark.parametrize("value", [500.0, 0.1, -3.0])
def test_constant_returns_have_zero_spread_and_a_degenerate_interval(value):
    d = stats.describe(np.full(37, value), np.full(37, 9))
    r = d["returns"]
    assert r["mean"] == pytest.approx(value) and r["iqm"] == pytest.approx(value)
    assert r["std"] == pytest.approx(0.0, abs=1e-12)
    assert r["standard_error"] == pytest.approx(0.0, abs=1e-12)
    assert r["mean_interval"] == [value, value]
    assert r["iqm_interval"] == [value, value]
    assert all(q == pytest.approx(value) for q in r["quantiles"].values())
    assert d["lengths"]["mean"] == 9.0
    assert stats.bootstrap_interval(np.full(5, value)) == (value, value)


def test_two_valued_returns_by_hand():
    # Six 0s and four 10s. Mean 4; sample variance (6 * 16 + 4 * 36) / 9 = 240/9;
    # IQM drops floor(10/4) = 2 at each end: mean of [0, 0, 0, 0, 10, 10] = 10/3.
    x = [10.0, 0, 0, 10, 0, 0, 10, 0, 10, 0]
    d = stats.describe(x)["returns"]
    assert d["mean"] == 4.0
    assert d["std"] == pytest.approx(math.sqrt(240 / 9))
    assert d["standard_error"] == pytest.approx(math.sqrt(240 / 9) / math.sqrt(10))
    assert d["iqm"] == pytest.approx(10 / 3)
    # Linear interpolation: the 75th percentile sits at position 0.75 * 9 = 6.75
    # of the sorted values (both 10), the median at 4.5 (both 0).
    assert d["quantiles"] == {
        "p5": 0.0,
        "p25": 0.0,
        "p50": 0.0,
        "p75": 10.0,
        "p95": 10.0,
    }
    assert (d["min"], d["max"]) == (0.0, 10.0)
    low, high = d["mean_interval"]
    assert 0.0 <= low < 4.0 < high <= 10.0


def test_quantiles_interpolate_linearly():
    # Sorted 1..5: percent p sits at position p/100 * 4.
    q = stats.quantiles([5, 3, 1, 4, 2])
    assert q == pytest.approx(
        {"p5": 1.2, "p25": 2.0, "p50": 3.0, "p75": 4.0, "p95": 4.8}
    )


@pytest.mark.parametrize(
    "values, expected",
    [
        # n = 7: floor(7/4) = 1 dropped at each end: [2, 3, 7, 8, 9] -> 29/5.
        ([9, 1, 8, 2, 7, 3, 100], 29 / 5),
        # n = 10: 2 dropped at each end: [1, 2, 3, 5, 8, 13] -> 32/6.
        ([34, 0, 21, 1, 13, 2, 8, 3, 5, 0], 32 / 6),
        # n = 3: nothing dropped, the mean.
        ([1, 2, 6], 3.0),
    ],
)
def test_iqm_by_hand_with_n_not_divisible_by_4(values, expected):
    assert stats.iqm(values) == pytest.approx(expected)
    assert stats.iqm(values) == pytest.approx(
        scipy.stats.trim_mean(values, proportiontocut=0.25)
    )


@pytest.mark.parametrize(
    "successes, trials, low, high",
    [
        # p = 0.8, z = 1.95996: center (0.8 + 0.19207) / 1.38415 = 0.71674,
        # half 1.41600 * sqrt(0.016 + 0.0009604) = 0.18431.
        (8, 10, 0.4902, 0.9433),
        # center 0.19207 / 1.38415 = 0.13877, half 1.41600 * 0.097998 = 0.13877.
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (1, 2, 0.0945, 0.9055),
    ],
)
def test_wilson_interval_worked_values(successes, trials, low, high):
    got = stats.wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize("successes, trials", [(0, 0), (11, 10), (-1, 10)])
def test_wilson_interval_refuses_impossible_counts(successes, trials):
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        stats.wilson_interval(successes, trials)


def test_too_few_values_give_none_never_a_made_up_number():
    one = stats.describe([3.0])
    assert one["returns"]["mean"] == 3.0 and one["returns"]["iqm"] == 3.0
    assert one["returns"]["std"] is None
    assert one["returns"]["mean_interval"] is None
    assert one["returns"]["iqm_interval"] is None
    empty = stats.describe([])
    assert empty["episodes"] == 0
    assert all(v is None for v in empty["returns"].values())
    json.dumps(one, allow_nan=False)
    json.dumps(empty, allow_nan=False)


def test_non_finite_values_are_refused_by_name():
    with pytest.raises(
        ValueError, match=r"returns holds non-finite values at entries \[1\]"
    ):
        stats.describe([1.0, float("nan"), 2.0])


# The bootstrap ----------------------------------------------------------------
def _scipy_interval(x, statistic):
    return scipy.stats.bootstrap(
        (x,),
        statistic,
        method="percentile",
        n_resamples=10_000,
        rng=np.random.default_rng(12345),
    ).confidence_interval


@pytest.mark.parametrize("n", [10, 151])
def test_bootstrap_intervals_match_scipy(n):
    # Skewed data, so that the percentile interval is asymmetric about the mean.
    x = np.random.default_rng(n).exponential(10.0, size=n)
    se = np.std(x, ddof=1) / math.sqrt(n)
    iqm = lambda v, axis: scipy.stats.trim_mean(v, 0.25, axis=axis)
    for statistic, reference in (("mean", np.mean), ("iqm", iqm)):
        low, high = stats.bootstrap_interval(x, statistic)
        ref = _scipy_interval(x, reference)
        # Two Monte Carlo estimates of the same percentiles, 10,000 resamples
        # each: they differ by about 0.04 standard errors.
        assert low == pytest.approx(ref.low, abs=0.2 * se), statistic
        assert high == pytest.approx(ref.high, abs=0.2 * se), statistic


def test_bootstrap_iqm_of_each_resample_is_trim_mean():
    # The counts trick against sorting each resample and trimming it.
    for n in (1, 2, 5, 7, 12, 33):
        xs = np.sort(np.round(np.random.default_rng(n).normal(size=n), 1))  # ties
        counts = next(stats._resampled_counts(n, 40, seed=n))
        dist = stats.bootstrap_distribution(xs, resamples=40, seed=n)
        for row, c in enumerate(counts):
            sample = np.repeat(xs, c)
            assert dist["mean"][row] == pytest.approx(sample.mean())
            assert dist["iqm"][row] == pytest.approx(
                scipy.stats.trim_mean(sample, 0.25)
            )


def test_bootstrap_is_deterministic_for_a_seed():
    x = np.random.default_rng(0).normal(100.0, 30.0, size=300)
    first = stats.describe(x)
    assert stats.describe(x) == first
    assert stats.bootstrap_interval(x, seed=7) == stats.bootstrap_interval(x, seed=7)
    assert stats.bootstrap_interval(x, seed=7) != stats.bootstrap_interval(x, seed=8)
    assert first["resamples"] == 10_000 and first["seed"] == 0


# Paired comparison ------------------------------------------------------------
def test_pairing_detects_an_improvement_unpaired_intervals_miss():
    # Each seed has its own difficulty (spread 50), shared by both policies; B
    # scores 2 more on every seed, give or take 1.
    rng = np.random.default_rng(0)
    difficulty = rng.normal(0.0, 50.0, size=200)
    a = synthetic(100.0 + difficulty + rng.normal(0.0, 1.0, size=200))
    b = synthetic(102.0 + difficulty + rng.normal(0.0, 1.0, size=200))

    a_low, a_high = a.stats()["returns"]["mean_interval"]
    b_low, b_high = b.stats()["returns"]["mean_interval"]
    assert a_low < b_low < a_high < b_high  # unpaired: the intervals overlap

    cmp = jaxmesh.compare(a, b)
    assert cmp.difference == pytest.approx(np.mean(b.returns - a.returns))
    assert 0.0 < cmp.interval[0] < cmp.difference < cmp.interval[1]  # excludes 0
    assert cmp.wins > 0.8
    assert cmp.episodes == 200
    assert "B scores more" in str(cmp)


def test_wins_count_ties_half_and_difference_by_hand():
    a = synthetic([1.0, 2.0, 3.0, 4.0])
    b = synthetic([2.0, 2.0, 1.0, 5.0])  # wins, tie, loss, win: 2.5 of 4
    cmp = jaxmesh.compare(a, b)
    assert cmp.wins == 0.625
    assert cmp.difference == 0.0  # (1 + 0 - 2 + 1) / 4
    low, high = cmp.interval
    assert -2.0 <= low < 0.0 < high <= 1.0
    same = jaxmesh.compare(a, a)
    assert (same.difference, same.interval, same.wins) == (0.0, (0.0, 0.0), 0.5)
    assert "no difference shown" in str(same)
    json.dumps(cmp.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    "a, b, message",
    [
        (
            synthetic([1, 2, 3]),
            synthetic([1, 2, 3], seeds=[5, 6, 7]),
            "ran seed 0 in a and 5 in b",
        ),
        (synthetic([1, 2, 3]), synthetic([1, 2, 3, 4]), "a holds 3 episodes and b 4"),
        (
            synthetic([1, 2, 3], indices=[0, 1, 3], seeds=[0, 1, 3]),
            synthetic([1, 2, 3]),
            "entry 2 is episode 3 in a and 2 in b",
        ),
        (synthetic([]), synthetic([]), "nothing to pair"),
        (synthetic([1]), synthetic([2]), "one pair gives no interval"),
    ],
)
def test_compare_refuses_unpaired_runs(a, b, message):
    with pytest.raises(ValueError, match="same seeds=") as info:
        jaxmesh.compare(a, b)
    assert message in str(info.value)


def test_compare_refuses_what_is_not_a_result():
    with pytest.raises(TypeError, match="expected a jaxmesh.RunResult"):
        jaxmesh.compare([1.0, 2.0], synthetic([1, 2]))


# RunResult: stats, summary, from_dict -------------------------------------------
def cartpole_run(act, episodes=24):
    return jaxmesh.evaluate(act, "gymnax:CartPole-v1", num_envs=8, episodes=episodes)


def test_summary_says_when_a_run_played_chunks():
    """An int vector from a discrete policy that forgot to index is read as a
    chunk: the summary says so, and says nothing of chunks for one action."""
    single = cartpole_run(lambda obs: (obs[2] > 0).astype(np.int32), episodes=8)
    assert "chunks of" not in single.summary()
    vector = cartpole_run(lambda obs: (obs + 0.5 > 0).astype(np.int32), episodes=8)
    text = vector.summary()
    assert re.search(r"lanes \(num_envs\) +8\n", text)
    assert re.search(r"chunk length +chunks of 4 actions\n", text)


def test_run_result_stats_summary_and_round_trip():
    result = cartpole_run(lambda obs: (obs[2] > 0).astype(np.int32))
    s = result.stats()
    json.dumps(s, allow_nan=False)
    assert s["episodes"] == 24
    assert s["returns"]["mean"] == pytest.approx(np.mean(np.float64(result.returns)))
    assert s["returns"]["iqm"] == pytest.approx(
        scipy.stats.trim_mean(result.returns, 0.25)
    )
    assert s["lengths"]["mean"] == pytest.approx(np.mean(result.lengths))
    assert s["success_rate"] is None and s["success_interval"] is None

    text = result.summary()
    for row in ("mean return", "min return", "max return", "mean length"):
        assert row in text
    low, high = s["returns"]["mean_interval"]
    assert f"[{low:.3f}, {high:.3f}]" in text
    assert "IQM return" in text and "standard error" in text

    d = json.loads(json.dumps(result.to_dict()))
    back = RunResult.from_dict(d)
    assert back.to_dict() == d
    np.testing.assert_array_equal(back.returns, result.returns)
    np.testing.assert_array_equal(back.seeds, result.seeds)
    assert back.stats() == s


def test_success_flags_give_a_wilson_interval_and_missing_ones_none():
    result = synthetic(np.arange(10.0))
    result = dataclasses.replace(result, success=np.array([True] * 8 + [False] * 2))
    s = result.stats()
    assert s["success_rate"] == 0.8
    assert s["success_interval"] == pytest.approx([0.4902, 0.9433], abs=5e-5)
    assert "success rate" in result.summary()
    result = dataclasses.replace(result, success=None)
    assert result.stats()["success_rate"] is None
    assert "success rate" not in result.summary()


@pytest.mark.parametrize(
    "broken, message",
    [
        ({"episodes": []}, "lacks ['settings', 'totals']"),
        ("text", "got a str"),
    ],
)
def test_from_dict_refuses_what_to_dict_did_not_write(broken, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        RunResult.from_dict(broken)
    d = synthetic([1.0, 2.0]).to_dict()
    del d["episodes"][1]["seed"]
    with pytest.raises(ValueError, match="key 'seed'"):
        RunResult.from_dict(d)


# The command line ---------------------------------------------------------------
def eval_json(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    argv = ["eval", str(CONFIG), "--set", "episodes=16", "--set", "num_envs=8"]
    argv += ["--set", f"output={out}", "--no-progress", *extra]
    assert main(argv) == 0
    return out


def test_cli_compare_on_two_eval_results(tmp_path, capsys):
    trained = eval_json(tmp_path, "trained")
    fresh = cartpole.init(jax.random.PRNGKey(3))  # an untrained MLP
    jaxmesh.save_params(tmp_path / "fresh", fresh)
    untrained = eval_json(
        tmp_path, "untrained", "--set", f"policy_config.checkpoint={tmp_path / 'fresh'}"
    )
    capsys.readouterr()

    assert main(["compare", str(untrained), str(trained)]) == 0
    out = capsys.readouterr().out
    a = [ep["return"] for ep in json.loads(untrained.read_text())["episodes"]]
    b = [ep["return"] for ep in json.loads(trained.read_text())["episodes"]]
    expected = np.mean(np.subtract(b, a))
    assert f"difference (B - A)  {expected:.3f}" in out
    assert "paired episodes     16" in out
    assert "B scores more" in out

    # Bad input: one line on stderr, exit status 2.
    other = eval_json(
        tmp_path, "other", "--set", "seeds=[16, 17, 18, 19]", "--set", "episodes=4"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    capsys.readouterr()
    for argv, message in [
        (["compare", str(trained), str(other)], "a holds 16 episodes and b 4"),
        (["compare", str(trained), str(tmp_path / "missing.json")], "not found"),
        (["compare", str(trained), str(broken)], "is not valid JSON"),
        (["compare", str(trained), str(trained), "--resamples", "0"], "resamples=0"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("jaxmesh compare: error: ") and message in err, err
        assert err.count("\n") == 1


# Runs that are not paired episodes, labels, suites ----------------------------------
def test_compare_refuses_runs_of_different_envs_by_name():
    a = synthetic([1, 2, 3, 4], env="gymnax:CartPole-v1")
    b = synthetic([1, 2, 3, 4], env="Reach2D")
    with pytest.raises(ValueError, match="not paired") as info:
        jaxmesh.compare(a, b)
    text = str(info.value)
    assert "'gymnax:CartPole-v1'" in text and "'Reach2D'" in text
    assert "unpaired=True" in text


def test_unpaired_compare_by_hand():
    # a = [1, 2], b = [2, 3, 0]: pairs (b > a) 2>1, 3>1, 3>2; tie 2=2: 3.5 of 6.
    a = synthetic([1.0, 2.0], env="gymnax:CartPole-v1")
    b = synthetic([2.0, 3.0, 0.0], env="Reach2D")
    cmp = jaxmesh.compare(a, b, unpaired=True)
    assert cmp.wins == pytest.approx(3.5 / 6)
    assert cmp.difference == pytest.approx(5.0 / 3.0 - 1.5)
    assert (cmp.episodes, cmp.episodes_b, cmp.paired) == (2, 3, False)
    assert re.search(r"episodes A / B +2 / 3 \(UNPAIRED", str(cmp)), str(cmp)
    assert "p on gymnax:CartPole-v1" == cmp.label_a and cmp.label_b == "p on Reach2D"
    # Constant runs: the difference has no spread.
    same = jaxmesh.compare(synthetic([4.0] * 3), synthetic([6.0] * 5), unpaired=True)
    assert (same.difference, same.interval, same.wins) == (2.0, (2.0, 2.0), 1.0)


def test_unpaired_interval_matches_a_plain_bootstrap():
    rng = np.random.default_rng(1)
    ra, rb = rng.normal(10.0, 3.0, 80), rng.normal(11.0, 3.0, 120)
    cmp = jaxmesh.compare(synthetic(ra), synthetic(rb), unpaired=True)
    # An independent bootstrap: resample each run on its own, difference of means.
    ref = np.random.default_rng(123)
    ra32, rb32 = ra.astype(np.float32), rb.astype(np.float32)
    diffs = [
        rng_b.mean() - rng_a.mean()
        for rng_a, rng_b in (
            (ref.choice(ra32, ra32.size), ref.choice(rb32, rb32.size))
            for _ in range(10_000)
        )
    ]
    low, high = np.percentile(diffs, [2.5, 97.5])
    assert cmp.interval[0] == pytest.approx(low, abs=0.1)
    assert cmp.interval[1] == pytest.approx(high, abs=0.1)


def test_labels_name_the_settings_that_differ():
    import dataclasses

    sync = synthetic([1, 2, 3], policy="act_head", env="gymnax:CartPole-v1")
    lagged = dataclasses.replace(sync, prefetch_lead=2, returns=sync.returns + 1)
    cmp = jaxmesh.compare(sync, lagged)
    assert cmp.label_a == "act_head on gymnax:CartPole-v1, prefetch_lead=0"
    assert cmp.label_b == "act_head on gymnax:CartPole-v1, prefetch_lead=2"
    two = dataclasses.replace(lagged, horizon=8, instruction="go")
    assert jaxmesh.compare(sync, two).label_b == (
        "act_head on gymnax:CartPole-v1, horizon=8, prefetch_lead=2, instruction='go'"
    )
    assert jaxmesh.compare(sync, sync).label_a == "act_head on gymnax:CartPole-v1"


def write_yaml(tmp_path, name, **keys):
    import yaml

    config = {"policy": "cli_policies:tilt", "num_envs": 4, "episodes": 8, **keys}
    config["output"] = str(tmp_path / f"{name}.json")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["eval", str(path), "--no-progress"]) == 0
    return tmp_path / f"{name}.json"


def test_cli_compare_refuses_two_envs_and_compares_them_unpaired(tmp_path, capsys):
    cartpole_json = write_yaml(tmp_path, "cartpole", env="gymnax:CartPole-v1")
    acrobot_json = write_yaml(
        tmp_path, "acrobot", env="gymnax:Acrobot-v1", max_episode_steps=30
    )
    capsys.readouterr()
    assert main(["compare", str(cartpole_json), str(acrobot_json)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxmesh compare: error: ") and err.count("\n") == 1
    assert "'gymnax:CartPole-v1'" in err and "'gymnax:Acrobot-v1'" in err
    assert "--unpaired" in err

    argv = ["compare", str(cartpole_json), str(acrobot_json), "--unpaired"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    a = [ep["return"] for ep in json.loads(cartpole_json.read_text())["episodes"]]
    b = [ep["return"] for ep in json.loads(acrobot_json.read_text())["episodes"]]
    wins = sum((y > x) + 0.5 * (y == x) for x in a for y in b) / (len(a) * len(b))
    assert f"difference (B - A)  {np.mean(b) - np.mean(a):.3f}" in out
    assert re.search(rf"B wins +{wins:.1%} of all \(A, B\) episode pairs", out)
    assert "UNPAIRED" in out


def test_cli_compares_two_suite_results_task_by_task(tmp_path, capsys):
    tasks = {"cartpole": "gymnax:CartPole-v1", "acrobot": "gymnax:Acrobot-v1"}
    keys = {"tasks": tasks, "max_episode_steps": 40, "horizon": 4}
    keys["policy"] = "cli_policies:chunked"
    sync = write_yaml(tmp_path, "sync", **keys)
    lagged = write_yaml(tmp_path, "lagged", prefetch_lead=1, **keys)
    capsys.readouterr()
    assert main(["compare", str(sync), str(lagged), "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "A: chunked on a suite of 2 tasks, prefetch_lead=0", out
    assert lines[1] == "B: chunked on a suite of 2 tasks, prefetch_lead=1", out
    da, db = json.loads(sync.read_text()), json.loads(lagged.read_text())
    pooled_a, pooled_b = [], []
    for name in tasks:
        ra = [ep["return"] for ep in da["tasks"][name]["episodes"]]
        rb = [ep["return"] for ep in db["tasks"][name]["episodes"]]
        pooled_a += ra
        pooled_b += rb
        row = next(line for line in lines if line.startswith(name))
        cells = row.split()
        assert cells[1:4] == [
            f"{np.mean(ra):.3f}",
            f"{np.mean(rb):.3f}",
            f"{np.mean(rb) - np.mean(ra):+.3f}",
        ], row
    row = next(line for line in lines if line.startswith("pooled "))
    assert row.split()[3] == f"{np.mean(pooled_b) - np.mean(pooled_a):+.3f}"


def test_the_readme_s_chunked_example_prints_what_the_readme_shows(capsys):
    """The README's chunked model, run as written: lag must show (the
    synchronous run keeps the pole up, the lagged one does not), and the
    comparison it prints is the table the README quotes."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### A chunked model", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    import jax.numpy as jnp

    scope: dict = {"jnp": jnp, "jaxmesh": jaxmesh}  # the Quick start's imports
    exec(compile(code, "README.md", "exec"), scope)
    printed = capsys.readouterr().out
    assert printed.endswith(shown), printed
    sync, lagged = scope["sync"], scope["lagged"]
    assert sync.mean_return == 500.0
    assert np.sum(lagged.returns < 500) > 50  # most episodes drop the pole
