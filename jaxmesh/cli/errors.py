"""The command line's errors: bad input (exit 2), a stopped run (130; 143 after
SIGTERM)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from jaxmesh.trace import redact_text, secret_values


class ConfigError(Exception):
    """Bad input (a run config or a command's argument): exit status 2."""


class Interrupted(Exception):
    """A run stopped by Ctrl-C (``status`` 130) or SIGTERM (143), its message
    already printed."""

    def __init__(self, status: int = 130):
        super().__init__(status)
        self.status = status


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is so that the run stops the same way."""


@contextlib.contextmanager
def terminating() -> Iterator[None]:
    """Within (in the main thread), SIGTERM raises ``Terminated``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def stopped(command: str, exc: BaseException, kept: str) -> Interrupted:
    """Says on stderr that Ctrl-C or SIGTERM (``exc``) stopped ``command`` and
    what it ``kept``; returns the ``Interrupted`` to raise."""
    term = isinstance(exc, Terminated)
    how = "terminated (SIGTERM)" if term else "interrupted"
    print(f"jaxmesh {command}: {how}. {kept}", file=sys.stderr)
    return Interrupted(143 if term else 130)


def resume_refused(error: Any, flag: str | None) -> str:
    """``error``'s text, a refusal of ``resume=`` named as ``--resume flag``."""
    text = str(error)
    if flag and text.startswith("resume="):
        return f"--resume {flag}: {text.removeprefix('resume=: ')}"
    return text


def _raised_by(exc: BaseException, module: str) -> bool:
    return any(cls.__module__.startswith(module) for cls in type(exc).__mro__)


def bad_input(exc: BaseException) -> str | None:
    """What to say of an error before a run started that is bad input (flax's
    shape errors at the probe, gymnasium's making the env); else None."""
    what = f"{type(exc).__name__}: {exc}"
    if _raised_by(exc, "flax.errors"):
        return (
            f"the policy's params do not fit this env ({what}); give params "
            "(policy_config, a checkpoint) made for this env's observations and "
            "actions, or the env the policy was made for"
        )
    if _raised_by(exc, "gymnasium.error"):
        return (
            f"gymnasium cannot make the env ({what}); check the id: "
            "gymnasium:<Id> for an env registered with gymnasium, "
            "gymnasium:<module>:<Id> for one that importing <module> registers"
        )
    return None


def refused(config: dict[str, Any], error: Any, task: str | None = None) -> str:
    """``evaluate``'s refusal of a config, secrets out, naming the suite's
    ``task`` (else all its tasks)."""
    tasks = config.get("tasks")
    if tasks is None:
        where = f"env {config['env']!r}"
    elif task is not None and task in tasks:
        where = f"task {task!r} (env {tasks[task]['env']!r})"
    else:
        where = f"tasks {list(tasks)}"
    text = f"policy {config['policy']!r} on {where}: {error}"
    return redact_text(text, secret_values(config))
