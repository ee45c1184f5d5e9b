"""``jaxmesh eval``: run a config, print the summary, write the results."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jaxmesh
from jaxmesh.cli.build import build_run, close
from jaxmesh.cli.cache import use_compile_cache
from jaxmesh.cli.checks import check_record_config, read_config
from jaxmesh.cli.config import read_resume
from jaxmesh.cli.errors import (
    ConfigError,
    bad_input,
    refused,
    resume_refused,
    stopped,
    terminating,
)
from jaxmesh.cli.hooks import CommandLog, Progress, SuiteSaver
from jaxmesh.cli.outputs import (
    EPISODE_LOG_SUFFIX,
    NEXT_TO_OUTPUT,
    check_writable,
    episode_log_path,
    report_path,
    video_path,
    write_json,
)
from jaxmesh.cli.parser import resume_command
from jaxmesh.cli.results import (
    VideoError,
    video_failed,
    write_report_file,
    write_videos,
)
from jaxmesh.run.cluster import Ray
from jaxmesh.run.resume import (
    LOG_KEY,
    fingerprint,
    load_episode_log,
    load_results,
)
from jaxmesh.suite import SuiteResult


def cmd_eval(args: argparse.Namespace) -> int:
    config = read_config(args.config, args.set)
    use_compile_cache(args.no_compile_cache, "eval")
    report = report_path(args.report, config, args.config)
    suite = config.get("tasks") is not None
    video = video_path(args.video, config)
    if video is not None and config.get("record") is None:
        config["record"] = check_record_config([0])
    earlier = load_resume(args.resume) if args.resume is not None else None
    # A suite keeps no episode log: its output JSON is written after every task.
    log_path = None if suite else episode_log_path(args, config)
    output = Path(config["output"]) if config.get("output") else None
    npz = output.with_suffix(".npz") if output and config.get("record") else None
    check_writable(
        ("output", output),
        ("--episode-log", log_path),
        ("--report", report),
        ("--trace", args.trace),
        ("--video", video),
        ("the recorded episodes' file", npz),
    )
    policy, env, run, kwargs = build_run(config)
    kwargs.update(config=run, trace=args.trace, resume=earlier)
    done = 0 if earlier is None or suite else earlier.num_episodes
    progress = Progress(enabled=not args.no_progress, initial=done)
    hooks: list = [progress]
    if suite and output:
        hooks.append(SuiteSaver(output, earlier))
    log = None
    if log_path is not None:
        log = CommandLog(log_path, policy, config, earlier is None, "eval")
        hooks.append(log)
    params = getattr(policy, "params", None)  # a Model's; a function has none
    steps = config.get("max_episode_steps")
    fp = log.fp if log else fingerprint(steps, params, digest=params is not None)
    kept = lambda e: _kept(args, config, log_path, e, earlier)
    ray = contextlib.nullcontext()
    if isinstance(run.workers, Ray):  # one connection, a suite's tasks share it
        from jaxmesh.run.host.ray_actors import connection  # the [ray] extra

        ray = connection(run.workers)
    try:
        with terminating(), ray:  # SIGTERM stops the run as Ctrl-C does
            result = jaxmesh.evaluate(policy, env, hooks=hooks, **kwargs)
    except KeyboardInterrupt as e:
        raise stopped(args.command, e, kept(e)) from None
    except Exception as e:  # jaxmesh.ParamError is a ValueError
        # Before the run started, a ValueError or TypeError (or flax's or
        # gymnasium's error, bad_input) is a refusal: nothing ran.
        why = e if isinstance(e, ValueError | TypeError) else bad_input(e)
        if progress.started or why is None:
            if progress.started or not isinstance(e, ConfigError):
                e.add_note(kept(e))
            raise
        text = resume_refused(why, args.resume)
        if not suite:
            raise ConfigError(refused(config, text)) from e
        done = progress.finished
        task = next((n for n in config["tasks"] if n not in done), None)
        line = refused(config, text, task if done or earlier is not None else None)
        if done and output:
            line += (
                f" (the tasks finished before it, {done}, are in {config['output']}: "
                f"fix this one, then --resume {config['output']} runs only the rest)"
            )
        elif done:
            line += f" (the tasks finished before it, {done}, are not saved: no output)"
        raise ConfigError(line) from e
    finally:  # a served policy's connections end with the command
        close(policy)
    if not suite:
        # What a later --resume of this result checks: the step cap, the params.
        result = dataclasses.replace(
            result, fingerprint={**(result.fingerprint or {}), **fp}
        )
    print(result.summary())
    if args.telemetry and not suite:
        print(result.format_telemetry())
    if isinstance(run.workers, Ray) and progress.where and not suite:
        print(f"{'lanes stepped by':<28}{progress.where}")
    whole = log is None or log.error is None
    # A log that stopped does not hold the episodes: write_json says so.
    held_log = log_path if whole else None
    saved = None
    if output is not None:
        try:
            saved = write_json(output, result.to_dict(), "eval", held_log)
        except OSError as e:  # a disk full everywhere
            n, held = result.num_episodes, _held(log_path)
            line = (
                f"cannot write {str(output)!r} ({e.strerror or e}), nor a copy in "
                "the working or the temporary folder; "
            )
            if held:
                line += (
                    f"the episode log {log_path} holds {held} of the {n} episodes; "
                    f"to run only the rest: {resume_command(args, config, log_path)}"
                )
            else:
                line += f"the result of its {n} episodes is lost"
            print(f"jaxmesh eval: error: {line}", file=sys.stderr)
            return 1
    status = _write_outputs(args, result, output, saved, held_log, report, video)
    if whole:
        return status
    print(
        f"jaxmesh eval: error: the episode log {log_path} stopped when it could "
        f"not be written ({log.error.strerror or log.error}); the result holds "
        "every episode",
        file=sys.stderr,
    )
    return max(status, 1)


def _write_outputs(
    args: argparse.Namespace,
    result: Any,
    output: Path | None,
    saved: Path | None,
    log_path: Path | None,
    report: Path | None,
    video: Path | None,
) -> int:
    """Writes a finished run's (or suite's) files beside its result JSON
    (``saved``, where ``output`` went), the videos last (a video that cannot be
    rendered never costs the rest); returns 0, or 1 when the JSON went
    elsewhere than ``output`` or a video failed."""
    suite = isinstance(result, SuiteResult)
    base = output.parent if output is not None and not suite else None
    written: list[Path] = []
    if saved is not None:
        written.append(saved)
        print(f"wrote {saved}")
        if getattr(result, "trajectories", None):
            npz = Path(result.save_trajectories(saved.with_suffix(".npz")))
            written.append(npz)
            print(f"wrote {npz}")
    if report is not None:
        write_report_file(result, report, base)
        written.append(report)
    status = 0 if saved is None or saved == output else 1
    if video is None:
        return status
    try:
        write_videos(result, video, base, args.video is not NEXT_TO_OUTPUT)
    except VideoError as e:
        print(f"jaxmesh eval: error: {video_failed(e, written)}", file=sys.stderr)
        return 1
    # The result and its report list the videos.
    if saved is not None:
        write_json(saved, result.to_dict(), "eval", log_path)
    if report is not None:
        write_report_file(result, report, base, announce=False)
    return status


def _kept(
    args: argparse.Namespace,
    config: dict,
    log_path: Path | None,
    exc: Any,
    earlier: Any,
) -> str:
    """Where a stopped run's finished episodes are and how to continue it
    (never raises: the run's own error comes first); ``earlier``: the result
    it resumes."""
    try:
        partial = getattr(exc, "partial_result", None)
        output = Path(config["output"]) if config.get("output") else None
        if isinstance(partial, SuiteResult):
            if output is None:
                return "The finished tasks are not saved (the config has no output)."
            where = write_json(output, partial.to_dict(), args.command)
            return (
                f"The finished tasks and episodes are in {where}; to run only the "
                f"rest: {resume_command(args, config, where)}"
            )
        # Stopped before the run made a result: the resumed run's episodes.
        made = partial if partial is not None else earlier
        n = 0 if made is None else made.num_episodes
        if not n:
            return "No episode had finished: nothing to resume from."
        held = _held(log_path)  # read back: it may have stopped, or hold less
        also = ""
        if log_path is not None and held >= n:
            where = log_path
        elif partial is not None:
            # No log, or one that holds less (it could not be written, or the run
            # resumed a result JSON): the finished episodes go to a file of their
            # own (on a full disk, write_json's fallback in the working directory).
            stem = (
                output.with_suffix(".partial.json") if output else Path("partial.json")
            )
            where = write_json(stem, partial.to_dict(), args.command)
            if log_path is not None:
                also = f" (the episode log {log_path} holds {held})"
        elif earlier is not None:  # stopped before it ran: as the resumed file was
            where = Path(args.resume)
        else:
            return f"{n} episodes had finished; they are not saved (no output)."
        return (
            f"{n} finished episodes are in {where}{also}; to run only the rest: "
            f"{resume_command(args, config, where)}"
        )
    except Exception as e:  # e.g. the partial result cannot be written either
        return f"jaxmesh: the finished episodes could not be saved ({e})."


def _held(log_path: Path | None) -> int:
    """How many episodes the episode log holds, read back (0: none readable)."""
    if log_path is None or not Path(log_path).is_file():
        return 0  # not a regular file (/dev/full reads zeros without end)
    try:
        return load_episode_log(log_path).num_episodes
    except (OSError, ValueError):
        return 0


def load_resume(path: str) -> Any:
    """The earlier run ``eval --resume PATH`` continues, from an episode log or
    a result JSON (ConfigError: neither)."""

    def parse(text: str) -> Any:
        # An episode log's first line names LOG_KEY; a result JSON's is "{".
        if f'"{LOG_KEY}"' in text.lstrip().partition("\n")[0]:
            return load_episode_log(path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"neither an episode log (a first line holding {LOG_KEY!r}) nor "
                f"a result JSON ({e})"
            ) from None
        if isinstance(data, dict) and data.get("suite"):
            return SuiteResult.from_dict(data)
        return load_results(path)  # RunResult.from_dict, with each episode's line

    hint = f"pass the episode log (NAME{EPISODE_LOG_SUFFIX}) or the result JSON"
    return read_resume(path, hint + " of the run to continue", parse)
