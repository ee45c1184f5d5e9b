"""Where a command's files go, checked before the run so that no result is lost:
the result JSON, the episode log, a sweep's files, the report, the videos.

Nothing here imports JAX: the parser reads these names for its help.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from jaxmesh.cli.errors import ConfigError

#: The suffix of the episode log next to the output JSON.
EPISODE_LOG_SUFFIX = ".episodes.jsonl"
#: The suffix of a sweep's result JSON, next to the config's output (the
#: output itself is the eval's result: a sweep never writes it).
SWEEP_SUFFIX = ".sweep.json"
#: The suffix of the file next to it where each finished cell of a sweep is
#: written as it finishes.
SWEEP_CELLS_SUFFIX = ".sweep.cells.jsonl"
#: ``--video`` given without a path.
VIDEO_NEXT_TO_OUTPUT = object()
#: ``--report`` given without a path.
REPORT_NEXT_TO_OUTPUT = object()


def check_writable(*paths: tuple[str, Any]) -> None:
    """Refuses, before the run, every ``(what, path)`` where a file cannot be
    written; the folders are made here (a None path is skipped).

    Raises:
      ConfigError: naming the flag or key, the path and what to do.
    """
    for what, path in paths:
        if path is None:
            continue
        p = Path(path)
        fix = f"pass a file path in a writable folder, e.g. {what} results/run.json"
        if what == "output":
            fix = "set output to a file in a writable folder (--set output=r.json)"
        if p.is_dir():
            raise ConfigError(
                f"{what} {str(p)!r} is a directory, not a file; {fix} (a file "
                "inside it: " + repr(str(p / "result.json")) + ")"
            )
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".jaxmesh-probe-", dir=p.parent)
            os.close(fd)
            os.unlink(probe)
            if p.exists():
                with open(p, "a"):  # a file there must take writes (not truncated)
                    pass
        except OSError as e:
            why = e.strerror or str(e)
            raise ConfigError(
                f"{what} {str(p)!r} cannot be written ({why}: "
                f"{e.filename or p.parent!s}); {fix}; checked before the run so "
                "that no result is lost"
            ) from None


def _write_new(fd: int, name: str, data: bytes, path: Path | None = None) -> None:
    """Writes ``data`` to the new file ``name`` open as ``fd`` (then renamed to
    ``path``), or removes it."""
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if path is not None:
            os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def write_file(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` whole or not at all (a new file beside it,
    renamed over it); a link or a path that is no regular file in place.

    Raises:
      OSError: the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        path.write_bytes(data)
        return
    name = str(path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"))
    # os.open applies the umask, as a plain open() would for ``path``.
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    _write_new(fd, name, data, path)


def write_json(path: Path, data: Any, command: str, log: Path | None = None) -> Path:
    """Writes ``data`` as JSON to ``path`` (``write_file``), else to a file in
    the working (or the temporary) directory, saying so on stderr; returns
    where it went."""
    text = json.dumps(data, indent=2) + "\n"
    try:
        write_file(path, text.encode())
        return path
    except OSError as e:
        error = e
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        try:
            fd, name = tempfile.mkstemp(
                prefix=f"{path.stem}.", suffix=path.suffix or ".json", dir=folder
            )
            _write_new(fd, name, text.encode())
        except OSError:
            continue
        also = f"; the episode log {log} holds its episodes too" if log else ""
        print(
            f"jaxmesh {command}: error: cannot write {str(path)!r} "
            f"({error.strerror or error}); the result is in {name} instead{also}",
            file=sys.stderr,
        )
        return Path(name)
    raise error


def episode_log_path(args: argparse.Namespace, config: dict[str, Any]) -> Path | None:
    """Where ``eval`` streams its episodes: ``--episode-log PATH``, else next to
    the output JSON (None: ``--no-episode-log``, or no output).

    Raises:
      ConfigError: the path is the output JSON or the config itself.
    """
    if getattr(args, "no_episode_log", False):
        return None
    given = getattr(args, "episode_log", None)
    output = config.get("output")
    if given is not None:
        path = Path(given)
    elif output:
        path = Path(output).with_suffix(EPISODE_LOG_SUFFIX)
    else:
        return None
    for name, other in (("the config", args.config), ("output", output)):
        if other and path.resolve() == Path(other).resolve():
            raise ConfigError(
                f"--episode-log {str(path)!r} is {name} file {str(other)!r}; the "
                "log would overwrite it: pass another path, e.g. --episode-log "
                "run.episodes.jsonl"
            )
    return path


def video_path(given: Any, config: dict[str, Any]) -> Path | None:
    """Where ``eval --video`` writes the videos (without a path: next to the
    output JSON, else ``video.mp4``), checked before the run.

    Raises:
      ConfigError: imageio (or imageio-ffmpeg for a non-GIF) is missing.
    """
    if given is None:
        return None
    if given is VIDEO_NEXT_TO_OUTPUT:
        output = config.get("output")
        path = Path(output).with_suffix(".mp4") if output else Path("video.mp4")
    else:
        path = Path(given)
    need = ["imageio"] + ([] if path.suffix.lower() == ".gif" else ["imageio_ffmpeg"])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"--video {str(path)!r} needs {', '.join(missing)}, which is not "
            "installed; run: pip install 'jaxmesh[video]'"
        )
    return path


def report_path(given: Any, config: dict[str, Any], config_path: str) -> Path | None:
    """Where ``eval --report`` writes the report (alone: next to the output
    JSON, else ``report.html``), checked before the run.

    Raises:
      ConfigError: matplotlib is missing, or the path is the config's or the
        JSON's own (the report would overwrite it).
    """
    if given is None:
        return None
    need_matplotlib("--report")
    if given is REPORT_NEXT_TO_OUTPUT:
        output = config.get("output")
        path = Path(output).with_suffix(".html") if output else Path("report.html")
    else:
        path = Path(given)
    for name, other in (("the config", config_path), ("output", config.get("output"))):
        if other and path.resolve() == Path(other).resolve():
            raise ConfigError(
                f"--report {str(path)!r} is {name} file {str(other)!r}; the report "
                "would overwrite it: pass another path, e.g. --report report.html"
            )
    return path


def need_matplotlib(what: str) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            f"{what} needs matplotlib, which is not installed; run: pip install "
            "'jaxmesh[report]'"
        )
