"""Resuming a run: ``evaluate(..., resume=result)`` runs only the episodes that
``result`` lacks, after checking it is the same run, and returns the whole
budget; and the episode log it reads (docs/cli.md, "Episode logs and ``--resume``").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import stat
import types
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxmesh.core.policy import resolve_policy
from jaxmesh.core.tally import EPISODE_FIELDS
from jaxmesh.results.result import (
    SETTINGS,
    SUCCESS_KINDS,
    RunResult,
    flags_array,
    headline,
    identity_text,
    record_check,
    select,
)
from jaxmesh.run import checks, identity
from jaxmesh.run.backend import SERVED, Target
from jaxmesh.run.stream import hooks_list

if TYPE_CHECKING:
    from jaxmesh.run.config import RunConfig


params_digest = identity.params_digest


def fingerprint(max_episode_steps: Any, params: Any = None, digest: bool = False):
    """The fingerprint fields only the caller knows: the cap and the params'."""
    out: dict = {"max_episode_steps": max_episode_steps}
    if digest:
        out["params"] = params_digest(params)
    return out


def _differs(what: str, before: Any, now: Any) -> ValueError:
    return ValueError(
        f"resume=: the earlier run had {what} {before!r}, this call {now!r}; a run "
        "resumes only with the same policy, params, env and settings (pass the "
        "same ones, or start a new run without resume=)"
    )


def _compare(done: RunResult, now: dict) -> None:
    before = {k: getattr(done, k, None) for k in now}
    before["metrics"] = dict(done.metric_reductions)
    for what, value in now.items():
        if what == "success_mode" and done.success_key is None:
            continue  # without a success signal the headline is moot
        if before[what] != value:
            raise _differs(what, before[what], value)


_WHAT_CHANGED = {
    "env": "its code, config or params changed (env_config, an env object built "
    "with other params), or it is another env of that name",
    "policy": "its code or a constant it closes over changed, or it is another "
    "function or model of the same name",
}


#: What a resumed run compares with the earlier one, in this order.
_COMPARED = ("policy", "env", "horizon", "prefetch_lead", "delay", "execution")
_COMPARED += ("max_episode_seconds", "metrics", "trial_index_base")
_COMPARED += ("success_mode", "instruction")


def _check_run(done: RunResult, info: dict) -> None:
    """A resumed run's ``on_run_start``: the run, once built, against ``done``."""
    zero = ("delay", "trial_index_base")
    now = {k: info.get(k, 0 if k in zero else None) for k in _COMPARED}
    now["metrics"] = info.get("metric_reductions")
    _compare(done, now)
    before, now = done.fingerprint or {}, info.get("fingerprint") or {}
    for key in ("env", "policy"):
        if before.get(key) == now.get(key):
            continue
        name = done.env if key == "env" else done.policy
        text = (
            f"resume=: the earlier run's {key} {name!r} is not this call's "
            f"(digest {str(before.get(key))[:12]} before, "
            f"{str(now.get(key))[:12]} now): {_WHAT_CHANGED[key]}"
        )
        if key == "policy" and before.get("jax") != now.get("jax"):
            text += (
                f" (the earlier run traced it with JAX {before.get('jax')}, this "
                f"call with JAX {now.get('jax')}: another JAX version may trace "
                "the same code to another program)"
            )
        raise ValueError(
            text + f"; resume with the {key} the earlier run had, or start a new "
            "run without resume= (jaxmesh eval: without --resume)"
        )


#: The hook methods a resumed run renumbers (``on_run_end``: ``merged``'s).
_RENUMBERED = ("on_run_start", "on_episode_end", "on_step", "on_fault")


class _Renumbered:
    """A user hook seen through a resumed run: the budget's episode indices."""

    def __init__(self, hook: Any, indices: np.ndarray, budget: int):
        self.hook, self.indices, self.budget = hook, indices, budget
        self.on_fault = getattr(hook, "on_fault", None)  # as it is
        for name in _RENUMBERED:
            if not callable(getattr(hook, name, None)):
                setattr(self, name, None)

    def on_run_start(self, info: dict) -> None:
        self.hook.on_run_start({**info, "episodes": self.budget})

    def on_episode_end(self, ep: Any) -> None:
        self.hook.on_episode_end(ep._replace(index=int(self.indices[ep.index])))

    def on_step(self, event: Any) -> None:
        self.hook.on_step(event._replace(episode=int(self.indices[event.episode])))


