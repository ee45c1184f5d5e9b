# ruff: noqa: E402 - OPENBLAS_NUM_THREADS must be set before numpy loads
"""The realistic served workload: 16 HalfCheetah lanes, a 2x256 MLP, side by side.

One run, one process (plus the server children), every contender on the same
16 gymnasium ``HalfCheetah-v5`` envs (MuJoCo), the same seeds (episode i is
reset with ``seed=i``), 200-step episodes (``max_episode_steps=200``) and the
same policy: a 2x256 tanh MLP with fixed random weights (``--seed``) mapping
the 17-dim observation to a 6-dim action in [-1, 1] (tanh head); its h = 8
variant computes an 8-action chunk ([8, 6]) from the same trunk with a wider
head. The contenders, in this order:

1. ``sim alone``: the 16 envs in a plain Python loop with a fixed action
   (zeros), no policy: what the simulator costs.
2. ``hand loop``: what a user writes by hand: reset the 16 envs with the
   first 16 seeds; per step one jitted batched policy call over the [16, 17]
   observations, then ``env.step`` per lane, a lane reset with the next seed
   when its episode ends (the same episodes, seeds and lane order as jaxmesh).
   Every ratio is to this row.
3. ``jaxmesh in process, h = 1``: ``jaxmesh.evaluate(policy, envs, num_envs=16,
   seeds=range(E), max_episode_steps=200)`` on the same list of envs, defaults.
4. ``jaxmesh in process, h = 8``: the chunk policy, ``horizon=8``.
5. ``jaxmesh served, h = 1``: a ``jaxmesh.EnvServer`` over 16 HalfCheetah envs
   in a child process on 127.0.0.1, ``evaluate(..., env="grpc://...")``,
   default options.
6. ``jaxmesh served, h = 8``.
7. ``jaxmesh served, h = 1, lane_groups = G`` for G in ``--groups`` (2, 4).
8. ``RLMesh served, h = 1``: rlmesh 0.1.0's ``EnvServer`` over 16 HalfCheetah
   envs in a child process, driven by ``Model.run(address, seeds=...,
   max_episode_steps=200)`` with an ``rlmesh.numpy.Model`` whose ``predict``
   and ``predict_batch`` call the hand loop's jitted policy (on a served list
   of envs rlmesh 0.1.0 calls ``predict``, once per lane).

Each contender's first call (compiling, connecting) is timed on its own and
reported as ``first call s``; then ``--repeats`` interleaved timed calls, medians.
The figure is env steps over the wall clock of the call (resets included, the
envs' construction not: they are built once, before any timing). Every
contender's per-episode returns are checked against the hand loop's
(``np.allclose``; served h = 8 against jaxmesh in process at h = 8, RLMesh
against the hand loop with one policy call per lane, run once untimed: a
one-row matmul rounds differently, and MuJoCo turns that into other returns):
a benchmark comparing different work would be worthless.

Run: ``python benchmarks/realistic.py [--quick] [--episodes 64]``
"""

from __future__ import annotations

import os

# Tiny numpy work is fastest on one thread, and idle OpenBLAS threads spin on the
# cores the env loop needs (see peer.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import numpy as np
from common import goal, header, machine, median, table
from mlp import ACT_DIM, HIDDEN, OBS_DIM, K, act, act_chunk, init_params, jaxmesh_run
from remote_common import (
    ServerPool,
    grpc_target,
    make_envs,
    rlmesh_model,
)

import jaxmesh

ENV_KIND = "halfcheetah"  # remote_common.make_envs: gymnasium HalfCheetah-v5
HAND = "hand loop (jit policy), h = 1"
IN1, IN8 = "jaxmesh in process, h = 1", f"jaxmesh in process, h = {K}"
SV1, SV8 = "jaxmesh served, h = 1", f"jaxmesh served, h = {K}"
RL1 = "RLMesh served, h = 1"
PER_LANE = "hand loop, one policy call per lane (untimed; RLMesh's reference)"
#: Returns agree when np.allclose(a, b, rtol=RTOL, atol=ATOL): jaxmesh sums an
#: episode's rewards in float32, the hand loop in Python floats.
RTOL, ATOL = 1e-4, 1e-3


