"""Resuming a run: ``evaluate(..., resume=result)`` runs only the episodes that
``result`` lacks and returns the whole budget.

Every episode's result depends only on the policy, the env, its seed and the
settings (CONTRACT 4), so the episodes a failed or interrupted run finished
need not run again. ``resume`` takes the earlier ``RunResult`` (an exception's
``partial_result``, ``RunResult.from_dict`` of a results file, or
``load_episode_log`` of a run's episode log), checks that it comes from the
same run, and runs the missing episodes with the earlier run's plan tile (the
rows a policy call sees, so that each episode rounds as it did). Inside that
run, episode ``k`` is budget episode ``missing[k]``: hooks see the budget's
indices, an env that declares ``trial_index`` gets the budget's index
(``episode_indices``), and the result and a failure's ``partial_result`` hold
the earlier episodes and the new ones, by index.

What must match, each refused with a ``ValueError`` naming it: the seeds of the
episodes done (and a budget that holds them); ``max_episode_steps``; the params
when both sides know them (``params_digest``: a result records it when its run
failed, or when asked, as ``jaxmesh eval`` does); and, once the run has built
its env and policy and before any episode starts, the policy's and the env's
names, ``horizon``, ``prefetch_lead``, ``max_episode_seconds``, the metrics
and ``success_mode``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxmesh.core.results import EPISODE_FIELDS
from jaxmesh.execution import Ensemble
from jaxmesh.run.checks import DEFAULT_SUCCESS_MODE
from jaxmesh.run.results import SUCCESS_KINDS, RunResult, flags_array, headline

_INDICES: contextvars.ContextVar = contextvars.ContextVar(
    "jaxmesh_resume_indices", default=None
)


def episode_indices(count: int) -> np.ndarray:
    """The budget index of each of a run's ``count`` episodes: ``0..count-1``,
    or inside a resumed run the missing episodes' indices."""
    got = _INDICES.get()
    return np.arange(count, dtype=np.int64) if got is None else got


@contextlib.contextmanager
def _indices(indices: np.ndarray) -> Iterator[None]:
    token = _INDICES.set(indices)
    try:
        yield
    finally:
        _INDICES.reset(token)


def params_digest(params: Any) -> str | None:
    """A digest of params' structure, dtypes, shapes and values (None: no
    params). Reads every leaf to the host once."""
    if params is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        a = np.ascontiguousarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def fingerprint(max_episode_steps: Any, params: Any = None, digest: bool = False):
    """What ``resume`` compares beyond a result's own fields: the step cap and,
    with ``digest``, the params' digest."""
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
    """Raises, naming the first difference, when a field of this run (``now``:
    any of the keys below) differs from the earlier run's."""
    before = {
        "policy": done.policy,
        "env": done.env,
        "horizon": done.horizon,
        "prefetch_lead": done.prefetch_lead,
        "delay": done.delay,
        "delay_ms": done.delay_ms,
        "execution": done.execution,
        "max_episode_seconds": done.max_episode_seconds,
        "metrics": dict(done.metric_reductions),
        "trial_index_base": done.trial_index_base,
        "success_mode": done.success_mode,
        "instruction": done.instruction,
    }
    for what, value in now.items():
        if what == "success_mode" and done.success_key is None:
            continue  # without a success signal the headline is moot
        if before[what] != value:
            raise _differs(what, before[what], value)


class _Check:
    """A hook that compares the run, once it is built, with the earlier one."""

    def __init__(self, done: RunResult):
        self.done = done

    def on_run_start(self, info: dict) -> None:
        now = {k: info.get(k) for k in ("policy", "env", "horizon", "prefetch_lead")}
        now["delay"] = info.get("delay", 0)
        now["execution"] = info.get("execution")
        now["max_episode_seconds"] = info.get("max_episode_seconds")
        now["metrics"] = info.get("metric_reductions")
        now["trial_index_base"] = info.get("trial_index_base", 0)
        now["success_mode"] = info.get("success_mode")
        now["instruction"] = info.get("instruction")
        _compare(self.done, now)


class _Renumbered:
    """A user hook seen through a resumed run: the budget's episode indices;
    ``on_run_end`` is called by ``run`` with the whole result."""

    def __init__(self, hook: Any, indices: np.ndarray, budget: int):
        self.hook, self.indices, self.budget = hook, indices, budget
        for name in ("on_run_start", "on_episode_end", "on_step", "on_fault"):
            if not callable(getattr(hook, name, None)):
                setattr(self, name, None)

    def on_run_start(self, info: dict) -> None:
        self.hook.on_run_start({**info, "episodes": self.budget})

    def on_episode_end(self, ep: Any) -> None:
        self.hook.on_episode_end(ep._replace(index=int(self.indices[ep.index])))

    def on_step(self, event: Any) -> None:
        self.hook.on_step(event._replace(episode=int(self.indices[event.episode])))

    def on_fault(self, info: dict) -> None:
        self.hook.on_fault(info)


