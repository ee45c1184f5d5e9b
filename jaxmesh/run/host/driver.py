"""``run_host``: a host-stepped run's lanes, metrics, recorder and the scan
engine's jitted agent step (CONTRACT 17) as one ``loop.HostRun``."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmesh.adapt import read_keys
from jaxmesh.core import agent, rules
from jaxmesh.core import tally as core_results
from jaxmesh.core.policy import Policy, resolve_policy
from jaxmesh.envs.gymnasium import workers as pool
from jaxmesh.errors import HostPolicyError, callback_error
from jaxmesh.results.record import (
    check_record,
    check_record_budget,
    observation_leaves,
    records_states,
)
from jaxmesh.results.result import RunResult
from jaxmesh.run import backend, build, checks, cluster, identity, instructions, stream
from jaxmesh.run.cluster import RAY, Ray
from jaxmesh.run.config import RunConfig, Served
from jaxmesh.run.host import agent_step as run_agent
from jaxmesh.run.host.loop import HostRun, wire_leaves
from jaxmesh.run.kept import Kept
from jaxmesh.run.seed_check import require_reproducible
from jaxmesh.run.telemetry import Telemetry


class HostMetrics:
    """Episode metrics and success from the lanes' infos (``core.rules`` in
    numpy); in auto mode the success key is an episode's first of
    ``checks.SUCCESS_KEYS``."""

    def __init__(self, asked: checks.Metrics, num_lanes: int, env_name: str):
        self.named, self.env_name = asked.named, env_name
        named = (asked.success,) if isinstance(asked.success, str) else ()
        auto = asked.success is None
        self.success_keys: tuple[str, ...] = checks.SUCCESS_KEYS if auto else named
        names = [n for n, _ in self.named]
        self.required = (*names, *named)
        # Every info key read each step (only these cross a wire).
        self.keys = tuple(dict.fromkeys(names + list(self.success_keys)))
        self.active, self.tracks_success = bool(self.keys), bool(self.success_keys)
        n = num_lanes
        # (slot, info key, reduction) per accumulator: a metric's slot is its
        # name; a success key has a ``last`` (its count: whether an episode had
        # the key) and an ``any`` (success once).
        self.slots = [(name, name, red) for name, red in self.named] + [
            ((red, k), k, red) for k in self.success_keys for red in ("last", "any")
        ]
        self.acc = {
            slot: np.zeros(n, bool if red == "any" else np.float64)
            for slot, _, red in self.slots
        }
        self.count = {slot: np.zeros(n, np.int64) for slot, _, _ in self.slots}
        # The reset info's value of each success key, and whether it had it.
        self.at_reset = {k: np.zeros(n, bool) for k in self.success_keys}
        self.reset_has = {k: np.zeros(n, bool) for k in self.success_keys}
        self.checked = False
        self.found: str | None = None

    def begin(self, js: Any) -> None:
        """Lanes ``js`` start an episode."""
        for slot, _, red in self.slots:
            a, c = self.acc[slot], self.count[slot]
            a[js], c[js] = rules.begin_metric(np, red, a[js], c[js], True)
        for k in self.success_keys:
            self.at_reset[k][js] = self.reset_has[k][js] = False

    def reset(self, js: Any, values: dict) -> None:
        """The reset infos of lanes ``js``: ``{key: (floats, present)}``."""
        for k in self.success_keys:
            if k in values:
                v, ok = values[k]
                self.at_reset[k][js] = ok & rules.success(np, v)
                self.reset_has[k][js] = ok

    def check(self, present: Any, seen_keys: Any = ()) -> None:
        """Once: ValueError for a required key not ``present``."""
        if self.checked:
            return
        self.checked = True
        missing = [k for k in self.required if k not in present]
        if missing:
            has = ", ".join(repr(k) for k in sorted(seen_keys)) or "no keys"
            raise ValueError(
                f"metric {missing[0]!r} is not in the info of env "
                f"{self.env_name!r} at its first step (its info has {has}); "
                "name a key the env reports on every step, or drop it from "
                "metrics= / success="
            )

    def step(self, lanes: np.ndarray, values: dict) -> None:
        """One step of ``lanes``: ``values[key] = (floats [m], present [m])``."""
        for slot, key, red in self.slots:
            v, ok = values[key]
            a, c = self.acc[slot], self.count[slot]
            a[lanes], c[lanes] = rules.accumulate_metric(
                np, red, a[lanes], c[lanes], v, ok
            )

    def write(self, res: Any, lanes: np.ndarray, episodes: np.ndarray) -> None:
        """Writes the episodes ``lanes`` just ended into ``res``."""
        for name, red in self.named:
            a, c = self.acc[name][lanes], self.count[name][lanes]
            res.metrics[name][episodes] = rules.finalize_metric(np, red, a, c)
        keys = self.success_keys
        if not keys:
            return
        # Each episode's key: the first one its steps had, else (no step had
        # one) the first one its reset had; -1: none.
        key_of = np.full(lanes.size, -1)
        seen = {k: self.count["last", k] for k in keys}
        for had in (seen, self.reset_has):
            for i, k in enumerate(keys):
                key_of[(key_of < 0) & (had[k][lanes] > 0)] = i
        mine = [key_of == i for i in range(len(keys))]
        has = [seen[k][lanes] > 0 for k in keys]
        per_key = {
            "success": [rules.success(np, self.acc["last", k][lanes]) for k in keys],
            "success_once": [self.acc["any", k][lanes] for k in keys],
            "has_success": has,
            "success_at_reset": [self.at_reset[k][lanes] for k in keys],
            "has_success_at_reset": [self.reset_has[k][lanes] for k in keys],
        }
        for field, values in per_key.items():  # each episode's key's values
            getattr(res, field)[episodes] = np.select(mine, values, False)
        if self.found is None:
            hit = [k for k, m, h in zip(keys, mine, has, strict=True) if (m & h).any()]
            self.found = hit[0] if hit else None

    def run_fields(self) -> dict:
        """The ``RunResult``'s metric reductions and success key."""
        key = self.success_keys[0] if len(self.success_keys) == 1 else self.found
        return {"metric_reductions": dict(self.named), "success_key": key}


