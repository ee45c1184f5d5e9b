"""A run's timeline as Chrome-trace / Perfetto JSON (``evaluate(..., trace=path)``):
one named row per part of the run (docs/evaluation.md, "Timeline"). A secret
setting (``is_secret_key``) reads ``"***"`` and its value leaves every string.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Events a trace keeps by default (about 150 MB of JSON at most).
MAX_EVENTS = 1_000_000

#: What a secret setting reads as in a trace (and in messages): given, not shown.
REDACTED = "***"

#: A setting whose name has one of these in it holds a secret (the served
#: token, TLS material).
_SECRET_WORDS = ("token", "secret", "password", "private_key", "credential", "tls_key")

#: ``jaxmesh.remote.protocol.TOKEN_ENV`` (not imported: that needs gRPC).
_TOKEN_ENV = "JAXMESH_TOKEN"

#: The trace of the ``evaluate`` call in progress in this context (None: none).
_CURRENT: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "jaxmesh_trace", default=None
)


def current() -> Trace | None:
    """The trace the ``evaluate`` call in progress writes to, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def tracing(path: Path | None, settings: dict | None = None) -> Iterator[None]:
    """A trace current for the block, written to ``path`` at its end, also on
    an error (None: nothing is traced)."""
    if path is None:
        yield
        return
    trace = Trace()
    token = _CURRENT.set(trace)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        trace.write(path, settings)


@contextlib.contextmanager
def span(name: str, row: str = "run", **args: Any) -> Iterator[None]:
    """A span on the current trace (nothing when there is none)."""
    trace = _CURRENT.get()
    with contextlib.nullcontext() if trace is None else trace.span(name, row, **args):
        yield


class Trace:
    """Spans of one run in ``time.perf_counter`` time; past ``max_events``
    events are counted and dropped."""

    def __init__(self, max_events: int = MAX_EVENTS):
        if not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events={max_events!r}: expected an int >= 1")
        self.max_events = max_events
        self.start = time.perf_counter()
        self.pid = os.getpid()
        self.events: list[dict] = []
        self.dropped = 0
        self._threads: dict[str, int] = {}
        self._lock = threading.Lock()

    def _us(self, t: float) -> float:
        return round((t - self.start) * 1e6, 3)

    def _add(self, name: str, ph: str, row: str, args: dict | None, **at: Any):
        event = {
            "name": name,
            "cat": row.split(" ")[0],
            "ph": ph,
            **at,
            "pid": self.pid,
        }
        with self._lock:  # a row's thread id is made on its first event
            event["tid"] = self._threads.setdefault(row, len(self._threads) + 1)
            if args:
                event["args"] = args
            if len(self.events) < self.max_events:
                self.events.append(event)
            else:
                self.dropped += 1

    def add(self, name: str, begin: float, end: float, row="run", args=None) -> None:
        """A span from ``begin`` to ``end`` (``time.perf_counter`` seconds)."""
        dur = max(0.0, round((end - begin) * 1e6, 3))
        self._add(name, "X", row, args, ts=self._us(begin), dur=dur)

    def instant(self, name: str, t: float, row: str = "run", args=None) -> None:
        """A moment (``"ph": "i"``, thread scope) at ``t``."""
        self._add(name, "i", row, args, s="t", ts=self._us(t))

    @contextlib.contextmanager
    def span(self, name: str, row: str = "run", **args: Any) -> Iterator[None]:
        """Times the ``with`` block as one span (recorded even if it raises)."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, begin, time.perf_counter(), row, args or None)

    def to_json(self, settings: dict | None = None) -> dict:
        """The Trace Event Format object, ``settings`` in ``otherData``,
        secrets redacted everywhere."""

        def meta(what: str, tid: int, **args: Any) -> dict:
            return {"name": what, "ph": "M", "pid": self.pid, "tid": tid, "args": args}

        head = [meta("process_name", 0, name="jaxmesh evaluate")]
        for row, tid in self._threads.items():
            head.append(meta("thread_name", tid, name=row))
            head.append(meta("thread_sort_index", tid, sort_index=tid))
        events = sorted(self.events, key=lambda e: (e["ts"], -e.get("dur", 0)))
        secrets = secret_values(settings)
        if secrets:  # a secret never reaches a shared file, whatever row it is in
            events = _scrub(events, secrets)
        other = {"events": len(self.events), "dropped_events": self.dropped}
        if settings:
            other["settings"] = redact_settings(settings)
        return {
            "traceEvents": head + events,
            "displayTimeUnit": "ms",
            "otherData": other,
        }

    def write(self, path: str | Path, settings: dict | None = None) -> Path:
        """Writes the trace as JSON to ``path`` (parents made); returns the path."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(settings), default=_plain))
        return out


def is_secret_key(name: Any) -> bool:
    """Whether a setting called ``name`` holds a secret (``_SECRET_WORDS``)."""
    return isinstance(name, str) and any(w in name.lower() for w in _SECRET_WORDS)


def secret_values(settings: dict | None = None) -> list[str]:
    """The secret strings of ``settings`` and ``$JAXMESH_TOKEN``, longest
    first, at least 4 characters (shorter ones would garble free text)."""
    found = {
        v
        for k, v in (settings or {}).items()
        if is_secret_key(k) and isinstance(v, str)
    }
    found.add(os.environ.get(_TOKEN_ENV) or "")
    return sorted((v for v in found if len(v) >= 4), key=len, reverse=True)


def redact_text(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """``text`` with every secret in ``secrets`` (and its ``repr``) as ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(repr(secret), REDACTED).replace(secret, REDACTED)
    return text


def _scrub(value: Any, secrets: list[str]) -> Any:
    """``value`` (JSON-like) with the secrets out of every string."""
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {_scrub(k, secrets): _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, secrets) for v in value]
    return value


def redact_settings(settings: dict | None) -> dict:
    """``settings`` with a given secret as ``"***"``, and out of other values."""
    settings = dict(settings or {})
    secrets = secret_values(settings)
    out = {
        k: REDACTED if v is not None and is_secret_key(k) else v
        for k, v in settings.items()
    }
    return _scrub(out, secrets) if secrets else out


def _plain(x: Any) -> Any:
    """numpy scalars and other strays in ``args`` as JSON values."""
    return x.item() if hasattr(x, "item") else str(x)


def check_trace_path(trace: Any) -> Path | None:
    """``evaluate``'s ``trace=`` checked before anything runs (None: no trace).

    Raises:
      TypeError: not a path.
      ValueError: its folder does not exist or is not writable.
    """
    if trace is None:
        return None
    if not isinstance(trace, str | os.PathLike):
        raise TypeError(
            f"trace={trace!r}: expected a file path for the timeline, e.g. "
            "trace='run.trace.json', or None"
        )
    path = Path(trace)
    folder = path.parent if str(path.parent) else Path(".")
    problem = None
    if not folder.is_dir():
        problem = "does not exist; create it first or write the trace elsewhere"
    elif not os.access(folder, os.W_OK):
        problem = "is not writable; write the trace elsewhere"
    if problem:
        raise ValueError(f"trace={str(trace)!r}: the folder {str(folder)!r} {problem}")
    return path


__all__ = [
    "MAX_EVENTS",
    "REDACTED",
    "Trace",
    "check_trace_path",
    "current",
    "is_secret_key",
    "redact_settings",
    "redact_text",
    "secret_values",
    "span",
    "tracing",
]
