"""An anytime-valid confidence sequence for a bounded mean, by betting.

Plain numpy. ``jaxmesh.decide`` feeds it the paired differences ``b - a`` of
two policies' episodes, batch by batch, and stops when the interval leaves 0.
The capital process of Waudby-Smith and Ramdas (arXiv:2010.09686), with a
mixture of constant bets (the default), online Newton step bets (``"ons"``)
or their hedged plug-in bets (``"plugin"``), on a grid of candidate means;
the formulas, the guarantee and what it needs: docs/statistics.md, "The
method" and "The guarantee, and what it is not".
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

#: Candidate means on the grid (odd: the middle of the range is a point).
GRID = 2001
#: The bets' cap ``c``: ``lambda+ <= c / m`` and ``lambda- <= c / (1 - m)``.
TRUNCATION = 0.5
#: The hedge between the two gamblers (``theta``).
THETA = 0.5
#: The online Newton step bets' prior ``A_0`` (``bets="ons"``).
ONS_PRIOR = 4.0
#: The online Newton step's step size, ``2 / (2 - log 3)``.
_ONS_STEP = 2.0 / (2.0 - math.log(3.0))
#: The mixture's constant bets (``bets="mixture"``): this many, evenly spread.
MIXTURE_BETS = 64
#: The mixture's cap ``c`` (its bets reach ``c / m`` and ``-c / (1 - m)``).
MIXTURE_TRUNCATION = 0.7
#: The kinds of bets (the first is the default).
BETS = ("mixture", "ons", "plugin")
#: Rows of (values x grid) worked on at once.
_ROWS = 256
#: The mixture's (values x candidates x bets) cells worked on at once.
_CELLS = 1 << 20


def _exp(x: float) -> float:
    """``exp(x)``, ``inf`` past the largest float."""
    return math.exp(x) if x < 709.0 else math.inf


def _check_alpha(alpha: Any) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.floating):
        raise TypeError(f"alpha={alpha!r}: expected a float in (0, 1), e.g. 0.05")
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(
            f"alpha={alpha!r}: expected a level strictly between 0 and 1, e.g. 0.05"
        )
    return float(alpha)


class BettingSequence:
    """An anytime-valid confidence sequence for the mean of values in
    ``[lo, hi]``, and the test of ``mean == null`` it gives.

    ``update`` with values (one by one or in batches: the same result), then
    read ``interval``, ``rejects`` and ``direction``.

    Args:
      lo, hi: the bounds of every value (``lo < hi``).
      alpha: the probability that the interval ever misses the true mean (and
        the test ever rejects a true null) is at most ``alpha``.
      null: the value tested (within ``(lo, hi)``).
      grid: candidate means (an odd int >= 3; the null is one); each value
        costs O(grid).
      truncation: the bets' cap ``c`` in (0, 1) (default 0.7 for the
        mixture, 0.5 for the others).
      bets: ``"mixture"`` (default), ``"ons"`` or ``"plugin"``.

    Attributes:
      n: values fed so far.
      decided_at: the number of values at which the null was first rejected,
        or None.
      direction: +1: rejected with the mean above the null (the upward bets
        won; ONS: the mean up to the rejection is above it), -1: below, 0: not
        rejected.

    Raises:
      ValueError, TypeError: bad bounds, level, null, grid or cap.
    """

    def __init__(
        self,
        lo: float,
        hi: float,
        *,
        alpha: float = 0.05,
        null: float = 0.0,
        grid: int = GRID,
        truncation: float | None = None,
        bets: str = "mixture",
    ):
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(
                f"bounds ({lo}, {hi}): expected finite lo < hi, the smallest and "
                "largest value a difference can take"
            )
        self.alpha = _check_alpha(alpha)
        self._threshold = math.log(1.0 / self.alpha)
        if not lo < float(null) < hi:
            raise ValueError(
                f"null={null!r}: expected a value strictly inside ({lo}, {hi})"
            )
        if type(grid) is not int or grid < 3 or grid % 2 == 0:
            raise ValueError(f"grid={grid!r}: expected an odd int >= 3, e.g. {GRID}")
        if bets not in BETS:
            raise ValueError(f"bets={bets!r}: expected one of {BETS}")
        if truncation is None:
            truncation = MIXTURE_TRUNCATION if bets == "mixture" else TRUNCATION
        if not 0.0 < truncation < 1.0:
            raise ValueError(f"truncation={truncation!r}: expected a cap in (0, 1)")
        self.bets = bets
        self.lo, self.hi, self.null = lo, hi, float(null)
        self.truncation = float(truncation)
        m0 = (self.null - lo) / (hi - lo)
        self.grid = points = np.union1d(np.linspace(0.0, 1.0, grid), [m0])
        self._null_at = int(np.searchsorted(points, m0))
        # log K+ and log K- per grid point (ONS: log K in both).
        self._log_plus = np.zeros(points.size)
        self._log_minus = np.zeros(points.size)
        # ONS: each grid point's next bet and ``A_t``.
        self._lam = np.zeros(points.size)
        self._ons_a = np.full(points.size, ONS_PRIOR)
        if bets == "mixture":  # the constant bets and each one's log capital
            self._mix_lam = _mixture_bets(points, self.truncation)
            self._log_mix = np.zeros(self._mix_lam.shape)
        self._excluded = np.zeros(points.size, bool)
        self.n = 0
        self._sum = 0.0  # sum of x
        self._squares = 0.0  # sum of (x_i - mu_i)^2
        self._total = 0.0  # sum of the values on their own scale
        self.decided_at: int | None = None
        self.direction = 0

    @property
    def mean(self) -> float:
        """The mean of the values fed so far (NaN for none)."""
        return self._total / self.n if self.n else math.nan

    @property
    def rejects(self) -> bool:
        """Whether the null's capital has reached ``1 / alpha`` (at any value
        so far): the null is rejected at level ``alpha``."""
        return self.decided_at is not None

    @property
    def interval(self) -> tuple[float, float]:
        """The open interval that holds the confidence set, on the values'
        scale: its ends are the nearest excluded grid points (or the bounds)."""
        kept = np.flatnonzero(~self._excluded)
        if kept.size:
            ends = [max(kept[0] - 1, 0), min(kept[-1] + 1, self.grid.size - 1)]
        else:  # every grid point excluded: the best-supported one
            ends = [np.argmin(self._hedged())] * 2
        low, high = self.lo + self.grid[ends] * (self.hi - self.lo)
        return float(low), float(high)

    def _hedged(self) -> np.ndarray:
        if self.bets == "mixture":
            return _log_mean(self._log_mix, axis=-1)
        if self.bets == "ons":
            return self._log_plus
        return np.maximum(
            math.log(THETA) + self._log_plus, math.log(1.0 - THETA) + self._log_minus
        )

    @property
    def log_capital(self) -> float:
        """The natural log of ``capital``."""
        return float(self._hedged()[self._null_at])

    @property
    def capital(self) -> float:
        """The null's capital (plug-in bets: ``max(theta K+, (1 - theta)
        K-)``); the test rejects once it reaches ``1 / alpha``; ``inf`` past
        the largest float (``log_capital`` keeps its size)."""
        return _exp(self.log_capital)

    @property
    def capitals(self) -> tuple[float, float]:
        """The null's ``(K+, K-)`` (mixture: the mean capital of its upward and
        of its downward bets; ONS: ``(K, K)``)."""
        k = self._null_at
        if self.bets == "mixture":
            half = self._log_mix.shape[1] // 2
            up, down = self._log_mix[k, half:], self._log_mix[k, :half]
            return _exp(float(_log_mean(up))), _exp(float(_log_mean(down)))
        return _exp(self._log_plus[k]), _exp(self._log_minus[k])

    def update(self, values: Any) -> None:
        """Bets on ``values`` one by one, in order.

        Raises:
          ValueError: a value outside ``[lo, hi]`` or not finite (nothing is
            fed then).
        """
        v = np.asarray(values, np.float64).reshape(-1)
        bad = np.flatnonzero(~np.isfinite(v) | (v < self.lo) | (v > self.hi))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"value {v[k]!r} (entry {k}) is outside the bounds [{self.lo}, "
                f"{self.hi}]: the test's guarantee needs every value within them; "
                "widen the bounds to what the metric can take"
            )
        if not v.size:
            return
        x = np.clip((v - self.lo) / (self.hi - self.lo), 0.0, 1.0)
        getattr(self, f"_update_{self.bets}")(x)
        self.n += int(x.size)
        self._sum += float(x.sum())
        self._total += float(v.sum())

    def _update_ons(self, x: np.ndarray) -> None:
        """Online Newton step bets on ``x`` (on [0, 1]), one value at a time."""
        m = self.grid
        high, down = self._caps()
        k = self._null_at
        log_k, lam, a = self._log_plus.copy(), self._lam.copy(), self._ons_a.copy()
        total = self._sum - self.n * float(m[k])  # sum of x_i - m at the null
        for t, xt in enumerate(x):
            y = xt - m
            factor = 1.0 + lam * y
            log_k += np.log(factor)
            z = y / factor
            a += z * z
            lam = np.clip(lam + _ONS_STEP * z / a, -down, high)
            self._excluded |= log_k >= self._threshold
            total += xt - float(m[k])
            if self.decided_at is None and log_k[k] >= self._threshold:
                self.decided_at = self.n + t + 1
                # the side of the mean so far (the bets followed it)
                self.direction = 1 if total > 0 or (total == 0 and lam[k] > 0) else -1
        self._log_plus = self._log_minus = log_k
        self._lam, self._ons_a = lam, a

    def _update_mixture(self, x: np.ndarray) -> None:
        """The mixture of constant bets on ``x``, on the kept candidates only
        (an excluded one stays excluded) and the null."""
        k = self._null_at
        done = 0
        while done < x.size:
            cols = np.flatnonzero(~self._excluded)
            at = int(np.searchsorted(cols, k))
            if self._excluded[k]:  # the null's capital is always kept up to date
                cols = np.insert(cols, at, k)
            lam, m = self._mix_lam[cols], self.grid[cols]
            rows = max(1, min(_ROWS, _CELLS // lam.size))
            xs = x[done : done + rows, None, None]
            steps = np.log1p(lam * (xs - m[:, None]))  # (rows, cols, bets)
            log_k = self._log_mix[cols] + np.cumsum(steps, axis=0)
            total = _log_mean(log_k, axis=-1)  # (rows, cols)
            crossed = total >= self._threshold
            self._excluded[cols] |= crossed.any(axis=0)
            if self.decided_at is None and crossed[:, at].any():
                row = int(np.argmax(crossed[:, at]))
                half = log_k.shape[-1] // 2
                up = _log_mean(log_k[row, at, half:])
                down = _log_mean(log_k[row, at, :half])
                self.decided_at = self.n + done + row + 1
                self.direction = 1 if up >= down else -1
            self._log_mix[cols] = log_k[-1]
            done += xs.shape[0]

    def _update_plugin(self, x: np.ndarray) -> None:
        """The hedged plug-in bets on ``x``: ``lambda_t`` (uncapped) from the
        running mean and the sum of squares ``S_t = sum (x_i - mu_i)^2``."""
        t = self.n + np.arange(1, x.size + 1, dtype=np.float64)
        mu = (0.5 + self._sum + np.cumsum(x)) / (t + 1.0)  # mu_t, with x_t
        squares = self._squares + np.cumsum((x - mu) ** 2)
        before = np.concatenate([[self._squares], squares[:-1]])
        sigma2 = (0.25 + before) / t  # sigma2_{t-1} = (1/4 + S_{t-1}) / t
        lam = np.sqrt(2.0 * math.log(2.0 / self.alpha) / (sigma2 * t * np.log1p(t)))
        m, k = self.grid, self._null_at
        cap_plus, cap_minus = self._caps()
        for start in range(0, x.size, _ROWS):
            xs, ls = x[start : start + _ROWS, None], lam[start : start + _ROWS, None]
            up = np.log1p(np.minimum(ls, cap_plus) * (xs - m))
            down = np.log1p(-np.minimum(ls, cap_minus) * (xs - m))
            plus = self._log_plus + np.cumsum(up, axis=0)
            minus = self._log_minus + np.cumsum(down, axis=0)
            hedged = np.maximum(math.log(THETA) + plus, math.log(1.0 - THETA) + minus)
            crossed = hedged >= self._threshold
            self._excluded |= crossed.any(axis=0)
            if self.decided_at is None and crossed[:, k].any():
                row = int(np.argmax(crossed[:, k]))
                up = math.log(THETA) + plus[row, k]  # the hedge's max: up or down
                self.decided_at = self.n + start + row + 1
                self.direction = 1 if hedged[row, k] == up else -1
            self._log_plus, self._log_minus = plus[-1], minus[-1]
        self._squares = float(squares[-1])

    def _caps(self) -> tuple[np.ndarray, np.ndarray]:
        """``c / m`` and ``c / (1 - m)`` per candidate (inf where m is 0 or 1)."""
        m, c = self.grid, self.truncation
        with np.errstate(divide="ignore"):
            return c / m, c / (1.0 - m)


def _mixture_bets(points: np.ndarray, c: float) -> np.ndarray:
    """The mixture's bets per candidate m (rows): the midpoints ``s_j`` of
    ``MIXTURE_BETS`` parts of [-1, 1] times ``c / m`` upwards, ``c / (1 - m)``
    downwards; at m = 0 or 1 the scale of the nearest candidate."""
    s = (np.arange(MIXTURE_BETS) + 0.5) / MIXTURE_BETS * 2.0 - 1.0
    below, above = points, 1.0 - points
    up = c / np.where(below > 0, below, below[below > 0].min())
    down = c / np.where(above > 0, above, above[above > 0].min())
    return np.where(s > 0, s * up[:, None], s * down[:, None])


def _log_mean(log_values: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log(mean(exp(log_values)))`` along ``axis``, without overflow."""
    top = np.max(log_values, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    total = np.sum(np.exp(log_values - top), axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):
        out = np.log(total) + top - math.log(log_values.shape[axis])
    return np.squeeze(out, axis=axis)


def fixed_sample_size(
    p_a: float, p_b: float, *, alpha: float = 0.05, power: float = 0.8
) -> int:
    """Episodes per arm of the fixed-size two-sided two-proportion z-test
    (pooled variance) that detects ``p_a`` vs ``p_b`` with probability
    ``power`` at level ``alpha`` (0.45 vs 0.70 at 0.05 and 80%: 61)::

        n = ceil((z_{1-alpha/2} sqrt(2 pbar qbar)
                  + z_power sqrt(pa qa + pb qb))^2 / (pa - pb)^2)

    Raises:
      ValueError: rates outside (0, 1), equal rates, or a bad level or power.
    """
    _check_alpha(alpha)
    if not (0.0 < p_a < 1.0 and 0.0 < p_b < 1.0) or p_a == p_b:
        raise ValueError(
            f"p_a={p_a}, p_b={p_b}: expected two different rates in (0, 1)"
        )
    if not 0.0 < power < 1.0:
        raise ValueError(f"power={power!r}: expected a probability in (0, 1), e.g. 0.8")
    normal = statistics.NormalDist()
    z_a, z_b = normal.inv_cdf(1.0 - alpha / 2.0), normal.inv_cdf(power)
    pbar = (p_a + p_b) / 2.0
    spread = z_a * math.sqrt(2.0 * pbar * (1.0 - pbar)) + z_b * math.sqrt(
        p_a * (1.0 - p_a) + p_b * (1.0 - p_b)
    )
    return math.ceil(spread**2 / (p_a - p_b) ** 2)