class HostRecorder:
    """A run's recorded episodes in numpy ``core.tally.Recording`` buffers; where
    the envs render here, each reset and step keeps a frame."""

    def __init__(self, record: Any, lanes: Any, num_lanes: int, served: bool):
        spec = lanes.spec
        obs = observation_leaves(spec.zeros(), record.keys, f"env {spec.name!r}")
        if served and record.frames:
            raise ValueError(
                "Record(frames=True): a served env sends observations, not "
                "frames; record without frames and render with "
                "jaxmesh.render(result, frames=fn), fn(obs, None) -> rgb"
            )
        no_envs = served or record.frames is False
        envs = None if no_envs else getattr(lanes, "envs", None)
        modes = [getattr(e, "render_mode", None) for e in envs or ()]
        self.render: Any = None  # lane -> rgb array
        if envs is not None and all(m == "rgb_array" for m in modes):
            self.render = lambda j: envs[j].render()
        elif record.frames:
            what = (
                "a VectorEnv's lanes" if envs is None else f"render_mode={modes[0]!r}"
            )
            raise ValueError(
                f"Record(frames=True): {what} gives no rgb_array frames; pass envs "
                "made with render_mode='rgb_array' (a list of gymnasium Envs, or "
                "'gymnasium:<id>'), or record without frames and render with "
                "jaxmesh.render(..., frames=fn)"
            )
        self.record, self.max_steps, self.keys = record, record.max_steps, record.keys
        eps = record.episodes
        self.recording = core_results.empty_recording(
            eps, self.max_steps, obs, spec.action_shape, spec.action_dtype, xp=np
        )
        if self.render is not None:
            self.recording = self.recording.replace(frames=tuple([] for _ in eps))
        self.slot_of = {int(e): r for r, e in enumerate(eps)}
        self.slot = np.full(num_lanes, -1, np.int64)

    def begin(self, js: Any, episodes: Any) -> None:
        """Lanes ``js`` start ``episodes`` (recorded or not)."""
        self.slot[js] = [self.slot_of.get(int(i), -1) for i in episodes]

    def _put(self, r: int, k: int, obs: Any, j: int) -> None:
        """Lane j's row of ``obs`` as slot r's observation k, and its frame."""
        picked = observation_leaves(obs, self.keys, "")
        put = lambda buf, x: buf.__setitem__((r, k), x[j])
        jax.tree.map(put, self.recording.observations, picked)
        if self.render is None:
            return
        try:
            frame = self.render(int(j))
        except Exception as e:
            if self.record.frames:  # asked for: the run fails
                raise
            # Frames were only "when the env renders": go on without them.
            warnings.warn(
                f"jaxmesh.Record: env.render() failed ({type(e).__name__}: {e}); "
                "recording goes on without frames (Record(frames=False) skips "
                "them, frames=True makes this an error)",
                stacklevel=3,
            )
            self.render = None
            for kept in self.recording.frames:  # a trajectory gets all or none
                kept.clear()
            return
        if frame is not None:
            self.recording.frames[int(r)].append(np.asarray(frame, np.uint8))

    def reset(self, js: Any, obs: Any) -> None:
        """The reset observations of lanes ``js`` (``obs`` by lane)."""
        for j in js:
            if self.slot[j] >= 0:
                self._put(self.slot[j], 0, obs, j)

    def actions(self, js: np.ndarray, t: np.ndarray, actions: np.ndarray) -> None:
        """The actions (by lane) lanes ``js`` execute at their steps ``t``."""
        q = np.flatnonzero((self.slot[js] >= 0) & (t < self.max_steps))
        self.recording.actions[self.slot[js[q]], t[q]] = actions[js[q]]

    def step(self, js: np.ndarray, t: np.ndarray, obs, reward, term, trunc) -> None:
        """Step ``t`` of lanes ``js`` (``obs`` by lane, the rest aligned)."""
        q = (self.slot[js] >= 0) & (t < self.max_steps)
        r, k, rec = self.slot[js[q]], t[q], self.recording
        rec.rewards[r, k] = reward[q]
        rec.terminated[r, k] = term[q]
        rec.truncated[r, k] = trunc[q]
        for j, r_j, k_j in zip(js[q], r, k, strict=True):
            self._put(r_j, k_j + 1, obs, j)


