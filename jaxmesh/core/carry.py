"""What the scan engine carries, and the host arithmetic of a run's first carry:
the first lanes (CONTRACT 3), a run's own values (``given``, ``refill``) and
the seed window a segment reads (docs/evaluation.md, "Compiling once").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import struct

from jaxmesh.core import agent, rules, tally

#: Built-in bound on an episode's length when no cap is given (CONTRACT 7).
DEFAULT_MAX_STEPS = 100_000

#: The episode index a lane without an episode holds: above every budget.
NO_EPISODE = np.iinfo(np.int32).max

#: A segment's seed window spans this many logs' worth of episodes (plus N),
#: so the host puts a new one only every few segments.
WINDOW_LOGS = 4


@dataclasses.dataclass(frozen=True, eq=False)
class TrialReset:
    """Episodes that start from a trial index (``jaxmesh.run.initial``).

    Attributes:
      reset: one lane's ``reset(key, trial, data) -> (obs, state)``.
      data: the shapes (``jax.ShapeDtypeStruct`` leaves) of the data ``reset``
        reads (``()`` for none), carried in ``LaneState.trials``.
    """

    reset: Any
    data: Any = ()


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static configuration: what the compiled program depends on.

    ``capacity``: the rows of a segment's log, or the budget of ``Engine.run``.
    """

    capacity: int
    max_steps: int
    agent: agent.AgentConfig
    #: ``(info key, reduction)`` pairs kept per episode (``tally.REDUCTIONS``).
    metrics: tuple[tuple[str, str], ...] = ()
    #: The info key of the success signal (None: none).
    success: str | None = None
    #: The reset's info (``env.reset_with_info``) holds the success key.
    success_at_reset: bool = False
    #: Recorded episodes (``jaxmesh.Record``): how many (0: none), the steps
    #: kept per episode, the observation leaves kept (None: all), and whether
    #: the env's render state is kept.
    record_slots: int = 0
    record_steps: int = 0
    record_keys: tuple[str, ...] | None = None
    record_states: bool = False
    #: Each step sends its per-lane arrays to ``Engine``'s ``on_step``.
    step_events: bool = False
    #: Episodes start from a trial index; None: from ``env.reset(PRNGKey(seed))``.
    trials: TrialReset | None = None

    @property
    def accumulators(self) -> tuple[tuple[str, str], ...]:
        """The metrics, then the success key's ``last`` and ``any``."""
        if self.success is None:
            return self.metrics
        return self.metrics + ((self.success, "last"), (self.success, "any"))

    @property
    def reads_info(self) -> bool:
        """Whether the step needs the env's info (``step_with_info``)."""
        return bool(self.accumulators)


@struct.dataclass
class LaneState:
    episode: jax.Array  # [N] episode index run (or about to start) by each lane
    active: jax.Array  # [N] lane runs an episode
    start: jax.Array  # [N] lane begins `episode` at the next step
    t: jax.Array  # [N] steps done in the current episode
    ret: jax.Array  # [N] return so far
    key: jax.Array  # [N, 2] PRNGKey(seed) of the current episode (at hand-over)
    env_state: Any
    #: The seeds of episodes ``base, base + 1, ...`` (a segment's window), or
    #: [capacity] under ``run``.
    seeds: jax.Array
    budget: jax.Array  # () episodes to score
    base: jax.Array  # () the episode of ``seeds[0]`` (and of the trial indices')
    next_episode: jax.Array  # () next unstarted episode index
    n_done: jax.Array  # () episodes ended
    #: [N] per ``EngineConfig.accumulators``: the current episode's reduction.
    acc: tuple = ()
    #: With ``EngineConfig.trials``: ``(trial_of, data)`` for the window.
    trials: tuple = ()
    #: [N] the current episode's reset info had a non-zero success key (None
    #: unless ``EngineConfig.success_at_reset``).
    reset_success: Any = None


#: The lane and agent fields a run brings, and the counters it reads before it
#: writes them: all that ``refill`` puts anew.
GIVEN = (
    "seeds",
    "base",
    "budget",
    "episode",
    "start",
    "next_episode",
    "trials",
    "active",
    "n_done",
)
AGENT_GIVEN = ("fresh", "rows", "texts")


@struct.dataclass
class Carry:
    lanes: LaneState
    agent: agent.AgentState
    results: tally.Results


@struct.dataclass
class Inner:
    """The inner loop's state: per-lane arrays and counters, no result buffer."""

    lanes: LaneState
    agent: agent.AgentState
    recording: Any  # the recording buffers (None without ``record_slots``)
    #: [R] each recorded episode was done when the loop began (None without
    #: ``record_slots``).
    record_done: Any
    fault: tally.Fault
    env_steps: jax.Array  # () executed env steps of active lanes
    steps: jax.Array  # () steps of the segment so far
    go_on: jax.Array  # () no step event was refused
    #: [N] of the last step: the lane's episode ended, terminated, truncated,
    #: and ended with no bad value (scored).
    ended: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    scored: jax.Array