def served_group(g: int) -> str:
    return f"jaxmesh served, h = 1, lane_groups = {g}"


# Policy ------------------------------------------------------------------------
def batched_policy(params: Any) -> Callable[[np.ndarray], np.ndarray]:
    """What a user jits by hand: obs [n, 17] -> actions [n, 6] as numpy."""
    fn = jax.jit(act)
    params = jax.device_put(params)

    def forward(obs: np.ndarray) -> np.ndarray:
        return np.asarray(fn(params, obs))

    return forward


def per_lane(forward: Callable[[np.ndarray], np.ndarray]) -> Callable:
    """``forward`` called on one row at a time, as rlmesh calls ``predict``."""

    def call(obs: np.ndarray) -> np.ndarray:
        return np.concatenate([forward(obs[j : j + 1]) for j in range(len(obs))])

    return call


# Contenders --------------------------------------------------------------------
def host_loop(
    envs: list[gym.Env],
    seeds: list[int],
    cap: int,
    forward: Callable[[np.ndarray], np.ndarray] | None,
) -> dict[str, Any]:
    """The hand loop (``forward``: obs [n, 17] float32 -> actions) or the sim alone.

    Lane j starts with seeds[j]; a lane whose episode ends (terminated,
    truncated or ``cap`` steps) takes the next unstarted seed, in ascending
    lane order, and is reset at once; a lane with none left is not stepped.
    Returns env steps/s over the call's wall clock and the returns in episode
    order.
    """
    n, total = len(envs), len(seeds)
    t0 = time.perf_counter()
    obs = np.zeros((n, OBS_DIM), np.float32)
    episode = np.full(n, -1)
    ret = np.zeros(n)
    length = np.zeros(n, np.int64)
    returns = np.zeros(total)
    fixed = np.zeros((n, ACT_DIM), np.float32)
    started = steps = 0
    for j in range(min(n, total)):
        obs[j] = envs[j].reset(seed=seeds[started])[0]
        episode[j], started = started, started + 1
    active = [j for j in range(n) if episode[j] >= 0]
    while active:
        actions = forward(obs) if forward is not None else fixed
        for j in active:
            o, r, term, trunc, _ = envs[j].step(actions[j])
            ret[j] += r
            length[j] += 1
            steps += 1
            obs[j] = o
            if term or trunc or length[j] >= cap:
                returns[episode[j]] = ret[j]
                ret[j], length[j] = 0.0, 0
                if started < total:
                    obs[j] = envs[j].reset(seed=seeds[started])[0]
                    episode[j], started = started, started + 1
                else:
                    episode[j] = -1
        active = [j for j in active if episode[j] >= 0]
    wall = time.perf_counter() - t0
    return {"sps": steps / wall, "wall": wall, "steps": float(steps)}, returns


def rlmesh_run(model, address, seeds, cap, budget: dict) -> tuple[dict, np.ndarray]:
    """One timed ``Model.run``; returns by episode index (NaN: not reported).

    ``budget`` receives the episodes reported and the distinct indices among
    them (rlmesh 0.1.0 does not always report each episode exactly once here).
    """
    t0 = time.perf_counter()
    r = model.run(address, seeds=seeds, max_episode_steps=cap)
    wall = time.perf_counter() - t0
    figures = {"sps": r.total_steps / wall, "wall": wall, "steps": float(r.total_steps)}
    returns = np.full(len(seeds), np.nan)
    for e in r.episodes:
        if 0 <= e.index < len(seeds):
            returns[e.index] = e.reward
    budget["reported"] = len(r.episodes)
    budget["distinct"] = len({e.index for e in r.episodes})
    return figures, returns