def worker_count(
    workers: int | None, env: Any, lanes: int, record: Any, check_seeds: bool
) -> int:
    """A run's worker processes (``None``: picked when nothing needs the envs
    here); TypeError or ValueError for workers the env or settings forbid."""
    frames = record is not None and record.frames is not False
    if workers is None:
        if frames or check_seeds or not pool.is_source(env):
            return 0
        return pool.default_workers(env, lanes)
    if workers == 0:
        return 0
    pool.check_source(env, lanes)
    if record is not None and record.frames:
        raise ValueError(
            f"workers={workers}: Record(frames=True) renders the envs, which live "
            "in the worker processes; record without frames, or pass workers=0"
        )
    if check_seeds:
        raise ValueError(
            f"workers={workers}: check_seeds=True checks an env in this process; "
            "pass workers=0, or check the env first with jaxmesh.check_seeds"
        )
    return min(workers, lanes)


class _HostProgram(NamedTuple):
    config: agent.AgentConfig
    chunk: int | None
    init: Any  # (obs [N], lanes [N]) -> run.agent.HostState
    step: Any  # agent.host_step with the config and policy bound (packed)
    plan: Any  # the run's jaxmesh.run.plan.RunPlan (the config holds its sizes)
    layout: Any  # the observation leaves the policy reads (put on the device)


class HostAgent:
    """The jitted agent side of a policy, lanes and settings."""

    def __init__(self, source, policy: Policy, spec, settings, tile_lanes=None):
        self._source = source  # keeps the keyed object alive
        self.policy, self.spec, self.settings = policy, spec, settings
        self.tile_lanes = tile_lanes
        self._programs: dict = {}
        self._compiled: set = set()

    def program(self, params: Any) -> _HostProgram:
        """The program for these params' shapes (built, not compiled, once)."""
        sig = build.signature(params)
        if sig not in self._programs:
            made = run_agent.agent_functions(
                self.policy, self.spec, self.settings, params, self.tile_lanes, True
            )
            self._programs[sig] = _HostProgram(*made, self.spec.layout)
        return self._programs[sig]

    def compile(self, params: Any) -> float:
        """Compiles the program for these params once; the seconds it took."""
        sig = build.signature(params)
        if sig in self._compiled:
            return 0.0
        t0 = time.perf_counter()
        program, n = self.program(params), self.settings.num_envs
        obs, off, t = self.spec.zeros((n,)), np.zeros(n, bool), np.zeros(n, np.int32)
        state, keys = program.init(obs, off), rules.episode_keys(np, t)
        skip = np.zeros(n, np.int32) if agent.can_skip(program.config) else None
        texts = agent.text_zeros(program.config, n, np)
        _, actions = program.step(
            params, state, obs, off, off, keys, t, None, skip, texts, episodes=t
        )
        jax.block_until_ready(actions)
        self._compiled.add(sig)
        return time.perf_counter() - t0


_AGENTS = Kept()