def window_size(config: EngineConfig) -> int:
    """The seeds a segment's window holds: a segment hands over at most
    ``capacity`` episodes, and its first lanes took theirs at most N before."""
    return WINDOW_LOGS * config.capacity + config.agent.num_envs


def first_lanes(xp, n: int, budget: Any) -> dict:
    """Lane j starts episode j (CONTRACT 3); every lane is reset on the first
    step, so that a masked lane steps a valid env state never scored."""
    start, episode, next_episode = rules.next_episodes(
        xp, xp.ones((n,), bool), 0, budget
    )
    return {
        "episode": xp.where(start, episode, NO_EPISODE).astype(xp.int32),
        "start": xp.ones((n,), bool),
        "next_episode": xp.asarray(next_episode).astype(xp.int32),
    }


def window(
    config: EngineConfig, seeds: np.ndarray, next_episode: int, trial_of: Any = None
) -> dict:
    """The window of a segment whose next unstarted episode is
    ``next_episode``: ``base = max(0, next_episode - N)`` and the seeds (and
    trial indices) of episodes ``base, ...``, zero past the budget."""
    size = window_size(config)
    base = max(0, int(next_episode) - config.agent.num_envs)

    def cut(values):
        part = np.asarray(values)[base : base + size].astype(np.int32)
        return np.pad(part, (0, size - part.size))

    out = {"seeds": cut(seeds), "base": np.int32(base)}
    if config.trials is not None:
        out["trial_of"] = cut(trial_of)
    return out


def window_fits(config: EngineConfig, base: int, next_episode: int) -> bool:
    """Whether the window at ``base`` holds every episode a segment that
    starts with ``next_episode`` may begin."""
    first = max(0, int(next_episode) - config.agent.num_envs)
    end = int(next_episode) + config.capacity
    return base <= first and end <= base + window_size(config)


def with_window(lanes: LaneState, window: dict) -> LaneState:
    """``lanes`` with a ``window`` (host or placed arrays) in them."""
    lanes = lanes.replace(seeds=window["seeds"], base=window["base"])
    if "trial_of" in window:
        lanes = lanes.replace(trials=(window["trial_of"], lanes.trials[1]))
    return lanes


def given(
    config: EngineConfig, carry: Carry, seeds, record=None, trials=None, texts=None
) -> Carry:
    """``carry`` with a run's own values (host arrays) in ``GIVEN`` and
    ``AGENT_GIVEN`` and the recorded episodes (``Engine.first_carry``).

    Raises:
      ValueError: ``record`` does not name ``config.record_slots`` episodes.
    """
    n = config.agent.num_envs
    budget = np.int32(seeds.size)
    lanes = carry.lanes.replace(
        budget=budget,
        active=np.zeros((n,), bool),
        n_done=np.int32(0),
        **first_lanes(np, n, budget),
    )
    if config.trials is not None:
        lanes = lanes.replace(trials=(None, trials[1]))
    lanes = with_window(lanes, window(config, seeds, 0, trials and trials[0]))
    ag = carry.agent.replace(fresh=np.zeros((n,), bool), rows=np.int32(0))
    if config.agent.texts:
        ag = ag.replace(texts=texts)
    carry = carry.replace(lanes=lanes, agent=ag)
    if config.record_slots:
        episodes = np.asarray(record, np.int32)
        if episodes.shape != (config.record_slots,):
            raise ValueError(
                f"record={record!r}: this engine records "
                f"{config.record_slots} episodes; pass that many indices"
            )
        rec = carry.results.recording.replace(episodes=episodes)
        carry = carry.replace(results=carry.results.replace(recording=rec))
    return carry


def refill(
    config: EngineConfig,
    spare: tuple,
    results0: tally.Results,
    seeds: np.ndarray,
    device: Any = None,
    **run: Any,
) -> Carry:
    """``Engine.first_carry`` on the ``spare`` ``(lanes, agent)`` of a finished
    run and the zero ``results0`` of a first carry: only ``GIVEN`` and
    ``AGENT_GIVEN`` travel to the device, in one transfer. ``run``: the
    run's ``record``, ``trials`` and ``texts``."""
    lanes, ag = spare
    put = given(config, Carry(lanes, ag, results0), seeds, **run)
    host = (
        {f: getattr(put.lanes, f) for f in GIVEN},
        {f: getattr(put.agent, f) for f in AGENT_GIVEN},
        put.results.recording.episodes if config.record_slots else None,
    )
    lane_fields, agent_fields, episodes = jax.device_put(host, device)
    res = results0
    if config.record_slots:
        res = res.replace(recording=res.recording.replace(episodes=episodes))
    return Carry(lanes.replace(**lane_fields), ag.replace(**agent_fields), res)