def missing_episodes(
    done: RunResult, seeds: np.ndarray, max_episode_steps: Any, digest: str | None
) -> np.ndarray:
    """The budget indices ``done`` lacks, after checking that it belongs to
    this budget and these settings.

    Raises:
      ValueError: naming what differs.
    """
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
        before_seed = int(done.seeds[wrong[0]])
        raise _differs(f"seed for episode {i}", before_seed, int(seeds[i]))
    before = done.fingerprint or {}
    cap = before.get("max_episode_steps", max_episode_steps)
    if cap != max_episode_steps:
        raise _differs("max_episode_steps", cap, max_episode_steps)
    if before.get("params") is not None and digest is not None:
        if before["params"] != digest:
            raise _differs("params (digest)", before["params"], digest)
    return np.setdiff1d(np.arange(seeds.size, dtype=np.int64), idx)


def merge(done: RunResult, new: RunResult, indices: np.ndarray) -> RunResult:
    """``done``'s episodes and ``new``'s (whose episode k is budget episode
    ``indices[k]``), by index; totals and timings added up."""
    at = np.concatenate([np.asarray(done.indices, np.int64), indices[new.indices]])
    order = np.argsort(at, kind="stable")

    def cat(a: Any, b: Any) -> np.ndarray:
        return np.concatenate([np.asarray(a), np.asarray(b)])[order]

    fields = {
        f: cat(getattr(done, f), getattr(new, f)) for f in ("seeds", *EPISODE_FIELDS)
    }
    kinds = {
        kind: flags_array(cat(_flags(done, kind), _flags(new, kind)))
        for kind in SUCCESS_KINDS
    }
    success = headline(new.success_mode, kinds["success_once"], kinds["success_at_end"])
    metrics = {
        k: cat(done.metrics[k], new.metrics[k])
        for k in new.metrics
        if k in done.metrics
    }
    return dataclasses.replace(
        new,
        indices=at[order],
        **fields,
        success=success,
        **kinds,
        metrics=metrics,
        env_steps=done.env_steps + new.env_steps,
        policy_rows=done.policy_rows + new.policy_rows,
        wall_time=done.wall_time + new.wall_time,
        compile_time=done.compile_time + new.compile_time,
        run_time=done.run_time + new.run_time,
        num_envs=max(done.num_envs, new.num_envs),
        server_losses=list(done.server_losses) + list(new.server_losses),
        fingerprint={**(done.fingerprint or {}), **(new.fingerprint or {})},
    )


def _flags(r: RunResult, kind: str) -> np.ndarray:
    """Per episode its flag of ``kind`` (``SUCCESS_KINDS``) or None."""
    flags = getattr(r, kind)
    if flags is None:
        return np.full(r.num_episodes, None, object)
    return np.asarray(flags, object)


def _params_of(policy: Any, params: Any) -> Any:
    """The params a run evaluates: ``params=``, else a Model's own."""
    return params if params is not None else getattr(policy, "params", None)


def resumable(evaluate: Callable[..., RunResult]) -> Callable[..., RunResult]:
    """``evaluate`` with ``resume=`` (see the module docstring); every result it
    returns records its ``fingerprint``, a failure's ``partial_result`` with the
    params' digest."""

    @functools.wraps(evaluate)
    def wrapper(policy: Any, env: Any, **kw: Any) -> RunResult:
        done = kw.pop("resume", None)
        if done is not None:
            from jaxmesh.run import checks

            seeds = checks.resolve_budget(kw.get("episodes"), kw.get("seeds"))
            digest = params_digest(_params_of(policy, kw.get("params")))
            args = {"policy": policy, "env": env, **kw}
            return run(wrapper, args, done, np.asarray(seeds, np.int64), digest)
        steps = kw.get("max_episode_steps")
        try:
            result = evaluate(policy, env, **kw)
        except BaseException as exc:
            partial = getattr(exc, "partial_result", None)
            if isinstance(partial, RunResult) and partial.fingerprint is None:
                params = _params_of(policy, kw.get("params"))
                partial.fingerprint = fingerprint(steps, params, digest=True)
            raise
        if result.fingerprint is None:
            result.fingerprint = fingerprint(steps)
        return result

    return wrapper