def _host_agent(policy, pol: Policy, spec, settings, with_params, tile_lanes=None):
    # The settings the program does not read stay out of the key.
    same = settings._replace(max_steps=0, segment_steps=0, delay_ms=None)
    key = (id(policy), with_params, spec.signature, same, tile_lanes, str(pol.device))
    return _AGENTS.get(key, lambda: HostAgent(policy, pol, spec, settings, tile_lanes))


def clear_agents() -> None:
    """Drops every host agent (and compiled program) ``run_host`` keeps."""
    _AGENTS.clear()


def run_host(
    policy: Any,
    env: Any,
    config: RunConfig,
    *,
    episodes: int | None,
    seeds: Sequence[int] | None,
    hooks: Any,
    params: Any,
    served: Served | None = None,
    record: Any = None,
    grid: tuple | None = None,
    route: Callable[..., Any],
) -> RunResult:
    """``evaluate`` on host-stepped envs (docs/evaluation.md); ``grid``: a
    sweep's ``(cells, cell_episodes)``, ``route``: the backend table. Bad input
    raises before any reset; a later error carries ``exc.partial_result``."""
    t_start = time.perf_counter()
    settings, starts, with_params = config.settings, config.starts, params is not None
    if grid is not None:
        settings = settings._replace(grid=grid[0], cell_episodes=grid[1])
    if starts.check_seeds and served is not None:
        raise ValueError(
            "check_seeds=True is for envs in this process; a served env's server "
            "holds one session at a time, so check it before the run: "
            f"`jaxmesh check-env {env if isinstance(env, str) else env[0]}` (or "
            "jaxmesh.check_seeds(address))"
        )
    record = check_record(record)
    pol = resolve_policy(policy, with_params=with_params)
    seeds_arr = checks.resolve_budget(episodes, seeds, pol.device)
    e = int(seeds_arr.size)
    check_record_budget(record, e)
    records_states(record, None, "a host-stepped env")
    hook_list = stream.hooks_list(hooks)
    w: int | Ray = 0  # the workers (none when served)
    if served is not None:
        row = route(backend.Target(env, backend.SERVED))
    else:
        most, check = max(1, min(settings.num_envs, e)), starts.check_seeds
        if isinstance(config.workers, Ray):
            cluster.check_source(env, most, record, check)
            w = config.workers
        else:
            w = worker_count(config.workers, env, most, record, check)
        row = route(backend.Target(env, backend.HOST), workers=w, record=record)
    if row.name == RAY:  # the actors serve the envs: a served run from here on
        served = Served()
    lanes = row.lanes(env, settings.num_envs, e, w, served)
    remote_agent = None
    try:
        if starts.check_seeds:
            first = lanes.envs[0] if hasattr(lanes, "envs") else lanes.vec
            require_reproducible(first, "check_seeds=True")
        # A served group plans alone: the default tile is sized for its lanes.
        tile = None if served is None else lanes.group(settings, served.lane_groups)
        settings = settings._replace(num_envs=min(settings.num_envs, lanes.num_lanes))
        settings = checks.resolve_delay_ms(settings, lanes.spec.dt, lanes.spec.name)
        n = settings.num_envs
        metrics = HostMetrics(config.scoring.asked, n, lanes.spec.name)
        recorder = None
        if record is not None:
            recorder = HostRecorder(record, lanes, n, served is not None)
        # The policy's view: only the observation leaves it reads.
        spec = lanes.spec.reading(read_keys(pol.spec))
        if row.name == backend.WORKERS:  # only those leaves (and a recording's) cross
            lanes.carry(wire_leaves(lanes.spec, spec, recorder))
        texts = _lane_texts(pol, starts, lanes, n, served, seeds_arr)
        params = pol.default_params() if params is None else pol.place(params)
        # A served policy (jaxmesh.RemotePolicy) runs the agent step on its
        # server: its agent side stands in for HostAgent.
        remote = getattr(policy, "remote_agent", None)
        if remote is not None:
            agent_side = remote_agent = remote(pol, spec, settings, tile)
        else:
            agent_side = _host_agent(policy, pol, spec, settings, with_params, tile)
        program = agent_side.program(params)  # every check runs before a hook hears
        run = HostRun(
            program,
            params,
            lanes,
            settings,
            seeds_arr,
            metrics,
            config.max_episode_seconds,
            recorder,
            starts.trial_index_base,
            texts,
        )
        loop = row.loop_for(program, lanes, recorder)
        return _run(run, config, loop, agent_side, pol, hook_list, t_start)
    finally:
        if remote_agent is not None:
            remote_agent.close()
        lanes.close()