def missing_episodes(
    done: RunResult, seeds: np.ndarray, max_episode_steps: Any, digest: str | None
) -> np.ndarray:
    """The budget indices ``done`` lacks, once it is shown to be of this budget."""
    if not isinstance(done, RunResult):
        raise TypeError(
            f"resume={type(done).__name__}: expected a jaxmesh.RunResult (an "
            "exception's partial_result, RunResult.from_dict(json) or "
            "jaxmesh.load_episode_log(path))"
        )
    idx = np.asarray(done.indices, np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= seeds.size):
        raise ValueError(
            f"resume=: the earlier run holds episode {int(idx.max())}, this budget "
            f"has {seeds.size} episodes; pass the earlier run's seeds or episodes"
        )
    wrong = np.flatnonzero(np.asarray(done.seeds, np.int64) != seeds[idx])
    if wrong.size:
        i = int(idx[wrong[0]])
        raise _differs(
            f"seed for episode {i}", int(done.seeds[wrong[0]]), int(seeds[i])
        )
    before = done.fingerprint or {}
    if "policy" not in before or "env" not in before:
        raise ValueError(
            "resume=: the earlier run records no identity of its policy and env "
            "(written by an older jaxmesh, or built by hand), so its episodes "
            "cannot be shown to be theirs; start a new run without resume= "
            "(jaxmesh eval: without --resume)"
        )
    cap = before.get("max_episode_steps", max_episode_steps)
    if cap != max_episode_steps:
        raise _differs("max_episode_steps", cap, max_episode_steps)
    if None not in (before.get("params"), digest) and before["params"] != digest:
        raise _differs("params (digest)", before["params"], digest)
    return np.setdiff1d(np.arange(seeds.size, dtype=np.int64), idx)


_DISAGREE = "two records of one episode disagree: remove the wrong one"
_EDITED = (
    "a record edited by hand, or copied from another run, is not resumed from: "
    "restore the run's own record, or remove it (its episode then runs again)"
)


def checked_records(done: RunResult) -> RunResult:
    """``done`` with its records verified, an exact repeat dropped; a ValueError
    names the first bad one (its file line when known)."""
    issues = done.record_issues
    bad = [x for x in issues if x[2] != "same"]
    if bad:
        position, index, what = bad[0]
        lines, source = done._record_lines, done._source
        where = f"episodes[{position}]"
        if source is not None and lines is not None and position < len(lines):
            where = f"{source}:{lines[position]}"
        hint = _DISAGREE if what.startswith("repeats") else _EDITED
        raise ValueError(
            f"resume=: {where}: the record of episode {index} {what}; {hint}"
        )
    if not issues:
        return done
    keep = np.setdiff1d(np.arange(done.num_episodes), [x[0] for x in issues])
    # The issues and lines were of the entries before the selection.
    return select(done, keep, _record_issues=[], _record_lines=None)


def merge(done: RunResult, new: RunResult, indices: np.ndarray) -> RunResult:
    """``done``'s episodes and ``new``'s (episode k is budget episode
    ``indices[k]``), by index; ``done``'s steps are its episodes' lengths (its
    unfinished ones ran again), and ``resumed_part`` is ``new``'s share."""
    at = np.concatenate([np.asarray(done.indices, np.int64), indices[new.indices]])
    order = np.argsort(at, kind="stable")

    def cat(a: Any, b: Any) -> np.ndarray:
        return np.concatenate([np.asarray(a), np.asarray(b)])[order]

    fields = {
        f: cat(getattr(done, f), getattr(new, f)) for f in ("seeds", *EPISODE_FIELDS)
    }

    def flags(r: RunResult, kind: str) -> list:
        values = getattr(r, kind)
        return [None] * r.num_episodes if values is None else list(values)

    kinds = {k: flags_array(cat(flags(done, k), flags(new, k))) for k in SUCCESS_KINDS}
    metrics = {
        k: cat(done.metrics[k], v) for k, v in new.metrics.items() if k in done.metrics
    }
    return dataclasses.replace(
        new,
        indices=at[order],
        **fields,
        success=headline(
            new.success_mode, kinds["success_once"], kinds["success_at_end"]
        ),
        **kinds,
        metrics=metrics,
        env_steps=int(np.sum(np.asarray(done.lengths, np.int64))) + new.env_steps,
        **{k: getattr(done, k) + getattr(new, k) for k in ("policy_rows", *_TIMES)},
        num_envs=max(done.num_envs, new.num_envs),
        server_losses=list(done.server_losses) + list(new.server_losses),
        fingerprint={**(done.fingerprint or {}), **(new.fingerprint or {})},
        resumed_part={
            "episodes": new.num_episodes,
            "env_steps": new.env_steps,
            "run_time": new.run_time,
        },
    )


