"""A run's configuration: ``RunConfig``'s flat knobs and groups, each checked once
in its constructor (docs/evaluation.md, "What ``evaluate`` takes")."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxmesh.envs import playground
from jaxmesh.remote.protocol import check_transport
from jaxmesh.run import backend, checks, cluster, initial, instructions


def _set(obj: Any, **values: Any) -> None:
    """Sets fields of a frozen dataclass (its checked values)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How a chunk is executed (docs/evaluation.md, "What ``evaluate`` takes",
    and "How a chunk is executed").

    Attributes:
      prefetch_lead: L, a chunk planned ``min(L, h)`` steps early (0: synchronous).
      delay: d steps of inference delay (0 < d < h); not with a lead.
      delay_ms: the delay in milliseconds, turned into steps by the env's ``dt``.
      execution: None (replay h actions per plan) or a ``jaxmesh.Ensemble``.

    Raises:
      TypeError, ValueError: a bad value, or two that exclude each other.
    """

    prefetch_lead: int = 0
    delay: int = 0
    delay_ms: float | None = None
    execution: Any = None

    def __post_init__(self) -> None:  # an ensemble with horizon > 1: RunConfig's
        lead, d, ex, ms = checks.check_chunking(
            self.prefetch_lead, self.delay, self.execution, self.delay_ms
        )
        _set(self, prefetch_lead=lead, delay=d, execution=ex, delay_ms=ms)


@dataclasses.dataclass(frozen=True)
class Starts:
    """How episodes start (docs/evaluation.md, "What ``evaluate`` takes", and
    "Initial states").

    Attributes:
      trial_index_base: episode i is trial ``trial_index_base + i``.
      initial_states: JAX envs: T ``(obs, state)`` pairs, stacked or a list.
      reset_fn: JAX envs: ``reset_fn(key, trial) -> (obs, state)`` of one lane.
      randomize: Playground envs: ``fn(mjx_model, key) -> mjx_model`` per reset.
      instruction: every episode's instruction, for a ``jaxmesh.adapt.Text`` input.
      check_seeds: envs in this process: ``jaxmesh.check_seeds`` first.
    """

    trial_index_base: int = 0
    initial_states: Any = None
    reset_fn: Any = None
    randomize: Any = None
    instruction: str | None = None
    check_seeds: bool = False

    def __post_init__(self) -> None:
        base = checks.check_trial_index_base(self.trial_index_base)
        _set(self, trial_index_base=base)
        if self.initial_states is not None and self.reset_fn is not None:
            raise ValueError(
                "initial_states= and reset_fn= both given: episode i starts either "
                "from initial_states entry trial_index_base + i or from reset_fn(key, "
                "trial_index_base + i); pass one of them"
            )
        if self.randomize is not None and not callable(self.randomize):
            raise TypeError(
                f"randomize={self.randomize!r}: expected a function "
                "(mjx_model, key) -> mjx_model"
            )
        instructions.check_instruction(self.instruction)
        if not isinstance(self.check_seeds, bool):
            raise TypeError(f"check_seeds={self.check_seeds!r}: expected True or False")


@dataclasses.dataclass(frozen=True)
class Scoring:
    """What is scored beside the return (docs/evaluation.md, "Episode metrics
    and success", and "Success").

    Attributes:
      metrics: info keys kept per episode: a key, a list, or a dict key -> reduction.
      success: the success info key; None: ``success`` or ``is_success``; False: none.
      success_mode: ``"once"`` (the default) or ``"end"``.
    """

    metrics: Any = None
    success: Any = None
    success_mode: str = checks.DEFAULT_SUCCESS_MODE

    def __post_init__(self) -> None:
        _set(self, _asked=checks.check_metrics(self.metrics, self.success))
        _set(self, success_mode=checks.check_success_mode(self.success_mode))

    @property
    def asked(self) -> checks.Metrics:
        """``metrics`` and ``success`` as checked (``checks.Metrics``)."""
        return self._asked


@dataclasses.dataclass(frozen=True)
class Served:
    """The connection to ``"grpc://host:port"`` env servers (docs/remote.md).

    Attributes:
      token: the servers' token (None: the ``JAXMESH_TOKEN`` variable).
      credentials: ``"grpcs://"``'s ``grpc.ChannelCredentials``; None: gRPC's roots.
      reply_timeout: seconds a reply may take; ``"auto"`` (default); None: no limit.
      lane_groups: groups of lanes that pipeline; None: the default.
      on_server_loss: ``"rerun"`` (None, the default) or ``"raise"``.
      transport: ``"auto"`` (default), ``"grpc"`` or ``"shm"``.
    """

    token: str | None = None
    credentials: Any = None
    reply_timeout: float | str | None = backend.AUTO
    lane_groups: int | None = None
    on_server_loss: str | None = None
    transport: str | None = "auto"

    def __post_init__(self) -> None:
        transport = self.transport
        _set(
            self,
            reply_timeout=backend.check_reply_timeout(self.reply_timeout),
            lane_groups=backend.check_lane_groups(self.lane_groups),
            on_server_loss=backend.check_server_loss(self.on_server_loss),
            transport=check_transport(backend.AUTO if transport is None else transport),
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the lanes run and in what pieces (docs/evaluation.md, "What
    ``evaluate`` takes"; docs/scale.md).

    Attributes:
      plan_tile: rows per policy call; None: ``build.default_plan_tile``.
      segment_steps: JAX envs: env steps per scan segment between host visits.
      devices: JAX envs: None (one device), ``"all"``, an int, a list or a Mesh.
    """

    plan_tile: int | None = None
    segment_steps: int = checks.DEFAULT_SEGMENT_STEPS
    devices: Any = None

    def __post_init__(self) -> None:
        tile, steps = checks.check_layout(self.plan_tile, self.segment_steps)
        _set(self, plan_tile=tile, segment_steps=steps)


#: Where each group's fields live: ``RunConfig``'s attribute -> its class.
GROUPS: dict[str, type] = {
    "chunking": Chunking,
    "starts": Starts,
    "scoring": Scoring,
    "served": Served,
    "layout": Layout,
}
#: The flat knobs, ``RunConfig``'s own fields.
FLAT = ("num_envs", "horizon", "max_episode_steps", "max_episode_seconds", "workers")
#: Every grouped field's name -> its group's attribute.
GROUP_OF: dict[str, str] = {
    f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run's configuration: the flat knobs and the groups, checked once
    (docs/evaluation.md, "What ``evaluate`` takes").

    Attributes:
      num_envs: lanes run side by side.
      horizon: H, actions of a chunk executed before the next plan.
      max_episode_steps: an episode's step cap (None: the env's, else built in).
      max_episode_seconds: host-stepped envs: a wall-clock cap on an episode.
      workers: host-stepped envs: worker processes, or ``jaxmesh.Ray(...)``.
      chunking, starts, scoring, layout: the groups.
      served: ``Served`` options for ``"grpc://host:port"`` envs, or None.

    Raises:
      TypeError, ValueError: a bad value, or settings that exclude each other.

    Example::

      config = jaxmesh.RunConfig(
          num_envs=256, horizon=8, chunking=jaxmesh.Chunking(prefetch_lead=2)
      )
      result = jaxmesh.evaluate(policy, env, config, episodes=1000)
    """

    num_envs: int = 64
    horizon: int = 1
    max_episode_steps: int | None = None
    max_episode_seconds: float | None = None
    workers: int | cluster.Ray | None = None
    chunking: Chunking = Chunking()
    starts: Starts = Starts()
    scoring: Scoring = Scoring()
    served: Served | None = None
    layout: Layout = Layout()

    def __post_init__(self) -> None:
        for name, cls in GROUPS.items():
            value = getattr(self, name)
            if name == "served" and value is None:
                continue
            if isinstance(value, dict):  # a config file's mapping
                value = cls(**value)
                _set(self, **{name: value})
            if not isinstance(value, cls):
                raise TypeError(
                    f"{name}={value!r}: expected a jaxmesh.{cls.__name__} "
                    f"(e.g. {name}=jaxmesh.{cls.__name__}(...))"
                )
        c, lay = self.chunking, self.layout
        n, h, cap = checks.check_flat(
            self.num_envs, self.horizon, self.max_episode_steps
        )
        s = checks.settings_of(
            n, h, c.prefetch_lead, cap, lay.plan_tile, lay.segment_steps,
            c.delay, c.execution, c.delay_ms,
        )  # fmt: skip
        _set(self, _settings=s, num_envs=s.num_envs, horizon=s.horizon)
        seconds = checks.check_number(
            "max_episode_seconds",
            self.max_episode_seconds,
            "seconds of wall clock an episode may run, or None for no limit",
        )
        _set(self, max_episode_seconds=seconds)
        _set(self, workers=cluster.workers_of(self.workers))

    @property
    def settings(self) -> checks.Settings:
        return self._settings

    def for_backend(self, target: backend.Target) -> Served | None:
        """Refuses what ``target``'s backend does not take; a served env's options."""
        kind, label = target.kind, target.label
        if kind != backend.SERVED and self.served is not None:
            for name in checks.changed(self.served):  # the first option set is refused
                value = getattr(self.served, name)
                if value is None:  # reply_timeout=None: no limit, nothing to refuse
                    continue
                why = {
                    "token": "a token is for served envs",
                    "lane_groups": "lane groups pipeline calls to env servers",
                }.get(name, f"{name} is for served envs")
                shown = "***" if name in ("token", "credentials") else repr(value)
                raise ValueError(
                    f"{name}={shown}: {why} ('grpc://host:port'); env {label!r} runs "
                    f"in this process, so drop {name}="
                )
        if self.workers and kind != backend.HOST:
            raise ValueError(
                f"workers={self.workers}: worker processes step a gymnasium env's "
                f"lanes ('gymnasium:<id>' or an env factory); env {label!r} is "
                + (
                    "served: start its server with `jaxmesh serve-env ... --workers N`"
                    if kind == backend.SERVED
                    else "a JAX env, stepped inside the jitted loop: drop workers="
                )
            )
        if kind == backend.SCAN:
            if self.max_episode_seconds is not None:
                raise ValueError(
                    f"max_episode_seconds={self.max_episode_seconds!r}: a "
                    "wall-clock cap applies to host-stepped (gymnasium) envs only; "
                    "a JAX env's episodes run inside one compiled program, so cap "
                    "them with max_episode_steps instead"
                )
            return None
        if self.layout.devices is not None:
            raise ValueError(
                f"devices={self.layout.devices!r}: lanes are split over devices "
                f"for JAX envs only; env {label!r} is stepped by the host, so drop "
                "devices= (Layout(devices=...))"
            )
        initial.refuse_host(self.starts.initial_states, self.starts.reset_fn, label)
        if self.starts.randomize is not None:
            raise TypeError(playground.not_playground(label))
        return (self.served or Served()) if kind == backend.SERVED else None

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with fields changed by name: ``replace(horizon=4, delay=1)``."""
        flat = {k: v for k, v in changes.items() if k in FLAT or k in GROUPS}
        by_group: dict[str, dict] = {}
        for name, value in changes.items():
            if name in flat:
                continue
            group = GROUP_OF.get(name)
            if group is None:
                raise TypeError(
                    f"{name}=: not a setting of a run; the settings are "
                    f"{', '.join(FLAT)} and the fields of "
                    + ", ".join(f"{cls.__name__}" for cls in GROUPS.values())
                )
            by_group.setdefault(group, {})[name] = value
        for group, fields in by_group.items():
            # served=None: the defaults
            current = flat.get(group, getattr(self, group)) or GROUPS[group]()
            flat[group] = dataclasses.replace(current, **fields)
        return dataclasses.replace(self, **flat)

    def to_dict(self) -> dict:
        """The settings a result records (objects by type, the token never)."""
        out: dict = {name: getattr(self, name) for name in FLAT}
        for group in filter(None, (getattr(self, name) for name in GROUPS)):
            for f in dataclasses.fields(group):
                out[f.name] = _plain(f.name, getattr(group, f.name))
        return out


def _plain(name: str, value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return "***" if name in ("token", "credentials") and value else value
    describe = getattr(value, "describe", None)
    return describe() if callable(describe) else type(value).__name__


def from_keywords(
    config: RunConfig | None, given: dict, caller: str = "jaxmesh.evaluate"
) -> RunConfig:
    """``config`` (None: the defaults) with ``given``'s flat knobs and groups."""
    flat = {k: v for k, v in given.items() if k in GROUP_OF}
    if flat:
        raise TypeError(_grouped_given_flat(caller, flat, given))
    base = RunConfig() if config is None else config
    if not isinstance(base, RunConfig):
        raise TypeError(
            f"config={config!r}: expected a jaxmesh.RunConfig, or None for the defaults"
        )
    return base.replace(**given) if given else base


def _grouped_given_flat(caller: str, flat: dict, given: dict) -> str:
    by_group: dict[str, list[str]] = {}
    for name, value in flat.items():
        by_group.setdefault(GROUP_OF[name], []).append(f"{name}={_short(value)}")
    where = "; ".join(
        f"{', '.join(k.split('=')[0] for k in keys)} "
        f"{'is a field' if len(keys) == 1 else 'are fields'} of {group}"
        for group, keys in by_group.items()
    )
    spelled = ", ".join(
        f"{group}=jaxmesh.{GROUPS[group].__name__}("
        + ", ".join((["..."] if group in given else []) + keys)
        + ")"
        for group, keys in by_group.items()
    )
    args = ", ".join(k for keys in by_group.values() for k in keys)
    return f"{caller}({args}): {where}; write {spelled}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else "..."
