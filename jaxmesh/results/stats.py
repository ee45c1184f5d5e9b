"""Statistics of a run's returns, and a comparison of two runs.

Plain numpy (and ``statistics.NormalDist``); nothing here imports JAX. Each
function's docstring states its convention so that a figure can be checked by
hand; docs/evaluation.md, "Statistics and paired comparison", lists them
(sample std, rliable's IQM, 95% percentile bootstrap with ``RESAMPLES`` draws
from ``numpy.random.default_rng(SEED)``, Wilson interval, pairing by seed).
The bootstrap costs O(resamples * n) time in memory bounded by
``_CHUNK_ELEMENTS``. Every interval here is fixed-sample; the anytime-valid
test for adding episodes until it is clear is ``jaxmesh.decide``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Bootstrap resamples, unless a caller asks for another number.
RESAMPLES = 10_000
#: The bootstrap's default seed (``numpy.random.default_rng(SEED)``).
SEED = 0
#: The default confidence level of every interval.
CONFIDENCE = 0.95
#: Percent points reported by ``quantiles`` and ``describe``.
QUANTILES = (5, 25, 50, 75, 95)
#: Resampled values held at once (int64 draws and counts: 8 MiB per array).
_CHUNK_ELEMENTS = 1 << 20


def summary_resamples(episodes: int) -> int:
    """Resamples for a summary or report: ``RESAMPLES``, fewer for a large run.

    The bootstrap costs resamples x episodes; a summary keeps it under about
    10^7 draws (10,000 resamples up to 1,000 episodes, at least 200), and says
    how many it used.
    """
    return min(RESAMPLES, max(200, 10**7 // max(episodes, 1)))


def _values(x: Any, name: str = "values") -> np.ndarray:
    """``x`` as a 1-D float64 array of finite values."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(
            f"{name} has shape {arr.shape}; expected one value per episode (1-D)"
        )
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(
            f"{name} holds non-finite values at entries {bad[:5].tolist()} "
            f"({arr[bad[:5]].tolist()}); statistics need finite values: drop those "
            "entries or fix what produced them"
        )
    return arr


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"confidence={confidence!r}: expected a level strictly between 0 and 1, "
            "e.g. 0.95"
        )


def _check_resamples(resamples: int) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int | np.integer):
        raise TypeError(f"resamples={resamples!r}: expected an int, e.g. 10_000")
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: expected at least 1, e.g. 10_000")


def mean(x: Any) -> float:
    """The mean of ``x`` (NaN for no values)."""
    arr = _values(x)
    return float(np.mean(arr)) if arr.size else math.nan


def std(x: Any) -> float:
    """The sample standard deviation (``ddof=1``); NaN for fewer than 2 values."""
    arr = _values(x)
    return float(np.std(arr, ddof=1)) if arr.size > 1 else math.nan


def standard_error(x: Any) -> float:
    """The standard error of the mean, ``std(x) / sqrt(n)``; NaN for n < 2."""
    arr = _values(x)
    return std(arr) / math.sqrt(arr.size) if arr.size > 1 else math.nan


def _cut(n: int) -> int:
    """Values dropped at each end for the IQM (``int(0.25 * n)``, as scipy)."""
    return n // 4


def iqm(x: Any) -> float:
    """The interquartile mean: the mean of the middle values (rliable's IQM).

    Sorts ``x``, drops the ``floor(n / 4)`` lowest and highest values and
    averages the rest (``scipy.stats.trim_mean(x, 0.25)``). With n = 10, the 3rd
    to 8th smallest values; with n = 7, the 2nd to 6th.

    Returns:
      The IQM, or NaN for no values.
    """
    arr = np.sort(_values(x))
    if not arr.size:
        return math.nan
    g = _cut(arr.size)
    return float(np.mean(arr[g : arr.size - g]))


