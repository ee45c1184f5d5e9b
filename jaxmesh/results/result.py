"""What a run gives back, as data (CONTRACT 8 and 16).

``RunResult``, ``EpisodeResult`` and ``StepEvent`` are fields, properties,
``to_dict`` / ``from_dict`` and the recorded trajectories' ``.npz`` files. This
module imports nothing of presentation: text tables live in
``jaxmesh.results.summary``, plots and HTML in ``jaxmesh.results.report``.
``RunResult.summary()`` (and ``str()``), ``format_telemetry()``, ``plot()`` and
``report(path)`` are one-line delegates to those modules that import them
inside the method: the one exception to imports at the top, so that reading
or building a result never loads the presentation (nor matplotlib).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.metadata
import math
import platform
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxmesh._version import __version__
from jaxmesh.core.tally import EPISODE_FIELDS
from jaxmesh.results import checksum, record
from jaxmesh.results import stats as _stats


class EpisodeResult(NamedTuple):
    """One budgeted episode (CONTRACT 8). ``return_`` is the sum of its rewards.

    ``success`` is the episode's headline success flag, ``success_once`` or
    ``success_at_end`` as the run's ``success_mode`` says (None: the run tracks
    none, or this episode had no signal); ``success_once``: the signal was true
    at any executed step; ``success_at_end``: at its last step;
    ``success_at_reset``: in its reset's info (None: not measured).
    ``metrics`` holds its metric values by name (None: the run keeps none).
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
            d["metrics"] = {k: _json_value(v) for k, v in d["metrics"].items()}
        return d


