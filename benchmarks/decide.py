"""Episodes to a decision, and decide's cost per batch on CartPole.

1. **Episodes per arm** (simulation, no env): two policies with success rates
   p_a and p_b, independent one-step Bernoulli episodes, the differences fed to
   the betting test of ``jaxmesh.decide`` (``BettingSequence``, alpha 0.05) in
   decide's schedule (a first batch of 8, then an eighth of the episodes so
   far: ``jaxmesh.decide.next_batch``, capped at 128). Per pair of rates and
   kind of bets (``--bets``: the mixture of constant bets, the default;
   online Newton steps; plug-in), on the same simulated streams: the mean and
   median episodes per arm at the stop (whole batches), the same with batches
   of a quarter of the episodes so far (the batch overshoot), the mean at the
   crossing itself (``decided_at``: what a batch of 1 would give), the share
   decided for B within 10,000, and the fixed-size two-proportion test's n for
   80% power at the same alpha. Goal: the mean at the stop is at most 1.0x the
   fixed n for 0.45 vs 0.70 (61). A null row (0.5 / 0.5) per kind gives the
   false-decision rate.

   The bound: an oracle that knows p_a and p_b bets the Kelly fraction
   ``lambda* = (P(+1) - P(-1)) / (P(+1) + P(-1))`` on each difference (a
   constant bet, one-sided: ``prod (1 + lambda* d_i)``) and is simulated on
   the same streams; and no test of level alpha that decides with probability
   1 can need fewer than ``log(1 / alpha) / KL`` pairs on average (Wald's
   identity and the data-processing inequality), ``KL = sup_lambda E log(1 +
   lambda d)``, the divergence of the alternative from the nearest
   distribution of differences with mean 0. Other e-processes on the same
   streams (``other_bets``): a Krichevsky-Trofimov mixture, aGRAPA bets, and
   the one-sided test "B is better" (what naming either side costs); and the
   default test's exact level on differences in {-1, 0, 1} (``exact_level``).
2. **CartPole**: ``jaxmesh.decide`` of "push left" against "push the way the
   pole leans" on gymnax CartPole-v1 (bounds 0..500): batches and episodes to
   stop, then, warm (programs compiled by a first call), decide's wall time
   against one ``evaluate`` per policy of the same total episodes; the
   difference over the batches is the overhead a batch costs.
3. **Worker processes**: the same two policies on gymnasium's CartPole-v1 with
   ``workers=2``: decide (its worker processes start once) against the same
   batches run as ``evaluate`` calls, each starting its own processes.

Run: ``python benchmarks/decide.py [--quick] [--runs R] [--lanes N]
[--bets mixture,ons,plugin] [--seed S] [--no-cartpole]``
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

ALPHA = 0.05
RATES = ((0.45, 0.70), (0.5, 0.6), (0.8, 0.9))
FIRST, CAP, MAX = 8, 128, 10_000
#: Episodes per arm of each null run (equal rates: the false-decision rate).
NULL_MAX = 2_000
#: Pairs fed to the test at once (it bets on them one by one).
CHUNK = 64


def batch_ends(growth: float | None, most: int) -> np.ndarray:
    """The episode counts at which decide's batches end: its own schedule
    (``next_batch``), or each batch ``growth`` of the episodes so far."""
    from jaxmesh.decide import next_batch

    ends, n = [], 0
    while n < most:
        if growth is None:
            k = next_batch(n, FIRST, CAP)
        else:
            k = min(max(FIRST, math.ceil(growth * n / FIRST) * FIRST), CAP)
        n = min(n + k, most)
        ends.append(n)
    return np.array(ends)


def streams(p_a: float, p_b: float, runs: int, most: int, seed: int):
    """Each run's differences b - a of independent Bernoulli episodes."""
    for r in range(runs):
        rng = np.random.default_rng([seed, r])
        a = rng.random(most) < p_a
        b = rng.random(most) < p_b
        yield b.astype(np.int8) - a.astype(np.int8)


def kelly(p_a: float, p_b: float) -> tuple[float, float]:
    """The oracle's bet ``lambda*`` on a difference and its growth per pair,
    ``KL = sup_lambda E log(1 + lambda d)`` (nats)."""
    up, down = p_b * (1 - p_a), p_a * (1 - p_b)
    lam = (up - down) / (up + down)
    return lam, up * math.log1p(lam) + down * math.log1p(-lam)