def _check_complete(done: RunResult, args: dict) -> None:
    """A result that holds the whole budget runs nothing, so the run is never
    built: its settings and the names known without building (the policy's,
    and the env's unless served) are compared here instead.

    Raises:
      ValueError: naming what differs.
    """
    from jaxmesh.core.policy import resolve_policy

    seconds = args.get("max_episode_seconds")
    execution = args.get("execution")
    now: dict = {
        "trial_index_base": args.get("trial_index_base") or 0,
        "instruction": args.get("instruction"),
        "horizon": args.get("horizon") or 1,
        "prefetch_lead": args.get("prefetch_lead") or 0,
        "execution": execution.describe()
        if isinstance(execution, Ensemble)
        else execution,
        "max_episode_seconds": None if seconds is None else float(seconds),
        "success_mode": args.get("success_mode") or DEFAULT_SUCCESS_MODE,
    }
    # A delay in milliseconds is compared as given (its steps need the env).
    if args.get("delay_ms") is not None:
        now["delay_ms"] = float(args["delay_ms"])
    else:
        now["delay"] = args.get("delay") or 0
    with contextlib.suppress(TypeError, ValueError):
        with_params = args.get("params") is not None
        now["policy"] = resolve_policy(args["policy"], with_params=with_params).name
    env = args.get("env")
    name = env if isinstance(env, str) else getattr(env, "name", None)
    if isinstance(name, str) and not name.startswith(("grpc://", "grpcs://")):
        now["env"] = name
    _compare(done, now)


def run(
    evaluate: Callable[..., RunResult],
    args: dict,
    done: RunResult,
    seeds: np.ndarray,
    digest: str | None,
) -> RunResult:
    """``evaluate(**args)`` over the episodes ``done`` lacks, merged with it.

    Raises:
      ValueError: ``done`` is from another budget or run (before anything
        runs), or ``record=`` is given.
      Any exception of the run, with ``partial_result`` holding ``done``'s
        episodes and those finished now.
    """
    if args.get("record") is not None:
        raise ValueError(
            "resume= with record=: the recorded episodes are named by budget index; "
            "resume without record=, then record the episodes you want in a run "
            "of their own"
        )
    missing = missing_episodes(done, seeds, args.get("max_episode_steps"), digest)
    user_hooks = args.get("hooks")
    user_hooks = [] if user_hooks is None else user_hooks
    if not isinstance(user_hooks, list | tuple):
        user_hooks = [user_hooks]
    if not missing.size:
        _check_complete(done, args)
        result = dataclasses.replace(done)
        for h in user_hooks:
            if callable(getattr(h, "on_run_end", None)):
                h.on_run_end(result)
        return result
    tile = args.get("plan_tile")
    if tile is not None and done.plan_tile and tile != done.plan_tile:
        raise _differs("plan_tile", done.plan_tile, tile)
    watched = ("on_run_start", "on_episode_end", "on_step", "on_fault")
    hooks = [_Check(done)] + [
        _Renumbered(h, missing, int(seeds.size))
        for h in user_hooks
        if any(callable(getattr(h, name, None)) for name in watched)
    ]
    inner = {
        **args,
        "episodes": None,
        "seeds": seeds[missing].tolist(),
        "hooks": hooks,
        # The rows a policy call sees: each episode rounds as it did before.
        "plan_tile": done.plan_tile or tile,
    }
    try:
        with _indices(missing):
            new = evaluate(**inner)
    except BaseException as exc:
        partial = getattr(exc, "partial_result", None)
        if partial is not None:
            exc.partial_result = merge(done, partial, missing)
        raise
    result = merge(done, new, missing)
    for h in user_hooks:
        if callable(getattr(h, "on_run_end", None)):
            h.on_run_end(result)
    return result


# The episode log ---------------------------------------------------------------------
#: The first key of a log's run line (and its format's version).
LOG_KEY = "jaxmesh_episode_log"
_RUN_KEYS = (
    "policy",
    "env",
    "num_envs",
    "horizon",
    "effective_horizon",
    "prefetch_lead",
    "delay",
    "delay_ms",
    "execution",
    "chunk",
    "plan_tile",
    "max_episode_seconds",
    "metric_reductions",
    "success_key",
    "success_mode",
    "trial_index_base",
    "instruction",
    "episodes",
)


