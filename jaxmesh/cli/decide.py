"""``jaxmesh decide A.yaml B.yaml``: which of two policies scores more, with as
few episodes as the gap allows (``jaxmesh.decide``).

A's config names the env (or a suite's ``tasks:``, decided over its tasks,
stratified) and the run's settings; B's config names the other
policy and must name the same env and settings (only ``policy``,
``policy_config``, ``host`` and ``output`` may differ; the budget keys are
ignored: decide runs episode i of both with seed ``--first-seed + i``). Each
batch prints a progress line on stderr; the summary goes to stdout; the
decision (both runs included) is written to ``--output`` and each run's result
JSON to its config's ``output``, as ``jaxmesh eval`` writes it, and each
run's episodes, as they finish, to its episode log next to it
(``NAME.episodes.jsonl``, ``jaxmesh.EpisodeLog``, batch by batch: a killed
decide keeps every finished episode of both; not for a suite); ``--plot``
draws the interval narrowing over the episodes (``Decision.plot``); ``--report``
writes the decision's HTML page (``Decision.report``).

Exit status: 0 decided, 1 undecided after ``--max-episodes``, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jaxmesh
from jaxmesh.cache import CACHE_DIR_ENV, enable_compile_cache
from jaxmesh.cli.build import build_policy, build_run
from jaxmesh.cli.cache import compile_cache_wanted
from jaxmesh.cli.checks import read_config
from jaxmesh.cli.config import existing_file
from jaxmesh.cli.errors import ConfigError, Interrupted, Terminated, terminating
from jaxmesh.cli.outputs import (
    check_writable,
    episode_log_path,
    need_matplotlib,
    write_json,
)
from jaxmesh.decide import check_settings
from jaxmesh.results.result import RunResult
from jaxmesh.run.resume import EpisodeLog
from jaxmesh.suite import SuiteResult

#: Keys of B's config that may differ from A's: the policy's own, and where
#: its result goes. The budget keys are not read at all.
POLICY_KEYS = ("policy", "policy_config", "host", "output")
BUDGET_KEYS = ("episodes", "seeds", "record", "check_seeds")


def _config(path: str, sets: list[str]) -> dict[str, Any]:
    return read_config(argparse.Namespace(config=path, set=sets))


def _check_same_run(a: dict, b: dict, path_a: str, path_b: str) -> None:
    skip = set(POLICY_KEYS) | set(BUDGET_KEYS)
    differ = sorted(
        k for k in set(a) | set(b) if k not in skip and a.get(k) != b.get(k)
    )
    if differ:
        shown = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in differ[:4])
        raise ConfigError(
            f"{path_a} and {path_b} differ in {differ} ({shown}); decide runs both "
            "policies on A's env and settings: B's config may differ only in "
            f"{', '.join(POLICY_KEYS)}"
        )


def load_decision(path: str) -> dict[str, Any]:
    """The decision JSON an earlier ``decide --output`` wrote, with its runs
    read back (``a``, ``b``: ``RunResult``, or ``SuiteResult`` for a suite).

    Raises:
      ConfigError: the file is missing or is not a decision.
    """
    p = existing_file(
        path, "--resume file", "pass the decision JSON an earlier decide wrote"
    )
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        kind = SuiteResult if data["a"].get("suite") else RunResult
        return {**data, "a": kind.from_dict(data["a"]), "b": kind.from_dict(data["b"])}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ConfigError(
            f"--resume {path!r}: not a decision JSON of jaxmesh decide ({e})"
        ) from e
    except ValueError as e:
        raise ConfigError(f"--resume {path!r}: {e}") from e


def _progress(enabled: bool):
    def line(d: Any) -> None:
        if not enabled:
            return
        low, high = d.interval
        state = f"decided: {d.winner.upper()}" if d.winner else "undecided"
        print(
            f"jaxmesh decide: {d.episodes} episodes per arm, difference "
            f"{d.difference:.4g}, interval ({low:.4g}, {high:.4g}), {state}",
            file=sys.stderr,
            flush=True,
        )

    return line


def _kept(args: argparse.Namespace, exc: BaseException, output: Path | None) -> str:
    """Where an interrupted decide's finished batches went, and how to go on."""
    partial = getattr(exc, "partial_decision", None)
    if partial is None:
        return "No batch had finished: nothing to resume from."
    if output is None:
        return (
            f"{partial.episodes} episodes per arm had run; they are not saved (no "
            "--output)."
        )
    where = write_json(output, partial.to_dict(), "decide")
    return (
        f"{partial.episodes} episodes per arm are in {where}; to go on from them, "
        f"run the same command with --resume {where}"
    )


