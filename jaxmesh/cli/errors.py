"""The command line's two errors: bad input (exit 2) and Ctrl-C (exit 130)."""

from __future__ import annotations

from typing import Any

from jaxmesh.trace import redact_text, secret_values


class ConfigError(Exception):
    """A run config (or a command's argument) is wrong; exit status 2."""


class Interrupted(Exception):
    """A run stopped by Ctrl-C (SIGINT), its message already printed; exit
    status 130 (128 + SIGINT), as a shell reports it."""


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