class StepEvent(NamedTuple):
    """One executed env step of one lane, as ``on_step`` hooks receive it.

    ``t`` is the 0-based step index within episode ``episode`` (its index in
    the budget); ``action`` is the action the env executed (numpy, the env's
    action shape, as the engine holds it); ``reward`` is the step's reward
    (float32, as summed into the return); ``terminated`` / ``truncated`` are
    the step's ends, ``truncated`` including jaxmesh's caps
    (``max_episode_steps``, ``max_episode_seconds``).

    ``planned``: the action is the first of a chunk (CONTRACT 10), else
    replayed; ``stale``: how many steps before its chunk started playing it
    was planned (0, or ``min(L, h)`` under a lead: CONTRACT 12; docs/
    evaluation.md, "Step hooks").

    The observation is not part of the event (it would cross from the device,
    or the wire, on every step); record episodes with ``jaxmesh.Record``.
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


def _json_value(v: Any) -> float | bool | None:
    """A metric value for JSON: a bool, a float, or None for NaN (no value)."""
    if isinstance(v, bool | np.bool_):
        return bool(v)
    v = float(v)
    return None if math.isnan(v) else v


def _record_issues(episodes: list, fingerprint: Any) -> list[tuple[int, int, str]]:
    """``RunResult.record_issues`` of a dict's episode entries (nothing is
    checked for a dict that records no run identity: ``resume=`` refuses it)."""
    if not isinstance(fingerprint, dict) or "policy" not in fingerprint:
        return []
    run = checksum.identity_text(fingerprint)
    issues: list[tuple[int, int, str]] = []
    seen: dict[int, dict] = {}
    for k, ep in enumerate(episodes):
        index = int(ep["index"])
        if "check" not in ep:
            issues.append((k, index, "has no checksum"))
        elif ep["check"] != checksum.record_check(ep, run):
            issues.append((k, index, "fails its checksum"))
        if index in seen:
            what = "same" if seen[index] == ep else "repeats it with other fields"
            issues.append((k, index, what))
        else:
            seen[index] = ep
    return issues


#: The per-episode success flags besides the headline, as ``RunResult`` and
#: ``EpisodeResult`` name them.
SUCCESS_KINDS = ("success_once", "success_at_end", "success_at_reset")


def headline(mode: str | None, once: Any, end: Any) -> Any:
    """The headline success of ``success_mode`` ``mode``: ``once`` or ``end``
    (flags per episode, or one episode's)."""
    return once if mode == "once" else end


def _flag_at(values: Any, has: Any, i: int) -> bool | None:
    """Entry ``i`` of success flags as a bool, or None (no flags, or this
    episode lacks the signal: ``has[i]`` False or the entry None)."""
    if values is None or (has is not None and not bool(has[i])):
        return None
    value = values[i]
    return None if value is None else bool(value)


def _success_at(arrays: Any, i: int, mode: str | None) -> dict:
    """Entry ``i``'s success fields (``EpisodeResult``'s names) of a RunResult
    or of the engine's Results (whose ``success`` is the flag at the end)."""
    if isinstance(arrays, RunResult):
        out = {k: _flag_at(getattr(arrays, k), None, i) for k in SUCCESS_KINDS}
        return {"success": _flag_at(arrays.success, None, i), **out}
    has = getattr(arrays, "has_success", None)
    once = _flag_at(getattr(arrays, "success_once", None), has, i)
    end = _flag_at(getattr(arrays, "success", None), has, i)
    reset = _flag_at(
        getattr(arrays, "success_at_reset", None),
        getattr(arrays, "has_success_at_reset", None),
        i,
    )
    return {
        "success": headline(mode, once, end),
        "success_once": once,
        "success_at_end": end,
        "success_at_reset": reset,
    }


def episode_at(
    arrays: Any, i: int, index: int, seed: int, mode: str | None = None
) -> EpisodeResult:
    """Entry ``i`` of per-episode arrays (a RunResult or the engine's Results;
    ``mode``: the run's ``success_mode``, which the engine's Results lack)."""
    metrics = getattr(arrays, "metrics", None)
    return EpisodeResult(
        index=int(index),
        seed=int(seed),
        return_=float(arrays.returns[i]),
        length=int(arrays.lengths[i]),
        terminated=bool(arrays.terminated[i]),
        truncated=bool(arrays.truncated[i]),
        predict_calls=int(arrays.predict_calls[i]),
        lane=int(arrays.lanes[i]),
        metrics=None
        if not metrics
        else {k: _metric_value(v[i]) for k, v in metrics.items()},
        **_success_at(arrays, i, mode),
    )


def _metric_value(v: Any) -> float | bool:
    return bool(v) if np.asarray(v).dtype == bool else float(v)


def success_array(success: Any, has: Any) -> np.ndarray | None:
    """Per-episode success: bools when every episode has the signal, else an
    object array with None where it is missing; None without a success key."""
    if success is None:
        return None
    success = np.asarray(success, bool)
    if has is None or np.all(has):
        return success
    out = success.astype(object)
    out[~np.asarray(has, bool)] = None
    return out


def flags_array(flags: Any) -> np.ndarray | None:
    """``success_array`` of a list of bools and Nones (None: an empty list or
    every entry None, nothing measured)."""
    flags = list(flags)
    if not flags or all(f is None for f in flags):
        return None
    return success_array([bool(f) for f in flags], [f is not None for f in flags])


def flag_rate(flags: Any) -> float | None:
    """The share of True among per-episode flags; None when there are none or
    any episode lacks the signal (never a silent 0)."""
    if flags is None or not len(flags):
        return None
    flags = np.asarray(flags, dtype=object)
    if any(f is None for f in flags):
        return None
    return float(np.mean(flags.astype(bool)))


@functools.cache  # read once: importlib.metadata takes about a ms a package
def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def made_with() -> dict:
    """``RunResult.provenance`` of a run made now: the date (UTC, to the
    second) and the versions of the packages that made it."""
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
    """``dataclasses.dataclass(frozen=True, slots=True)``, whose assignment
    of an undeclared name raises ``FrozenInstanceError`` too (Python 3.11's
    raises a TypeError: it calls ``super()`` on the class slots replaced)."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    cls.__setattr__ = _refuse
    return cls


#: ``RunResult`` array -> (the episode key ``to_dict`` writes it under, its
#: dtype for ``from_dict``).
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
_EPISODE_KEYS = {field: key for field, (key, _) in _ARRAYS.items()}


@frozen
class RunResult:
    """A run's results, arrays ordered by episode index.

    Attributes:
      indices: the episode index of each entry (``0..E-1`` for a finished run;
        on ``exc.partial_result`` only the episodes that finished).
      seeds, returns, lengths, terminated, truncated, predict_calls, lanes: per
        episode (``EPISODE_FIELDS`` and the seeds).
      env_steps: executed env steps of active lanes (masked lanes never count).
      policy_rows: rows the policy actually computed (whole tiles of
        ``plan_tile`` rows, padding included; a ``HostPolicy`` computes
        only the lanes that plan).
      wall_time: seconds for the whole call; ``compile_time`` of it compiling;
        ``run_time`` running the segments.
      steps_per_second: ``env_steps`` over ``run_time``; of a resumed run,
        the part this call ran (``resumed_part``).
      num_envs, horizon, prefetch_lead: the run's settings; ``effective_horizon``
        is ``min(horizon, K)``; ``plan_tile`` the rows per policy call.
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
    #: Inference delay in steps (CONTRACT 23); 0: none.
    delay: int = 0
    #: The delay as given in milliseconds (``delay_ms=``), turned into
    #: ``delay`` steps by the env's dt; None: given in steps.
    delay_ms: float | None = None
    #: How chunks were executed: None (replayed), or an ensemble's label
    #: (``jaxmesh.Ensemble.describe``, CONTRACT 22).
    execution: str | None = None
    #: The wall-clock cap on an episode (host-stepped envs, CONTRACT 18), or
    #: None. With a cap, which episodes it truncated depends on timing.
    max_episode_seconds: float | None = None
    #: Host-stepped envs that declare a ``trial_index`` reset option: episode
    #: i got ``trial_index_base + i`` (CONTRACT 6).
    trial_index_base: int = 0
    #: The language instruction every episode got (``Starts(instruction=)``,
    #: for ``jaxmesh.adapt.Text`` inputs), or None (none given: no Text input,
    #: or one read per episode from the env's reset info).
    instruction: str | None = None
    #: Host-stepped runs: per series (``predict``, ``env_step``, ``encode``,
    #: ``decode``, ``wire``, ``queue``, message bytes) its count, mean, p50, p95
    #: and p99 (seconds or bytes); None for a JAX env. See
    #: ``jaxmesh.run.telemetry``.
    telemetry: dict | None = None
    #: Per episode, whether it succeeded, the headline: ``success_once`` or
    #: ``success_at_end`` as ``success_mode`` says. Bools, or an object array
    #: with None for the episodes without the signal; None when the env gives
    #: no success signal.
    success: np.ndarray | None = None
    #: name -> per-episode values of each metric asked for (``metrics=``):
    #: bool for ``any``, float32 otherwise (NaN: no value on a host-stepped
    #: env whose info lacked the key for the whole episode).
    metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: name -> its reduction (``last``, ``sum``, ``max``, ``mean``, ``any``).
    metric_reductions: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The info key read as success (None: none).
    success_key: str | None = None
    #: Which success is the headline (``success``, ``success_rate``, the
    #: summary's and the report's): ``"once"`` or ``"end"``.
    success_mode: str = "once"
    #: Per episode, whether the success signal was true at any executed step
    #: (as ``success``: bools, None entries where an episode lacked the signal,
    #: None without a signal).
    success_once: np.ndarray | None = None
    #: Per episode, whether the success signal was true at its last step.
    success_at_end: np.ndarray | None = None
    #: Per episode, whether the success signal was already true in its reset's
    #: info; None where not measured (an env whose reset gives no info, e.g.
    #: gymnax), never False.
    success_at_reset: np.ndarray | None = None
    #: The recorded episodes that finished (``record=``), in episode order, as
    #: ``jaxmesh.Trajectory`` records; None when the run recorded none. Not in
    #: ``to_dict()`` (only ``recorded``, their index): ``save_trajectories``
    #: writes the arrays to an ``.npz`` file, ``load_trajectories`` reads them.
    trajectories: list | None = None
    #: Video files of recorded episodes (``jaxmesh.render`` appends what it
    #: writes); the HTML report embeds them. Relative paths are relative to the
    #: working directory (``jaxmesh report``: to the results JSON's folder).
    videos: list[str] = dataclasses.field(default_factory=list)
    #: Served runs: the servers lost during the run, in order, each a dict
    #: (``server``: its address, ``at_seconds``: into the run, ``error``,
    #: ``lanes``: lanes dropped, ``episodes_rerun``: the unfinished episodes
    #: run again from their seeds elsewhere). Empty when none was lost.
    server_losses: list[dict] = dataclasses.field(default_factory=list)
    #: What ``evaluate(..., resume=)`` compares beyond the fields above: the
    #: run's identity (``jaxmesh.run.identity``: digests of the ``env``, the
    #: ``policy``'s traced program and the ``params``, ``max_episode_steps``,
    #: the ``jax`` version); None: not recorded (a result written before runs
    #: had one, which ``resume=`` refuses).
    fingerprint: dict | None = None
    #: When and with what the run was made (``made_with()``: ``date``, UTC,
    #: and the ``versions`` of jaxmesh, jax, jaxlib, numpy and Python); None:
    #: not recorded (a result built by hand, or written before runs kept it).
    provenance: dict | None = None
    #: A resumed run (``resume=``): the part this call ran, ``{"episodes",
    #: "env_steps", "run_time"}``, whose rate ``steps_per_second`` is (the
    #: earlier part's run time is not known when it was stopped). None: not
    #: resumed.
    resumed_part: dict | None = None
    # Of a result read by ``from_dict`` (``load_results`` adds the file):
    # the ``recorded`` index it held, written back by ``to_dict`` while
    # ``trajectories`` is None; its ``record_issues``; the file it was read
    # from and each episode entry's line there, so that ``resume=`` names a
    # refused entry by its line. Declared, as every attribute is (the class
    # has slots: setting an undeclared one raises AttributeError).
    _recorded_meta: list | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    _record_issues: list[tuple[int, int, str]] = dataclasses.field(
        default_factory=list, repr=False, compare=False
    )
    _source: str | None = dataclasses.field(default=None, repr=False, compare=False)
    _record_lines: list[int] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def from_results(
        cls, res: Any, seeds: np.ndarray, keep: np.ndarray | None = None, **run: Any
    ) -> RunResult:
        """Builds a result from the engine's ``Results`` (read to the host).

        Args:
          res: ``jaxmesh.core.tally.Results`` with numpy leaves.
          seeds: the budget's seeds.
          keep: a mask of the episodes to keep (default: the whole budget).
          **run: the totals and settings fields.
        """
        e = seeds.size
        idx = np.arange(e) if keep is None else np.flatnonzero(keep[:e])
        per_episode = {f: np.asarray(getattr(res, f))[idx] for f in EPISODE_FIELDS}

        def flags(name: str, has: str) -> np.ndarray | None:
            values, present = getattr(res, name, None), getattr(res, has, None)
            return success_array(
                None if values is None else np.asarray(values)[idx],
                None if present is None else np.asarray(present)[idx],
            )

        end = flags("success", "has_success")
        once = flags("success_once", "has_success")
        mode = run.get("success_mode", "once")
        metrics = {
            k: np.asarray(v)[idx]
            for k, v in (getattr(res, "metrics", None) or {}).items()
        }
        trajectories = None
        recording = getattr(res, "recording", None)
        if recording is not None:
            trajectories = record.trajectories_from(
                recording,
                idx,
                np.asarray(seeds)[idx],
                per_episode["lengths"],
            )
        return cls(
            indices=idx,
            seeds=np.asarray(seeds, np.int64)[idx],
            env_steps=int(res.env_steps),
            policy_rows=int(res.policy_rows),
            success=headline(mode, once, end),
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

    @property
    def success_rate(self) -> float | None:
        """The share of episodes that succeeded (the headline, ``success``);
        None when any episode lacks the success signal (or the env gives
        none), never a silent 0."""
        return flag_rate(self.success)

    @property
    def success_once_rate(self) -> float | None:
        """The share of episodes whose success signal was true at any step."""
        return flag_rate(self.success_once)

    @property
    def success_at_end_rate(self) -> float | None:
        """The share of episodes whose success signal was true at the end."""
        return flag_rate(self.success_at_end)

    @property
    def successes_at_reset(self) -> int | None:
        """How many episodes were already successful at reset; None when not
        measured for every episode (an env whose reset gives no info)."""
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
        """A readable summary table (``jaxmesh.results.summary.text``).

        The run's settings, the statistics of ``stats()`` (the mean return and
        its 95% bootstrap interval, the IQM with its interval, the quantiles,
        the success rate with its Wilson interval when the env gives a success
        signal) and the totals: the rows the HTML report shows too.
        """

        from jaxmesh.results import summary  # presentation (see the module doc)

        return summary.text(self)

    def __str__(self) -> str:
        return self.summary()

    def stats(
        self,
        *,
        confidence: float = _stats.CONFIDENCE,
        resamples: int = _stats.RESAMPLES,
        seed: int = _stats.SEED,
    ) -> dict[str, Any]:
        """The statistics of the returns (and the mean length), as plain data.

        See ``jaxmesh.results.stats`` for each convention (sample std, rliable's IQM,
        percentile bootstrap with a fixed seed, Wilson interval).

        Args:
          confidence: the level of every interval.
          resamples: bootstrap resamples (default 10,000).
          seed: the bootstrap's seed (the same result gives the same intervals).

        Returns:
          A JSON-serialisable dict: ``jaxmesh.results.stats.describe``'s keys
          of the returns, lengths and headline success, with ``success_key``,
          ``success_mode``, the other success figures and ``metrics``
          (``run_stats``). What too few episodes cannot give is None.
        """
        return _stats.run_stats(
            self, confidence=confidence, resamples=resamples, seed=seed
        )

    def plot(self) -> Any:
        """The run's plots as a matplotlib ``Figure``
        (``jaxmesh.results.report.plot``)."""

        from jaxmesh.results import report  # presentation (see the module doc)

        return report.plot(self)

    def report(self, path: str | Path) -> Path:
        """Writes the run's HTML report
        (``jaxmesh.results.report.write_report``)."""

        from jaxmesh.results import report  # presentation (see the module doc)

        return report.write_report(self, path)

    def trajectory(self, episode: int) -> Any:
        """The recorded ``Trajectory`` of episode ``episode`` (its index).

        Raises:
          ValueError: the run recorded no such episode (naming those it did).
        """
        for tr in self.trajectories or []:
            if tr.episode == episode:
                return tr
        have = [tr.episode for tr in self.trajectories or []]
        raise ValueError(
            f"episode {episode} was not recorded (recorded: {have or 'none'}); "
            "run with record=jaxmesh.Record(episodes=[...]) naming it"
        )

    def save_trajectories(self, path: str | Path) -> Path:
        """Writes the recorded trajectories to one ``.npz`` file.

        Each array is stored as ``ep<episode>/<name>`` (``observations``, or
        ``observations/<key>`` per leaf, ``actions``, ``rewards``,
        ``terminated``, ``truncated``, ``frames`` when captured); the episode,
        seed, length and cut flag are in ``to_dict()["recorded"]``.

        Raises:
          ValueError: the run recorded nothing.
        """
        return record.save_trajectories(self.trajectories, path)

    def load_trajectories(
        self, path: str | Path, recorded: list | None = None
    ) -> RunResult:
        """This result with the trajectories ``save_trajectories`` wrote
        (``result = result.load_trajectories("run.npz")``).

        Args:
          path: the ``.npz`` file.
          recorded: ``to_dict()["recorded"]`` of the run (default: what
            ``from_dict`` kept of it).

        Raises:
          ValueError: the file lacks an episode the record lists.
        """
        recorded = recorded if recorded is not None else self._recorded
        loaded = record.load_trajectories(path, recorded)
        return dataclasses.replace(self, trajectories=loaded)

    @property
    def _recorded(self) -> list | None:
        if self.trajectories is None:
            return self._recorded_meta
        return record.recorded_index(self.trajectories)

    def format_telemetry(self) -> str:
        """The telemetry as a table (milliseconds per call; bytes)."""

        from jaxmesh.results import summary  # presentation (see the module doc)

        return summary.telemetry_text(self.telemetry)

    def episode_records(self) -> list[dict]:
        """Every episode's ``EpisodeResult.to_dict()`` with its ``check``: a
        checksum over its fields and the run's ``fingerprint``
        (``jaxmesh.results.checksum.record_check``), which ``resume=`` verifies."""
        run = checksum.identity_text(self.fingerprint)
        records = (e.to_dict() for e in self.episodes)
        return [{**d, "check": checksum.record_check(d, run)} for d in records]

    def to_dict(self) -> dict:
        """JSON-serialisable dict (settings, totals and every episode)."""
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
                "env_steps": self.env_steps,
                "policy_rows": self.policy_rows,
                "rows_per_step": self.rows_per_step,
                "wall_time": self.wall_time,
                "compile_time": self.compile_time,
                "run_time": self.run_time,
                "steps_per_second": self.steps_per_second,
                "success_rate": self.success_rate,
                "success_once_rate": self.success_once_rate,
                "success_at_end_rate": self.success_at_end_rate,
                "successes_at_reset": self.successes_at_reset,
                **({"resumed_part": self.resumed_part} if self.resumed_part else {}),
            },
            "telemetry": self.telemetry,
            **({"server_losses": self.server_losses} if self.server_losses else {}),
            **({"fingerprint": self.fingerprint} if self.fingerprint else {}),
            **({"provenance": self.provenance} if self.provenance else {}),
            "episodes": self.episode_records(),
            **({"recorded": self._recorded} if self._recorded is not None else {}),
            **({"videos": list(self.videos)} if self.videos else {}),
        }

    @property
    def record_issues(self) -> list[tuple[int, int, str]]:
        """Of a result read by ``from_dict``: each episode entry that fails its
        checksum (``episode_records``), or repeats an earlier entry's episode
        with other fields, as ``(entry position, episode index, what)``; an
        entry that repeats one exactly is listed with ``what`` ``"same"``.
        ``resume=`` refuses a result with any but ``"same"``. Empty for a
        result built otherwise."""
        return list(self._record_issues)

    @classmethod
    def from_dict(cls, d: dict) -> RunResult:
        """The result ``to_dict`` wrote (e.g. the JSON of ``jaxmesh eval``).

        The inverse of ``to_dict``: ``RunResult.from_dict(r.to_dict()).to_dict()
        == r.to_dict()``. Returns are float32, as the engine writes them, unless
        a value is not a float32 (then float64: nothing written is lost).
        A dict written before ``totals`` held ``run_time`` gets it from
        ``env_steps / steps_per_second``.

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
            columns = {
                key: [ep[key] for ep in episodes] for key in _EPISODE_KEYS.values()
            }
            steps, sps = int(totals["env_steps"]), float(totals["steps_per_second"])
            run_time = totals.get("run_time", steps / sps if sps > 0 else 0.0)
            arrays = {
                field: np.asarray(columns[key], dtype)
                for field, (key, dtype) in _ARRAYS.items()
            }
            # The engine's returns are float32; keep them so (the mean, and so
            # ``to_dict``, depends on the dtype) unless a value needs more.
            single = arrays["returns"].astype(np.float32)
            if np.array_equal(single, arrays["returns"]):
                arrays["returns"] = single
            reductions = dict(settings.get("metrics") or {})
            success_key = settings.get("success_key")
            mode = settings.get("success_mode", "end")  # an older file's: "end"
            kinds = _success_kinds(settings, episodes)
            metrics = _episode_metrics(episodes, reductions)
            return cls(
                **arrays,
                env_steps=steps,
                policy_rows=int(totals["policy_rows"]),
                wall_time=float(totals["wall_time"]),
                compile_time=float(totals["compile_time"]),
                run_time=float(run_time),
                **_settings_of(cls, settings),
                policy=str(d.get("policy", "")),
                env=str(d.get("env", "")),
                telemetry=d.get("telemetry"),
                success=headline(mode, kinds["success_once"], kinds["success_at_end"]),
                **kinds,
                success_mode=mode,
                metrics=metrics,
                metric_reductions=reductions,
                success_key=success_key,
                videos=[str(v) for v in d.get("videos", [])],
                server_losses=[dict(x) for x in d.get("server_losses", [])],
                fingerprint=d.get("fingerprint"),
                provenance=d.get("provenance"),
                resumed_part=totals.get("resumed_part"),
                # The arrays live in an .npz file (load_trajectories); their
                # index is kept so that to_dict() writes it back.
                _recorded_meta=d.get("recorded"),
                _record_issues=_record_issues(episodes, d.get("fingerprint")),
            )
        except (KeyError, TypeError, ValueError) as e:
            what = f"key {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(
                f"the result dict is malformed ({type(e).__name__}: {what}); "
                "expected what RunResult.to_dict() writes: settings, totals and "
                f"episodes with fields {sorted(_EPISODE_KEYS.values())}"
            ) from e


def _success_kinds(settings: dict, episodes: list) -> dict:
    """Each success kind's flags per episode of a results dict (None: none
    kept); a file written before ``success_mode`` holds the flag at the end
    as ``success``."""
    kinds: dict = dict.fromkeys(SUCCESS_KINDS)
    if settings.get("success_key") is not None:
        for kind in SUCCESS_KINDS:
            kinds[kind] = flags_array(ep.get(kind) for ep in episodes)
        if "success_mode" not in settings:
            kinds["success_at_end"] = flags_array(ep.get("success") for ep in episodes)
    return kinds


def _episode_metrics(episodes: list, reductions: dict) -> dict:
    """Each metric's values per episode of a results dict: bool for ``any``,
    else float32 with NaN for a metric an episode never had."""
    metrics = {}
    for name, red in reductions.items():
        values = [ep["metrics"][name] for ep in episodes]
        if red == "any":
            metrics[name] = np.asarray(values, bool)
        else:
            none_nan = [np.nan if v is None else v for v in values]
            metrics[name] = np.asarray(none_nan, np.float32)
    return metrics


def select(result: RunResult, keep: Any, **changes: Any) -> RunResult:
    """``result`` cut to the episodes ``keep`` (a mask, indices or a slice)
    picks: every per-episode array, and dict of them, cut; ``changes`` replace
    fields (the totals are the caller's)."""
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


#: The settings ``to_dict`` writes as they are, in order (``asynchronous``,
#: a property, is not read back); the first four are required.
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


def _settings_of(cls: type, settings: dict) -> dict:
    """``SETTINGS``' fields read from ``settings``: the first four required,
    the others their field's default when absent; an int field's as an int."""
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    out = {}
    for k, name in enumerate(n for n in SETTINGS if n in fields):
        value = settings[name] if k < 4 else settings.get(name, fields[name])
        out[name] = int(value) if k < 4 or isinstance(fields[name], int) else value
    return out