def _params_of(policy: Any, params: Any) -> Any:
    """``params=``, else a Model's own."""
    return params if params is not None else getattr(policy, "params", None)


@contextlib.contextmanager
def fingerprinting(
    policy: Any, config: RunConfig, call: dict
) -> Iterator[Callable[[RunResult], RunResult]]:
    """Within: the run learns the fingerprint fields only its caller knows.
    Yields ``stamp``, which records them on a result; a failure's
    ``partial_result`` is stamped too, and its episode logs get what they lack."""
    params = _params_of(policy, call.get("params"))
    fields = fingerprint(config.max_episode_steps, params, digest=True)

    def stamp(result: RunResult) -> RunResult:
        return dataclasses.replace(
            result, fingerprint={**fields, **(result.fingerprint or {})}
        )

    with _on_partial(call.get("hooks"), stamp), identity.evaluating(fields):
        yield stamp


@contextlib.contextmanager
def _on_partial(hooks: Any, fix: Callable, ran: Callable = lambda p: p.episodes):
    """A failure's ``partial_result`` becomes ``fix(partial)``; the episode logs
    in ``hooks`` get the episodes ``ran(partial)`` they lack, and the totals."""
    try:
        yield
    except BaseException as exc:
        partial = getattr(exc, "partial_result", None)
        if isinstance(partial, RunResult):
            exc.partial_result = fix(partial)
            for log in hooks_list(hooks):
                if isinstance(log, EpisodeLog):
                    with contextlib.suppress(OSError):
                        log.flush(ran(partial), exc.partial_result)
        raise


def _check_complete(
    done: RunResult, policy: Any, target: Target, config: RunConfig, call: dict
) -> None:
    """For a result of the whole budget: compares what is known without
    building the run (settings, the policy's name, the env's unless served)."""
    d = config.to_dict()  # an ensemble by its description
    # A delay in milliseconds is compared as given (its steps need the env).
    delay = "delay" if d["delay_ms"] is None else "delay_ms"
    keys = ("horizon", "prefetch_lead", delay, "execution", "max_episode_seconds")
    now = {k: d[k] for k in (*keys, "trial_index_base", "success_mode", "instruction")}
    with contextlib.suppress(TypeError, ValueError):
        with_params = call.get("params") is not None
        now["policy"] = resolve_policy(policy, with_params=with_params).name
    if isinstance(target.name, str) and target.kind != SERVED:
        now["env"] = target.name
    _compare(done, now)


