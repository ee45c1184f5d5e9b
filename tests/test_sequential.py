"""The anytime-valid betting test (jaxmesh.results.sequential): values worked
out by hand, a plain-loop reference of the capital, validity under peeking by
simulation (with a peeked z-test as the control that fails), and power."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from jaxmesh.results.sequential import BettingSequence, fixed_sample_size

ALPHA = 0.05
BATCH = 8


def binomial_upper(n: int, p: float, q: float = 0.999) -> int:
    """The smallest k with P(Binomial(n, p) <= k) >= q (summed exactly)."""
    total = 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if total >= q:
            return k
    return n


def reference_capitals(x, m, alpha=ALPHA, c=0.5):
    """K+ and K- at candidate m of values x on [0, 1], one plain loop over the
    paper's formulas (Waudby-Smith and Ramdas 2024, hedged capital, PrPl bets)."""
    k_plus = k_minus = 1.0
    total = squares = 0.0
    for t, xt in enumerate(x, start=1):
        sigma2 = (0.25 + squares) / t  # sigma^2_{t-1}
        lam = math.sqrt(2 * math.log(2 / alpha) / (sigma2 * t * math.log(1 + t)))
        lam_plus = min(lam, c / m) if m > 0 else lam
        lam_minus = min(lam, c / (1 - m)) if m < 1 else lam
        k_plus *= 1 + lam_plus * (xt - m)
        k_minus *= 1 - lam_minus * (xt - m)
        total += xt
        mu = (0.5 + total) / (t + 1)  # mu_t, with x_t
        squares += (xt - mu) ** 2
    return k_plus, k_minus


def test_capital_after_three_values_by_hand():
    # Differences 1, -1, 1 on [-1, 1]: x = 1, 0, 1 around m = 1/2. The
    # plug-in bets are 6.53, 4.63, 3.08 (sqrt(2 ln 40 / (sigma2 t ln(1+t))),
    # sigma2 = 1/4, 5/32, 3/16), all capped at c / m = 0.5 / 0.5 = 1:
    # K+ = 1.5 * 0.5 * 1.5 = 1.125, K- = 0.5 * 1.5 * 0.5 = 0.375.
    seq = BettingSequence(-1.0, 1.0, alpha=ALPHA)
    seq.update([1, -1, 1])
    assert seq.capitals == pytest.approx((1.125, 0.375), rel=1e-12)
    assert seq.capital == pytest.approx(0.5 * 1.125, rel=1e-12)
    assert seq.n == 3 and seq.mean == pytest.approx(1 / 3)
    assert not seq.rejects and seq.direction == 0
    # An uncapped side: values on [0, 1], null 0.1, one value 0.2. The bet
    # 6.53 is capped at 0.5 / 0.1 = 5 upwards and 0.5 / 0.9 downwards:
    # K+ = 1 + 5 * 0.1 = 1.5, K- = 1 - (5 / 9) * 0.1.
    seq = BettingSequence(0.0, 1.0, null=0.1)
    seq.update([0.2])
    assert seq.capitals == pytest.approx((1.5, 1 - 0.5 / 0.9 * 0.1), rel=1e-12)


def test_capital_equals_a_plain_loop_and_batches_do_not_matter():
    rng = np.random.default_rng(3)
    x = rng.beta(2.0, 3.0, size=300)  # mean 0.4
    ref = reference_capitals(x, 0.3)
    whole = BettingSequence(0.0, 1.0, null=0.3, grid=3)
    whole.update(x)
    assert whole.capitals == pytest.approx(ref, rel=1e-9)
    pieces = BettingSequence(0.0, 1.0, null=0.3, grid=3)
    for part in np.split(x, [1, 2, 10, 45, 200]):
        pieces.update(part)
    assert pieces.capitals == pytest.approx(ref, rel=1e-9)
    assert pieces.decided_at == whole.decided_at
    # rejected (the mean is 0.4) upwards, at the first value whose capital
    # reached 1 / alpha in the reference
    first = next(
        t
        for t in range(1, 301)
        if max(0.5 * v for v in reference_capitals(x[:t], 0.3)) >= 1 / ALPHA
    )
    assert whole.decided_at == first and whole.direction == 1


