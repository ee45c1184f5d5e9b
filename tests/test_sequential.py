"""The anytime-valid betting test (jaxmesh.results.sequential): values worked
out by hand, plain-loop references of the capital (mixture of constant bets,
online Newton step and plug-in bets), validity under peeking by simulation
(with a peeked z-test as the control that fails), and power."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from jaxmesh.results.sequential import (
    MIXTURE_BETS,
    ONS_PRIOR,
    BettingSequence,
    fixed_sample_size,
)

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


def reference_ons(x, m, c=0.5, prior=ONS_PRIOR):
    """K at candidate m of values x on [0, 1], one plain loop over the online
    Newton step bets (Cutkosky and Orabona 2018; Shekhar and Ramdas)."""
    capital, lam, a = 1.0, 0.0, prior
    step = 2 / (2 - math.log(3))
    for xt in x:
        y = xt - m
        capital *= 1 + lam * y
        z = y / (1 + lam * y)
        a += z * z
        low = -c / (1 - m) if m < 1 else -math.inf
        high = c / m if m > 0 else math.inf
        lam = min(max(lam + step * z / a, low), high)
    return capital


def reference_mixture(x, m, c=0.7, bets=MIXTURE_BETS):
    """K at candidate m of values x on [0, 1]: the mean over the constant bets
    s c / m (s > 0) and s c / (1 - m) (s < 0), s the midpoints of ``bets``
    equal parts of [-1, 1], of each bet's capital, one plain loop each."""
    total = 0.0
    for j in range(bets):
        s = -1 + (2 * j + 1) / bets
        lam = s * c / m if s > 0 else s * c / (1 - m)
        capital = 1.0
        for xt in x:
            capital *= 1 + lam * (xt - m)
        total += capital
    return total / bets


def test_mixture_capital_after_three_values_by_hand():
    # Differences 1, -1, 1 on [-1, 1]: x - m = 1/2, -1/2, 1/2 at m = 1/2. A
    # constant bet lambda = 1.4 s (c / m = 0.7 / 0.5) multiplies the capital by
    # (1 + u)^2 (1 - u) = 1 + u - u^2 - u^3, u = 0.7 s. Over the 64 midpoints
    # s_j the odd powers cancel and the mean of s^2 is 1/3 - 1/(3 * 64^2):
    # K = 1 - 0.49 (1/3 - 1/12288) = 0.836706543.
    seq = BettingSequence(-1.0, 1.0, alpha=ALPHA)
    assert seq.bets == "mixture"
    seq.update([1, -1, 1])
    assert seq.capital == pytest.approx(1 - 0.49 * (1 / 3 - 1 / 12288), rel=1e-12)
    assert seq.capital == pytest.approx(0.836706543, abs=1e-9)
    # the upward half (s > 0) and the downward half: the means over s of
    # 1 + u - u^2 - u^3 with u > 0 and u < 0; they average to K
    up, down = seq.capitals
    assert (up + down) / 2 == pytest.approx(seq.capital, rel=1e-12)
    assert up > 1 > down
    assert not seq.rejects and seq.direction == 0
    # A pair that agrees (difference 0, x = m) changes no capital.
    seq.update([0, 0, 0])
    assert seq.capital == pytest.approx(0.836706543, abs=1e-9) and seq.n == 6


def whole_and_pieces(x, reference, splits, bets):
    """``bets``' capital on ``x`` (values on [0, 1], null 0.3) fed at once and
    in pieces: both ``reference``'s plain loop, both deciding at its first
    crossing of 1 / alpha, with the mean above the null."""
    ref = reference(x, 0.3)
    whole = BettingSequence(0.0, 1.0, null=0.3, grid=3, bets=bets)
    whole.update(x)
    assert whole.capital == pytest.approx(ref, rel=1e-9)
    pieces = BettingSequence(0.0, 1.0, null=0.3, grid=3, bets=bets)
    for part in np.split(x, splits):
        pieces.update(part)
    assert pieces.capital == pytest.approx(ref, rel=1e-9)
    n = len(x)
    first = next(t for t in range(1, n + 1) if reference(x[:t], 0.3) >= 1 / ALPHA)
    assert whole.decided_at == pieces.decided_at == first
    assert whole.direction == 1


