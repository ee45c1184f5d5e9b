"""The command line's two errors: bad input (exit 2) and Ctrl-C (exit 130;
SIGTERM 143)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from jaxmesh.trace import redact_text, secret_values


class ConfigError(Exception):
    """A run config (or a command's argument) is wrong; exit status 2."""


class Interrupted(Exception):
    """A run stopped by Ctrl-C, its message already printed: exit ``status``
    130 (128 + SIGINT), as a shell reports it, or 143 after SIGTERM."""

    def __init__(self, status: int = 130):
        super().__init__(status)
        self.status = status


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C's ``KeyboardInterrupt`` is, so that the run
    stops the same way (``terminating``)."""


@contextlib.contextmanager
def terminating() -> Iterator[None]:
    """Within (in the main thread): SIGTERM raises ``Terminated``. The
    handler before is restored after."""
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


def _raised_by(exc: BaseException, module: str) -> bool:
    """Whether ``exc`` is one of ``module``'s exceptions (nothing imported)."""
    return any(cls.__module__.startswith(module) for cls in type(exc).__mro__)


def bad_input(exc: BaseException) -> str | None:
    """What to say of an error raised before a run started that is bad input
    (flax's shape errors at the probe, gymnasium's errors making the env);
    None for any other error."""
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
    """``evaluate``'s refusal of a config, with no secret of it in the text.

    A suite's refusal names its task (``task``), else all of its tasks."""
    tasks = config.get("tasks")
    if tasks is None:
        where = f"env {config['env']!r}"
    elif task is not None and task in tasks:
        where = f"task {task!r} (env {tasks[task]['env']!r})"
    else:
        where = f"tasks {list(tasks)}"
    text = f"policy {config['policy']!r} on {where}: {error}"
    return redact_text(text, secret_values(config))