class _LogStart:
    """Before an arm's ``EpisodeLog``: at the arm's first batch it makes the
    log's folder and, for a new decide (``fresh``), empties the file (a
    resumed decide appends to it, as ``eval --resume`` does)."""

    def __init__(self, path: Path, fresh: bool):
        self.path, self.fresh = path, fresh

    def on_run_start(self, info: dict) -> None:
        del info
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            self.path.write_text("", encoding="utf-8")
            self.fresh = False


def _warn(text: str) -> None:
    print(f"jaxmesh decide: warning: {text}", file=sys.stderr)


def _log_paths(args, config_a, config_b) -> tuple[Path | None, Path | None]:
    """Each arm's episode log: next to its output as ``NAME.episodes.jsonl``
    (None: no output, or a suite, whose results are written whole)."""
    if config_a.get("tasks") is not None:
        return None, None
    return tuple(
        episode_log_path(argparse.Namespace(config=path), config)
        for path, config in ((args.a, config_a), (args.b, config_b))
    )


def _arm_hooks(paths, configs, policies, fresh: bool) -> tuple[list, list]:
    """Per arm: the hooks that write its episode log (none without one)."""
    hooks = []
    for path, config, policy in zip(paths, configs, policies, strict=True):
        if path is None:
            hooks.append([])
            continue
        log = EpisodeLog(
            path,
            params=getattr(policy, "params", None),
            max_episode_steps=config.get("max_episode_steps"),
            on_error=_warn,
        )
        hooks.append([_LogStart(path, fresh), log])
    return hooks[0], hooks[1]


def cmd_decide(args: argparse.Namespace) -> int:
    config_a = _config(args.a, args.set)
    config_b = _config(args.b, args.set)
    _check_same_run(config_a, config_b, args.a, args.b)
    if args.metric == "return" and args.bounds is None:
        raise ConfigError(
            "--metric return needs --bounds LO HI: the smallest and largest return "
            "an episode can score (e.g. --bounds 0 500 for CartPole-v1), since the "
            "test's guarantee rests on them; or pass --metric success"
        )
    if args.metric == "success" and args.bounds is not None:
        raise ConfigError("--bounds is for --metric return; leave it out")
    first_seed = args.first_seed
    try:
        check_settings(
            args.alpha,
            args.metric,
            args.bounds,
            args.max_episodes,
            0 if first_seed is None else first_seed,
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
    logs = _log_paths(args, config_a, config_b)
    check_writable(
        ("output of A", out_a),
        ("output of B", out_b),
        ("episode log of A", logs[0]),
        ("episode log of B", logs[1]),
        ("--output", output),
        ("--plot", plot),
        ("--report", report),
    )
    earlier = load_decision(args.resume) if args.resume else None
    if compile_cache_wanted(args.no_compile_cache):
        try:
            enable_compile_cache()
        except OSError as e:
            print(
                f"jaxmesh decide: warning: compilation cache off ({e}); set "
                f"{CACHE_DIR_ENV} to a writable directory",
                file=sys.stderr,
            )
    policy_a, env, run, _ = build_run(config_a)
    policy_b = build_policy(
        config_b["policy"], config_b["policy_config"], bool(config_b.get("host"))
    )
    resume = None
    if earlier is not None:
        resume = (earlier["a"], earlier["b"])
        if first_seed is None:
            first_seed = int(earlier.get("first_seed", 0))
    kwargs = dict(
        alpha=args.alpha,
        metric=args.metric,
        bounds=None if args.bounds is None else tuple(args.bounds),
        max_episodes=args.max_episodes,
        first_seed=0 if first_seed is None else first_seed,
        batch=args.batch,
        on_batch=_progress(not args.no_progress),
        resume=resume,
        arm_hooks=_arm_hooks(
            logs, (config_a, config_b), (policy_a, policy_b), resume is None
        ),
    )
    try:
        with terminating():  # SIGTERM stops it as Ctrl-C does
            decision = jaxmesh.decide(policy_a, policy_b, env, run, **kwargs)
    except KeyboardInterrupt as e:
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"jaxmesh decide: {how}. {_kept(args, e, output)}", file=sys.stderr)
        raise Interrupted(143 if isinstance(e, Terminated) else 130) from None
    except (ValueError, TypeError) as e:
        text = str(e)
        if resume is not None and text.startswith("resume="):
            text = f"--resume {args.resume}: {text.removeprefix('resume=: ')}"
        raise ConfigError(text) from e
    finally:
        for policy in (policy_a, policy_b):
            close = getattr(policy, "close", None)
            if callable(close):
                close()
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