def episodes_to_decide(
    p_a: float,
    p_b: float,
    runs: int,
    seed: int = 0,
    kinds: tuple[str, ...] = ("mixture",),
    most: int = MAX,
) -> dict:
    """Per kind of bets (and ``"oracle"``): the crossings (pairs at which the
    test first rejected; ``most + 1`` when it did not) and the directions."""
    from jaxmesh.results.sequential import BettingSequence

    lam, _ = kelly(p_a, p_b) if p_a != p_b else (0.0, 0.0)
    threshold = math.log(1 / ALPHA)
    out = {k: ([], []) for k in (*kinds, "oracle")}
    others: dict[str, list[int]] = {}
    for d in streams(p_a, p_b, runs, most, seed):
        if p_a != p_b:
            for name, at in other_bets(d, most).items():
                others.setdefault(name, []).append(at)
        for bets in kinds:
            seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, grid=3, bets=bets)
            while seq.n < most and not seq.rejects:
                seq.update(d[seq.n : seq.n + CHUNK])
            out[bets][0].append(seq.decided_at or most + 1)
            out[bets][1].append(seq.direction)
        wealth = np.cumsum(np.log1p(lam * d))
        hit = np.flatnonzero(wealth >= threshold)
        out["oracle"][0].append(int(hit[0]) + 1 if hit.size else most + 1)
        out["oracle"][1].append(1 if hit.size else 0)
    result = {k: (np.array(c), np.array(s)) for k, (c, s) in out.items()}
    result["others"] = {k: np.array(v) for k, v in others.items()}
    return result


def first_at(log_wealth: np.ndarray, most: int) -> int:
    """The first pair (1-based) at which ``log_wealth`` reaches log(1/alpha)."""
    hit = np.flatnonzero(log_wealth >= math.log(1 / ALPHA))
    return int(hit[0]) + 1 if hit.size else most + 1