class Resumption:
    """``evaluate(..., resume=done)`` around the run it makes (``done=None``:
    the run as asked): the constructor checks ``done`` and works out the run of
    the episodes it lacks (``config``, ``call``; an empty run, which still
    compares the identities, when it lacks none), made inside ``running()``;
    ``merged`` gives the whole budget."""

    def __init__(
        self,
        done: RunResult | None,
        policy: Any,
        target: Target,
        config: RunConfig,
        call: dict,
    ):
        self.done, self.config, self.call = done, config, call
        if done is None:
            return
        if call.get("record") is not None:
            raise ValueError(
                "resume= with record=: the recorded episodes are named by budget "
                "index; resume without record=, then record the episodes you want "
                "in a run of their own"
            )
        seeds = np.asarray(
            checks.resolve_budget(call.get("episodes"), call.get("seeds")), np.int64
        )
        digest = params_digest(_params_of(policy, call.get("params")))
        self.missing = missing_episodes(done, seeds, config.max_episode_steps, digest)
        self.done = checked_records(done)
        self.user_hooks = hooks_list(call.get("hooks"))
        check = types.SimpleNamespace(on_run_start=functools.partial(_check_run, done))
        if not self.missing.size:
            _check_complete(self.done, policy, target, config, call)
            self.call = {**call, "episodes": 0, "seeds": None, "hooks": [check]}
            return
        tile = config.layout.plan_tile
        if tile is not None and done.plan_tile and tile != done.plan_tile:
            raise _differs("plan_tile", done.plan_tile, tile)
        self.call = {
            **call,
            "episodes": None,
            "seeds": seeds[self.missing].tolist(),
            "hooks": [check]
            + [
                _Renumbered(h, self.missing, int(seeds.size))
                for h in self.user_hooks
                if any(callable(getattr(h, name, None)) for name in _RENUMBERED)
            ],
        }
        # The rows a policy call sees: each episode rounds as it did before.
        self.config = config.replace(plan_tile=done.plan_tile or tile)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Within: the run of the missing episodes; a failure's result is merged."""
        if self.done is None or not self.missing.size:
            yield
            return
        renumbered = lambda p: [
            e._replace(index=int(self.missing[e.index])) for e in p.episodes
        ]
        fix = lambda p: merge(self.done, p, self.missing)
        with _on_partial(self.user_hooks, fix, renumbered):
            with identity.resumed_indices(self.missing):
                yield

    def merged(self, new: RunResult) -> RunResult:
        """The whole budget, which the user's ``on_run_end`` hooks get."""
        if self.done is None:
            return new
        if self.missing.size:
            result = merge(self.done, new, self.missing)
        else:
            result = dataclasses.replace(self.done)
        for h in self.user_hooks:
            if callable(getattr(h, "on_run_end", None)):
                h.on_run_end(result)
        return result


#: The first key of a log's run line (and its format's version).
LOG_KEY = "jaxmesh_episode_log"
#: A run line: the settings as a result writes them, the starts after the scoring.
_LATER = ("asynchronous", "trial_index_base", "instruction")
_RUN_KEYS = ("policy", "env", *(k for k in SETTINGS if k not in _LATER))
_RUN_KEYS += ("metric_reductions", "success_key", "success_mode", *_LATER[1:])
_RUN_KEYS += ("episodes",)