class EpisodeLog:
    """A hook that appends every finished episode to a JSON-lines file as it
    finishes, flushed line by line: the file is safe to read while the run
    goes on, and what a run finished survives whatever ends it.

    Each run start writes a ``run`` line (``{"jaxmesh_episode_log": 1, "run":
    {...}, "fingerprint": {...}}``: the run's policy, env and settings); each
    episode an ``{"episode": EpisodeResult.to_dict()}`` line; a lost server a
    ``{"fault": ...}`` line. A resumed run appends to the same file.
    ``load_episode_log`` reads it back as a ``RunResult`` for ``resume=``.

    Args:
      path: the file (created, or appended to).
      params: the params evaluated (their digest goes in the run line, so that
        a resume with other params is refused); None: not recorded.
      max_episode_steps: the run's cap, recorded for the same check.
    """

    def __init__(self, path: Any, *, params: Any = None, max_episode_steps: Any = None):
        self.path = os.fspath(path)
        self.fp = fingerprint(max_episode_steps, params, digest=params is not None)
        self._file: Any = None

    def _write(self, record: dict) -> None:
        if self._file is None:
            self._file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115
            if self._file.tell():  # a line cut short by a killed run ends here
                self._file.seek(self._file.tell() - 1)
                cut = self._file.read(1) != "\n"
                self._file.seek(0, os.SEEK_END)
                if cut:
                    self._file.write("\n")
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def on_run_start(self, info: dict) -> None:
        run_info = {k: info.get(k) for k in _RUN_KEYS}
        self._write({LOG_KEY: 1, "run": run_info, "fingerprint": self.fp})

    def on_episode_end(self, ep: Any) -> None:
        self._write({"episode": ep.to_dict()})

    def on_fault(self, info: dict) -> None:
        self._write({"fault": info})

    def on_run_end(self, result: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def load_episode_log(path: Any) -> RunResult:
    """The episodes of an episode log (``EpisodeLog``) as a ``RunResult``, by
    index, for ``evaluate(..., resume=)``; its settings are the first run
    line's. A line cut short (a run killed while writing it: the file's last,
    or the last before a resumed run's) is skipped.

    Raises:
      ValueError: not an episode log, or runs of other settings in one file.
    """
    path = os.fspath(path)
    runs: list[dict] = []
    episodes: dict[int, dict] = {}
    faults: list[dict] = []
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
        if LOG_KEY in rec:
            runs.append(rec)
        elif "episode" in rec and runs:
            episodes[int(rec["episode"]["index"])] = rec["episode"]
        elif "fault" in rec:
            faults.append(rec["fault"])
    if not runs:
        raise ValueError(
            f"{path} has no run line; expected an episode log written by "
            "jaxmesh.EpisodeLog (jaxmesh eval --episode-log)"
        )
    first = runs[0]["run"]
    for other in runs[1:]:
        keys = ("policy", "env", "horizon", "prefetch_lead", "delay", "execution")
        for key in (*keys, "plan_tile"):
            if other["run"].get(key) != first.get(key):
                raise ValueError(
                    f"{path} holds runs with {key} {first.get(key)!r} and "
                    f"{other['run'].get(key)!r}; one log holds one run (and its "
                    "resumptions)"
                )
    eps = [episodes[i] for i in sorted(episodes)]
    d = {
        "policy": first.get("policy") or "",
        "env": first.get("env") or "",
        "settings": {
            "num_envs": first.get("num_envs") or 0,
            "horizon": first.get("horizon") or 1,
            "effective_horizon": first.get("effective_horizon") or 1,
            "prefetch_lead": first.get("prefetch_lead") or 0,
            "delay": first.get("delay") or 0,
            "delay_ms": first.get("delay_ms"),
            "execution": first.get("execution"),
            "chunk": first.get("chunk"),
            "plan_tile": first.get("plan_tile") or 0,
            "max_episode_seconds": first.get("max_episode_seconds"),
            "trial_index_base": first.get("trial_index_base") or 0,
            "instruction": first.get("instruction"),
            "metrics": first.get("metric_reductions") or {},
            "success_key": first.get("success_key"),
            # A log written before the mode was recorded: the rule of the time.
            "success_mode": first.get("success_mode") or "end",
        },
        "totals": {
            "env_steps": sum(int(e["length"]) for e in eps),
            "policy_rows": 0,
            "steps_per_second": 0.0,
            "wall_time": 0.0,
            "compile_time": 0.0,
            "run_time": 0.0,
        },
        "episodes": eps,
        "server_losses": faults,
        "fingerprint": runs[0].get("fingerprint"),
    }
    return RunResult.from_dict(d)


__all__ = [
    "EpisodeLog",
    "load_episode_log",
    "resumable",
    "episode_indices",
    "params_digest",
    "fingerprint",
    "missing_episodes",
    "merge",
    "run",
]