def test_mixture_capital_equals_a_plain_loop_and_batches_do_not_matter():
    rng = np.random.default_rng(3)
    x = rng.beta(2.0, 3.0, size=120)  # mean 0.4
    whole_and_pieces(x, reference_mixture, [1, 2, 10, 45, 100], "mixture")
    # on a grid, each kept candidate's capital is the same loop's
    full = BettingSequence(0.0, 1.0, null=0.3, grid=11)
    full.update(x[:20])
    for m, log_k, out in zip(full.grid, full._hedged(), full._excluded, strict=True):
        if not out and 0 < m < 1:
            assert math.exp(log_k) == pytest.approx(
                reference_mixture(x[:20], m), rel=1e-9
            )


def test_ons_capital_after_three_values_by_hand():
    # Differences 1, -1, 1 on [-1, 1]: x = 1, 0, 1 around m = 1/2, so
    # y = x - m = 1/2, -1/2, 1/2; step k = 2 / (2 - ln 3) = 2.21880, A_0 = 4.
    # t=1: lambda_1 = 0, factor 1; z = 1/2, A = 4.25,
    #      lambda_2 = k * 0.5 / 4.25 = 0.261035.
    # t=2: factor 1 - lambda_2 / 2 = 0.869482; z = -0.5 / 0.869482 = -0.575055,
    #      A = 4.25 + 0.330688 = 4.580688, lambda_3 = 0.261035 - k * 0.575055
    #      / 4.580688 = -0.017511.
    # t=3: factor 1 + lambda_3 / 2 = 0.991244: K = 0.869482 * 0.991244 = 0.861869.
    k = 2 / (2 - math.log(3))
    lam2 = k * 0.5 / 4.25
    f2 = 1 - lam2 / 2
    lam3 = lam2 + k * (-0.5 / f2) / (4.25 + (0.5 / f2) ** 2)
    assert (lam2, lam3) == pytest.approx((0.261035, -0.017511), abs=1e-6)
    seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, bets="ons")
    seq.update([1, -1, 1])
    assert seq.capital == pytest.approx(f2 * (1 + lam3 / 2), rel=1e-12)
    assert seq.capital == pytest.approx(0.861869, abs=1e-6)
    assert seq.capitals == (seq.capital, seq.capital)  # one gambler
    assert not seq.rejects and seq.direction == 0
    # The cap: values on [0, 1], null 0.1, values 1 then 1: lambda_2 = k * 0.9
    # / (4 + 0.81) = 0.415 is within [-0.5 / 0.9, 0.5 / 0.1] = [-0.556, 5].
    seq = BettingSequence(0.0, 1.0, null=0.1, bets="ons")
    seq.update([1.0, 1.0])
    assert seq.capital == pytest.approx(1 + k * 0.9 / 4.81 * 0.9, rel=1e-12)


def test_ons_capital_equals_a_plain_loop_and_batches_do_not_matter():
    rng = np.random.default_rng(3)
    x = rng.beta(2.0, 3.0, size=300)  # mean 0.4
    whole_and_pieces(x, reference_ons, [1, 2, 10, 45, 200], "ons")
    # on the full grid, each candidate's capital is the same loop's
    full = BettingSequence(0.0, 1.0, null=0.3, grid=11, bets="ons")
    full.update(x)
    for m, log_k in zip(full.grid, full._hedged(), strict=True):
        assert math.exp(log_k) == pytest.approx(reference_ons(x, m), rel=1e-9)


def test_capital_after_three_values_by_hand():
    # Differences 1, -1, 1 on [-1, 1]: x = 1, 0, 1 around m = 1/2. The
    # plug-in bets are 6.53, 4.63, 3.08 (sqrt(2 ln 40 / (sigma2 t ln(1+t))),
    # sigma2 = 1/4, 5/32, 3/16), all capped at c / m = 0.5 / 0.5 = 1:
    # K+ = 1.5 * 0.5 * 1.5 = 1.125, K- = 0.5 * 1.5 * 0.5 = 0.375.
    seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, bets="plugin")
    seq.update([1, -1, 1])
    assert seq.capitals == pytest.approx((1.125, 0.375), rel=1e-12)
    assert seq.capital == pytest.approx(0.5 * 1.125, rel=1e-12)
    assert seq.n == 3 and seq.mean == pytest.approx(1 / 3)
    assert not seq.rejects and seq.direction == 0
    # An uncapped side: values on [0, 1], null 0.1, one value 0.2. The bet
    # 6.53 is capped at 0.5 / 0.1 = 5 upwards and 0.5 / 0.9 downwards:
    # K+ = 1 + 5 * 0.1 = 1.5, K- = 1 - (5 / 9) * 0.1.
    seq = BettingSequence(0.0, 1.0, null=0.1, bets="plugin")
    seq.update([0.2])
    assert seq.capitals == pytest.approx((1.5, 1 - 0.5 / 0.9 * 0.1), rel=1e-12)