def quantiles(x: Any, percents: Sequence[float] = QUANTILES) -> dict[str, float]:
    """Quantiles of ``x`` (numpy's linear interpolation), keyed ``"p5"``, ...

    Returns:
      ``{"p5": ..., "p25": ..., ...}``, one per entry of ``percents``; empty
      values give NaNs.
    """
    arr = _values(x)
    keys = [f"p{p:g}" for p in percents]
    if not arr.size:
        return dict.fromkeys(keys, math.nan)
    values = np.percentile(arr, list(percents))
    return {k: float(v) for k, v in zip(keys, values, strict=True)}


def _resampled_counts(n: int, resamples: int, seed: int):
    """Yields ``(k, n)`` arrays: how often each value is drawn in k resamples.

    The chunk size depends on ``n`` only, so a seed gives the same resamples
    whatever the caller does with them.
    """
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        draws = rng.integers(0, n, size=(k, n))
        draws += np.arange(k)[:, None] * n
        yield np.bincount(draws.ravel(), minlength=k * n).reshape(k, n)


def _smallest_sums(counts: np.ndarray, xs: np.ndarray, ps: Sequence[int]):
    """Per resample, the sums of its p smallest values, for each p in ``ps``.

    Sorted value i fills positions ``[start_i, end_i)`` of the sorted resample
    (``end`` the running count). The p smallest values are every value with
    ``end_i <= p`` plus ``p - start_j`` copies of the value j that straddles p.
    """
    k, n = counts.shape
    end = np.zeros((k, n + 1), np.int64)
    np.cumsum(counts, axis=1, out=end[:, 1:])
    total = np.zeros((k, n + 1))
    np.cumsum(counts * xs, axis=1, out=total[:, 1:])
    # Rows offset by (n + 1) make ``end`` one ascending array: one search for
    # all rows finds, in each, the first value whose end passes p.
    offset = np.arange(k) * (n + 1)
    flat = (end + offset[:, None]).ravel()
    rows = np.arange(k)
    sums = []
    for p in ps:
        t = np.searchsorted(flat, offset + p, side="right") - offset
        j = t - 1  # the straddling value's index (n when p == n: nothing left)
        part = (p - end[rows, j]) * xs[np.minimum(j, n - 1)]
        sums.append(total[rows, j] + part)
    return sums


def bootstrap_distribution(
    x: Any, *, resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, np.ndarray]:
    """The mean and the IQM of ``resamples`` bootstrap resamples of ``x``.

    Each resample draws n values of ``x`` with replacement. Both statistics are
    read from the same resamples, from how often each sorted value was drawn
    (the sorted resample is each value repeated that often), so no resample is
    sorted: the IQM is the sum of its ``n - g`` smallest values less the sum of
    its ``g`` smallest, over ``n - 2g``.

    Args:
      x: the values (at least one).
      resamples: how many resamples.
      seed: seed of ``numpy.random.default_rng``.

    Returns:
      ``{"mean": (resamples,), "iqm": (resamples,)}`` float64 arrays.
    """
    _check_resamples(resamples)
    xs = np.sort(_values(x))
    n = xs.size
    if not n:
        raise ValueError("no values to resample; a bootstrap needs at least one")
    g = _cut(n)
    means, iqms = [], []
    for counts in _resampled_counts(n, resamples, seed):
        low, high, everything = _smallest_sums(counts, xs, (g, n - g, n))
        means.append(everything / n)
        iqms.append((high - low) / (n - 2 * g))
    return {"mean": np.concatenate(means), "iqm": np.concatenate(iqms)}