_TIMES = ("wall_time", "compile_time", "run_time")
_LOG_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class EpisodeLog:
    """A hook that appends each finished episode to a JSON-lines file, one
    flushed line each (docs/evaluation.md, "Episode logs"), which
    ``load_episode_log`` reads back for ``resume=``.

    Args:
      path: the file (created, or appended to).
      params: the params evaluated, for a log of runs not made by ``evaluate``
        (which records their digest itself); None: not recorded here.
      max_episode_steps: the run's cap, recorded likewise.
      on_error: called with one line of text when the log cannot be written;
        None: a ``RuntimeWarning`` with that text.
    """

    def __init__(
        self,
        path: Any,
        *,
        params: Any = None,
        max_episode_steps: Any = None,
        on_error: Callable[[str], None] | None = None,
    ):
        self.path = os.fspath(path)
        self.fp = fingerprint(max_episode_steps, params, digest=params is not None)
        self._fd: int | None = None
        self._identity = identity_text(self.fp)
        self.on_error = on_error
        #: The episode indices this log wrote (in this process).
        self.written: set[int] = set()
        #: The error that stopped the log (None: every line was written).
        self.error: OSError | None = None

    def _write(self, record: dict) -> bool:
        """Appends ``record`` as one line; False when the log cannot be written."""
        if self.error is not None:
            return False
        data = (json.dumps(record, allow_nan=True) + "\n").encode()
        start = None
        try:
            if self._fd is None:
                self._fd = os.open(self.path, _LOG_FLAGS, 0o666)
                size = os.fstat(self._fd).st_size
                # A line cut short by a killed run ends here.
                if size and os.pread(self._fd, 1, size - 1) != b"\n":
                    data = b"\n" + data
            start = os.lseek(self._fd, 0, os.SEEK_END)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as e:
            self._stop(e, start)
            return False
        return True

    def _stop(self, error: OSError, start: int | None) -> None:
        """After a failed write: takes the cut line back, closes, says so once."""
        self.error = error
        removed = False
        if self._fd is not None:
            with contextlib.suppress(OSError):
                held = os.fstat(self._fd)
                if start is not None and stat.S_ISREG(held.st_mode):
                    os.ftruncate(self._fd, start)
                    # Nothing written at all: no empty file is left behind.
                    if not start and os.path.samestat(os.lstat(self.path), held):
                        os.unlink(self.path)
                        removed = True
        self.close()
        held = (
            "nothing was written to it, so it was removed"
            if removed
            else f"it holds the {len(self.written)} episodes written before"
        )
        text = (
            f"the episode log {self.path} cannot be written "
            f"({error.strerror or error}); {held}, and the run goes on without "
            "it (its result holds every episode)"
        )
        if self.on_error is None:
            warnings.warn(text, RuntimeWarning, stacklevel=4)
        else:
            self.on_error(text)

    def on_run_start(self, info: dict) -> None:
        run_info = {k: info.get(k) for k in _RUN_KEYS}
        fp = {**self.fp, **(info.get("fingerprint") or {})}
        self._identity = identity_text(fp)
        self._write({LOG_KEY: 1, "run": run_info, "fingerprint": fp})

    def on_episode_end(self, ep: Any) -> None:
        d = ep.to_dict()
        d["check"] = record_check(d, self._identity)
        if self._write({"episode": d}):
            self.written.add(int(ep.index))

    def on_fault(self, info: dict) -> None:
        self._write({"fault": info})

    def on_run_end(self, result: Any) -> None:
        keys = ("env_steps", "policy_rows", *_TIMES)
        self._write({"totals": {k: getattr(result, k) for k in keys}})
        self.close()

    def flush(self, episodes: list, result: Any) -> None:
        """After a failure: the ``episodes`` not written yet, the totals, closed."""
        if self._fd is None and not self.written and self.error is None:
            return  # the run never started: the log is left as it was
        for ep in episodes:
            if int(ep.index) not in self.written:
                self.on_episode_end(ep)
        self.on_run_end(result)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


#: A log's settings that a falsy value leaves at these.
_LOG_DEFAULTS = {"num_envs": 0, "horizon": 1, "effective_horizon": 1}
_LOG_DEFAULTS |= {"prefetch_lead": 0, "delay": 0, "plan_tile": 0, "trial_index_base": 0}


