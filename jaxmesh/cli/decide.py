"""``jaxmesh decide A.yaml B.yaml``: which of two policies scores more, with as
few episodes as the gap allows (``jaxmesh.decide``; docs/cli.md, "jaxmesh
decide": what it reads, prints and writes, and its exit statuses).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jaxmesh
from jaxmesh.cli.build import build_run, close, config_policy
from jaxmesh.cli.cache import use_compile_cache
from jaxmesh.cli.checks import read_config
from jaxmesh.cli.config import read_resume
from jaxmesh.cli.errors import ConfigError, resume_refused, stopped, terminating
from jaxmesh.cli.hooks import CommandLog
from jaxmesh.cli.outputs import (
    check_writable,
    episode_log_path,
    need_matplotlib,
    write_json,
)
from jaxmesh.decide import check_settings
from jaxmesh.results.result import RunResult
from jaxmesh.suite import SuiteResult

#: Keys of B's config that may differ from A's: the policy's own, and where
#: its result goes. The budget keys are not read at all.
POLICY_KEYS = ("policy", "policy_config", "host", "output")
BUDGET_KEYS = ("episodes", "seeds", "record", "check_seeds")


def load_decision(path: str) -> dict[str, Any]:
    """The decision JSON an earlier ``decide --output`` wrote, its runs ``a``
    and ``b`` read back (ConfigError: missing, or not a decision)."""

    def parse(text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
            kind = SuiteResult if data["a"].get("suite") else RunResult
            a, b = kind.from_dict(data["a"]), kind.from_dict(data["b"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"not a decision JSON of jaxmesh decide ({e})") from e
        return {**data, "a": a, "b": b}

    return read_resume(path, "pass the decision JSON an earlier decide wrote", parse)


def _progress(d: Any) -> None:
    low, high = d.interval
    state = f"decided: {d.winner.upper()}" if d.winner else "undecided"
    print(
        f"jaxmesh decide: {d.episodes} episodes per arm, difference "
        f"{d.difference:.4g}, interval ({low:.4g}, {high:.4g}), {state}",
        file=sys.stderr,
        flush=True,
    )


def _kept(exc: BaseException, output: Path | None) -> str:
    """Where an interrupted decide's finished batches went, and how to go on."""
    partial = getattr(exc, "partial_decision", None)
    if partial is None:
        return "No batch had finished: nothing to resume from."
    if output is None:
        return f"{partial.episodes} episodes per arm had run, not saved (no --output)."
    where = write_json(output, partial.to_dict(), "decide")
    return (
        f"{partial.episodes} episodes per arm are in {where}; to go on from them, "
        f"run the same command with --resume {where}"
    )


def cmd_decide(args: argparse.Namespace) -> int:
    config_a = read_config(args.a, args.set)
    config_b = read_config(args.b, args.set)
    keys = {*config_a, *config_b} - {*POLICY_KEYS, *BUDGET_KEYS}
    differ = sorted(k for k in keys if config_a.get(k) != config_b.get(k))
    if differ:
        shown = [f"{k}: {config_a.get(k)!r} vs {config_b.get(k)!r}" for k in differ[:4]]
        raise ConfigError(
            f"{args.a} and {args.b} differ in {differ} ({', '.join(shown)}); decide "
            "runs both policies on A's env and settings: B's config may differ only "
            f"in {', '.join(POLICY_KEYS)}"
        )
    if args.metric == "return" and args.bounds is None:
        raise ConfigError(
            "--metric return needs --bounds LO HI: the smallest and largest return "
            "an episode can score (e.g. --bounds 0 500 for CartPole-v1), since the "
            "test's guarantee rests on them; or pass --metric success"
        )
    if args.metric == "success" and args.bounds is not None:
        raise ConfigError("--bounds is for --metric return; leave it out")
    earlier = load_decision(args.resume) if args.resume else None
    first_seed = args.first_seed
    if first_seed is None:  # 0, or the resumed decision's
        first_seed = 0 if earlier is None else int(earlier.get("first_seed", 0))
    try:
        check_settings(
            args.alpha, args.metric, args.bounds, args.max_episodes, first_seed
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e
    out_a = Path(config_a["output"]) if config_a.get("output") else None
    out_b = Path(config_b["output"]) if config_b.get("output") else None
    if out_a is not None and out_a == out_b:
        raise ConfigError(
            f"{args.a} and {args.b} both write {out_a}: give B's config another "
            "output (or --set output=... applies to both: set it in the files)"
        )
    output = Path(args.output) if args.output else None
    plot = Path(args.plot) if args.plot else None
    report = Path(args.report) if args.report else None
    for flag, path in (("--plot", plot), ("--report", report)):
        if path is not None:
            need_matplotlib(f"jaxmesh decide {flag}")
    logs = (None, None)
    if config_a.get("tasks") is None:  # a suite's results are written whole
        logs = tuple(
            episode_log_path(argparse.Namespace(config=path), config)
            for path, config in ((args.a, config_a), (args.b, config_b))
        )
    check_writable(
        ("output of A", out_a),
        ("output of B", out_b),
        ("episode log of A", logs[0]),
        ("episode log of B", logs[1]),
        ("--output", output),
        ("--plot", plot),
        ("--report", report),
    )
    use_compile_cache(args.no_compile_cache, "decide")
    policy_a, env, run, _ = build_run(config_a)
    policy_b = config_policy(config_b, args.b)
    resume = None if earlier is None else (earlier["a"], earlier["b"])
    kwargs = dict(
        alpha=args.alpha,
        metric=args.metric,
        bounds=None if args.bounds is None else tuple(args.bounds),
        max_episodes=args.max_episodes,
        first_seed=first_seed,
        batch=args.batch,
        on_batch=None if args.no_progress else _progress,
        resume=resume,
        arm_hooks=tuple(
            [] if path is None else [CommandLog(path, p, c, resume is None, "decide")]
            for path, c, p in zip(
                logs, (config_a, config_b), (policy_a, policy_b), strict=True
            )
        ),
    )
    try:
        with terminating():  # SIGTERM stops it as Ctrl-C does
            decision = jaxmesh.decide(policy_a, policy_b, env, run, **kwargs)
    except KeyboardInterrupt as e:
        raise stopped("decide", e, _kept(e, output)) from None
    except (ValueError, TypeError) as e:
        raise ConfigError(resume_refused(e, args.resume)) from e
    finally:
        close(policy_a, policy_b)
    print(decision)
    for path, result in ((out_a, decision.a), (out_b, decision.b)):
        if path is not None:
            print(f"wrote {write_json(path, result.to_dict(), 'decide')}")
    if output is not None:
        print(f"wrote {write_json(output, decision.to_dict(), 'decide')}")
    if plot is not None:
        decision.plot().savefig(plot, dpi=100)
        print(f"wrote {plot}")
    if report is not None:
        print(f"wrote {decision.report(report)}")
    return 0 if decision.winner is not None else 1
