"""The hooks the commands run with: the progress bar (which marks a started
run), the episode log and its start, a suite's saver."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from jaxmesh.cli.outputs import write_file
from jaxmesh.results.summary import short_env
from jaxmesh.run.resume import EpisodeLog
from jaxmesh.suite import SuiteResult


class Progress:
    """A tqdm bar on stderr: episodes done of the budget (from ``initial``, a
    resumed run's), and env steps/s from the first finished episode (compile
    time left out). ``where``: the run's ``lanes_where``, once started.

    ``started`` marks the end of ``evaluate``'s checks: an error before
    ``on_run_start`` is bad input, one after a failure of the run. In a suite,
    ``finished`` names the tasks done, and each task's run starts anew."""

    def __init__(self, enabled: bool = True, stream: Any = None, initial: int = 0):
        self.enabled, self.initial = enabled, initial
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None
        self.steps = 0
        self.t_first: float | None = None
        self.steps_first = 0
        self.where: str | None = None
        self.started = False
        self.finished: list[str] = []

    def on_task_end(self, name: str, result: Any) -> None:
        self.finished.append(name)
        self.started = False

    def on_run_start(self, info: dict) -> None:
        self.started = True
        desc = f"{info.get('policy', '')} on {short_env(info.get('env', ''))}"
        self.where = info.get("lanes_where")
        if self.where and self.where != "this process":
            desc += f" ({self.where})"
        self.bar = tqdm(
            total=info.get("episodes"),
            initial=self.initial,
            desc=desc,
            unit="ep",
            file=self.stream,
            disable=not self.enabled,
            dynamic_ncols=True,
        )

    def on_episode_end(self, ep: Any) -> None:
        now = time.perf_counter()
        self.steps += int(ep.length)
        if self.t_first is None:
            self.t_first, self.steps_first = now, self.steps
        elif now > self.t_first:
            rate = (self.steps - self.steps_first) / (now - self.t_first)
            self.bar.set_postfix_str(f"{rate:,.0f} env steps/s", refresh=False)
        self.bar.update(1)

    def on_fault(self, info: dict) -> None:
        """A lost or rejoined server, or a lost worker: a line on stderr."""
        event = info.get("event")
        if event == "lost":
            line = (
                f"jaxmesh: lost the env server {info.get('server')} "
                f"({info.get('error')}); its {info.get('lanes')} lanes are out and "
                f"{info.get('episodes_rerun')} unfinished episodes run again on "
                "the other servers"
            )
        elif event == "rejoined":
            line = f"jaxmesh: the env server {info.get('server')} is back"
        elif event == "worker lost":
            line = (
                f"jaxmesh: a worker process died; {len(info.get('episodes_rerun', []))}"
                " unfinished episodes run again on a new one"
            )
        else:
            line = f"jaxmesh: {info}"
        if self.bar is not None and self.enabled:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream)

    def on_run_end(self, result: Any) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"{result.steps_per_second:,.0f} env steps/s", refresh=False
            )
            self.bar.close()


class CommandLog(EpisodeLog):
    """The ``EpisodeLog`` of a command's run of ``policy``: its first run
    start makes the log's folder and, for a new run (``fresh``; a resumed one
    appends), empties it (eval says so on stderr when it held episodes)."""

    def __init__(
        self, path: Path, policy: Any, config: dict, fresh: bool, command: str
    ):
        super().__init__(
            path,
            params=getattr(policy, "params", None),
            max_episode_steps=config.get("max_episode_steps"),
            on_error=lambda text: print(
                f"jaxmesh {command}: warning: {text}", file=sys.stderr
            ),
        )
        self.fresh, self.note = fresh, command == "eval"

    def on_run_start(self, info: dict) -> None:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            self.fresh = False
            if self.note and path.is_file() and path.stat().st_size:
                print(
                    f"jaxmesh eval: note: starting the episode log {path} afresh "
                    f"(--resume {path} continues the run it holds)",
                    file=sys.stderr,
                )
            path.write_text("", encoding="utf-8")
        super().on_run_start(info)


class SuiteSaver:
    """Writes a suite's output JSON after every task, so that a failed run
    keeps the tasks it finished (``--resume`` continues it)."""

    def __init__(self, path: Path, earlier: Any):
        self.path = path
        self.tasks = dict(getattr(earlier, "tasks", None) or {})

    def on_task_end(self, name: str, result: Any) -> None:
        self.tasks[name] = result
        text = json.dumps(SuiteResult(dict(self.tasks)).to_dict(), indent=2)
        write_file(self.path, f"{text}\n".encode())  # whole or not at all