def measure(
    contenders: dict[str, Callable[[], tuple[dict, np.ndarray]]], repeats: int
) -> tuple[dict[str, dict[str, float]], dict[str, np.ndarray], dict[str, str]]:
    """First call of each contender, then ``repeats`` interleaved timed calls.

    Returns medians per contender (``first`` = the first call's wall clock),
    each contender's returns (last call), and why a contender failed.
    """
    first, runs, returns, failed = {}, {}, {}, {}
    for name, fn in list(contenders.items()):
        try:
            figures, returns[name] = fn()
        except Exception:
            failed[name] = traceback.format_exc().strip().splitlines()[-1]
            print(f"{name} failed:\n```\n{traceback.format_exc()}```\n")
            del contenders[name]
            continue
        first[name], runs[name] = figures["wall"], []
    for _ in range(repeats):
        for name, fn in contenders.items():
            figures, returns[name] = fn()
            runs[name].append(figures)
    med = {
        name: {k: median([r[k] for r in rs]) for k in rs[0]}
        | {"first": first[name], "runs": [r["sps"] for r in rs]}
        for name, rs in runs.items()
    }
    return med, returns, failed


def agreement(a: np.ndarray | None, b: np.ndarray | None) -> tuple[str, float]:
    """("k/n", k/n): episodes whose returns agree (allclose), or ("n/a", nan)."""
    if a is None or b is None:
        return "n/a", float("nan")
    if a.shape != b.shape:
        return f"budget differs ({a.size} vs {b.size})", 0.0
    same = np.isclose(a, b, rtol=RTOL, atol=ATOL)
    return f"{int(same.sum())}/{same.size}", float(same.mean())


# Measuring and reporting -------------------------------------------------------
def collect(args: argparse.Namespace, pool: ServerPool) -> tuple:
    """Builds the envs, policies and contenders and measures them.

    Returns (medians, returns per contender, failures, notes, RLMesh's budget).
    """
    n, cap, groups = args.lanes, args.cap, args.groups
    seeds = list(range(args.episodes))
    # The servers build their envs while this process compiles.
    have_rlmesh = importlib.util.find_spec("rlmesh") is not None
    pool.start(
        ("jaxmesh", ENV_KIND, n), *([("rlmesh", ENV_KIND, n)] if have_rlmesh else [])
    )

    m = machine()
    print(
        header(
            f"realistic: {n} served HalfCheetah-v5 lanes, a 2x{HIDDEN} MLP",
            {
                "nproc": m["nproc"],
                "cpu": m["cpu"],
                "python": m["python"],
                "jax": f"{m['jax']} ({m['jax backend']})",
                "gymnasium": gym.__version__,
                "load": m["load average (1, 5, 15 min)"],
                "N": n,
                "episodes": args.episodes,
                "max_episode_steps": cap,
                "repeats": args.repeats,
                "lane_groups": groups,
                "OPENBLAS_NUM_THREADS": os.environ["OPENBLAS_NUM_THREADS"],
            },
        )
    )
    params = init_params(args.seed)
    forward = batched_policy(params)
    policy = jaxmesh.Model(act, params=params, name="mlp2x256_tanh")
    chunk_policy = jaxmesh.Model(
        act_chunk, params=params, native_chunk=K, name=f"mlp2x256_tanh_chunk{K}"
    )
    envs = make_envs(ENV_KIND, n)
    contenders: dict[str, Callable[[], tuple[dict, np.ndarray]]] = {
        "sim alone (fixed action, no policy)": lambda: host_loop(
            envs, seeds, cap, None
        ),
        HAND: lambda: host_loop(envs, seeds, cap, forward),
        IN1: lambda: jaxmesh_run(policy, envs, n, seeds, cap),
        IN8: lambda: jaxmesh_run(chunk_policy, envs, n, seeds, cap, horizon=K),
    }
    notes = []
    try:
        target = grpc_target(pool.address("jaxmesh", ENV_KIND, n))
    except RuntimeError as e:
        notes.append(f"jaxmesh served not measured: {e}")
        target = None
    if target is not None:
        contenders[SV1] = lambda: jaxmesh_run(policy, target, n, seeds, cap)
        contenders[SV8] = lambda: jaxmesh_run(
            chunk_policy, target, n, seeds, cap, horizon=K
        )
        for g in groups:
            contenders[served_group(g)] = lambda g=g: jaxmesh_run(
                policy, target, n, seeds, cap, served=jaxmesh.Served(lane_groups=g)
            )
    model, note = (
        rlmesh_model(
            lambda o: forward(o.astype(np.float32)),
            "MLP2x256",
            one=lambda a: a,
            many=lambda a: a,
        )
        if have_rlmesh
        else (None, "not installed")
    )
    rl_budget: dict[str, int] = {}
    if model is not None:
        try:
            rl_address = pool.address("rlmesh", ENV_KIND, n)
            contenders[RL1] = lambda: rlmesh_run(
                model, rl_address, seeds, cap, rl_budget
            )
        except RuntimeError as e:
            notes.append(f"rlmesh not measured: {e}")
    else:
        notes.append(f"rlmesh not measured: {note}")

    try:
        med, returns, failed = measure(contenders, args.repeats)
        if RL1 in returns:
            # rlmesh calls predict once per lane on this route (one-row batches);
            # a one-row matmul rounds differently from a 16-row one, and MuJoCo
            # amplifies that, so its reference is the hand loop with per-lane calls.
            _, returns[PER_LANE] = host_loop(envs, seeds, cap, per_lane(forward))
    finally:
        for e in envs:
            e.close()
        if model is not None:
            model.close()
    return med, returns, failed, notes, rl_budget