def betaln(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log B(a, b), elementwise (``math.lgamma``: no SciPy)."""
    lgamma = np.vectorize(math.lgamma, otypes=[float])
    return lgamma(a) + lgamma(b) - lgamma(np.add(a, b))


def other_bets(d: np.ndarray, most: int) -> dict[str, int]:
    """The pair at which other e-processes on the same differences (in
    {-1, 0, 1}) decide: a Krichevsky-Trofimov mixture (Beta(1/2, 1/2) prior
    on the coin's bias, over the discordant pairs), aGRAPA bets
    (``lambda_t = clip(mu / (sigma2 + mu^2), -1/2, 1/2)`` from the mean and
    second moment of the earlier differences, each shrunk by one prior
    value), and the one-sided test "B is better": the default mixture's
    upward half alone (its 32 bets ``0.7 s_j``, ``s_j > 0``)."""
    from jaxmesh.results.sequential import MIXTURE_BETS, MIXTURE_TRUNCATION

    heads = np.cumsum(d == 1)
    tails = np.cumsum(d == -1)
    kt = (heads + tails) * math.log(2) + betaln(heads + 0.5, tails + 0.5)
    kt -= betaln(0.5, 0.5)
    s = (np.arange(MIXTURE_BETS) + 0.5) / MIXTURE_BETS * 2 - 1
    lam = MIXTURE_TRUNCATION * s[s > 0]
    each = heads[:, None] * np.log1p(lam) + tails[:, None] * np.log1p(-lam)
    top = each.max(axis=1)
    up = top + np.log(np.exp(each - top[:, None]).mean(axis=1))
    wealth, total, squares, grapa = 0.0, 0.0, 0.0, most + 1
    threshold = math.log(1 / ALPHA)
    for t, v in enumerate(d.tolist()):
        mu, var = total / (t + 1), (squares + 0.25) / (t + 1)
        bet = min(max(mu / (var + mu * mu), -0.5), 0.5)
        wealth += math.log1p(bet * v)
        total, squares = total + v, squares + v * v
        if wealth >= threshold:
            grapa = t + 1
            break
    return {
        "Krichevsky-Trofimov": first_at(kt, most),
        "aGRAPA": grapa,
        "one-sided mixture": first_at(up, most),
    }


def exact_level(pairs: int = 2000) -> tuple[float, float]:
    """The default test's exact chance of ever rejecting "equal means" on
    differences in {-1, 0, 1}: under the null the signs of the discordant
    pairs are fair coins, and the mixture's capital depends only on the counts
    of each sign, so the chance of reaching 1/alpha within ``pairs``
    discordant pairs is summed exactly over the counts; past them, Ville's
    inequality from each count's capital bounds the rest. Returns (within
    ``pairs``, an upper bound on ever)."""
    from jaxmesh.results.sequential import MIXTURE_BETS, MIXTURE_TRUNCATION

    s = (np.arange(MIXTURE_BETS) + 0.5) / MIXTURE_BETS * 2 - 1
    up, down = np.log1p(MIXTURE_TRUNCATION * s), np.log1p(-MIXTURE_TRUNCATION * s)
    threshold = math.log(1 / ALPHA)
    alive, rejected = np.array([1.0]), 0.0
    for n in range(1, pairs + 1):
        alive = np.concatenate([alive, [0.0]]) / 2 + np.concatenate([[0.0], alive]) / 2
        heads = np.arange(n + 1)[:, None]
        each = heads * up + (n - heads) * down
        top = each.max(axis=1)
        log_k = top + np.log(np.exp(each - top[:, None]).mean(axis=1))
        hit = log_k >= threshold
        rejected += alive[hit].sum()
        alive[hit] = 0.0
    tail = alive * np.exp(np.minimum(log_k - threshold, 0.0))
    return rejected, rejected + float(tail.sum())


def stops(crossing: np.ndarray, ends: np.ndarray, most: int) -> np.ndarray:
    """Episodes run per arm: the end of the batch that holds the crossing."""
    at = np.searchsorted(ends, np.minimum(crossing, most))
    return ends[np.minimum(at, ends.size - 1)]


def table(runs: int, kinds: list[str], seed: int = 0) -> None:
    from jaxmesh.results.sequential import fixed_sample_size

    print(f"## Episodes per arm to a decision (alpha {ALPHA}, {runs} runs each)\n")
    null = episodes_to_decide(
        0.5, 0.5, runs, seed=seed + 1, kinds=tuple(kinds), most=NULL_MAX
    )
    for bets in kinds:
        wrong = float(np.mean(null[bets][0] <= NULL_MAX))
        print(
            f"- 0.5 / 0.5, {bets}: false decisions within {NULL_MAX:,} "
            f"pairs {wrong:.1%}"
        )
    within, ever = exact_level()
    print(
        f"- the mixture's exact level on differences in {{-1, 0, 1}}: {within:.2%} "
        f"within 2,000 discordant pairs, at most {ever:.2%} ever (alpha {ALPHA})"
    )
    print(
        "\n| p_a / p_b | bets | fixed n (80% power) | decide: mean (median) at "
        "the stop | ratio | 80% of runs decided by | batches of a quarter: mean "
        "| mean at the crossing | ratio | decided for B |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ends, quarter = batch_ends(None, MAX), batch_ends(0.25, MAX)
    results, other_rows = [], []
    for p_a, p_b in RATES:
        n = fixed_sample_size(p_a, p_b, alpha=ALPHA, power=0.8)
        r = episodes_to_decide(p_a, p_b, runs, seed=seed, kinds=tuple(kinds))
        lam, kl = kelly(p_a, p_b)
        bound = math.log(1 / ALPHA) / kl
        for bets in (*kinds, "oracle"):
            crossing, side = r[bets]
            stop = stops(crossing, ends, MAX)
            old = stops(crossing, quarter, MAX)
            name = bets if bets != "oracle" else f"oracle Kelly ({lam:.3f})"
            print(
                f"| {p_a} / {p_b} | {name} | {n} | {stop.mean():.0f} "
                f"({np.median(stop):.0f}) | {stop.mean() / n:.2f}x | "
                f"{np.percentile(stop, 80):.0f} | {old.mean():.0f} "
                f"({old.mean() / n:.2f}x) | {crossing.mean():.0f} | "
                f"{crossing.mean() / n:.2f}x | {np.mean(side == 1):.1%} |"
            )
        print(
            f"| {p_a} / {p_b} | bound log(1/alpha) / KL (KL {kl:.4f}) | {n} | | | | "
            f"| {bound:.1f} | {bound / n:.2f}x | |"
        )
        results.append((p_a, p_b, n, stops(r[kinds[0]][0], ends, MAX).mean()))
        other_rows.append(
            f"| {p_a} / {p_b} | {n} | "
            + " | ".join(
                f"{c.mean():.0f} ({c.mean() / n:.2f}x)" for c in r["others"].values()
            )
            + " |"
        )
    names = list(r["others"])
    print("\nOther e-processes on the same streams: the mean pair at the decision\n")
    print(f"| p_a / p_b | fixed n | {' | '.join(names)} |")
    print("|---|---|" + "---|" * len(names))
    print("\n".join(other_rows))
    print()
    for p_a, p_b, n, mean in results:
        print(
            f"result: {p_a} vs {p_b} ({kinds[0]} bets): decide stops after "
            f"{mean:.0f} episodes per arm on average ({mean / n:.2f}x the fixed "
            f"test's {n})"
        )
    mean = results[0][3]
    goal = "met" if mean <= results[0][2] else "MISSED"
    print(f"goal: 0.45 vs 0.70, mean episodes per arm <= 1.0x the fixed n -> {goal}")


def cartpole(lanes: int) -> None:
    import jax.numpy as jnp

    import jaxmesh

    env = "gymnax:CartPole-v1"

    def push_left(obs):
        return jnp.int32(0)

    def lean(obs):
        return (obs[2] > 0).astype(jnp.int32)

    kw = dict(bounds=(0, 500), num_envs=lanes)
    t0 = time.perf_counter()
    cold = jaxmesh.decide(push_left, lean, env, **kw)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    d = jaxmesh.decide(push_left, lean, env, **kw)
    warm_s = time.perf_counter() - t0
    assert d.episodes == cold.episodes and d.winner == "b"
    n = d.episodes
    t0 = time.perf_counter()
    jaxmesh.evaluate(push_left, env, num_envs=lanes, seeds=range(n))
    jaxmesh.evaluate(lean, env, num_envs=lanes, seeds=range(n))
    once_s = time.perf_counter() - t0
    per_batch = (warm_s - once_s) / d.batches
    print(f"\n## decide on CartPole-v1 ({lanes} lanes, push left vs lean)\n")
    print(
        f"- winner {d.winner}, {d.batches} batches, {n} episodes per arm "
        f"(decided at {d.decided_at}), interval {d.interval}"
    )
    print(f"- first call (compiles both programs): {cold_s:.2f} s")
    print(
        f"- warm: decide {warm_s * 1e3:.1f} ms against one evaluate per policy of "
        f"{n} episodes {once_s * 1e3:.1f} ms"
    )
    print(
        f"result: decide on CartPole ({lanes} lanes): {d.batches} batches, {n} "
        f"episodes per arm; overhead {per_batch * 1e3:.1f} ms per batch over one "
        "evaluate of the same episodes"
    )


def host_workers(lanes: int, workers: int) -> None:
    import jax.numpy as jnp

    import jaxmesh

    env = "gymnasium:CartPole-v1"

    def push_left(obs):
        return jnp.int32(0)

    def lean(obs):
        return (obs[2] > 0).astype(jnp.int32)

    kw = dict(num_envs=lanes, workers=workers)
    jaxmesh.decide(push_left, lean, env, bounds=(0, 500), max_episodes=lanes, **kw)
    t0 = time.perf_counter()
    d = jaxmesh.decide(push_left, lean, env, bounds=(0, 500), **kw)
    kept_s = time.perf_counter() - t0
    ends = [int(p[0]) for p in d.path]
    t0 = time.perf_counter()  # the same batches, each evaluate its own processes
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        for policy in (push_left, lean):
            jaxmesh.evaluate(policy, env, seeds=range(start, end), **kw)
    fresh_s = time.perf_counter() - t0
    print(f"\n## decide on gymnasium CartPole-v1 ({lanes} lanes, {workers} workers)\n")
    print(
        f"- winner {d.winner}, {d.batches} batches, {d.episodes} episodes per arm; "
        f"decide {kept_s:.2f} s against the same batches as evaluate calls, each "
        f"starting its worker processes, {fresh_s:.2f} s"
    )
    print(
        f"result: decide with workers={workers}: {fresh_s / kept_s:.2f}x faster "
        f"than starting the workers per batch ({d.batches} batches, both arms)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer simulated runs")
    ap.add_argument("--runs", type=int, default=None, help="simulated runs per pair")
    ap.add_argument("--lanes", type=int, default=8, help="num_envs on CartPole")
    ap.add_argument(
        "--bets",
        default="mixture,ons,plugin",
        help="kinds of bets, comma-separated (the first is the one the goal reads)",
    )
    ap.add_argument("--no-cartpole", action="store_true", help="the table only")
    ap.add_argument("--seed", type=int, default=0, help="the simulated streams' seed")
    args = ap.parse_args()
    runs = args.runs or (200 if args.quick else 2000)
    table(runs, args.bets.split(","), args.seed)
    if not args.no_cartpole:
        cartpole(args.lanes)
        host_workers(args.lanes, 2)


if __name__ == "__main__":
    main()
