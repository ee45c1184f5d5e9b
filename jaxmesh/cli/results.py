"""``jaxmesh compare`` and ``jaxmesh report``: read results ``eval`` wrote."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jaxmesh.cli.artifacts import write_report_file
from jaxmesh.cli.config import read_text
from jaxmesh.cli.errors import ConfigError
from jaxmesh.cli.outputs import need_matplotlib
from jaxmesh.results.result import RunResult
from jaxmesh.suite import SuiteResult, compare


def load_result(path: str | Path) -> Any:
    """The ``RunResult`` (a suite's ``SuiteResult``) ``jaxmesh eval`` wrote to a
    JSON file; ConfigError: missing, not JSON, or not a result."""
    hint = "pass the JSON that jaxmesh eval wrote (its config's output key)"
    text = read_text(path, "result file", hint)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"result file {str(path)!r} is not valid JSON: {e}") from e
    try:
        if isinstance(data, dict) and data.get("suite"):
            return SuiteResult.from_dict(data)
        result = RunResult.from_dict(data)
        npz = Path(path).with_suffix(".npz")  # eval's, for a run with record:
        if data.get("recorded") and npz.is_file():
            result = result.load_trajectories(npz, data["recorded"])
        return result
    except (ValueError, OSError) as e:
        raise ConfigError(f"result file {str(path)!r}: {e}") from e


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = load_result(args.a), load_result(args.b)
    try:
        comparison = compare(
            a, b, resamples=args.resamples, seed=args.seed, unpaired=args.unpaired
        )
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{args.a} and {args.b}: {e}") from e
    print(comparison)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    need_matplotlib("jaxmesh report")
    result = load_result(args.results)
    out = Path(args.output) if args.output else Path(args.results).with_suffix(".html")
    if out.resolve() == Path(args.results).resolve():
        raise ConfigError(
            f"-o {str(out)!r} is the results file itself; pass another path, e.g. "
            "-o report.html"
        )
    write_report_file(result, out, Path(args.results).parent)
    return 0