def report(
    args: argparse.Namespace,
    med: dict[str, dict[str, float]],
    returns: dict[str, np.ndarray],
    failed: dict[str, str],
    notes: list[str],
    rl_budget: dict[str, int],
) -> int:
    """Prints the table and the goal lines; 1 when a contender failed, else 0."""
    n, cap, groups = args.lanes, args.cap, args.groups
    seeds = list(range(args.episodes))

    def ratio(a: str, b: str) -> float | None:
        """The median over repeats of a's env steps/s over b's in the same
        repeat (paired: the machine's drift between repeats cancels)."""
        if a in med and b in med:
            pairs = zip(med[a]["runs"], med[b]["runs"], strict=True)
            return median([x / y for x, y in pairs])
        return None

    share: dict[str, float] = {}
    rows = []
    for name, figures in med.items():
        ref = {SV8: returns.get(IN8), RL1: returns.get(PER_LANE)}.get(
            name, returns.get(HAND)
        )
        if name == HAND:
            same, frac = "(reference)", float("nan")
        elif name == IN8:
            same, frac = f"(reference at h = {K})", float("nan")
        elif name.startswith("sim alone"):
            same, frac = "- (no policy)", float("nan")
        else:
            same, frac = agreement(returns.get(name), ref)
        share[name] = frac
        rows.append(
            [
                name,
                figures["steps"],
                figures["first"],
                figures["wall"],
                figures["sps"],
                ratio(name, HAND) if HAND in med else float("nan"),
                same,
            ]
        )
    print(
        table(
            [
                "contender",
                "env steps",
                "first call s",
                "wall s",
                "env steps/s",
                "x hand loop",
                "same returns",
            ],
            rows,
        )
    )
    mean_return = float(np.mean(returns[HAND])) if HAND in returns else float("nan")
    print(
        f"\nN = {n} HalfCheetah-v5 lanes, {args.episodes} episodes of {cap} steps, "
        f"seeds 0..{args.episodes - 1}; the MLP (2x{HIDDEN} tanh, weights from seed "
        f"{args.seed}) has a mean return of {mean_return:.4g} per episode in the hand "
        "loop. env steps/s: env steps over the wall clock of the call (median of "
        f"{args.repeats}; first call s: the first call, compiling and connecting "
        "included). x hand loop and every goal's ratio: the median over repeats of "
        "the ratio of the two runs of one repeat. same returns: episodes whose "
        "return agrees with the hand "
        f"loop's (np.allclose, rtol={RTOL}, atol={ATOL}); the served h = {K} row "
        f"against the in-process h = {K} row (the chunk policy acts differently); "
        "RLMesh's against the hand loop with one policy call per lane (untimed): "
        "rlmesh calls predict once per lane on a served list of envs, a one-row "
        "matmul rounds differently from a 16-row one, and 200 MuJoCo steps turn "
        "that into different returns (the batched hand loop's seed 0 return is not "
        "the per-lane one's). Served: one EnvServer child process per library on "
        f"127.0.0.1 over {n} envs built before timing.\n"
    )
    if rl_budget:
        print(
            f"RLMesh's last run reported {rl_budget['reported']} episodes for a "
            f"budget of {len(seeds)} ({rl_budget['distinct']} distinct indices; "
            "missing ones count as not the same).\n"
        )
    for line in notes + [f"{k} failed: {v}" for k, v in failed.items()]:
        print(line)

    out = []

    def add(text: str, r: float | None, floor: float) -> None:
        if r is None:
            out.append(f"result: realistic: {text}: not measured")
        else:
            out.append(goal(f"realistic: {text} (>= {floor}x)", r, r >= floor))

    add("jaxmesh in process over the hand loop, h = 1", ratio(IN1, HAND), 0.95)
    add(f"jaxmesh in process h = {K} over h = 1", ratio(IN8, IN1), 1.0)
    add("jaxmesh served over the hand loop, h = 1", ratio(SV1, HAND), 0.8)
    add(f"jaxmesh served over the hand loop, h = {K}", ratio(SV8, HAND), 1.0)
    if groups:
        g = groups[0]
        add(
            f"jaxmesh served lane_groups={g} over the hand loop, h = 1",
            ratio(served_group(g), HAND),
            1.0,
        )
        for g in groups[1:]:
            r = ratio(served_group(g), HAND)
            if r is not None:
                out.append(
                    f"result: realistic: jaxmesh served lane_groups={g} over the "
                    f"hand loop, h = 1: {r:.3g}x"
                )
    add("jaxmesh served over RLMesh served, h = 1", ratio(SV1, RL1), 1.0)
    checked = [IN1, SV1, *(served_group(g) for g in groups)]
    fracs = [share[c] for c in checked if c in share]
    if fracs:
        worst = min(fracs)
        out.append(
            goal(
                "realistic: share of episodes whose jaxmesh h = 1 returns equal the "
                "hand loop's (allclose; in process and served)",
                worst,
                worst == 1.0,
            )
        )
    if RL1 in share:
        out.append(
            "result: realistic: share of episodes whose RLMesh returns equal the "
            f"hand loop's with one policy call per lane (allclose): {share[RL1]:.3g}"
        )
    print("\n".join(out))
    return 1 if failed else 0


# Main --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Runs the contenders, prints the table and goal lines; 1 when one failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=16, help="HalfCheetah lanes (N)")
    ap.add_argument("--episodes", type=int, default=64, help="episodes per run (E)")
    ap.add_argument("--cap", type=int, default=200, help="max_episode_steps")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    ap.add_argument(
        "--groups", default="2,4", help="lane_groups to measure served (first: goal)"
    )
    ap.add_argument("--seed", type=int, default=0, help="the policy weights' seed")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 90 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.repeats = args.lanes, 1
    args.groups = [int(g) for g in args.groups.split(",") if g.strip()]
    with ServerPool() as pool:
        measured = collect(args, pool)
    return report(args, *measured)


if __name__ == "__main__":
    sys.exit(main())
