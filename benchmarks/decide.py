"""Episodes to a decision, and decide's cost per batch on CartPole.

1. **Episodes per arm** (simulation, no env): two policies with success rates
   p_a and p_b, independent one-step Bernoulli episodes, the differences fed to
   the betting test of ``jaxmesh.decide`` (``BettingSequence``, alpha 0.05) in
   decide's schedule (a first batch of 8, then a quarter of the episodes so far:
   ``jaxmesh.decide.next_batch``, capped at 128). Per pair of
   rates: the mean and median episodes per arm at the stop (whole batches), the
   mean at the crossing itself (``decided_at``: what a batch of 1 would give),
   the share decided for B within 10,000, and the fixed-size two-proportion
   test's n for 80% power at the same alpha. Goal: the mean at the stop is at
   most 1.0x the fixed n for 0.45 vs 0.70 (61). Each kind of bets
   (``--bets``: online Newton step, the default, and plug-in) runs on the same
   simulated streams; a null row (0.5 / 0.5) gives the false-decision rate.
2. **CartPole**: ``jaxmesh.decide`` of "push left" against "push the way the
   pole leans" on gymnax CartPole-v1 (bounds 0..500): batches and episodes to
   stop, then, warm (programs compiled by a first call), decide's wall time
   against one ``evaluate`` per policy of the same total episodes; the
   difference over the batches is the overhead a batch costs.

Run: ``python benchmarks/decide.py [--quick] [--runs R] [--lanes N]
[--bets ons,plugin] [--no-cartpole]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

ALPHA = 0.05
RATES = ((0.45, 0.70), (0.5, 0.6), (0.8, 0.9))
FIRST, CAP, MAX = 8, 128, 10_000
#: Episodes per arm of each null run (equal rates: the false-decision rate).
NULL_MAX = 2_000


def episodes_to_decide(
    p_a: float,
    p_b: float,
    runs: int,
    seed: int = 0,
    bets: str = "ons",
    most: int = MAX,
) -> dict:
    from jaxmesh.decide import next_batch
    from jaxmesh.results.sequential import BettingSequence

    rng = np.random.default_rng(seed)
    stops, crossings, right, decided = [], [], 0, []
    for _ in range(runs):
        seq = BettingSequence(-1.0, 1.0, alpha=ALPHA, grid=3, bets=bets)
        while seq.n < most and not seq.rejects:
            k = min(next_batch(seq.n, FIRST, CAP), most - seq.n)
            a = rng.random(k) < p_a
            b = rng.random(k) < p_b
            seq.update(b.astype(np.int64) - a.astype(np.int64))
        stops.append(seq.n)
        crossings.append(seq.decided_at or most)
        decided.append(seq.decided_at)
        right += seq.direction == 1
    return {
        "mean": float(np.mean(stops)),
        "median": float(np.median(stops)),
        "p80": float(np.percentile(stops, 80)),
        "crossing": float(np.mean(crossings)),
        "right": right / runs,
        "decided": float(np.mean([s is not None for s in decided])),
    }


def table(runs: int, kinds: list[str]) -> None:
    from jaxmesh.results.sequential import fixed_sample_size

    print(f"## Episodes per arm to a decision (alpha {ALPHA}, {runs} runs each)\n")
    print(
        "| p_a / p_b | bets | fixed n (80% power) | decide: mean (median) at the "
        "stop | ratio | 80% of runs decided by | mean at the crossing | ratio | "
        "decided for B |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for bets in kinds:
        null = episodes_to_decide(0.5, 0.5, runs, seed=1, bets=bets, most=NULL_MAX)
        print(
            f"| 0.5 / 0.5 | {bets} | - | false decisions within {NULL_MAX:,}: "
            f"{null['decided']:.1%} | | | | | |"
        )
    for (p_a, p_b), bets in ((r, b) for r in RATES for b in kinds):
        n = fixed_sample_size(p_a, p_b, alpha=ALPHA, power=0.8)
        r = episodes_to_decide(p_a, p_b, runs, bets=bets)
        print(
            f"| {p_a} / {p_b} | {bets} | {n} | {r['mean']:.0f} ({r['median']:.0f}) | "
            f"{r['mean'] / n:.2f}x | {r['p80']:.0f} | {r['crossing']:.0f} | "
            f"{r['crossing'] / n:.2f}x | "
            f"{r['right']:.1%} |"
        )
        if (p_a, p_b) == RATES[0] and bets == kinds[0]:
            goal = "met" if r["mean"] <= n else "MISSED"
            first = (
                f"result: 0.45 vs 0.70 ({bets} bets): decide stops after "
                f"{r['mean']:.0f} episodes per arm on average "
                f"({r['mean'] / n:.2f}x the fixed test's {n}; "
                f"median {r['median']:.0f})"
            )
            line = f"goal: mean episodes per arm <= 1.0x the fixed n -> {goal}"
    print()
    print(first)
    print(line)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer simulated runs")
    ap.add_argument("--runs", type=int, default=None, help="simulated runs per pair")
    ap.add_argument("--lanes", type=int, default=8, help="num_envs on CartPole")
    ap.add_argument(
        "--bets", default="ons,plugin", help="kinds of bets, comma-separated"
    )
    ap.add_argument("--no-cartpole", action="store_true", help="the table only")
    args = ap.parse_args()
    runs = args.runs or (200 if args.quick else 1000)
    table(runs, args.bets.split(","))
    if not args.no_cartpole:
        cartpole(args.lanes)


if __name__ == "__main__":
    main()
