"""Statistics of a run's returns, and a paired comparison of two runs.

Plain numpy; the conventions are in docs/evaluation.md, "Statistics and paired
comparison". Every interval is fixed-sample (``jaxmesh.decide`` is the
anytime-valid test).
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
    """Resamples for a summary or report: ``RESAMPLES``, fewer for a large run
    (about 10^7 draws at most, at least 200 resamples)."""
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


def _check(confidence: float, resamples: int = 1) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"confidence={confidence!r}: expected a level strictly between 0 and 1, "
            "e.g. 0.95"
        )
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


def iqm(x: Any) -> float:
    """rliable's interquartile mean: the mean after dropping the ``n // 4``
    lowest and highest values (``scipy.stats.trim_mean(x, 0.25)``); NaN for
    no values."""
    arr = np.sort(_values(x))
    if not arr.size:
        return math.nan
    g = arr.size // 4
    return float(np.mean(arr[g : arr.size - g]))


def quantiles(x: Any, percents: Sequence[float] = QUANTILES) -> dict[str, float]:
    """Quantiles of ``x`` (numpy's linear interpolation) keyed ``"p5"``, ...
    (NaN for no values)."""
    arr = _values(x)
    keys = [f"p{p:g}" for p in percents]
    if not arr.size:
        return dict.fromkeys(keys, math.nan)
    values = np.percentile(arr, list(percents))
    return {k: float(v) for k, v in zip(keys, values, strict=True)}


def _resampled_counts(n: int, resamples: int, seed: int):
    """Yields ``(k, n)`` arrays: how often each value is drawn in k resamples
    (chunks that depend on ``n`` only: a seed gives the same resamples)."""
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        draws = rng.integers(0, n, size=(k, n))
        draws += np.arange(k)[:, None] * n
        yield np.bincount(draws.ravel(), minlength=k * n).reshape(k, n)


def _smallest_sums(counts: np.ndarray, xs: np.ndarray, ps: Sequence[int]):
    """Per resample, the sum of its p smallest values for each p in ``ps``:
    every sorted value whose running count ``end_i <= p``, and ``p - start_j``
    copies of the value j that straddles p."""
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
    """The mean and the IQM of ``resamples`` bootstrap resamples of ``x`` (at
    least one value), as ``{"mean", "iqm"}`` float64 arrays. Both are read
    from how often each sorted value was drawn, so no resample is sorted; when
    every value is ``v``, every resample's is exactly ``v``.
    """
    _check(0.5, resamples)
    xs = np.sort(_values(x))
    n = xs.size
    if not n:
        raise ValueError("no values to resample; a bootstrap needs at least one")
    if xs[0] == xs[-1]:
        return dict.fromkeys(("mean", "iqm"), np.full(resamples, xs[0]))
    g = n // 4  # dropped at each end, as scipy's trim_mean
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
    _check(confidence)
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
    """A percentile bootstrap interval of the ``"mean"`` or ``"iqm"`` of
    ``x``: ``(low, high)``, ``(v, v)`` when every value is ``v``, None for
    fewer than two values.

    Raises:
      ValueError: an unknown statistic, a bad level or non-finite values.
    """
    if statistic not in ("mean", "iqm"):
        raise ValueError(f"statistic={statistic!r}: expected 'mean' or 'iqm'")
    _check(confidence, resamples)
    arr = _values(x)
    if arr.size < 2:
        return None
    dist = bootstrap_distribution(arr, resamples=resamples, seed=seed)
    return percentile_interval(dist[statistic], confidence)


def wilson_interval(
    successes: int, trials: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` of ``trials`` (inside [0, 1],
    not empty at 0 or n successes: 0 of 10 gives [0, 0.278]).

    Raises:
      ValueError: ``trials < 1`` or ``successes`` outside ``[0, trials]``.
    """
    _check(confidence)
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


def none_if_nan(v: float) -> float | None:
    return None if math.isnan(v) else v


def success_flags(success: Any, n: int) -> np.ndarray | None:
    """Per-episode success as bools; None without a signal, or when an
    episode lacks it."""
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
    """Every statistic of a run as a JSON-serialisable dict: ``{"episodes",
    "confidence", "resamples", "seed", "returns": {"mean", "std",
    "standard_error", "mean_interval", "iqm", "iqm_interval", "quantiles",
    "min", "max"}, "lengths": {"mean"}, "success_rate", "success_interval"}``;
    intervals as lists; None for what too few values cannot give (a
    ``success`` of None: no signal, never a rate of 0).
    """
    r = _values(returns, "returns")
    n = int(r.size)
    keys = ("mean", "std", "standard_error", "mean_interval", "iqm", "iqm_interval")
    ret: dict[str, Any] = dict.fromkeys((*keys, "quantiles", "min", "max"))
    if n:
        ret.update(
            mean=mean(r),
            std=none_if_nan(std(r)),
            standard_error=none_if_nan(standard_error(r)),
            iqm=iqm(r),
            quantiles=quantiles(r),
            min=float(r.min()),
            max=float(r.max()),
        )
    if n > 1:
        dist = bootstrap_distribution(r, resamples=resamples, seed=seed)
        for key in ("mean", "iqm"):
            ret[f"{key}_interval"] = list(percentile_interval(dist[key], confidence))
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


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Run B against run A on the same seeds, episode by episode.

    Attributes:
      difference: the mean of ``b.return - a.return`` (positive: B scores more)
        and ``interval`` its percentile bootstrap interval (pairs kept).
      wins: the share of seeds where B returns more, a tie counting half.
      episodes: paired episodes (unpaired: A's; ``episodes_b``: B's).
      label_a, label_b: ``policy on env`` and the settings the runs differ in.
      paired: False (``unpaired=True``): each run resampled on its own,
        ``wins`` over every (a, b) pair of episodes.
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
        """Which test the interval is (fixed-sample: not for adding episodes
        until it leaves 0, which ``jaxmesh.decide`` tests)."""
        how = "paired" if self.paired else "unpaired"
        return (
            f"fixed-sample {how} percentile bootstrap (valid for a budget fixed in "
            "advance, not when adding episodes until it excludes 0: jaxmesh.decide)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field (the interval as a list) and ``test``."""
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


#: The settings that change what an episode scores (CONTRACT 4), in a label's
#: order.
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
    """Labels of two runs: ``policy on env`` and the settings they differ in
    (``..., prefetch_lead=0`` and ``..., prefetch_lead=2``)."""
    differ = [n for n in LABEL_SETTINGS if getattr(a, n, None) != getattr(b, n, None)]

    def label(r: Any, default: str) -> str:
        policy, env = getattr(r, "policy", ""), getattr(r, "env", "")
        out = f"{policy} on {env}" if policy and env else policy or env or default
        for name in differ:
            v = getattr(r, name, None)
            out += f", {name}={v!r}" if isinstance(v, str) else f", {name}={v}"
        return out

    return label(a, "A"), label(b, "B")


def _pairing_error(a: Any, b: Any) -> str | None:
    """What keeps ``a`` and ``b`` from being paired, or None."""
    ea, eb = getattr(a, "env", ""), getattr(b, "env", "")
    if ea and eb and ea != eb:
        return (
            f"a ran env {ea!r} and b env {eb!r}: episodes of different envs are "
            "not paired (seed s of one env is not seed s of the other), so a "
            "paired comparison would be meaningless; compare two runs of the same "
            "env, or pass unpaired=True (jaxmesh compare --unpaired) to compare "
            "the two means without pairing"
        )
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
    the mean of ``b - a`` (docs/evaluation.md, "Statistics and paired
    comparison").

    Args:
      a: the baseline ``RunResult``.
      b: the ``RunResult`` compared with it (same episode indices and seeds).
      resamples: bootstrap resamples (default 10,000).
      seed: the bootstrap's seed.
      confidence: the interval's level.
      unpaired: True: compare the two means without pairing (each run
        bootstrapped on its own; at least two episodes each).

    Returns:
      A ``Comparison``; ``print`` it for a table.

    Raises:
      TypeError: ``a`` or ``b`` is not a run result.
      ValueError: the runs cannot be paired (envs, budgets, episode indices
        or seeds differ), naming what differs.
    """
    _check(confidence, resamples)
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
    problem = None if unpaired else _pairing_error(a, b)
    if problem:
        raise ValueError(f"cannot compare these runs: {problem}")
    ra, rb = _values(a.returns, "a.returns"), _values(b.returns, "b.returns")
    if unpaired and (ra.size < 2 or rb.size < 2):
        raise ValueError(
            f"cannot compare these runs: a holds {ra.size} episodes and b "
            f"{rb.size}; an unpaired comparison needs at least two episodes in each"
        )

    def means(x: np.ndarray, s: int) -> np.ndarray:
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
