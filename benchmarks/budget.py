"""Cost per episode against the budget: 1e3 to 1e7 episodes on one program.

gymnax CartPole-v1 and the zoo's CartPole MLP (2x64 tanh, argmax) with
untrained weights (``cartpole.init(PRNGKey(0))``, saved as its checkpoint):
episodes of ~10 steps, so lanes end episodes all the time, the regime where
per-episode bookkeeping shows. At 8 and at 1024 lanes, for budgets of 1e3, 1e4,
..., 1e7 episodes, two paths:

- ``evaluate``: ``jaxmesh.evaluate(policy, env, num_envs=N, episodes=E)``,
  warm (compiled by a first call); the figure is ``result.run_time``.
- ``cli``: ``jaxmesh eval CONFIG`` on the same policy and env, run in this
  process with what the command does by default: the progress bar (written to
  a buffer) and the episode log (one JSON line per episode, next to the output
  JSON); the figure is the output JSON's ``run_time`` (its compile excluded).

Per row: microseconds per episode (run time / E), env steps per second, and the
cost per episode over the smallest budget's (1.0: the budget does not change
the cost of an episode). A budget whose run would take longer than
``--max-seconds`` at the previous budget's cost per episode is not run; its row
says so and gives that estimate, marked as an estimate.

Goal, per path and lane count: the cost per episode at every budget measured
is within 1.5x of the reference budget's, the smallest with at least 8
episodes per lane (smaller runs are mostly their last episodes' tail, where
lanes stand masked).

Run: ``python benchmarks/budget.py [--quick] [--lanes 8,1024] [--paths evaluate,cli]
[--budgets 1e3,1e4] [--max-seconds 120]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import jax
import yaml
from common import goal, header, machine, median, table

import jaxmesh
from jaxmesh import cli
from jaxmesh.zoo import cartpole

ENV = "gymnax:CartPole-v1"
POLICY = "jaxmesh.zoo.cartpole:CartPoleMLP"
#: Within this factor of the reference budget's cost per episode.
GOAL_RATIO = 1.5
#: The reference budget has at least this many episodes per lane.
REFERENCE_PER_LANE = 8


def repeats_for(episodes: int) -> int:
    """Short runs are repeated (median), long ones run once."""
    return 3 if episodes <= 10_000 else 1


def run_evaluate(policy, lanes: int, episodes: int) -> dict:
    r = jaxmesh.evaluate(policy, ENV, num_envs=lanes, episodes=episodes)
    return {"run_time": r.run_time, "env_steps": r.env_steps}


def run_cli(workdir: Path, checkpoint: Path, lanes: int, episodes: int) -> dict:
    """``jaxmesh eval`` in this process; its output JSON's figures."""
    out = workdir / f"n{lanes}_e{episodes}.json"
    config = workdir / "budget.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "env": ENV,
                "policy": POLICY,
                "policy_config": {"checkpoint": str(checkpoint)},
                "episodes": episodes,
                "num_envs": lanes,
                "output": str(out),
            }
        )
    )
    with (
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        code = cli.main(["eval", str(config)])
    if code not in (0, None):
        raise RuntimeError(f"jaxmesh eval exited with {code}")
    totals = json.loads(out.read_text())["totals"]
    for written in workdir.glob(f"{out.stem}.*"):  # GBs at 1e7 episodes
        written.unlink()
    return {"run_time": totals["run_time"], "env_steps": totals["env_steps"]}


def measure(run, lanes: int, budgets: list[int], max_seconds: float) -> list[dict]:
    """One row per budget; a budget past ``max_seconds`` is estimated, not run."""
    rows: list[dict] = []
    for e in budgets:
        if rows:
            estimate = rows[-1]["us"] * e / 1e6
            if estimate > max_seconds:
                rows.append({"episodes": e, "estimate_s": estimate})
                continue
        runs = [run(lanes, e) for _ in range(repeats_for(e))]
        run_time = median([r["run_time"] for r in runs])
        steps = runs[0]["env_steps"]
        rows.append(
            {
                "episodes": e,
                "us": run_time / e * 1e6,
                "sps": steps / run_time,
                "run_time": run_time,
                "mean_len": steps / e,
            }
        )
    return rows


def report(path: str, lanes: int, rows: list[dict]) -> tuple[str, str]:
    """The table of one path and lane count, and its goal line."""
    first = rows[0]["us"]
    ref = next(
        (r for r in rows if "us" in r and r["episodes"] >= REFERENCE_PER_LANE * lanes),
        rows[0],
    )
    out = []
    for r in rows:
        if "us" not in r:
            out.append(
                [path, lanes, r["episodes"], "not run", "", "", "", "",
                 f"estimate: {r['estimate_s']:,.0f} s at the previous cost"]
            )  # fmt: skip
            continue
        out.append(
            [
                path,
                lanes,
                r["episodes"],
                r["us"],
                r["sps"],
                r["us"] / first,
                r["us"] / ref["us"],
                r["run_time"],
                f"mean length {r['mean_len']:.1f}",
            ]
        )
    measured = [r for r in rows if "us" in r and r["episodes"] >= ref["episodes"]]
    worst = max(r["us"] / ref["us"] for r in measured)
    line = goal(
        f"{path}, {lanes} lanes: us/episode at budgets "
        f"{ref['episodes']:,}..{measured[-1]['episodes']:,} within "
        f"{GOAL_RATIO}x of {ref['episodes']:,}'s (worst ratio)",
        worst,
        worst <= GOAL_RATIO,
    )
    return table(
        [
            "path",
            "lanes",
            "episodes",
            "us/episode",
            "env steps/s",
            "x smallest",
            "x reference",
            "run s",
            "note",
        ],
        out,
    ), line


def main(argv: list[str] | None = None) -> list[dict]:
    """Prints the budget tables; returns their rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="8,1024", help="comma-separated lane counts")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="skip (and estimate) a budget whose run would take longer",
    )
    ap.add_argument("--paths", default="evaluate,cli", help="evaluate and/or cli")
    ap.add_argument("--quick", action="store_true", help="budgets up to 1e5 only")
    ap.add_argument("--budgets", help="comma-separated budgets (default 1e3..1e7)")
    args = ap.parse_args(argv)
    top = 5 if args.quick else 7
    budgets = [10**k for k in range(3, top + 1)]
    if args.budgets:
        budgets = [int(float(x)) for x in args.budgets.split(",")]
    print(
        header(
            "Cost per episode against the budget",
            {
                "env": ENV,
                "policy": "CartPoleMLP, untrained weights",
                "budgets": ",".join(f"{b:.0e}" for b in budgets),
                "lanes": args.lanes,
                "max_seconds": args.max_seconds,
                **machine(),
            },
        )
    )
    with tempfile.TemporaryDirectory(prefix="jaxmesh-budget-") as tmp:
        return measure_all(args, budgets, Path(tmp))


def measure_all(args: argparse.Namespace, budgets: list[int], workdir: Path) -> list:
    """Every table and goal line, with files written under ``workdir``."""
    lanes_list = [int(x) for x in args.lanes.split(",")]
    paths = args.paths.split(",")
    checkpoint = workdir / "untrained"
    jaxmesh.save_params(checkpoint, cartpole.init(jax.random.PRNGKey(0)))
    policy = cartpole.CartPoleMLP.from_config(checkpoint=str(checkpoint))
    runs = {
        "evaluate": lambda n, e: run_evaluate(policy, n, e),
        "cli": lambda n, e: run_cli(workdir, checkpoint, n, e),
    }
    results, lines = [], []
    t0 = time.perf_counter()
    for lanes in lanes_list:
        for path in paths:
            runs[path](lanes, 100)  # compiles (the CLI: its persistent cache)
            rows = measure(runs[path], lanes, budgets, args.max_seconds)
            text, line = report(path, lanes, rows)
            print(text + "\n")
            lines.append(line)
            results += [{"path": path, "lanes": lanes, **r} for r in rows]
    print("\n".join(lines))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return results


if __name__ == "__main__":
    main()
