"""A finished run's optional files: its videos and its HTML report (the
``[video]`` and ``[report]`` extras, imported when a file is made)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaxmesh.cli.errors import ConfigError
from jaxmesh.envs import libero
from jaxmesh.results import video
from jaxmesh.results.report import write_report, write_suite_report
from jaxmesh.suite import SuiteResult


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
    own), listed in the result relative to ``base`` (the output's folder).

    Raises:
      VideoError: an episode's video could not be rendered (the result lists
        the videos written before it).
    """
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
