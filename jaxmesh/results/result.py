"""What a run gives back, as data (CONTRACT 8 and 16).

Fields, ``to_dict`` / ``from_dict`` and the trajectories' ``.npz`` files. The
presentation (``summary``, ``report``) is imported inside the methods that
delegate to it, so that reading a result never loads it (nor matplotlib).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxmesh._version import __version__
from jaxmesh.core.tally import EPISODE_FIELDS
from jaxmesh.results import record
from jaxmesh.results import stats as _stats
from jaxmesh.results.stats import none_if_nan as _nan_none

#: The per-episode success flags besides the headline.
SUCCESS_KINDS = ("success_once", "success_at_end", "success_at_reset")


class EpisodeResult(NamedTuple):
    """One budgeted episode (CONTRACT 8); ``return_`` sums its rewards.

    ``success`` is the headline flag (``success_once`` or ``success_at_end``
    as the run's ``success_mode`` says); ``success_once``: the signal was true
    at some step; ``success_at_end``: at its last; ``success_at_reset``: in
    its reset's info. None: not tracked or no signal. ``metrics``: values by
    name (None: the run keeps none).
    """

    index: int
    seed: int
    return_: float
    length: int
    terminated: bool
    truncated: bool
    predict_calls: int
    lane: int
    success: bool | None = None
    metrics: dict[str, float | bool] | None = None
    success_once: bool | None = None
    success_at_end: bool | None = None
    success_at_reset: bool | None = None

    def to_dict(self) -> dict:
        d = self._asdict()
        d["return"] = d.pop("return_")
        for key in ("success", "metrics", *SUCCESS_KINDS):  # None: not written
            if d[key] is None:
                del d[key]
        if "metrics" in d:
            d["metrics"] = {  # JSON has no NaN: None
                k: bool(v) if isinstance(v, bool | np.bool_) else _nan_none(float(v))
                for k, v in d["metrics"].items()
            }
        return d


class StepEvent(NamedTuple):
    """One executed env step of one lane, as ``on_step`` hooks receive it.

    ``t``: the step's index within episode ``episode``; ``action``: what the
    env executed (numpy); ``reward``: float32, as summed into the return;
    ``truncated`` includes jaxmesh's caps. ``planned``: the first action of a
    chunk (CONTRACT 10); ``stale``: how many steps before its chunk started it
    was planned (CONTRACT 12; docs/evaluation.md, "Step hooks"). No
    observation: record episodes with ``jaxmesh.Record``.
    """

    lane: int
    episode: int
    t: int
    action: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    planned: bool
    stale: int


# A record's checksum binds it to its run's fingerprint: a record edited by hand
# or moved to another run's file fails it (an accident, not a forger, who can
# recompute it).
def identity_text(fingerprint: dict | None) -> str:
    """The part of a run's fingerprint a record's checksum covers, as text."""
    return json.dumps(fingerprint or {}, sort_keys=True, allow_nan=True)


def record_check(record: dict, identity: str) -> str:
    """The checksum of an ``EpisodeResult.to_dict()`` under ``identity_text``."""
    body = {k: v for k, v in record.items() if k != "check"}
    h = hashlib.blake2b(digest_size=16)
    h.update(identity.encode())
    h.update(json.dumps(body, sort_keys=True, allow_nan=True).encode())
    return h.hexdigest()


def _record_issues(episodes: list, fingerprint: Any) -> list[tuple[int, int, str]]:
    """``RunResult.record_issues`` of a dict's episodes (none without an identity)."""
    if not isinstance(fingerprint, dict) or "policy" not in fingerprint:
        return []
    run = identity_text(fingerprint)
    issues: list[tuple[int, int, str]] = []
    seen: dict[int, dict] = {}
    for k, ep in enumerate(episodes):
        index = int(ep["index"])
        if "check" not in ep:
            issues.append((k, index, "has no checksum"))
        elif ep["check"] != record_check(ep, run):
            issues.append((k, index, "fails its checksum"))
        if index in seen:
            what = "same" if seen[index] == ep else "repeats it with other fields"
            issues.append((k, index, what))
        else:
            seen[index] = ep
    return issues


def headline(mode: str | None, once: Any, end: Any) -> Any:
    """The headline success of ``success_mode`` ``mode``: ``once`` or ``end``."""
    return once if mode == "once" else end


def _flag_at(arrays: Any, name: str, has: str, i: int) -> bool | None:
    """Entry ``i`` of success flags ``name`` as a bool, or None (no flag there)."""
    values, has = getattr(arrays, name, None), getattr(arrays, has, None)
    if values is None or (has is not None and not bool(has[i])):
        return None
    value = values[i]
    return None if value is None else bool(value)


def episode_at(
    arrays: Any, i: int, index: int, seed: int, mode: str | None = None
) -> EpisodeResult:
    """Entry ``i`` of a RunResult or the engine's Results (whose ``success`` is
    the flag at the end; ``mode``: the run's ``success_mode``, which they lack)."""
    metrics = getattr(arrays, "metrics", None)
    if metrics:
        metrics = {
            k: bool(v[i]) if np.asarray(v[i]).dtype == bool else float(v[i])
            for k, v in metrics.items()
        }
    own = isinstance(arrays, RunResult)
    once = _flag_at(arrays, "success_once", "has_success", i)
    end = _flag_at(arrays, "success_at_end" if own else "success", "has_success", i)
    success = _flag_at(arrays, "success", "", i) if own else headline(mode, once, end)
    return EpisodeResult(
        index=int(index),
        seed=int(seed),
        return_=float(arrays.returns[i]),
        length=int(arrays.lengths[i]),
        terminated=bool(arrays.terminated[i]),
        truncated=bool(arrays.truncated[i]),
        predict_calls=int(arrays.predict_calls[i]),
        lane=int(arrays.lanes[i]),
        metrics=metrics or None,
        success=success,
        success_once=once,
        success_at_end=end,
        success_at_reset=_flag_at(
            arrays, "success_at_reset", "has_success_at_reset", i
        ),
    )


def success_array(success: Any, has: Any) -> np.ndarray | None:
    """Per-episode success: bools, or an object array with None where an
    episode lacks the signal; None without a success key."""
    if success is None:
        return None
    success = np.asarray(success, bool)
    if has is None or np.all(has):
        return success
    out = success.astype(object)
    out[~np.asarray(has, bool)] = None
    return out


def flags_array(flags: Any) -> np.ndarray | None:
    """``success_array`` of bools and Nones (None: none, or all None)."""
    flags = list(flags)
    if not flags or all(f is None for f in flags):
        return None
    return success_array([bool(f) for f in flags], [f is not None for f in flags])


def flag_rate(flags: Any) -> float | None:
    """The share of True; None when there are no flags or one is missing
    (never a silent 0)."""
    bools = None if flags is None else _stats.success_flags(flags, len(flags))
    return None if bools is None or not bools.size else float(np.mean(bools))


@functools.cache  # importlib.metadata takes about a ms a package
def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def made_with() -> dict:
    """``RunResult.provenance`` of a run made now: the UTC date and versions."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {
            "jaxmesh": __version__,
            **{name: _version(name) for name in ("jax", "jaxlib", "numpy")},
            "python": platform.python_version(),
        },
    }


def _refuse(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def frozen(cls: type) -> type:
    """A frozen, slotted dataclass whose assignment of an undeclared name
    raises ``FrozenInstanceError`` too (Python 3.11 raises a TypeError)."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    cls.__setattr__ = _refuse
    return cls


#: ``RunResult`` array -> (its episode key in ``to_dict``, its dtype).
_ARRAYS = {
    "indices": ("index", np.int64),
    "seeds": ("seed", np.int64),
    "returns": ("return", np.float64),
    "lengths": ("length", np.int64),
    "terminated": ("terminated", bool),
    "truncated": ("truncated", bool),
    "predict_calls": ("predict_calls", np.int64),
    "lanes": ("lane", np.int64),
}
_HIDDEN = {"repr": False, "compare": False}


@frozen
class RunResult:
    """A run's results, arrays ordered by episode index.

    Attributes:
      indices, seeds, returns, lengths, terminated, truncated, predict_calls,
        lanes: per episode (of ``exc.partial_result``: the finished ones).
      env_steps, policy_rows: executed env steps of active lanes, and rows
        the policy computed (whole ``plan_tile`` tiles).
      wall_time, compile_time, run_time: seconds for the call, compiling and
        running; ``steps_per_second`` of a resumed run: its ``resumed_part``.
      num_envs, horizon, effective_horizon, prefetch_lead, chunk, plan_tile,
        delay, delay_ms, execution, max_episode_seconds, trial_index_base,
        instruction: the run's settings (docs/evaluation.md).
      telemetry: host-stepped runs' series (``jaxmesh.run.telemetry``).
      success, success_once, success_at_end, success_at_reset: per episode
        (``success``: the ``success_mode`` one), None where an episode lacked
        the signal; None without ``success_key``.
      metrics, metric_reductions: each metric's values and its reduction.
      trajectories: the recorded ``Trajectory`` records (not in ``to_dict``,
        whose ``recorded`` indexes the ``save_trajectories`` file), or None.
      videos: video files of recorded episodes, embedded by the report.
      server_losses: served runs: each server lost, as a dict.
      fingerprint: the run's identity that ``resume=`` compares
        (``jaxmesh.run.identity``); provenance: ``made_with()``; None: not
        recorded.
      resumed_part: of a resumed run, this call's ``{"episodes",
        "env_steps", "run_time"}``.
    """

    indices: np.ndarray
    seeds: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    predict_calls: np.ndarray
    lanes: np.ndarray
    env_steps: int
    policy_rows: int
    wall_time: float
    compile_time: float
    run_time: float
    num_envs: int
    horizon: int
    effective_horizon: int
    prefetch_lead: int
    policy: str = ""
    env: str = ""
    chunk: int | None = None
    plan_tile: int = 0
    delay: int = 0
    delay_ms: float | None = None
    execution: str | None = None
    max_episode_seconds: float | None = None
    trial_index_base: int = 0
    instruction: str | None = None
    telemetry: dict | None = None
    success: np.ndarray | None = None
    metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    metric_reductions: dict[str, str] = dataclasses.field(default_factory=dict)
    success_key: str | None = None
    success_mode: str = "once"
    success_once: np.ndarray | None = None
    success_at_end: np.ndarray | None = None
    success_at_reset: np.ndarray | None = None
    trajectories: list | None = None
    videos: list[str] = dataclasses.field(default_factory=list)
    server_losses: list[dict] = dataclasses.field(default_factory=list)
    fingerprint: dict | None = None
    provenance: dict | None = None
    resumed_part: dict | None = None
    # Of a result read by ``from_dict``: the ``recorded`` index, written back
    # while ``trajectories`` is None; its ``record_issues``; and (from
    # ``load_results``) the file and each episode's line there, so that
    # ``resume=`` names a refused entry by its line.
    _recorded_meta: list | None = dataclasses.field(default=None, **_HIDDEN)
    _record_issues: list[tuple] = dataclasses.field(default_factory=list, **_HIDDEN)
    _source: str | None = dataclasses.field(default=None, **_HIDDEN)
    _record_lines: list[int] | None = dataclasses.field(default=None, **_HIDDEN)

    @classmethod
    def from_results(
        cls, res: Any, seeds: np.ndarray, keep: np.ndarray | None = None, **run: Any
    ) -> RunResult:
        """A result of the engine's ``Results`` (numpy leaves), the episodes
        ``keep`` masks (default: all); ``run``: the other fields."""
        e = seeds.size
        idx = np.arange(e) if keep is None else np.flatnonzero(keep[:e])
        per_episode = {f: np.asarray(getattr(res, f))[idx] for f in EPISODE_FIELDS}

        def kept(name: str) -> np.ndarray | None:
            value = getattr(res, name, None)
            return None if value is None else np.asarray(value)[idx]

        def flags(name: str, has: str) -> np.ndarray | None:
            return success_array(kept(name), kept(has))

        end = flags("success", "has_success")
        once = flags("success_once", "has_success")
        metrics = getattr(res, "metrics", None) or {}
        metrics = {k: np.asarray(v)[idx] for k, v in metrics.items()}
        trajectories = record.trajectories_from(
            getattr(res, "recording", None), idx, seeds[idx], per_episode["lengths"]
        )
        return cls(
            indices=idx,
            seeds=np.asarray(seeds, np.int64)[idx],
            env_steps=int(res.env_steps),
            policy_rows=int(res.policy_rows),
            success=headline(run.get("success_mode", "once"), once, end),
            success_once=once,
            success_at_end=end,
            success_at_reset=flags("success_at_reset", "has_success_at_reset"),
            metrics=metrics,
            trajectories=trajectories,
            **per_episode,
            **{"provenance": made_with(), **run},
        )

    @property
    def num_episodes(self) -> int:
        return int(len(self.returns))

    @property
    def steps_per_second(self) -> float:
        part = self.resumed_part or {}
        steps = part.get("env_steps", self.env_steps)
        seconds = part.get("run_time", self.run_time)
        return steps / seconds if seconds > 0 else 0.0

    @property
    def rows_per_step(self) -> float:
        """Policy rows computed per executed env step (ideal: 1/h)."""
        return self.policy_rows / self.env_steps if self.env_steps else 0.0

    #: The share of episodes that succeeded (the headline, or at some step, or
    #: at the end); None when an episode lacks the signal, never a silent 0.
    success_rate = property(lambda self: flag_rate(self.success))
    success_once_rate = property(lambda self: flag_rate(self.success_once))
    success_at_end_rate = property(lambda self: flag_rate(self.success_at_end))

    @property
    def successes_at_reset(self) -> int | None:
        """Episodes already successful at reset; None unless measured for all."""
        if flag_rate(self.success_at_reset) is None:
            return None
        return int(np.sum(self.success_at_reset.astype(bool)))

    @property
    def asynchronous(self) -> bool:
        return self.prefetch_lead > 0

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.num_episodes else float("nan")

    @property
    def episodes(self) -> list[EpisodeResult]:
        return [self.episode(i) for i in range(self.num_episodes)]

    def episode(self, i: int) -> EpisodeResult:
        """The i-th entry (episode ``indices[i]``) as an ``EpisodeResult``."""
        return episode_at(self, i, self.indices[i], self.seeds[i], self.success_mode)

    def summary(self) -> str:
        """A readable table of the settings, ``stats()`` and the totals (the
        rows the HTML report shows too; ``jaxmesh.results.summary.text``)."""
        from jaxmesh.results import summary

        return summary.text(self)

    __str__ = summary

    def stats(
        self,
        *,
        confidence: float = _stats.CONFIDENCE,
        resamples: int = _stats.RESAMPLES,
        seed: int = _stats.SEED,
    ) -> dict[str, Any]:
        """``jaxmesh.results.stats.describe`` of the returns, lengths and
        successes (at level ``confidence``, ``resamples`` bootstrap draws from
        ``seed``) with the success key, mode and other rates, and each
        metric's reduction and mean over the episodes that have a value."""
        out = _stats.describe(
            self.returns,
            self.lengths,
            self.success,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        rates = ("success_once_rate", "success_at_end_rate", "successes_at_reset")
        for name in ("success_key", "success_mode", *rates):
            out[name] = getattr(self, name)
        out["metrics"] = {}
        for name, values in self.metrics.items():
            v = np.asarray(values, np.float64).reshape(-1)
            v = v[~np.isnan(v)]  # NaN: the episode has no value
            reduction = self.metric_reductions.get(name, "last")
            mean = float(v.mean()) if v.size else None
            out["metrics"][name] = {"reduction": reduction, "mean": mean}
        return out

    def plot(self) -> Any:
        """The run's plots as a matplotlib ``Figure``
        (``jaxmesh.results.report.plot``)."""
        from jaxmesh.results import report

        return report.plot(self)

    def report(self, path: str | Path) -> Path:
        """Writes the run's HTML report
        (``jaxmesh.results.report.write_report``)."""
        from jaxmesh.results import report

        return report.write_report(self, path)

    def trajectory(self, episode: int) -> Any:
        """The recorded ``Trajectory`` of episode ``episode`` (else a
        ValueError naming those recorded)."""
        have = {tr.episode: tr for tr in self.trajectories or []}
        if episode in have:
            return have[episode]
        raise ValueError(
            f"episode {episode} was not recorded (recorded: {list(have) or 'none'}); "
            "run with record=jaxmesh.Record(episodes=[...]) naming it"
        )

    def save_trajectories(self, path: str | Path) -> Path:
        """Writes the recorded trajectories to one ``.npz`` file, each array as
        ``ep<episode>/<name>`` (the episode, seed, length and cut are in
        ``to_dict()["recorded"]``); a ValueError when nothing was recorded."""
        if not self.trajectories:
            raise ValueError(
                "this result holds no trajectories; run with "
                "record=jaxmesh.Record(episodes=[...])"
            )
        arrays = {
            f"ep{tr.episode}/{name}": value
            for tr in self.trajectories
            for name, value in tr.arrays().items()
        }
        path = Path(path)
        with open(path, "wb") as f:  # np.savez would append .npz to other names
            np.savez_compressed(f, **arrays)
        return path

    def load_trajectories(
        self, path: str | Path, recorded: list | None = None
    ) -> RunResult:
        """This result with the trajectories ``save_trajectories`` wrote to
        ``path`` (``recorded``: ``to_dict()["recorded"]``, default: what
        ``from_dict`` kept); a ValueError when the file lacks one."""
        recorded = recorded if recorded is not None else self._recorded
        loaded = []
        with np.load(path) as z:
            for r in recorded or []:
                arrays = record.under(z, f"ep{r['episode']}/")
                if not arrays:
                    raise ValueError(
                        f"{path} holds no arrays of episode {r['episode']} "
                        f"(it has {sorted(z.files)[:6]}...); pass the .npz file "
                        "that save_trajectories wrote for this result"
                    )
                fields = (r[k] for k in ("episode", "seed", "length", "cut"))
                loaded.append(record.Trajectory.from_arrays(arrays, *fields))
        return dataclasses.replace(self, trajectories=loaded)

    @property
    def _recorded(self) -> list | None:
        if self.trajectories is None:
            return self._recorded_meta
        keys = ("episode", "seed", "length", "steps", "cut")
        return [{k: getattr(tr, k) for k in keys} for tr in self.trajectories]

    def format_telemetry(self) -> str:
        """The telemetry as a table (milliseconds per call; bytes)."""
        from jaxmesh.results import summary

        return summary.telemetry_text(self.telemetry)

    def episode_records(self) -> list[dict]:
        """Every ``EpisodeResult.to_dict()`` with its ``check``, a checksum of
        its fields and the ``fingerprint`` that ``resume=`` verifies."""
        run = identity_text(self.fingerprint)
        records = (e.to_dict() for e in self.episodes)
        return [{**d, "check": record_check(d, run)} for d in records]

    def to_dict(self) -> dict:
        """JSON-serialisable dict (settings, totals and every episode)."""

        def some(key: str, value: Any) -> dict:
            return {key: value} if value else {}

        return {
            "policy": self.policy,
            "env": self.env,
            "settings": {
                **{name: getattr(self, name) for name in SETTINGS},
                "metrics": dict(self.metric_reductions),
                "success_key": self.success_key,
                "success_mode": self.success_mode,
            },
            "totals": {
                "episodes": self.num_episodes,
                "mean_return": None if not self.num_episodes else self.mean_return,
                **{name: getattr(self, name) for name in _TOTALS},
                **some("resumed_part", self.resumed_part),
            },
            "telemetry": self.telemetry,
            **{k: getattr(self, k) for k in _GIVEN if getattr(self, k)},
            "episodes": self.episode_records(),
            **({"recorded": self._recorded} if self._recorded is not None else {}),
            **some("videos", list(self.videos)),
        }

    @property
    def record_issues(self) -> list[tuple[int, int, str]]:
        """Of a result read by ``from_dict``: each episode entry that fails its
        checksum or repeats an earlier entry's episode, as ``(entry position,
        episode index, what)`` (``what`` ``"same"`` for an exact repeat, the
        only kind ``resume=`` accepts). Empty for a result built otherwise."""
        return list(self._record_issues)

    @classmethod
    def from_dict(cls, d: dict) -> RunResult:
        """The result ``to_dict`` wrote (e.g. the JSON of ``jaxmesh eval``).

        ``RunResult.from_dict(r.to_dict()).to_dict() == r.to_dict()``; returns
        are float32 unless a value needs float64. An older dict without
        ``run_time`` gets ``env_steps / steps_per_second``.

        Raises:
          ValueError: a key or an episode field is missing or has the wrong
            type, naming it.
        """
        if not isinstance(d, dict):
            raise ValueError(
                f"a result dict was expected (RunResult.to_dict(), the JSON of "
                f"jaxmesh eval); got a {type(d).__name__}"
            )
        missing = [k for k in ("settings", "totals", "episodes") if k not in d]
        if missing:
            raise ValueError(
                f"the result dict lacks {missing} (it has {sorted(d)}); expected "
                "what RunResult.to_dict() writes (the JSON of jaxmesh eval)"
            )
        settings, totals, episodes = d["settings"], d["totals"], d["episodes"]
        try:
            steps, sps = int(totals["env_steps"]), float(totals["steps_per_second"])
            run_time = totals.get("run_time", steps / sps if sps > 0 else 0.0)
            arrays = {
                field: np.asarray([ep[key] for ep in episodes], dtype)
                for field, (key, dtype) in _ARRAYS.items()
            }
            # float32 as the engine writes them (the mean depends on it).
            single = arrays["returns"].astype(np.float32)
            if np.array_equal(single, arrays["returns"]):
                arrays["returns"] = single
            reductions = dict(settings.get("metrics") or {})
            mode = settings.get("success_mode", "end")  # an older file's: "end"
            kinds: dict = dict.fromkeys(SUCCESS_KINDS)
            if settings.get("success_key") is not None:
                for kind in SUCCESS_KINDS:
                    kinds[kind] = flags_array(ep.get(kind) for ep in episodes)
                if "success_mode" not in settings:  # an older file's end flag
                    old = flags_array(ep.get("success") for ep in episodes)
                    kinds["success_at_end"] = old
            return cls(
                **arrays,
                env_steps=steps,
                policy_rows=int(totals["policy_rows"]),
                **{k: float(totals[k]) for k in ("wall_time", "compile_time")},
                run_time=float(run_time),
                **_settings_of(cls, settings),
                **{k: str(d.get(k, "")) for k in ("policy", "env")},
                **{k: d.get(k) for k in ("telemetry", "fingerprint", "provenance")},
                success=headline(mode, kinds["success_once"], kinds["success_at_end"]),
                **kinds,
                success_mode=mode,
                metrics=_episode_metrics(episodes, reductions),
                metric_reductions=reductions,
                success_key=settings.get("success_key"),
                videos=[str(v) for v in d.get("videos", [])],
                server_losses=[dict(x) for x in d.get("server_losses", [])],
                resumed_part=totals.get("resumed_part"),
                _recorded_meta=d.get("recorded"),
                _record_issues=_record_issues(episodes, d.get("fingerprint")),
            )
        except (KeyError, TypeError, ValueError) as e:
            what = f"key {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(
                f"the result dict is malformed ({type(e).__name__}: {what}); "
                "expected what RunResult.to_dict() writes: settings, totals and "
                f"episodes with fields {sorted(k for k, _ in _ARRAYS.values())}"
            ) from e


def _episode_metrics(episodes: list, reductions: dict) -> dict:
    """Each metric's values of a results dict (NaN: no value)."""
    return {
        name: np.asarray(
            [ep["metrics"][name] for ep in episodes],
            bool if red == "any" else np.float32,  # float32: None as NaN
        )
        for name, red in reductions.items()
    }


def select(result: RunResult, keep: Any, **changes: Any) -> RunResult:
    """``result`` cut to the episodes ``keep`` (a mask, indices or a slice)
    picks, every per-episode array (and dict of them) cut; ``changes``
    replace fields (the totals are the caller's)."""
    n = len(result.returns)

    def per_episode(v: Any) -> bool:
        return isinstance(v, np.ndarray) and v.shape[:1] == (n,)

    def cut(v: Any) -> Any:
        if per_episode(v):
            return v[keep]
        if isinstance(v, dict) and v and all(map(per_episode, v.values())):
            return {key: x[keep] for key, x in v.items()}
        return v

    fields = {f.name: cut(getattr(result, f.name)) for f in dataclasses.fields(result)}
    return RunResult(**{**fields, **changes})


#: The settings ``to_dict`` writes as they are, in order (``asynchronous`` is
#: not read back); the first four are required.
SETTINGS = (
    "num_envs",
    "horizon",
    "effective_horizon",
    "prefetch_lead",
    "delay",
    "delay_ms",
    "execution",
    "asynchronous",
    "chunk",
    "plan_tile",
    "max_episode_seconds",
    "trial_index_base",
    "instruction",
)
#: The fields ``to_dict`` writes when set, after the telemetry.
_GIVEN = ("server_losses", "fingerprint", "provenance")
#: The totals ``to_dict`` writes after the episodes and the mean return.
_TOTALS = (
    "env_steps",
    "policy_rows",
    "rows_per_step",
    "wall_time",
    "compile_time",
    "run_time",
    "steps_per_second",
    "success_rate",
    "success_once_rate",
    "success_at_end_rate",
    "successes_at_reset",
)


def _settings_of(cls: type, settings: dict) -> dict:
    """``SETTINGS``' fields of ``settings`` (the first four required)."""
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    out = {}
    for k, name in enumerate(n for n in SETTINGS if n in fields):
        value = settings[name] if k < 4 else settings.get(name, fields[name])
        out[name] = int(value) if k < 4 or isinstance(fields[name], int) else value
    return out
