"""A finished run's files: its videos and its HTML report (the ``[video]`` and
``[report]`` extras, imported when a file is made); ``jaxmesh compare`` and
``jaxmesh report``, which read the results ``eval`` wrote."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from jaxmesh.cli.config import read_text
from jaxmesh.cli.errors import ConfigError
from jaxmesh.cli.outputs import need_matplotlib
from jaxmesh.envs import libero
from jaxmesh.results import video
from jaxmesh.results.report import write_report, write_suite_report
from jaxmesh.results.result import RunResult
from jaxmesh.suite import SuiteResult, compare


class VideoError(Exception):
    """A recorded episode's video could not be rendered."""


def video_failed(error: VideoError, written: list[Path]) -> str:
    """The error line of a failed video: the results kept, and what to set for
    headless OpenGL."""
    kept = ", ".join(str(p) for p in written) if written else "nothing (no output)"
    gl = os.environ.get("MUJOCO_GL")
    if gl:
        fix = (
            f"MUJOCO_GL={gl} is set: check that its library is installed (egl: the "
            "GPU's driver; osmesa: Debian's libosmesa6), or try the other"
        )
    else:
        fix = (
            "without a display, rendering needs headless OpenGL: set MUJOCO_GL=egl "
            "(a GPU) or MUJOCO_GL=osmesa (CPU, Debian's libosmesa6)"
        )
    return (
        f"--video: {error}. The run's results are written ({kept}); the video "
        f"is not: {fix}, then run again (or drop --video)"
    )


def write_videos(
    result: Any, path: Path, base: Path | None, explicit: bool = True
) -> None:
    """Renders every recorded episode (``jaxmesh.render``) to
    ``<path stem>[.<task>].ep<i><suffix>`` (an ``explicit`` path: one episode's
    own), listed in the result relative to ``base`` (the output's folder);
    VideoError: one could not be rendered (the videos before it listed)."""
    if isinstance(result, SuiteResult):
        for name, task in result.tasks.items():
            target = path.with_name(f"{path.stem}.{name}{path.suffix}")
            write_videos(task, target, None, explicit=False)
        return
    trajectories = result.trajectories or []
    for tr in trajectories:
        if explicit and len(trajectories) == 1:
            target = path
        else:
            target = path.with_name(f"{path.stem}.ep{tr.episode}{path.suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        frames = None
        if tr.frames is None and "libero:" in str(result.env):
            # Worker processes capture no render() frames: a LIBERO episode's
            # video is its recorded camera image.
            frames = libero.video_frame
        try:
            video.render(result, tr.episode, target, frames=frames)
        except Exception as e:  # any failure of this optional file is reported alike
            raise VideoError(f"episode {tr.episode}: {type(e).__name__}: {e}") from e
        print(f"wrote {target}")
    if base is not None:
        result.videos[:] = [
            os.path.relpath(Path(v).absolute(), base.absolute()) for v in result.videos
        ]


def write_report_file(
    result: Any, path: Path, base: Path | None = None, announce: bool = True
) -> None:
    """Writes ``result``'s HTML report to ``path`` (``announce``: say so);
    ``base``: the folder of the result's relative video paths (ConfigError: the
    file cannot be written)."""
    try:
        if isinstance(result, SuiteResult):
            write_suite_report(result, path)
        else:
            write_report(result, path, base=base)
    except OSError as e:
        raise ConfigError(
            f"cannot write the report to {str(path)!r}: {e}; pass a writable path"
        ) from e
    if announce:
        print(f"wrote {path}")


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
