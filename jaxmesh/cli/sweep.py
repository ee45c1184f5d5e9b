"""``jaxmesh sweep``: score a config at every (delay, horizon) of a grid, each
finished cell written to a cells file so that ``--resume`` runs only the others.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import jaxmesh
from jaxmesh.cli.build import build_run
from jaxmesh.cli.checks import check_run_config
from jaxmesh.cli.config import apply_overrides, load_config, read_resume
from jaxmesh.cli.errors import ConfigError, refused, stopped
from jaxmesh.cli.outputs import (
    SWEEP_CELLS_SUFFIX,
    SWEEP_SUFFIX,
    check_writable,
    write_json,
)
from jaxmesh.cli.parser import resume_command
from jaxmesh.results.result import RunResult
from jaxmesh.run.resume import params_digest

#: The config keys that may hold a list of values to sweep.
SWEEP_AXES = ("delay", "horizon", "delay_ms")
#: The key of a sweep cells file's first line.
SWEEP_CELLS_KEY = "jaxmesh_sweep_cells"


def cmd_sweep(args: argparse.Namespace) -> int:
    raw = apply_overrides(load_config(args.config), args.set)
    axes = {"delay": 0, "horizon": 1}  # delay_ms: only when given
    axes.update({k: raw.pop(k) for k in SWEEP_AXES if raw.get(k) is not None})
    axes = {k: v if isinstance(v, list) else [v] for k, v in axes.items()}
    config = check_run_config(raw)
    if config.get("tasks") is not None:
        raise ConfigError(
            "jaxmesh sweep with tasks: a sweep runs one env; pick a task with "
            "--set env=..."
        )
    given = Path(config["output"]) if config.get("output") else None
    output = None if given is None else given.with_suffix(SWEEP_SUFFIX)
    cells_path = None if given is None else given.with_suffix(SWEEP_CELLS_SUFFIX)
    hint = (
        f"pass the cells file of the sweep to continue (NAME{SWEEP_CELLS_SUFFIX} "
        "next to its output)"
    )
    # The earlier sweep's config and finished cells.
    earlier = args.resume and read_resume(args.resume, hint, _sweep_cells)
    # The sweep's files go next to the output: its folder is checked through it.
    check_writable(
        ("output", given),
        ("the sweep's output", output),
        ("the sweep's cells file", cells_path),
    )
    policy, env, run, kwargs = build_run(config)
    identity = {
        **{k: v for k, v in config.items() if k != "output" and v is not None},
        **axes,
        "params": params_digest(getattr(policy, "params", None)),
    }
    # As the cells file gives it back: tuples as lists, objects as text.
    identity = json.loads(json.dumps(identity, default=str))
    before, done = earlier or (identity, {})
    for key in sorted(set(before) | set(identity)):
        if before.get(key) != identity.get(key):
            raise ConfigError(
                f"--resume {args.resume!r}: the earlier sweep had {key}="
                f"{before.get(key)!r}, this call {identity.get(key)!r}; a sweep "
                "resumes only with the same config (pass the same one, or start a "
                "new sweep without --resume)"
            )
    cells = None if cells_path is None else SweepCells(cells_path, identity, done)
    try:
        result = jaxmesh.sweep(
            policy,
            env,
            run,
            **axes,
            **kwargs,
            on_cell=None if cells is None else cells.write,
            resume=done or None,
        )
    except KeyboardInterrupt as e:
        kept = "No cell was kept (no output)."
        kept = kept if cells is None else _sweep_kept(args, config, cells)
        raise stopped("sweep", e, kept) from None
    except Exception as e:
        ran = cells is not None and cells.started
        if isinstance(e, ValueError | TypeError) and not ran:  # a refusal
            raise ConfigError(refused(config, e)) from e
        if cells is not None and cells.count:
            e.add_note(_sweep_kept(args, config, cells))
        raise
    finally:
        if cells is not None:
            cells.close()
    print(result.summary())
    if output is not None:
        written = write_json(output, result.to_dict(), "sweep", cells_path)
        print(f"wrote {written}")
        return 0 if written == output else 1
    return 0


class SweepCells:
    """The cells file: a first line with the sweep's config
    (``{"jaxmesh_sweep_cells": 1, "config": {...}}``), then one flushed line
    per finished cell (``{"cell": {"delay", "horizon", "result"}}``)."""

    def __init__(self, path: Path, identity: dict, done: dict):
        self.path, self.identity, self.done = path, identity, dict(done)
        self.file: Any = None
        self.count = 0
        self.started = False

    def _open(self) -> None:
        if not self.done and self.path.is_file() and self.path.stat().st_size:
            print(
                f"jaxmesh sweep: note: starting the cells file {self.path} afresh "
                f"(--resume {self.path} continues the sweep it holds)",
                file=sys.stderr,
            )
        # The head and the resumed cells go in whole (a new file renamed over
        # the old), so that the file never holds fewer cells than before.
        lines = [{SWEEP_CELLS_KEY: 1, "config": self.identity}]
        for (d, h), r in self.done.items():
            lines.append({"cell": {"delay": d, "horizon": h, "result": r.to_dict()}})
        fresh = self.path.with_name(self.path.name + ".new")
        fresh.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
        os.replace(fresh, self.path)
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, delay: int, horizon: int, result: Any) -> None:
        """``jaxmesh.sweep``'s ``on_cell``: one finished cell."""
        self.started = True
        if self.file is None:
            self._open()
        record = {"delay": delay, "horizon": horizon, "result": result.to_dict()}
        self.file.write(json.dumps({"cell": record}) + "\n")
        self.file.flush()
        self.count += 1

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _sweep_kept(args: argparse.Namespace, config: dict, cells: SweepCells) -> str:
    n = cells.count + len(cells.done)
    if not n:
        return "No cell had finished."
    return (
        f"{n} finished cell(s) are in {cells.path}; to run only the rest: "
        f"{resume_command(args, config, cells.path)}"
    )


def _sweep_cells(text: str) -> tuple[dict, dict]:
    """A cells file's sweep config and its finished cells, ``(delay, horizon) ->
    RunResult`` (a last line cut short skipped); ValueError: not a cells file."""
    lines = text.splitlines()
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):  # cut short by a killed sweep
                continue
            raise ValueError(
                f"line {n} is not JSON; expected the cells file of jaxmesh sweep "
                f"(NAME{SWEEP_CELLS_SUFFIX})"
            ) from None
    head = records[0] if records else None
    if not (isinstance(head, dict) and SWEEP_CELLS_KEY in head):
        raise ValueError(
            f"not a sweep's cells file (its first line holds no {SWEEP_CELLS_KEY!r}); "
            f"pass the NAME{SWEEP_CELLS_SUFFIX} file next to the output of the sweep "
            "to continue"
        )
    try:
        cells = {
            (int(c["delay"]), int(c["horizon"])): RunResult.from_dict(c["result"])
            for c in (rec["cell"] for rec in records[1:])
        }
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"a malformed cell ({e})") from e
    return head.get("config") or {}, cells