def percentile_interval(
    distribution: np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The central ``confidence`` interval of a bootstrap distribution."""
    _check_confidence(confidence)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(distribution, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_interval(
    x: Any,
    statistic: str = "mean",
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of the mean or the IQM of ``x``.

    Args:
      x: the values, one per episode.
      statistic: ``"mean"`` or ``"iqm"``.
      confidence: the level (0.95: the 2.5th and 97.5th percentiles).
      resamples: bootstrap resamples (default 10,000).
      seed: seed of ``numpy.random.default_rng`` (fixed: same data, same
        interval).

    Returns:
      ``(low, high)``; ``(v, v)`` when every value is ``v``; None for fewer than
      two values (one value says nothing about its spread).

    Raises:
      ValueError: an unknown statistic, a bad level or non-finite values.

    Example:
      >>> bootstrap_interval([1.0, 1.0, 1.0])
      (1.0, 1.0)
    """
    if statistic not in ("mean", "iqm"):
        raise ValueError(f"statistic={statistic!r}: expected 'mean' or 'iqm'")
    _check_confidence(confidence)
    _check_resamples(resamples)
    arr = _values(x)
    if arr.size < 2:
        return None
    if arr.min() == arr.max():
        return float(arr[0]), float(arr[0])
    dist = bootstrap_distribution(arr, resamples=resamples, seed=seed)
    return percentile_interval(dist[statistic], confidence)


def wilson_interval(
    successes: int, trials: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The Wilson score interval of a success rate.

    With ``p = successes / trials`` and z the normal quantile of the level
    (1.96 for 0.95)::

        center = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    Unlike ``p +- z * sqrt(p (1 - p) / n)`` it stays inside [0, 1] and is not
    empty at 0 or n successes (0 of 10: [0, 0.278]).

    Args:
      successes: episodes that succeeded.
      trials: episodes (at least one).
      confidence: the level.

    Returns:
      ``(low, high)`` within [0, 1].

    Raises:
      ValueError: ``trials < 1`` or ``successes`` outside ``[0, trials]``.
    """
    _check_confidence(confidence)
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(
            f"successes={successes}, trials={trials}: expected trials >= 1 and "
            "0 <= successes <= trials"
        )
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    n, p = float(trials), successes / trials
    z2n = z * z / n
    center = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == trials else min(1.0, center + half)
    return low, high


def _none_if_nan(v: float) -> float | None:
    return None if math.isnan(v) else v


def success_flags(success: Any, n: int) -> np.ndarray | None:
    """Per-episode success as bools; None without a signal, or when any
    episode lacks it (a rate over some episodes would mislead)."""
    if success is None:
        return None
    flags = np.asarray(success, dtype=object)
    if flags.shape != (n,):
        raise ValueError(
            f"success has shape {flags.shape}; expected one flag per episode ({n},)"
        )
    if any(f is None for f in flags):
        return None
    return flags.astype(bool)


def metric_mean(values: Any) -> float | None:
    """The mean of an episode metric over the episodes that have a value.

    Bools (an ``any`` metric) give the share of True; NaN (no value on an
    episode) is left out; None when no episode has a value.
    """
    v = np.asarray(values, np.float64).reshape(-1)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else None


def mean_if_all(values: Sequence[float | None]) -> float | None:
    """The mean of ``values``; None when there are none or any is None."""
    if not len(values) or any(v is None for v in values):
        return None
    return float(np.mean(values))


def describe(
    returns: Any,
    lengths: Any = None,
    success: Any = None,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """Every statistic of a run, as a JSON-serialisable dict.

    Args:
      returns: one return per episode.
      lengths: one length per episode (only their mean is reported), or None.
      success: one bool per episode, or None when the env gives no success
        signal (then ``success_rate`` is None, never 0).
      confidence, resamples, seed: of the intervals.

    Returns:
      ``{"episodes", "confidence", "resamples", "seed", "returns": {"mean",
      "std", "standard_error", "mean_interval", "iqm", "iqm_interval",
      "quantiles", "min", "max"}, "lengths": {"mean"}, "success_rate",
      "success_interval"}``. Intervals are ``[low, high]`` lists; what a too
      small sample cannot give (a std of one value, anything of none) is None.
    """
    r = _values(returns, "returns")
    n = int(r.size)
    keys = ("mean", "std", "standard_error", "mean_interval", "iqm", "iqm_interval")
    ret: dict[str, Any] = dict.fromkeys((*keys, "quantiles", "min", "max"))
    if n:
        ret.update(
            mean=mean(r),
            std=_none_if_nan(std(r)),
            standard_error=_none_if_nan(standard_error(r)),
            iqm=iqm(r),
            quantiles=quantiles(r),
            min=float(r.min()),
            max=float(r.max()),
        )
    if n > 1:
        _check_confidence(confidence)
        if r.min() == r.max():
            ret["mean_interval"] = ret["iqm_interval"] = [float(r[0])] * 2
        else:
            dist = bootstrap_distribution(r, resamples=resamples, seed=seed)
            ret["mean_interval"] = list(percentile_interval(dist["mean"], confidence))
            ret["iqm_interval"] = list(percentile_interval(dist["iqm"], confidence))
    mean_length = None
    if lengths is not None and n:
        mean_length = mean(_values(lengths, "lengths"))
    flags = success_flags(success, n)
    rate = interval = None
    if flags is not None and n:
        rate = float(flags.mean())
        interval = list(wilson_interval(int(flags.sum()), n, confidence))
    return {
        "episodes": n,
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "returns": ret,
        "lengths": {"mean": mean_length},
        "success_rate": rate,
        "success_interval": interval,
    }


def run_stats(
    result: Any,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """``RunResult.stats()``: ``describe`` of its returns, lengths and
    headline success, with its success key and mode, the other success
    figures and each metric's reduction and mean."""
    out = describe(
        result.returns,
        result.lengths,
        result.success,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    out["success_key"] = result.success_key
    out["success_mode"] = result.success_mode
    out["success_once_rate"] = result.success_once_rate
    out["success_at_end_rate"] = result.success_at_end_rate
    out["successes_at_reset"] = result.successes_at_reset
    out["metrics"] = {
        name: {
            "reduction": result.metric_reductions.get(name, "last"),
            "mean": metric_mean(values),
        }
        for name, values in result.metrics.items()
    }
    return out


# Paired comparison ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Comparison:
    """Run B against run A on the same seeds, episode by episode.

    Attributes:
      difference: the mean over paired episodes of ``b.return - a.return``
        (positive: B scores more).
      interval: ``(low, high)``, the percentile bootstrap interval of that mean
        at ``confidence``, resampling episodes (pairs stay together).
      wins: the share of seeds where B's return is greater than A's; a tie
        counts half (so two equal runs give 0.5).
      episodes: the number of paired episodes.
      mean_a, mean_b: each run's mean return over those episodes.
      label_a, label_b: what ran (``policy on env``, and the settings in
        which the two runs differ, e.g. ``prefetch_lead=2``), for the table.
      confidence, resamples, seed: of the interval.
      paired: True: episodes paired by seed; False (``unpaired=True``): each
        run resampled on its own, ``wins`` over every (a, b) pair of episodes.
      episodes_b: B's episodes when unpaired (``episodes`` is then A's).
    """

    difference: float
    interval: tuple[float, float]
    wins: float
    episodes: int
    mean_a: float
    mean_b: float
    label_a: str = "A"
    label_b: str = "B"
    confidence: float = CONFIDENCE
    resamples: int = RESAMPLES
    seed: int = SEED
    paired: bool = True
    episodes_b: int | None = None

    @property
    def verdict(self) -> str:
        """Which run is better at this level, or that the interval holds 0."""
        low, high = self.interval
        level = f"{self.confidence:.0%}"
        if low > 0:
            return f"B scores more (the {level} interval is above 0)"
        if high < 0:
            return f"A scores more (the {level} interval is below 0)"
        return f"no difference shown (the {level} interval holds 0)"

    @property
    def test(self) -> str:
        """Which test the interval is: a fixed-sample percentile bootstrap,
        valid for a budget chosen before the runs; not for adding episodes
        until it leaves 0 (``jaxmesh.decide`` is the test for that)."""
        how = "paired" if self.paired else "unpaired"
        return (
            f"fixed-sample {how} percentile bootstrap (valid for a budget fixed in "
            "advance, not when adding episodes until it excludes 0: jaxmesh.decide)"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (the interval as a list)
        and ``test``."""
        d = dataclasses.asdict(self)
        d["interval"] = list(self.interval)
        d["test"] = self.test
        return d

    def __str__(self) -> str:
        low, high = self.interval
        if self.paired:
            episodes = ("paired episodes", f"{self.episodes} (same seeds)")
            how, share = "paired bootstrap", "of seeds"
        else:
            episodes = (
                "episodes A / B",
                f"{self.episodes} / {self.episodes_b} (UNPAIRED: not the same "
                "episodes; each run resampled on its own)",
            )
            how, share = "unpaired bootstrap", "of all (A, B) episode pairs"
        rows = [
            ("A", self.label_a),
            ("B", self.label_b),
            episodes,
            ("mean return A / B", f"{self.mean_a:.3f} / {self.mean_b:.3f}"),
            ("difference (B - A)", f"{self.difference:.3f}"),
            (
                f"{self.confidence:.0%} interval",
                f"[{low:.3f}, {high:.3f}] ({how}, "
                f"{self.resamples:,} resamples, seed {self.seed})",
            ),
            ("B wins", f"{self.wins:.1%} {share} (ties count half)"),
            ("verdict", self.verdict),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _label(result: Any, default: str) -> str:
    policy, env = getattr(result, "policy", ""), getattr(result, "env", "")
    if policy and env:
        return f"{policy} on {env}"
    return policy or env or default


#: The settings that change what an episode scores (CONTRACT 4), in the order
#: a label names them when two runs differ in them.
LABEL_SETTINGS = (
    "horizon",
    "chunk",
    "prefetch_lead",
    "delay",
    "delay_ms",
    "execution",
    "max_episode_seconds",
    "trial_index_base",
    "instruction",
    "success_mode",
)


def labels(a: Any, b: Any) -> tuple[str, str]:
    """Labels of two runs: ``policy on env`` and the settings they differ in.

    ``compare(sync, lagged)`` of one policy on one env labels the sides
    ``act_head on gymnax:CartPole-v1, prefetch_lead=0`` and ``..., prefetch_lead=2``
    rather than twice the same words. A setting neither run has (None on both,
    e.g. a suite's pooled pairs) is left out.
    """
    la, lb = _label(a, "A"), _label(b, "B")
    diff_a, diff_b = [], []
    for name in LABEL_SETTINGS:
        va, vb = getattr(a, name, None), getattr(b, name, None)
        if va != vb:
            diff_a.append(f"{name}={va!r}" if isinstance(va, str) else f"{name}={va}")
            diff_b.append(f"{name}={vb!r}" if isinstance(vb, str) else f"{name}={vb}")
    if diff_a:
        la, lb = f"{la}, {', '.join(diff_a)}", f"{lb}, {', '.join(diff_b)}"
    return la, lb


def _env_error(a: Any, b: Any) -> str | None:
    """Why ``a`` and ``b`` are not paired episodes by env, or None."""
    ea, eb = getattr(a, "env", ""), getattr(b, "env", "")
    if ea and eb and ea != eb:
        return (
            f"a ran env {ea!r} and b env {eb!r}: episodes of different envs are "
            "not paired (seed s of one env is not seed s of the other), so a "
            "paired comparison would be meaningless; compare two runs of the same "
            "env, or pass unpaired=True (jaxmesh compare --unpaired) to compare "
            "the two means without pairing"
        )
    return None


def _pairing_error(a: Any, b: Any) -> str | None:
    """What keeps ``a`` and ``b`` from being paired, or None."""
    fix = (
        "a paired comparison needs both runs on the same episodes: run both with "
        "the same seeds= (e.g. seeds=range(100)) and compare finished runs"
    )
    ia, ib = np.asarray(a.indices), np.asarray(b.indices)
    sa, sb = np.asarray(a.seeds), np.asarray(b.seeds)
    if ia.size == 0 or ib.size == 0:
        return f"a holds {ia.size} episodes and b {ib.size}: nothing to pair; {fix}"
    if ia.size != ib.size:
        return (
            f"a holds {ia.size} episodes and b {ib.size} (different budgets, or a "
            f"partial result); {fix}"
        )
    if ia.size < 2:
        return f"a and b hold one episode each: one pair gives no interval; {fix}"
    differ = np.flatnonzero(ia != ib)
    if differ.size:
        k = int(differ[0])
        return (
            f"a and b hold different episodes: entry {k} is episode {int(ia[k])} in "
            f"a and {int(ib[k])} in b ({differ.size} entries differ; a partial "
            f"result?); {fix}"
        )
    differ = np.flatnonzero(sa != sb)
    if differ.size:
        k = int(differ[0])
        return (
            f"a and b ran different seeds: episode {int(ia[k])} ran seed "
            f"{int(sa[k])} in a and {int(sb[k])} in b ({differ.size} of {sa.size} "
            f"episodes differ); {fix}"
        )
    return None


def compare(
    a: Any,
    b: Any,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
    unpaired: bool = False,
) -> Comparison:
    """Compares run B with run A, paired by seed: a percentile bootstrap of
    the mean of ``b - a`` over episodes (docs/evaluation.md, "Statistics and
    paired comparison").

    Args:
      a: the baseline ``RunResult``.
      b: the ``RunResult`` compared with it (same episode indices and seeds).
      resamples: bootstrap resamples (default 10,000).
      seed: the bootstrap's seed (same inputs, same interval).
      confidence: the interval's level.
      unpaired: False (default): pair episodes by seed, and refuse runs that
        cannot be paired. True: compare the two means without pairing (each
        run bootstrapped on its own; any budgets, seeds or envs, at least two
        episodes each); the table says UNPAIRED.

    Returns:
      A ``Comparison``; ``print`` it for a table. Its labels name the settings
      in which the runs differ (``labels``).

    Raises:
      TypeError: ``a`` or ``b`` is not a run result.
      ValueError: the runs cannot be paired (different envs, no episodes,
        different budgets, different episode indices, e.g. a partial result,
        or different seeds), naming what differs.

    Example:
      >>> cmp = jaxmesh.compare(baseline, tuned)   # both with seeds=range(200)
      >>> cmp.difference, cmp.interval, cmp.wins
    """
    _check_confidence(confidence)
    _check_resamples(resamples)
    for name, r in (("a", a), ("b", b)):
        missing = [f for f in ("indices", "seeds", "returns") if not hasattr(r, f)]
        if missing:
            raise TypeError(
                f"{name} is a {type(r).__name__} without {missing}; expected a "
                "jaxmesh.RunResult (from jaxmesh.evaluate, or RunResult.from_dict "
                "of a saved result)"
            )
    if not isinstance(unpaired, bool):
        raise TypeError(f"unpaired={unpaired!r}: expected True or False")
    label_a, label_b = labels(a, b)
    if not unpaired:
        problem = _env_error(a, b) or _pairing_error(a, b)
        if problem:
            raise ValueError(f"cannot compare these runs: {problem}")
    ra, rb = _values(a.returns, "a.returns"), _values(b.returns, "b.returns")
    if unpaired and (ra.size < 2 or rb.size < 2):
        raise ValueError(
            f"cannot compare these runs: a holds {ra.size} episodes and b "
            f"{rb.size}; an unpaired comparison needs at least two episodes in each"
        )

    def means(x: np.ndarray, s: int) -> np.ndarray:
        if x.min() == x.max():  # every resample's mean: x[0]
            return np.full(resamples, float(x[0]))
        return bootstrap_distribution(x, resamples=resamples, seed=s)["mean"]

    if unpaired:
        # Each run bootstrapped on its own (A with ``seed``, B with ``seed +
        # 1``); wins: P(B > A) + P(B == A) / 2 over every pair, from ranks.
        dist, difference = means(rb, seed + 1) - means(ra, seed), rb.mean() - ra.mean()
        sa = np.sort(ra)
        below = np.searchsorted(sa, rb, side="left")
        ties = np.searchsorted(sa, rb, side="right") - below
        wins = (below.sum() + 0.5 * ties.sum()) / (ra.size * rb.size)
    else:
        d = rb - ra
        dist, difference = means(d, seed), np.mean(d)
        wins = np.mean((rb > ra) + 0.5 * (rb == ra))
    return Comparison(
        difference=float(difference),
        interval=percentile_interval(dist, confidence),
        wins=float(wins),
        episodes=int(ra.size),
        mean_a=float(np.mean(ra)),
        mean_b=float(np.mean(rb)),
        label_a=label_a,
        label_b=label_b,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        paired=not unpaired,
        episodes_b=int(rb.size) if unpaired else None,
    )