def test_bad_values_and_settings_are_refused():
    seq = BettingSequence(-1.0, 1.0)
    with pytest.raises(ValueError, match=r"outside the bounds \[-1.0, 1.0\]"):
        seq.update([0.5, 1.5])
    with pytest.raises(ValueError, match="outside the bounds"):
        seq.update([np.nan])
    assert seq.n == 0  # nothing fed
    with pytest.raises(ValueError, match="lo < hi"):
        BettingSequence(1.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        BettingSequence(0.0, 1.0, alpha=1.5)
    with pytest.raises(ValueError, match="null"):
        BettingSequence(0.0, 1.0, null=1.0)
    with pytest.raises(ValueError, match="grid"):
        BettingSequence(0.0, 1.0, null=0.5, grid=10)


def test_interval_excludes_the_null_exactly_when_it_is_rejected():
    rng = np.random.default_rng(5)
    for gap in (0.0, 0.1, 0.3):
        seq = BettingSequence(-1.0, 1.0)
        assert seq.interval == (-1.0, 1.0)
        lows = []
        for _ in range(60):
            a = rng.random(BATCH) < 0.5
            b = rng.random(BATCH) < 0.5 + gap
            seq.update(b.astype(int) - a.astype(int))
            low, high = seq.interval
            assert low < high
            # an open interval: the null is out iff it is rejected
            assert (low >= 0.0 or high <= 0.0) == seq.rejects
            lows.append(low)
        # a running intersection: the lower end never falls
        assert lows == sorted(lows)
    assert seq.rejects and seq.direction == 1 and seq.interval[0] >= 0.0


def peeked_z_test(d: np.ndarray, batch: int, alpha: float) -> bool:
    """A two-sided z-test of the mean difference, looked at after each batch."""
    z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
    for n in range(batch, d.size + 1, batch):
        x = d[:n]
        sd = x.std(ddof=1)
        if sd > 0 and abs(x.mean()) / (sd / math.sqrt(n)) >= z:
            return True
    return False


def test_false_decisions_under_the_null_stay_within_alpha_and_a_peeked_z_test_fails():
    # Equal success rates, independent arms, one-step Bernoulli episodes:
    # differences in {-1, 0, 1}, looked at after every batch of 8 pairs.
    runs, batches = 400, 100
    upper = binomial_upper(runs, ALPHA)  # 99.9% of Binomial(400, 0.05)
    rng = np.random.default_rng(11)
    wrong = z_wrong = 0
    for r in range(runs):
        p = (0.2, 0.5, 0.8)[r % 3]
        d = (rng.random(BATCH * batches) < p).astype(int) - (
            rng.random(BATCH * batches) < p
        ).astype(int)
        seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, grid=3)
        for k in range(batches):
            seq.update(d[k * BATCH : (k + 1) * BATCH])
            if seq.rejects:
                break
        wrong += seq.rejects
        z_wrong += peeked_z_test(d, BATCH, ALPHA)
    print(f"false decisions: betting {wrong}/{runs}, peeked z-test {z_wrong}/{runs}")
    assert wrong <= upper
    # the control: peeking at a fixed-sample test breaks its level
    assert z_wrong > upper
    assert z_wrong / runs > 2 * ALPHA


def test_fixed_sample_size_by_hand():
    # pbar = 0.575: (1.95996 sqrt(0.48875) + 0.84162 sqrt(0.4575))^2 / 0.0625
    # = 1.93951^2 / 0.0625 = 60.19 -> 61
    assert fixed_sample_size(0.45, 0.70) == 61
    assert fixed_sample_size(0.70, 0.45) == 61
    with pytest.raises(ValueError, match="two different rates"):
        fixed_sample_size(0.5, 0.5)


def test_power_045_against_070():
    # Peeked after every batch of 8 pairs: how many episodes per arm it takes.
    runs = 200
    rng = np.random.default_rng(7)
    episodes, right = [], 0
    for _ in range(runs):
        seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, grid=3)
        while not seq.rejects and seq.n < 2000:
            a = rng.random(BATCH) < 0.45
            b = rng.random(BATCH) < 0.70
            seq.update(b.astype(int) - a.astype(int))
        right += seq.rejects and seq.direction == 1
        episodes.append(seq.n)
    mean = float(np.mean(episodes))
    fixed = fixed_sample_size(0.45, 0.70)
    print(
        f"0.45 vs 0.70: {mean:.1f} episodes per arm on average ({mean / fixed:.2f}x "
        f"the fixed-size test's {fixed}), median {np.median(episodes):.0f}"
    )
    assert right == runs  # every run decided, for B
    assert mean < 1.6 * fixed


def test_a_capital_past_the_largest_float_is_inf_not_an_error():
    seq = BettingSequence(-1.0, 1.0)
    # Every value 1 (x = 1 against m = 1/2): sigma2_{t-1} stays near 0.4 / t,
    # so the plug-in bet sqrt(2 ln 40 / (sigma2 t ln(1 + t))) stays above its
    # cap 1 and each factor is 1.5: log K+ = 3000 ln 1.5, far past a float.
    seq.update(np.ones(3000))
    assert seq.log_capital == pytest.approx(math.log(0.5) + 3000 * math.log(1.5))
    assert seq.capital == math.inf and seq.capitals[0] == math.inf
    assert seq.rejects and seq.direction == 1 and seq.decided_at == 10