def test_capital_equals_a_plain_loop_and_batches_do_not_matter():
    rng = np.random.default_rng(3)
    x = rng.beta(2.0, 3.0, size=300)  # mean 0.4
    ref = reference_capitals(x, 0.3)
    whole = BettingSequence(0.0, 1.0, null=0.3, grid=3, bets="plugin")
    whole.update(x)
    assert whole.capitals == pytest.approx(ref, rel=1e-9)
    pieces = BettingSequence(0.0, 1.0, null=0.3, grid=3, bets="plugin")
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
    with pytest.raises(ValueError, match="bets"):
        BettingSequence(0.0, 1.0, null=0.5, bets="kelly")


@pytest.mark.parametrize("bets", ["mixture", "ons", "plugin"])
def test_interval_excludes_the_null_exactly_when_it_is_rejected(bets):
    rng = np.random.default_rng(5)
    for gap in (0.0, 0.1, 0.3):
        seq = BettingSequence(-1.0, 1.0, bets=bets)
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


@pytest.mark.parametrize(
    "bets",
    ["mixture", "ons", pytest.param("plugin", marks=pytest.mark.slow)],
)
def test_false_decisions_under_the_null_stay_within_alpha_and_a_peeked_z_test_fails(
    bets,
):
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
        seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, grid=3, bets=bets)
        for k in range(batches):
            seq.update(d[k * BATCH : (k + 1) * BATCH])
            if seq.rejects:
                break
        wrong += seq.rejects
        z_wrong += peeked_z_test(d, BATCH, ALPHA)
    print(
        f"false decisions: betting ({bets}) {wrong}/{runs}, peeked z-test "
        f"{z_wrong}/{runs}"
    )
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


def test_mixture_and_ons_decide_045_against_070_sooner_than_plug_in_bets():
    # The same simulated streams, fed in batches of 8 pairs to each kind.
    runs = 200
    rng = np.random.default_rng(13)
    mean = {}
    streams = [
        (rng.random(800) < 0.70).astype(int) - (rng.random(800) < 0.45).astype(int)
        for _ in range(runs)
    ]
    for bets in ("mixture", "ons", "plugin"):
        episodes = []
        for d in streams:
            seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, grid=3, bets=bets)
            while not seq.rejects and seq.n < d.size:
                seq.update(d[seq.n : seq.n + BATCH])
            assert seq.rejects and seq.direction == 1
            episodes.append(seq.n)
        mean[bets] = float(np.mean(episodes))
    print(f"0.45 vs 0.70, mean episodes per arm: {mean}")
    assert mean["ons"] < mean["plugin"] and mean["mixture"] < mean["plugin"]


def test_a_capital_past_the_largest_float_is_inf_not_an_error():
    seq = BettingSequence(-1.0, 1.0, bets="plugin")
    # Every value 1 (x = 1 against m = 1/2): sigma2_{t-1} stays near 0.4 / t,
    # so the plug-in bet sqrt(2 ln 40 / (sigma2 t ln(1 + t))) stays above its
    # cap 1 and each factor is 1.5: log K+ = 3000 ln 1.5, far past a float.
    seq.update(np.ones(3000))
    assert seq.log_capital == pytest.approx(math.log(0.5) + 3000 * math.log(1.5))
    assert seq.capital == math.inf and seq.capitals[0] == math.inf
    assert seq.rejects and seq.direction == 1 and seq.decided_at == 10
    # ONS bets: the bet climbs to its cap 1 (factor 1.5) and stays there
    seq = BettingSequence(-1.0, 1.0, bets="ons")
    seq.update(np.ones(3000))
    assert seq.capital == math.inf and seq.log_capital > 2900 * math.log(1.5)
    assert seq.rejects and seq.direction == 1
    # The mixture: after t values 1, K is the mean over s of (1 + 0.7 s)^t,
    # close to the integral (1.7^(t+1) - 0.3^(t+1)) / (1.4 (t + 1)): 14.4 at
    # t = 9, 22.2 at t = 10, so it reaches 1 / 0.05 = 20 at the tenth value.
    # After 3000, its largest bet (s = 63/64) holds all but e^-39 of it:
    # log K = 3000 log(1 + 0.7 * 63/64) - log 64.
    seq = BettingSequence(-1.0, 1.0)
    seq.update(np.ones(3000))
    assert seq.capital == math.inf
    assert seq.log_capital == pytest.approx(
        3000 * math.log(1 + 0.7 * 63 / 64) - math.log(64), rel=1e-12
    )
    assert seq.rejects and seq.direction == 1 and seq.decided_at == 10