def load_episode_log(path: Any) -> RunResult:
    """An episode log (``EpisodeLog``) as a ``RunResult`` for ``resume=``: the
    first run line's settings and identity, the episodes by index (a line cut
    short by a killed run skipped, an exact repeat counted once), the last
    totals plus the episodes after them (a lower bound).

    Raises:
      ValueError: not an episode log; runs of other settings or identities in
        one file; an episode line that fails its checksum, or two lines of one
        episode that disagree (naming the file line and the episode).
    """
    path = os.fspath(path)
    runs: list[dict] = []
    episodes: dict[int, tuple[int, dict]] = {}  # by index, with their line
    faults: list[dict] = []
    totals: dict | None = None
    after: list[dict] = []  # the episodes after the last totals line
    run_identity, checked = "", False
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            later = [x for x in lines[n:] if x.strip()]
            if not later or LOG_KEY in later[0]:  # cut short, then resumed
                continue
            raise ValueError(
                f"{path}:{n} is not JSON; an episode log (jaxmesh.EpisodeLog, "
                "jaxmesh eval --episode-log) holds one JSON object per line"
            ) from None
        if not isinstance(rec, dict):
            raise ValueError(
                f"{path}:{n}: not a JSON object; an episode log holds one per line"
            )
        if LOG_KEY in rec:
            fp = rec.get("fingerprint") or {}
            if runs and _identity_of(fp) != _identity_of(runs[0].get("fingerprint")):
                raise ValueError(
                    f"{path}:{n}: this run line's identity (env, policy, params, "
                    "max_episode_steps) is not the first run line's; one log "
                    "holds one run and its resumptions: split the file"
                )
            first, run = (runs[0] if runs else rec)["run"], rec["run"]
            for key in (*_COMPARED[:6], "plan_tile"):
                if run.get(key) != first.get(key):
                    raise ValueError(
                        f"{path}:{n}: the log holds runs with {key} "
                        f"{first.get(key)!r} and {run.get(key)!r}; one log holds "
                        "one run (and its resumptions)"
                    )
            runs.append(rec)
            run_identity = identity_text(fp)
            checked = "policy" in fp and "env" in fp
        elif "episode" in rec and runs:
            ep = rec["episode"]
            index = int(ep["index"])
            if checked and ep.get("check") != record_check(ep, run_identity):
                what = "has no checksum" if "check" not in ep else "fails its checksum"
                raise ValueError(
                    f"{path}:{n}: the record of episode {index} {what} (its fields "
                    f"or its run's identity were changed); {_EDITED}"
                )
            if index in episodes:
                first_line, seen = episodes[index]
                if seen != ep:
                    raise ValueError(
                        f"{path}:{n}: episode {index} is also on line {first_line} "
                        f"with other fields; {_DISAGREE}"
                    )
                continue  # the same record twice: once
            episodes[index] = (n, ep)
            after.append(ep)
        elif "fault" in rec:
            faults.append(rec["fault"])
        elif "totals" in rec:
            totals, after = rec["totals"], []
    if not runs:
        raise ValueError(
            f"{path} has no run line; expected an episode log written by "
            "jaxmesh.EpisodeLog (jaxmesh eval --episode-log)"
        )
    # Checked above, line by line: from_dict checks nothing again.
    eps = [
        {k: v for k, v in episodes[i][1].items() if k != "check"}
        for i in sorted(episodes)
    ]
    result = records_result(runs[0]["run"], eps, totals, after, faults)
    return dataclasses.replace(result, fingerprint=runs[0].get("fingerprint"))


def records_result(
    run: dict,
    eps: list[dict],
    totals: dict | None = None,
    after: list[dict] | None = None,
    losses: list | None = None,
    **settings: Any,
) -> RunResult:
    """A ``RunResult`` of a run line (or ``on_run_start`` info) and episode
    records: ``totals`` plus the episodes ``after`` them (None: all; times 0
    without totals); ``settings`` override the run line's."""
    base, after = totals or {}, eps if after is None else after
    return RunResult.from_dict(
        {
            "policy": run.get("policy") or "",
            "env": run.get("env") or "",
            "settings": {
                **{k: run.get(k) for k in SETTINGS},  # from_dict skips asynchronous
                **{k: run.get(k) or v for k, v in _LOG_DEFAULTS.items()},
                "metrics": run.get("metric_reductions") or {},
                "success_key": run.get("success_key"),
                # A log written before the mode was recorded: the rule of the time.
                "success_mode": run.get("success_mode") or "end",
                **settings,
            },
            "totals": {
                "env_steps": int(base.get("env_steps", 0))
                + sum(int(e["length"]) for e in after),
                "policy_rows": int(base.get("policy_rows", 0))
                + sum(int(e["predict_calls"]) for e in after),
                "steps_per_second": 0.0,
                **{k: float(base.get(k, 0.0)) for k in _TIMES},
            },
            "episodes": eps,
            "server_losses": losses or [],
        }
    )


def _identity_of(fp: Any) -> tuple:
    fp = fp if isinstance(fp, dict) else {}
    return tuple(fp.get(k) for k in ("env", "policy", "params", "max_episode_steps"))


def load_results(path: Any) -> RunResult:
    """A results JSON (``jaxmesh eval``'s) for ``resume=``:
    ``RunResult.from_dict``, with each episode's file line for messages."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    result = RunResult.from_dict(json.loads(text))
    # Each entry's line: where its "index" key is, in order, after "episodes".
    start = text.find('"episodes"')
    at = [m.start() for m in re.finditer('"index"', text)] if start >= 0 else []
    at = [p for p in at if p > start][: result.num_episodes]
    lines = [text.count("\n", 0, p) + 1 for p in at]
    return dataclasses.replace(result, _source=path, _record_lines=lines)
