"""Where a command's files go, checked before the run so that no result is lost
(nothing here imports JAX: the parser reads these names for its help)."""

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
#: A sweep's result JSON and the file of its cells, each written as it
#: finishes, next to the config's output (a sweep never writes the output).
SWEEP_SUFFIX = ".sweep.json"
SWEEP_CELLS_SUFFIX = ".sweep.cells.jsonl"
#: ``--video`` or ``--report`` given without a path.
NEXT_TO_OUTPUT = object()


def check_writable(*paths: tuple[str, Any]) -> None:
    """Refuses, before the run, each ``(what, path)`` (None: skipped) where a
    file cannot be written; makes the folders."""
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
            with tempfile.NamedTemporaryFile(prefix=".jaxmesh-probe-", dir=p.parent):
                pass
            if p.exists():  # a file there must take writes (not truncated)
                open(p, "a").close()
        except OSError as e:
            why = e.strerror or str(e)
            raise ConfigError(
                f"{what} {str(p)!r} cannot be written ({why}: "
                f"{e.filename or p.parent!s}); {fix}; checked before the run so "
                "that no result is lost"
            ) from None


def _write_new(fd: int, name: str, data: bytes, path: Path | None = None) -> None:
    """Writes ``data`` to the new file ``name`` open as ``fd`` (renamed to
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
    """Writes ``data`` to ``path`` whole or not at all (a new file renamed over
    it); a link or a path that is no regular file in place."""
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


def _beside(given: Any, config: dict[str, Any], suffix: str, default: str) -> Path:
    """``given``; ``NEXT_TO_OUTPUT``: the output with ``suffix`` (else ``default``)."""
    if given is not NEXT_TO_OUTPUT:
        return Path(given)
    output = config.get("output")
    return Path(output).with_suffix(suffix) if output else Path(default)


def _not_over(
    flag: str, path: Path, config_path: Any, output: Any, what: str, example: str
) -> Path:
    """``path``, refused when it is the config's or the output's file."""
    for name, other in (("the config", config_path), ("output", output)):
        if other and path.resolve() == Path(other).resolve():
            raise ConfigError(
                f"{flag} {str(path)!r} is {name} file {str(other)!r}; the {what} "
                f"would overwrite it: pass another path, e.g. {flag} {example}"
            )
    return path


def episode_log_path(args: argparse.Namespace, config: dict[str, Any]) -> Path | None:
    """Where ``eval`` streams its episodes: ``--episode-log PATH``, else next to
    the output JSON (None: ``--no-episode-log``, or no output)."""
    given = getattr(args, "episode_log", None)
    output = config.get("output")
    if getattr(args, "no_episode_log", False) or (given is None and not output):
        return None
    path = Path(given if given is not None else output)
    if given is None:
        path = path.with_suffix(EPISODE_LOG_SUFFIX)
    return _not_over(
        "--episode-log", path, args.config, output, "log", "run.episodes.jsonl"
    )


def video_path(given: Any, config: dict[str, Any]) -> Path | None:
    """Where ``eval --video`` writes the videos (without a path: next to the
    output JSON, else ``video.mp4``); ConfigError: imageio is missing."""
    if given is None:
        return None
    path = _beside(given, config, ".mp4", "video.mp4")
    need = ["imageio"] + ([] if path.suffix.lower() == ".gif" else ["imageio_ffmpeg"])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"--video {str(path)!r} needs {', '.join(missing)}, which is not "
            "installed; run: pip install 'jaxmesh[video]'"
        )
    return path


def report_path(given: Any, config: dict[str, Any], config_path: str) -> Path | None:
    """Where ``eval --report`` writes the report (without a path: next to the
    output JSON, else ``report.html``); ConfigError: matplotlib is missing."""
    if given is None:
        return None
    need_matplotlib("--report")
    path = _beside(given, config, ".html", "report.html")
    output = config.get("output")
    return _not_over("--report", path, config_path, output, "report", "report.html")


def need_matplotlib(what: str) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            f"{what} needs matplotlib, which is not installed; run: pip install "
            "'jaxmesh[report]'"
        )