def _lane_texts(
    pol: Policy, starts: Any, lanes: Any, n: int, served: Any, seeds: np.ndarray
) -> instructions.LaneTexts | None:
    """The Text inputs' per-lane encodings (None: none), shaped by lane 0's reset."""
    name = lanes.spec.name
    encoded = instructions.check_sources(pol.spec, starts.instruction, name, host=True)
    if not encoded:
        return None
    texts = instructions.LaneTexts(pol.spec, encoded, n, pol.device, name)
    if texts.keys and served is not None:
        raise ValueError(
            f"Text(info_key={texts.keys[0]!r}): a served env sends numeric info "
            "only, so its reset info cannot carry an instruction string; pass "
            "evaluate(..., starts=jaxmesh.Starts(instruction='...')) (CLI: "
            "instruction: in the YAML)"
        )
    if texts.missing and seeds.size:
        base = [starts.trial_index_base]
        lanes.reset([0], [int(seeds[0])], base, text_keys=texts.keys)
        texts.begin([0], lanes.reset_text, [0])
    return texts


def _run(
    run: HostRun, config, loop_class, host_agent, pol, hooks, t_start
) -> RunResult:
    """Runs the budget of ``run`` in ``loop_class``."""
    program, lanes = run.program, run.lanes
    settings, cfg, metrics = run.settings, program.config, run.metrics
    n, e = settings.num_envs, int(run.seeds.size)
    # What resume= compares: digests of the env, the policy's program (kept
    # by the probe of host_agent.program) and the params.
    if hasattr(host_agent, "digest"):  # a served policy: its server's
        policy_digest = host_agent.digest()
    else:
        told = build.told_horizon(host_agent.policy, settings)
        policy_digest = build.policy_digest(
            host_agent.policy, host_agent.spec, run.params, settings.horizon, told
        )
    fingerprint = identity.run_identity(identity.host_env_digest(lanes), policy_digest)
    run_fields = stream.run_fields(
        settings,
        num_envs=n,
        effective_horizon=cfg.h,
        chunk=program.chunk,
        plan_tile=cfg.tile,
        policy=pol.name,
        env=lanes.spec.name,
        metrics=metrics.run_fields(),
        trial_index_base=run.trial_base,
        instruction=config.starts.instruction,
        success_mode=config.scoring.success_mode,
        fingerprint=fingerprint,
        max_episode_seconds=run.seconds,
    )
    workers = getattr(lanes, "workers", None)  # where the lanes are stepped:
    if getattr(lanes, "where", None):  # served lanes say it
        where = lanes.where
    elif isinstance(workers, int) and workers:
        where = f"{workers} worker process{'es' * (workers > 1)}"
    else:
        where = "this process"
    start = {"episodes": e, **run_fields, "lanes_where": where}
    stream.call(hooks, "on_run_start", start)
    episodes_out = stream.EpisodeStream(
        hooks, run.seeds, pol.on_episode_end, run_fields
    )
    episodes_out.steps = stream.StepStream(hooks, cfg.h, cfg.lead)
    ts = metrics.tracks_success
    res = core_results.empty(e, n, np, metrics=metrics.named, success=ts, at_reset=ts)
    if run.recorder is not None:  # filled in place by the loop
        res = res.replace(recording=run.recorder.recording)
    episodes_out.latest = res
    tel = Telemetry()

    def loop() -> Any:
        if e:
            host_loop = loop_class(run, res, episodes_out, tel)
            try:
                host_loop.run()
            except Exception as exc:
                own = callback_error(exc)  # a HostPolicy's own error, not JAX's
                if isinstance(own, HostPolicyError):  # it names its episodes
                    raise host_loop.policy_error(own) from own.__cause__
                named = host_loop.env_error(exc)  # an env's error names its episode
                if named is exc:
                    raise
                raise named from exc
        run_fields["telemetry"] = tel.stats()
        run_fields.update(metrics.run_fields())
        if run_fields["success_key"] is None:  # auto mode, no episode had one
            return res.replace(**dict.fromkeys(core_results.SUCCESS_FIELDS))
        if not res.has_success_at_reset.any():  # no reset info had the key
            return res.replace(success_at_reset=None, has_success_at_reset=None)
        return res

    warm_up = lambda: host_agent.compile(run.params) if e else 0.0
    return stream.drive(episodes_out, t_start, warm_up, loop)
