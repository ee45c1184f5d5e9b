"""The host loop: ``HostLoop``'s per-lane state and step rules, paced by
``LocalRun`` (every lane once per iteration), ``GroupedRun`` (a worker's lanes at
a time) or ``served`` (each lane at its own pace). docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import jax
import numpy as np

from jaxmesh.core import agent, replay, rules
from jaxmesh.core import tally as core_results
from jaxmesh.envs.gymnasium import workers as pool
from jaxmesh.envs.gymnasium.lanes import where_raised
from jaxmesh.errors import (
    EnvError,
    HostPolicyError,
    RemoteEnvError,
    WorkerError,
    describe_env_error,
)
from jaxmesh.run import identity, stream

#: Seeds whose reset observations a run remembers (``HostLoop.seen_resets``).
MAX_SEEDS_CHECKED = 1_000_000


def wire_leaves(spec: Any, program: Any, recorder: Any) -> tuple[str, ...]:
    """The observation leaves the policy reads or a recording keeps, in order."""
    read = tuple(program.layout.names)
    if recorder is None:
        return read
    keep = recorder.keys
    return tuple(
        n
        for n in spec.layout.names
        if keep is None
        or n in read
        or any(n == k or n.startswith(k + "/") for k in keep)
    )


@dataclasses.dataclass(frozen=True)
class HostRun:
    """What one host-stepped run is given (``driver.run_host``)."""

    program: Any  # the agent program (``driver.HostAgent.program``)
    params: Any
    lanes: Any  # in process, in worker processes or served
    settings: Any  # checked: ``num_envs`` lanes, ``max_steps``
    seeds: np.ndarray  # the budget's
    metrics: Any  # ``driver.HostMetrics``
    seconds: float | None = None  # ``max_episode_seconds``
    recorder: Any = None  # ``driver.HostRecorder``
    trial_base: int = 0  # episode i's trial index is this + i
    texts: Any = None  # Text inputs per lane (``instructions.LaneTexts``)


class HostLoop:
    """Per-lane episode state and step rules, filling ``res`` (numpy
    ``core.tally.Results``); a subclass defines ``reset_lanes`` and ``run``."""

    def __init__(
        self, run: HostRun, res: core_results.Results, episodes_out: Any, tel: Any
    ):
        self.program, self.lanes = program, lanes = run.program, run.lanes
        self.params = jax.device_put(run.params)
        self.texts, self.seconds, self.seeds = run.texts, run.seconds, run.seeds
        self.cfg, self.spec = program.config, lanes.spec
        self.res, self.episodes_out, self.tel = res, episodes_out, tel
        self.metrics, self.recorder = run.metrics, run.recorder
        self.steps = episodes_out.steps  # on_step hooks (falsy: none)
        self.n, self.e = run.settings.num_envs, int(run.seeds.size)
        self.max_steps = run.settings.max_steps
        n, spec = self.n, self.spec
        self.episode = np.full(n, -1, np.int64)
        # Running an episode; beginning it at the next step; of a lost server.
        self.active, self.started, self.dead = np.zeros((3, n), bool)
        self.t = np.zeros(n, np.int32)  # steps executed
        self.ret = np.zeros(n, np.float32)
        self.ep_keys = rules.episode_keys(np, np.zeros(n))  # seed 0's until a start
        self.keys_device: Any = None  # ep_keys on the device (None: stale)
        # Each lane's last observation (aligned: a CPU device reads it in place),
        # as its structure (``obs``) and the leaves the policy reads.
        self.obs_leaves = spec.layout.empty((n,), aligned=True)
        self.obs = spec.layout.build(self.obs_leaves)
        self.agent_obs = program.layout.build(self.obs_leaves)
        # The action each lane executes at its current step (for the hooks).
        self.step_action = np.zeros((n,) + spec.action_shape, spec.action_dtype)
        # Episode start times where this process measures max_episode_seconds.
        self.t0: np.ndarray | None = None
        self.env_steps = self.next_episode = 0
        # Each episode's trial index (a resumed run runs a part of the budget).
        self.trial_of = run.trial_base + identity.episode_indices(self.e)
        self.losses: dict[int, int] = {}  # episode -> worker deaths under it
        # Started episodes to run again from their seeds (a lost lane's), taken
        # before the next unstarted ones, lowest index first.
        self.rerun: list[int] = []
        # Seed -> (first episode, digest of its reset observation).
        self.reset_digest: dict[int, tuple[int, int]] = {}
        self.warned_seeds = False
        self.state: Any = None
        # A lane whose next action is a known replay takes it on the host; the
        # next agent step is told how many it took (``skip``).
        self.skipping = agent.can_skip(self.cfg)
        self.skip = np.zeros(n, np.int32) if self.skipping else None
        self.cursor = np.zeros(n, np.int64)  # the next chunk index per lane
        self.chunk: np.ndarray | None = None
        # Under a sweep: each lane's episode's h and lead (``lane_setting``).
        self.lane_h = self.lane_lead = None
        if self.cfg.grid is not None:
            self.lane_h = np.full(n, self.cfg.h, np.int64)
            self.lane_lead = np.zeros(n, np.int64)

    def start(self, js: list[int], eps: list[int]) -> None:
        """Lanes ``js`` begin episodes ``eps`` (``rules.next_episodes``)."""
        if not js:
            return
        self.ep_keys[js] = rules.episode_keys(np, self.seeds[eps])
        self.keys_device = None
        self.episode[js] = eps
        if self.lane_h is not None:  # the cell the agent step gives it
            cell = agent.cell_setting(self.cfg, eps, np)
            self.lane_h[js], self.lane_lead[js] = cell[:, 0], cell[:, 1]
        self.t[js], self.ret[js], self.active[js] = 0, 0.0, True
        self.metrics.begin(js)
        if self.recorder is not None:
            self.recorder.begin(js, eps)
        self.reset_lanes(js, eps)

    def take_next(self, free: np.ndarray) -> np.ndarray:
        """Free live lanes take the reruns, then unstarted episodes (CONTRACT
        3); returns the lanes left without one (masked, ascending)."""
        free = self.start_reruns(free & ~self.dead)
        starts, eps, self.next_episode = rules.next_episodes(
            np, free, self.next_episode, self.e
        )
        masked = free & ~starts
        self.active[masked] = False
        self.episode[masked] = -1
        if starts.any():
            self.start(np.flatnonzero(starts).tolist(), eps[starts].tolist())
        return np.flatnonzero(masked)

    def start_reruns(self, free: np.ndarray) -> np.ndarray:
        """The lowest ``free`` lanes start the reruns; the lanes still free."""
        js = np.flatnonzero(free)[: len(self.rerun)]
        if not js.size:  # no rerun, or no free lane
            return free
        again, self.rerun = self.rerun[: js.size], self.rerun[js.size :]
        free = free.copy()
        free[js] = False
        self.start(js.tolist(), again)
        return free

    def seen_resets(self, js: Any) -> None:
        """Warns once when a seed reset twice gives another observation."""
        if self.warned_seeds:
            return
        for j in np.asarray(js).tolist():
            i = int(self.episode[j])
            seed = int(self.seeds[i])
            digest = hash(b"".join(x[j].tobytes() for x in self.obs_leaves.values()))
            first = self.reset_digest.setdefault(seed, (i, digest))
            if first[1] != digest:
                self.warned_seeds = True
                warnings.warn(
                    f"env {self.spec.name!r} gave different reset observations for "
                    f"seed {seed} (episodes {first[0]} and {i}): its reset(seed=...) "
                    "does not reproduce an episode, so results depend on what the "
                    "env ran before (MetaWorld-style envs pick their task by the "
                    "trial index, not the seed); jaxmesh.check_seeds(env) checks an "
                    "env",
                    UserWarning,
                    stacklevel=2,
                )
                return
            if len(self.reset_digest) >= MAX_SEEDS_CHECKED:
                self.warned_seeds = True  # enough seeds seen: stop checking
                return

    def lose_lanes(self, js: np.ndarray) -> list[int]:
        """Lanes ``js`` are gone for good: their episodes, to run again."""
        self.dead[js] = True
        lost = self.give_back(js)
        self.start_reruns(~self.active & ~self.dead)  # idle lanes take them now
        return lost

    def give_back(self, js: np.ndarray) -> list[int]:
        """Lanes ``js``' unfinished episodes, moved to ``rerun``."""
        lost = sorted(int(i) for i in self.episode[js][self.active[js]])
        self.active[js] = self.started[js] = False
        self.episode[js] = -1
        self.rerun = sorted(self.rerun + lost)
        return lost

    def requeue(self, js: np.ndarray) -> None:
        """Lanes ``js`` lost their worker: their unfinished episodes run again
        (CONTRACT 30); WorkerError for an episode lost this way twice."""
        js = js[self.active[js]]
        # The episode whose step was under way is the one counted; every one
        # on the worker when that is unknown.
        culprits = [j for j in getattr(self.lanes, "culprits", ()) if j in js]
        counted = sorted(int(self.episode[j]) for j in culprits or js)
        for i in counted:
            self.losses[i] = self.losses.get(i, 0) + 1
            if self.losses[i] >= 2:
                raise WorkerError(
                    f"episode {i} (seed {int(self.seeds[i])}) was running when its "
                    "worker process died, twice: its env crashes the process (a "
                    "simulator fault, or memory). Run it alone (seeds=[...], "
                    "workers=0) to see the error",
                    episode=i,
                    seed=int(self.seeds[i]),
                )
        lost = self.give_back(js)
        self.tel.add("worker_lost", 1)
        event = {"event": "worker lost", "lanes": js.tolist(), "episodes_rerun": lost}
        stream.call(self.episodes_out.hooks, "on_fault", event)

    def lane_setting(self, js: np.ndarray) -> tuple[Any, Any]:
        """Lanes ``js``' effective horizon and lead (a delay plans as a lead)."""
        if self.lane_h is None:
            m = np.shape(js)[0]
            return np.full(m, self.cfg.h), np.full(m, self.cfg.lead)
        return self.lane_h[js], self.lane_lead[js]

    def agent_step(self, started: Any, active: Any, moved: Any) -> Any:
        """The jitted agent step (``agent.host_step``): actions on the device."""
        if self.keys_device is None:
            self.keys_device = self.program.step.keys_on_device(self.ep_keys)
        self.state, actions = self.program.step(
            self.params,
            self.state,
            self.agent_obs,
            started,
            active,
            self.keys_device,
            self.t,
            moved,
            self.skip,
            {} if self.texts is None else self.texts.device(),
            episodes=self.episode,
        )
        return actions

    def predict(self, go: np.ndarray, row: str, cursor: bool = False) -> tuple:
        """``(actions, cursors or None, end time)`` of lanes ``go``."""
        t0 = time.perf_counter()
        # moved = go, not None: the same actions, and XLA on a CPU pushes the
        # frame into the windows in one fused pass where it copies an unmasked
        # one (a third less time with large images).
        device = self.agent_step(self.started & go, go, go)
        actions, cursors = self.read_actions(device, cursor)
        t1 = time.perf_counter()
        self.tel.span("predict", t0, t1, row)
        self.started[go] = False
        return actions, cursors, t1

    def read_actions(self, actions: Any, cursor: bool = False) -> tuple:
        """The actions on the host, and the cursors if skipping or asked."""
        if self.skipping:
            (actions,) = self.state.read_back(actions)  # with the state's words
            cur, self.chunk = jax.device_get((self.state.cursor, self.state.chunk))
            self.cursor = cur.astype(np.int64)
            self.skip[:] = 0
            return np.asarray(actions), self.cursor
        if cursor:
            (actions,) = self.state.read_back(actions)
            return np.asarray(actions), self.state.cursor
        return np.asarray(actions), None

    def replays_next(self) -> np.ndarray:
        """[N] lanes whose next action is a replay the host knows."""
        if not self.skipping:
            return np.zeros(self.n, bool)
        return ~self.started & ~agent.plans_due(
            self.cfg, self.cursor, self.lane_h, self.lane_lead
        )

    def replayed(self, js: np.ndarray) -> np.ndarray:
        """Lanes ``js``' next chunk actions (by lane) without an agent step."""
        actions = np.zeros_like(self.step_action)
        actions[js] = self.chunk[js, replay.play_index(self.cursor[js], self.cfg.h, np)]
        self.cursor[js] += 1
        self.skip[js] += 1
        return actions

    def account(self, j, r, te, tr, faults: tuple | None = None) -> None:
        """Step results ``r, te, tr`` [m] of lanes ``j`` (ascending; their
        observations in ``obs``); ``faults``: ``action_faults``'."""
        if j.size == self.n:  # every lane (j ascending: 0 .. n-1), no index
            step_index = self.t.copy()  # the 0-based step just executed
            self.t += 1
            self.ret += r
        else:
            step_index = self.t[j]  # a copy
            self.t[j] = step_index + 1
            self.ret[j] += r
        self.env_steps += int(j.size)
        tr = tr | rules.at_cap(np, step_index + 1, self.max_steps)
        if self.t0 is not None:
            tr = tr | (time.perf_counter() - self.t0[j] >= self.seconds)
        if self.recorder is not None:
            self.recorder.step(j, step_index, self.obs, r, te, tr)
        ok = np.isfinite(r)  # rules.reward_faults, for these lanes alone
        clean = np.count_nonzero(ok) == ok.size  # the usual step: all finite
        if not clean:  # the bad rewards join the step's faults (a copy)
            bad, n = ~ok, self.n
            kinds, values = rules.reward_faults(np, r, np.ones(j.size, bool))
            new = (np.zeros(n, np.int32), np.zeros(n, np.float32), self.t.copy())
            faults = new if faults is None else tuple(x.copy() for x in faults)
            for x, v in zip(faults, (kinds, values, step_index), strict=True):
                x[j[bad]] = v[bad]
        if self.steps:  # lanes ascending; a step that met a bad value is not one
            js = j[ok]
            rows = (step_index[ok], self.step_action[js], r[ok], te[ok], tr[ok])
            self.steps.emit(js, self.episode[js], *rows)
        end = te | tr if clean else (te | tr) & ok
        ended = j[end]
        if ended.size:
            res, i = self.res, self.episode[ended]
            if self.metrics.active:
                self.metrics.write(res, ended, i)
            res.returns[i] = self.ret[ended]
            res.lengths[i] = self.t[ended]
            res.terminated[i] = te[end]
            res.truncated[i] = tr[end]
            res.lanes[i] = ended
        self.close_episodes(ended, faults)
        self.steps.raise_error()  # a hook raised on a step that ended nothing

    def action_faults(self, go: np.ndarray, actions: np.ndarray) -> tuple | None:
        """``(kinds, values, steps)`` [N] of bad actions of lanes ``go``, or None."""
        n = self.spec.num_actions
        if n is None:  # the usual step in one or two reductions
            usual = np.isfinite(actions).all()
        else:
            usual = not actions.size or (actions.min() >= 0 and actions.max() < n)
        if usual:
            return None
        kinds, values = rules.action_faults(np, actions, go, n)
        return (kinds, values, self.t.copy()) if kinds.any() else None

    def close_episodes(self, ended: np.ndarray, faults: tuple | None) -> None:
        """Marks lanes ``ended``' episodes done, raises ``faults``, starts more."""
        res = self.res
        res.env_steps[...] = self.env_steps
        if not ended.size and faults is None:
            return
        calls, rows = jax.device_get((self.state.predict_calls, self.state.rows))
        res.policy_rows[...] = rows
        i = self.episode[ended]
        res.predict_calls[i] = calls[ended]
        res.done[i] = True
        if faults is not None:
            kinds, values, steps = faults
            js = np.flatnonzero(kinds != core_results.NO_FAULT)
            f = res.fault
            f.kind[js] = kinds[js]
            f.episode[js] = np.maximum(self.episode[js], 0)
            f.step[js] = steps[js]
            f.value[js] = values[js]
        # A hook that raised on this step ends the run here: the episodes that
        # ended on it are done (in exc.partial_result), as on the scan path.
        self.steps.raise_error()
        self.episodes_out.update(res)
        self.episodes_out.check_fault(res)
        self.take_next(np.isin(np.arange(self.n), ended))

    def env_error(self, exc: Exception) -> Exception:
        """``exc`` naming the episode, seed, lane and step it was raised at."""
        where = where_raised(exc)
        if where is None or not 0 <= where[0] < self.n:
            return exc
        lane, phase, steps = where
        episode = int(self.episode[lane])
        if episode < 0:
            return exc
        seed = int(self.seeds[episode])
        step = None if phase == "resetting" else int(self.t[lane]) + steps
        at = {"episode": episode, "seed": seed, "lane": lane, "step": step}
        if isinstance(exc, RemoteEnvError):
            kept = ("address", "remote_traceback", "phase", "steps_done", "summary")
            message = describe_env_error(
                exc.summary or "an error", server=exc.address, **at
            )
            return RemoteEnvError(
                f"{message}; its traceback on the server:\n{exc.remote_traceback}",
                server=exc.address,
                **{k: getattr(exc, k) for k in kept},
                **at,
            )
        what = f"{type(exc).__name__}: {exc}"
        return EnvError(describe_env_error(what, **at), **at)

    def policy_error(self, exc: HostPolicyError) -> HostPolicyError:
        """``exc`` with the episode each of its lanes was running."""
        if exc.episodes is not None:
            return exc
        lanes = [j for j in exc.lanes if 0 <= j < self.n and self.episode[j] >= 0]
        if not lanes:
            return exc
        return HostPolicyError(
            str(exc),
            policy=exc.policy,
            lanes=lanes,
            episodes=[int(self.episode[j]) for j in lanes],
        )

    def finish(self) -> None:
        """The run's totals, once every episode has ended."""
        self.res.env_steps[...] = self.env_steps
        self.res.policy_rows[...] = jax.device_get(self.state.rows)


class LocalRun(HostLoop):
    """Every running lane once per iteration, in the scan's order (CONTRACT 3,
    6); ``max_episode_seconds`` counts from just before a reset."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        if self.seconds is not None:
            self.t0 = np.zeros(self.n, np.float64)
        self.lanes.info_keys = self.metrics.keys

    def reset_lanes(self, js: list[int], eps: list[int]) -> None:
        if self.t0 is not None:
            self.t0[js] = time.perf_counter()
        seeds = [int(self.seeds[i]) for i in eps]
        trials = self.trial_of[eps].tolist()
        keys = () if self.texts is None else self.texts.keys
        if keys:  # the episodes' instructions are in their reset infos
            first = self.lanes.reset(js, seeds, trials, text_keys=keys)
            self.texts.begin(js, self.lanes.reset_text, eps)
        else:
            first = self.lanes.reset(js, seeds, trials)
        for name, rows in first.items():
            self.obs_leaves[name][js] = rows
        if self.metrics.tracks_success:
            self.metrics.reset(js, self.lanes.reset_info)
        self.started[js] = True
        self.seen_resets(js)
        if self.recorder is not None:
            self.recorder.reset(js, self.obs)

    def run(self) -> None:
        self.take_next(np.ones(self.n, bool))
        self.state = self.program.init(self.agent_obs, self.active.copy())
        while np.count_nonzero(self.active):  # every running lane steps once
            t_env = time.perf_counter()
            if self.skipping and not np.any(self.active & ~self.replays_next()):
                actions = self.replayed(np.flatnonzero(self.active))
            else:
                actions, _, t_env = self.predict(self.active, "lanes")
            self.started[:] = False
            faults = self.action_faults(self.active, actions)
            go = self.passed(self.active, faults)
            reward, term, trunc = self.lanes.step(actions, go, self.obs_leaves)
            self.stepped(go, reward, term, trunc, actions, faults, t_env, "lanes")
        self.finish()

    def passed(self, go: np.ndarray, faults: tuple | None) -> np.ndarray:
        """The lanes of ``go`` whose action passed the checks."""
        return go if faults is None else go & (faults[0] == core_results.NO_FAULT)

    def stepped(self, go, reward, term, trunc, actions, faults, t_env, row) -> None:
        """The lanes in ``go`` executed ``actions`` (by lane)."""
        self.tel.span("env_step", t_env, time.perf_counter(), row)
        metrics, lanes = self.metrics, self.lanes
        lost = getattr(lanes, "lost", ())  # lanes whose worker died in this step
        if len(lost):
            lost = np.asarray(lost, np.int64)
            lost = lost[lost < self.n]
        if len(lost):
            go = go.copy()
            go[lost] = False
            self.requeue(lost)
        j = go.nonzero()[0]  # (``np.flatnonzero`` of [N] bool, without its ravel)
        if metrics.active:  # the step's info values (``lanes.info``)
            if getattr(lanes, "info_empty", False):  # no info had a key asked for
                present: set = set()
            else:
                present = {k for k, (_, p) in lanes.info.items() if p.any()}
            if not metrics.checked and go.any():
                metrics.check(present, lanes.info_seen)
            if present:  # else no lane's info had a key: nothing to add
                metrics.step(j, {k: (v[j], p[j]) for k, (v, p) in lanes.info.items()})
        if self.recorder is not None:
            self.recorder.actions(j, self.t[j], actions)
        if self.steps:  # only the hooks read it (``account``)
            shape = (-1,) + (1,) * (actions.ndim - 1)
            self.step_action = np.where(go.reshape(shape), actions, self.step_action)
        if j.size == self.n:  # every lane: the arrays as they are (fresh ones)
            self.account(j, reward, term, trunc, faults)
        else:
            self.account(j, reward[j], term[j], trunc[j], faults)
        if len(lost):  # a dead worker's lanes (rebuilt) take the reruns
            self.take_next(np.isin(np.arange(self.n), lost) & ~self.active)


class GroupedRun(LocalRun):
    """One worker's lanes at a time: this process plans the next group while a
    worker steps its own (``LocalRun``'s results; lanes depend on timing)."""

    @staticmethod
    def applies(program: Any, lanes: Any, recorder: Any) -> bool:
        """The per-step case with more cores than workers."""
        cfg = program.config
        groups = getattr(lanes, "groups", None)
        return (
            groups is not None
            and 1 < len(groups) < pool.cores()
            and cfg.h == 1
            and cfg.lead == 0
            and cfg.grid is None
            and recorder is None
        )

    def run(self) -> None:
        self.take_next(np.ones(self.n, bool))
        self.state = self.program.init(self.agent_obs, self.active.copy())
        masks = [np.isin(np.arange(self.n), g) for g in self.lanes.groups]
        inflight: list = [None] * len(masks)
        try:
            while self.active.any() or any(inflight):
                for g, group in enumerate(masks):
                    if inflight[g] is not None:  # the group's step is taken
                        sent, step, actions, faults, t1 = inflight[g]
                        inflight[g] = None
                        got = self.lanes.take(sent, step, self.obs_leaves)
                        self.stepped(step, *got, actions, faults, t1, "group")
                    go = self.active & group
                    if go.any():  # its agent step, and the send of its actions
                        actions, _, t1 = self.predict(go, "group")
                        faults = self.action_faults(go, actions)
                        step = self.passed(go, faults)
                        sent = self.lanes.send(actions, step)
                        inflight[g] = sent, step, actions, faults, t1
        finally:
            sent = [f[0] for f in inflight if f is not None]
            if sent:  # an error: read what is in flight, so no reply is left
                self.lanes.pool.take(sum(sent, []))
        self.finish()
