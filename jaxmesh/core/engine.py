"""The scan engine: lane bookkeeping around the agent step and a JAX env.

For all N lanes at once, the engine resets the lanes that start an episode
(compacted tiles), plans (compacted tiles) and replays chunks
(``agent.act``), steps the env, pushes frame windows (``agent.observe``),
accounts episodes (returns, lengths, ends, results written at the episode's
index), hands the next unstarted episode to lanes that finished (ascending
lane order), masks lanes with nothing left to start, and checks for bad
values on the device (``tally.Fault``). Episode metrics
(``EngineConfig.metrics``) are accumulators in the lane state, reduced on
every step and written into the results at the episode's end: no host round
trip. Recorded episodes (``EngineConfig.record_slots``) are written step by
step into fixed buffers in the results (``tally.Recording``), also without
a host round trip. Only ``EngineConfig.step_events`` (an ``on_step`` hook)
adds one: an ordered ``io_callback`` per step that hands the per-lane values
to the host.

The loop has two levels (``Engine._advance``): an inner loop of env steps
(resets of starting lanes included) that runs until an episode ends, holding
per-lane state only, and an outer loop that writes the ended episodes'
results and hands the next episodes over. Step by step the order is CONTRACT
3's; the split keeps the result buffers out of the step every step runs.

The segment program never depends on the budget, and neither do the
buffers it carries or what the host reads after it: ``Engine.run_segment``
advances up to S steps, writes the episodes that end into a *log* of
``capacity`` rows (each row names its episode, ``Results.index``) and reads
the seeds from a *window* of them starting at ``LaneState.base``
(``window_size``), which the host puts anew when a segment could need a seed
past it (``window``, ``window_fits``). It stops
as soon as the budget is done, a fault is seen, or the log could not hold
another step's ends; the host then copies the rows written into its own
arrays, indexed by episode (``tally.write``). ``capacity`` is sized by the
lanes, so every budget runs on one program at the same cost per episode.
``Engine.run`` runs a whole budget of ``capacity`` seeds in one call, with
result buffers indexed by episode, and is the pure function behind
``make_evaluator``.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from jaxmesh.core import agent, convs, rules, tally, tiles
from jaxmesh.core.policy import Policy

#: Built-in bound on an episode's length when no cap is given (CONTRACT 7).
DEFAULT_MAX_STEPS = 100_000

#: Lanes reset per call of the env's reset, at most: only lanes that start an
#: episode are reset, gathered in tiles of ``min(RESET_TILE, N)``. Fewer lanes
#: get a smaller tile: a one-lane step then touches no buffer over 512 bytes,
#: which XLA:CPU needs to run a step's kernels in one sequence, and the env's
#: step runs all N lanes in one batch anyway.
RESET_TILE = 32

#: The episode index a lane without an episode holds: above every budget.
NO_EPISODE = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True, eq=False)
class TrialReset:
    """Episodes that start from a trial index (``Starts(initial_states=...)``
    or ``reset_fn=``, ``jaxmesh.run.initial``) instead of ``env.reset(key)``.

    Attributes:
      reset: one lane's ``reset(key, trial, data) -> (obs, state)``, with the
        output structure, shapes and dtypes of ``env.reset``'s.
      data: the shapes (``jax.ShapeDtypeStruct`` leaves) of the run's data that
        ``reset`` reads (the stacked initial states; ``()`` for none). The data
        itself rides in the lanes (``LaneState.trials``): new values of the same
        shapes run on the same program.
    """

    reset: Any
    data: Any = ()


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static configuration: what the compiled program depends on.

    ``capacity``: the rows of a segment's log (``run_segment``; its seed
    window: ``window_size``), or the budget of ``run``.
    """

    capacity: int
    max_steps: int
    agent: agent.AgentConfig
    #: ``(info key, reduction)`` pairs kept per episode (``tally.REDUCTIONS``).
    metrics: tuple[tuple[str, str], ...] = ()
    #: The info key that is an episode's success signal (None: none): its
    #: last value (success at the end) and whether any step had it non-zero
    #: (success once) are kept per episode.
    success: str | None = None
    #: Whether the reset's info (``env.reset_with_info``) holds the success
    #: key: each episode then also keeps whether it was successful at reset.
    success_at_reset: bool = False
    #: Recorded episodes (``jaxmesh.Record``): how many (0: no recording), the
    #: steps kept per episode, and the observation leaves kept (None: all).
    #: Which episodes they are is data (``Recording.episodes``).
    record_slots: int = 0
    record_steps: int = 0
    record_keys: tuple[str, ...] | None = None
    #: Whether the recording keeps the env's render state per step
    #: (``env.render_state(state)``; ``Record.states``).
    record_states: bool = False
    #: Step events for ``on_step`` hooks: the step sends its per-lane arrays to
    #: the host through an ordered ``io_callback`` (``Engine.step_sink``), and a
    #: segment stops after a step whose sink answered False. False: no callback
    #: is compiled in.
    step_events: bool = False
    #: Episodes start from a trial index (``TrialReset``); None: from
    #: ``env.reset(PRNGKey(seed))``, and the lanes carry nothing for it.
    trials: TrialReset | None = None

    @property
    def accumulators(self) -> tuple[tuple[str, str], ...]:
        """Every per-lane accumulator: the metrics, then the success key's last
        value and whether any step had it."""
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
    env_key: jax.Array  # [N, 2] fold_in(key, STREAM_ENV), cached per episode
    env_state: Any
    #: [window_size] under ``run_segment``: the seeds of episodes ``base,
    #: base + 1, ...`` (the segment's window); [capacity] under ``run``.
    seeds: jax.Array
    budget: jax.Array  # () episodes to score
    base: jax.Array  # () the episode of ``seeds[0]`` (and of the trial indices')
    next_episode: jax.Array  # () next unstarted episode index
    n_done: jax.Array  # () episodes ended
    #: [N] per accumulator of ``EngineConfig.accumulators``: the reduction so
    #: far of the current episode's info values (empty without metrics).
    acc: tuple = ()
    #: With ``EngineConfig.trials``: ``(trial_of, data)``, the int32 trial
    #: index of each episode of the window (as ``seeds``) and the data the
    #: reset reads (empty without).
    trials: tuple = ()
    #: [N] bool: the current episode's reset info had a non-zero success key
    #: (None unless ``EngineConfig.success_at_reset``).
    reset_success: Any = None


#: The lane fields a run brings (its budget, first lanes and trials) and the
#: counters it reads before it writes them (zero: no lane runs, no episode
#: ended); with the agent's ``AGENT_GIVEN``, all a run reuses a finished run's
#: buffers for needs to be put anew (``Engine.refill``). Every other field is
#: written when a lane begins an episode (the reset, ``agent.begin``), and a
#: lane that begins none stays masked, as the zero lanes of a first carry are.
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
#: The agent's: which lanes must plan (none), the policy rows (zero) and the
#: instructions' encodings.
AGENT_GIVEN = ("fresh", "rows", "texts")


@struct.dataclass
class Carry:
    lanes: LaneState
    agent: agent.AgentState
    results: tally.Results


def batched(env: Any) -> bool:
    """Whether ``env`` steps all lanes in one call (an EnvPool pool,
    ``jaxmesh.envs.envpool``) instead of a one-lane step that the engine
    vmaps: it then has ``reset_lanes(begins, episode, state) -> (obs,
    state)`` and ``step_lanes(active, state, action) -> (obs, state, reward,
    terminated, truncated, info)``, over all N lanes. A lane outside
    ``begins`` (or ``active``) must leave every episode's env alone."""
    return callable(getattr(env, "step_lanes", None))


def env_stream(keys: jax.Array) -> jax.Array:
    """The per-episode base of env-step keys: ``fold_in(key, STREAM_ENV)``."""
    return jax.vmap(lambda k: jax.random.fold_in(k, agent.STREAM_ENV))(keys)


#: A segment's seed window spans this many logs' worth of episodes (plus N),
#: so the host puts a new one only every few segments (``Engine.window_fits``).
WINDOW_LOGS = 4


def window_size(config: EngineConfig) -> int:
    """The seeds a segment's window holds: ``WINDOW_LOGS * capacity + N``. A
    segment hands over at most ``capacity`` episodes (its log's rows), and the
    lanes that begin one on its first step took it at most N episodes before,
    so a window serves every segment that starts with its next unstarted
    episode in ``[base + N, base + (WINDOW_LOGS - 1) * capacity + N]``."""
    return WINDOW_LOGS * config.capacity + config.agent.num_envs


def _first_lanes(xp, n: int, budget: Any) -> dict:
    """Lane bookkeeping at the start of a run: lane j starts episode j (CONTRACT 3).

    Every lane is reset on the first step, so that a masked lane (j >= budget)
    steps a valid env state (seed 0) that is never scored. Written once for
    numpy (the host builds the first carry without compiling) and jax.numpy
    (``Engine.run`` builds it under trace). Lanes without an episode hold
    ``NO_EPISODE``.
    """
    # Every lane is free and none has started: lane j takes episode j.
    start, episode, next_episode = rules.next_episodes(
        xp, xp.ones((n,), bool), 0, budget
    )
    return {
        "episode": xp.where(start, episode, NO_EPISODE).astype(xp.int32),
        "start": xp.ones((n,), bool),
        "next_episode": xp.asarray(next_episode).astype(xp.int32),
    }


def with_step_events(engine: Engine) -> Engine:
    """The same engine with step events compiled in (``EngineConfig.step_events``)."""
    config = dataclasses.replace(engine.config, step_events=True)
    return Engine(engine.policy, engine.env, config)


def _on_cpu(policy: Policy) -> bool:
    """Whether the policy runs on a CPU (its device, or JAX's default)."""
    return (policy.device or jax.devices()[0]).platform == "cpu"


class Engine:
    """The jitted engine for one (policy, env, configuration).

    Args:
      policy: the resolved policy.
      env: a jaxmesh single-lane env.
      config: static configuration.
    """

    def __init__(self, policy: Policy, env: Any, config: EngineConfig):
        # On a CPU the policy runs inside the loops' bodies, where XLA runs a
        # non-NHWC convolution on a naive loop (``jaxmesh.core.convs``).
        self.policy = convs.canonical_convs(policy) if _on_cpu(policy) else policy
        self.env = env
        self.config = config
        #: With ``config.step_events``: the host function each step's arrays go
        #: to, ``sink(stepped, episode, t, action, reward, terminated,
        #: truncated) -> bool`` (all [N] numpy; False stops the segment). The
        #: compiled program calls ``_emit``, which reads this at run time, so
        #: each run sets its own sink on the same program.
        self.step_sink: Any = None
        #: A finished run's ``(lanes, agent)`` and the device zero results of
        #: the first run (``keep``, ``start``): the next run reuses them.
        self._spare: tuple | None = None
        self._results0: Any = None
        self._spare_lock = threading.Lock()
        # The lanes and agent state are donated (updated in place); the results
        # are not, so the host keeps the last segment's results alive until the
        # next segment returns: a failure inside a segment loses nothing finished.
        self.run_segment = jax.jit(
            self._run_segment, static_argnums=(3,), donate_argnums=(1,)
        )

    # The first carry ----------------------------------------------------------
    def _zero_carry(self, log: bool = True) -> Carry:
        """A carry of the right shapes; ``begin`` fills what a lane reads.

        ``log``: a segment's (a seed window and a log); else ``run``'s
        (seeds and results indexed by episode)."""
        cfg = self.config
        n = cfg.agent.num_envs
        seeds = window_size(cfg) if log else cfg.capacity
        key0 = jax.random.PRNGKey(0)  # under eval_shape: traced, never run
        obs, env_state = self.env.reset(key0)
        lanes_of = lambda tree: jax.tree.map(
            lambda x: jnp.zeros((n,) + jnp.shape(x), jnp.result_type(x)), tree
        )
        lanes = LaneState(
            episode=jnp.zeros((n,), jnp.int32),
            active=jnp.zeros((n,), bool),
            start=jnp.zeros((n,), bool),
            t=jnp.zeros((n,), jnp.int32),
            ret=jnp.zeros((n,), jnp.float32),
            key=lanes_of(key0),
            env_key=lanes_of(key0),
            env_state=lanes_of(env_state),
            seeds=jnp.zeros((seeds,), jnp.int32),
            budget=jnp.int32(0),
            base=jnp.int32(0),
            next_episode=jnp.int32(0),
            n_done=jnp.int32(0),
            acc=tuple(
                jnp.zeros((n,), tally.metric_dtype(red)) for _, red in cfg.accumulators
            ),
            trials=()
            if cfg.trials is None
            else (
                jnp.zeros((seeds,), jnp.int32),
                jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cfg.trials.data),
            ),
            reset_success=jnp.zeros((n,), bool) if cfg.success_at_reset else None,
        )
        ag = agent.init(cfg.agent, self.policy, lanes_of(obs), lanes.active)
        res = tally.empty(
            cfg.capacity,
            n,
            metrics=cfg.metrics,
            success=cfg.success is not None,
            has_success=False,  # every episode of a JAX env has the signal
            at_reset=cfg.success_at_reset,
            log=log,
        )
        if cfg.record_slots:
            res = res.replace(
                recording=tally.empty_recording(
                    np.zeros(cfg.record_slots, np.int32),
                    cfg.record_steps,
                    self._record_obs(obs),
                    tuple(self.env.action_shape),
                    self.env.action_dtype,
                    states=self.env.render_state(env_state)
                    if cfg.record_states
                    else None,
                )
            )
        return Carry(lanes, ag, res)

    @functools.cached_property
    def _carry_shape(self) -> Carry:
        return jax.eval_shape(self._zero_carry)

    def carry_shape(self) -> Carry:
        """Shapes and dtypes of the carry (traces the env's reset once, compiles
        nothing)."""
        return self._carry_shape

    def first_carry(
        self,
        seeds: np.ndarray,
        device: Any = None,
        record: Any = None,
        trials: tuple | None = None,
        texts: Any = None,
    ) -> Carry:
        """The carry a run starts from, built on the host (nothing compiles).

        Args:
          seeds: the budget's seeds (int32, at most ``capacity``).
          device: where to put it (None: JAX's default device).
          record: the recorded episode indices (``config.record_slots`` of
            them); required when the engine records.
          trials: ``(trial_of, data)``: each episode's trial index (int32, as
            many as ``seeds``) and the data of ``config.trials``; required
            when the engine has ``config.trials``.
          texts: each ``jaxmesh.adapt.Text`` input's encoded instruction per
            lane (name -> pytree of ``[num_envs, ...]``); required when the
            policy reads one. Data, not part of the program.
        """
        zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self.carry_shape())
        carry = self._given(zeros, seeds, record, trials, texts)
        return jax.device_put(carry, device)

    def start(self, seeds: np.ndarray, device: Any = None, **run: Any) -> Carry:
        """The first carry of a run on ``device``: ``refill`` of the buffers
        the last finished run kept (``keep``), else ``first_carry``. ``run``:
        ``record``, ``trials`` and ``texts``, as for ``first_carry``."""
        with self._spare_lock:
            spare, self._spare = self._spare, None
        if spare is not None and device in (None, *spare[0].seeds.devices()):
            return self.refill(spare, self._results0, seeds, device, **run)
        carry = self.first_carry(seeds, device, **run)
        self._results0 = carry.results
        return carry

    def keep(self, state: tuple) -> None:
        """Keeps a finished run's ``(lanes, agent)`` for the next ``start``."""
        with self._spare_lock:
            self._spare = state

    def refill(
        self,
        spare: tuple,
        results0: tally.Results,
        seeds: np.ndarray,
        device: Any = None,
        **run: Any,
    ) -> Carry:
        """``first_carry`` on the buffers of a finished run: only the run's own
        fields and the counters it reads first (``GIVEN``, ``AGENT_GIVEN``)
        travel to the device, in one transfer.

        Args:
          spare: ``(lanes, agent)`` a run of this engine ended with (donated
            to this run's first segment).
          results0: device results of a ``first_carry`` (never donated, so
            still zero; only the recorded episodes are this run's).
          seeds, device: as for ``first_carry``; ``run``: its ``record``,
            ``trials`` and ``texts``.

        Putting a whole first carry on the device costs about 0.1 ms per
        array on a CPU (an MJX state has over a hundred): most of a short
        run's time.
        """
        lanes, ag = spare
        given = self._given(Carry(lanes, ag, results0), seeds, **run)
        host = (
            {f: getattr(given.lanes, f) for f in GIVEN},
            {f: getattr(given.agent, f) for f in AGENT_GIVEN},
            given.results.recording.episodes if self.config.record_slots else None,
        )
        lane_fields, agent_fields, episodes = jax.device_put(host, device)
        res = results0
        if self.config.record_slots:
            res = res.replace(recording=res.recording.replace(episodes=episodes))
        return Carry(lanes.replace(**lane_fields), ag.replace(**agent_fields), res)

    def _given(
        self, carry: Carry, seeds, record=None, trials=None, texts=None
    ) -> Carry:
        """``carry`` with a run's own values (host arrays) in ``GIVEN`` and
        ``AGENT_GIVEN`` and the recorded episodes; see ``first_carry``."""
        n = self.config.agent.num_envs
        budget = np.int32(seeds.size)
        trial_of = None if trials is None else trials[0]
        lanes = carry.lanes.replace(
            budget=budget,
            active=np.zeros((n,), bool),
            n_done=np.int32(0),
            **_first_lanes(np, n, budget),
        )
        if self.config.trials is not None:
            lanes = lanes.replace(trials=(None, trials[1]))
        lanes = self.with_window(lanes, self.window(seeds, 0, trial_of))
        ag = carry.agent.replace(fresh=np.zeros((n,), bool), rows=np.int32(0))
        if self.config.agent.texts:
            ag = ag.replace(texts=texts)
        carry = carry.replace(lanes=lanes, agent=ag)
        if self.config.record_slots:
            episodes = np.asarray(record, np.int32)
            if episodes.shape != (self.config.record_slots,):
                raise ValueError(
                    f"record={record!r}: this engine records "
                    f"{self.config.record_slots} episodes; pass that many indices"
                )
            rec = carry.results.recording.replace(episodes=episodes)
            carry = carry.replace(results=carry.results.replace(recording=rec))
        return carry

    def window(
        self, seeds: np.ndarray, next_episode: int, trial_of: Any = None
    ) -> dict:
        """The window of a segment that starts with ``next_episode`` as the
        next unstarted episode (host arrays): ``base = max(0, next_episode -
        N)``, and the seeds (and, with ``config.trials``, the trial indices)
        of episodes ``base, base + 1, ...``, zero past the budget. Host work
        and transfer proportional to the lanes, never to the budget.

        Args:
          seeds: the whole budget's seeds (host).
          next_episode: the lanes' ``next_episode`` (read by the host).
          trial_of: each episode's trial index (host), with ``config.trials``.
        """
        size = window_size(self.config)
        base = max(0, int(next_episode) - self.config.agent.num_envs)

        def cut(values):  # masked lanes read seed 0 (trial 0) past the budget
            out = np.zeros((size,), np.int32)
            part = np.asarray(values)[base : base + size]
            out[: part.size] = part
            return out

        out = {"seeds": cut(seeds), "base": np.int32(base)}
        if self.config.trials is not None:
            out["trial_of"] = cut(trial_of)
        return out

    def window_fits(self, base: int, next_episode: int) -> bool:
        """Whether the window at ``base`` holds every episode a segment that
        starts with ``next_episode`` may begin (see ``window_size``)."""
        n, cap = self.config.agent.num_envs, self.config.capacity
        first = max(0, int(next_episode) - n)
        return base <= first and int(next_episode) + cap <= base + window_size(
            self.config
        )

    @staticmethod
    def with_window(lanes: LaneState, window: dict) -> LaneState:
        """``lanes`` with a ``window`` (host or placed arrays) in them."""
        lanes = lanes.replace(seeds=window["seeds"], base=window["base"])
        if "trial_of" in window:
            lanes = lanes.replace(trials=(window["trial_of"], lanes.trials[1]))
        return lanes

    # The step -----------------------------------------------------------------
    def _begin(self, lanes: LaneState, ag: agent.AgentState):
        """Resets the lanes in ``lanes.start``; those with an episode begin it.

        The reset runs only as many tiles as lanes start, in a ``cond`` that
        skips it on a step where none does (most steps); the agent's
        ``begin``, which touches every lane's windows, sits in one too.

        Returns the lanes, the agent state, the reset observations ([N]; zeros
        for lanes that do not start) and the lanes that begin an episode.
        """
        cfg = self.config
        start = lanes.start
        begins = start & (lanes.episode < lanes.budget)
        abstract_key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        obs = jax.tree.map(
            lambda s: jnp.zeros((cfg.agent.num_envs,) + s.shape, s.dtype),
            jax.eval_shape(self.env.reset, abstract_key)[0],
        )

        def body(rows, c):
            env_key, env_state, obs, at_reset = c
            episode = rows.take(lanes.episode)
            k = rows.take(lanes.key)  # set at the hand-over (_inner)
            at = rows.put
            if cfg.success_at_reset:  # never with trials (build.py)
                obs0, state0, info0 = jax.vmap(self.env.reset_with_info)(k)
                flag = tally.info_leaves(info0)[cfg.success]
                at_reset = at(at_reset, rules.success(jnp, jnp.reshape(flag, (-1,))))
            else:
                obs0, state0 = self._reset(lanes, k, episode)
            return (
                at(env_key, env_stream(k)),
                jax.tree.map(at, env_state, state0),
                jax.tree.map(at, obs, obs0),
                at_reset,
            )

        first = (lanes.env_key, lanes.env_state, obs, lanes.reset_success)
        if batched(self.env):  # one call starts every lane that begins
            env_key, env_state, obs, reset_success = jax.lax.cond(
                jnp.any(start),
                lambda c: self._reset_lanes(lanes, begins, c),
                lambda c: c,
                first,
            )
        else:
            env_key, env_state, obs, reset_success = tiles.rarely(
                start, min(RESET_TILE, cfg.agent.num_envs), body, first
            )
        ag = jax.lax.cond(
            jnp.any(begins),
            lambda ag: agent.begin(
                cfg.agent, self.policy, ag, begins, obs, lanes.episode
            ),
            lambda ag: ag,
            ag,
        )
        lanes = lanes.replace(
            env_key=env_key,
            env_state=env_state,
            active=lanes.active | begins,
            start=jnp.zeros_like(start),
            t=jnp.where(begins, 0, lanes.t),
            ret=jnp.where(begins, 0.0, lanes.ret),
            acc=tuple(
                rules.begin_metric(jnp, red, a, None, begins)[0]
                for a, (_, red) in zip(lanes.acc, cfg.accumulators, strict=True)
            ),
            reset_success=reset_success,
        )
        return lanes, ag, obs, begins

    def _reset_lanes(self, lanes: LaneState, begins: jax.Array, c: tuple) -> tuple:
        """``_begin``'s reset for a batched env (``batched``): one
        ``env.reset_lanes`` call for all lanes, kept for the lanes that
        begin."""
        env_key, env_state, _, reset_success = c
        obs, env_state = self.env.reset_lanes(begins, lanes.episode, env_state)
        env_key = jnp.where(lanes.start[:, None], env_stream(lanes.key), env_key)
        return env_key, env_state, obs, reset_success

    def _reset(self, lanes: LaneState, keys: jax.Array, episodes: jax.Array):
        """The reset of a tile of lanes starting ``episodes`` with these keys:
        ``env.reset(key)``, or with ``config.trials`` its reset from each
        episode's trial index (read from the window at ``lanes.base``)."""
        trials = self.config.trials
        if trials is None:
            return jax.vmap(self.env.reset)(keys)
        trial_of, data = lanes.trials
        at = jnp.clip(episodes - lanes.base, 0, trial_of.shape[0] - 1)
        reset = jax.vmap(trials.reset, in_axes=(0, 0, None))
        return reset(keys, trial_of[at], data)

    # Recording ----------------------------------------------------------------
    def _record_obs(self, obs: Any) -> Any:
        """The observation leaves a recording keeps (``record_keys``)."""
        keys = self.config.record_keys
        if keys is None:
            return obs
        leaves = tally.info_leaves(obs)
        return {k: leaves[k] for k in keys}

    @staticmethod
    def _record_lanes(rec: Any, mask: jax.Array, episode: jax.Array):
        """Per slot: whether a lane in ``mask`` runs its episode, and which lane.

        A [R, N] comparison; the writes then touch R rows, never N.
        """
        match = (rec.episodes[:, None] == episode[None, :]) & mask[None, :]
        return jnp.any(match, axis=1), jnp.argmax(match, axis=1)

    def _render_states(self, rec: Any, env_state: Any) -> Any:
        """The lanes' render states (``env.render_state``), or None when the
        recording keeps none. Field reads only: no physics runs here."""
        if rec.states is None:
            return None
        return jax.vmap(self.env.render_state)(env_state)

    def _record_reset(self, rec: Any, lanes: LaneState, begins, obs) -> Any:
        """Writes the reset observation (and the reset state's render state,
        ``lanes.env_state``) of recorded episodes that begin now."""
        has, lane = self._record_lanes(rec, begins, lanes.episode)
        slots = jnp.arange(has.shape[0])
        at = jnp.where(has, 0, self.config.record_steps + 1)  # else: dropped
        put = lambda b, x: b.at[slots, at].set(x[lane].astype(b.dtype), mode="drop")
        return rec.replace(
            observations=jax.tree.map(put, rec.observations, self._record_obs(obs)),
            states=jax.tree.map(
                put, rec.states, self._render_states(rec, lanes.env_state)
            ),
        )

    def _record_step(self, rec: Any, lanes: LaneState, **values: Any) -> Any:
        """Writes step ``lanes.t`` of the recorded episodes running now.

        ``values``: per lane ``obs`` and ``states`` (the env states, after
        the step), ``actions``, ``rewards``, ``terminated``, ``truncated``.
        Steps past ``record_steps`` are dropped (the episode is cut).
        """
        t_max = self.config.record_steps
        has, lane = self._record_lanes(rec, lanes.active, lanes.episode)
        slots = jnp.arange(has.shape[0])
        step = jnp.where(has, lanes.t[lane], t_max + 1)  # out of range: dropped

        def put(at):
            return lambda b, x: b.at[slots, at].set(
                x[lane].astype(b.dtype), mode="drop"
            )

        obs = self._record_obs(values.pop("obs"))
        states = self._render_states(rec, values.pop("states"))
        updates = {
            "observations": jax.tree.map(put(step + 1), rec.observations, obs),
            "states": jax.tree.map(put(step + 1), rec.states, states),
            **{k: put(step)(getattr(rec, k), v) for k, v in values.items()},
        }
        return rec.replace(**updates)

    def _accumulate(self, lanes: LaneState, info: Any) -> tuple:
        """Every accumulator after this step's info values (active lanes only).

        A JAX env's info has a fixed structure: every step has every key, so
        no count is kept (an episode's count is its length).
        """
        active = lanes.active
        leaves = tally.info_leaves(info)
        return tuple(
            rules.accumulate_metric(
                jnp, red, a, None, jnp.reshape(leaves[name], active.shape), active
            )[0]
            for a, (name, red) in zip(lanes.acc, self.config.accumulators, strict=True)
        )

    def _episode_metrics(self, lanes: LaneState, t: jax.Array) -> tuple[dict, dict]:
        """The per-lane metric values of an episode ending now (after ``t``
        steps), and its success fields (``Results``' names; {} without a
        success key)."""
        cfg, acc = self.config, lanes.acc
        values = {
            name: rules.finalize_metric(jnp, red, a, t)
            for a, (name, red) in zip(acc[: len(cfg.metrics)], cfg.metrics, strict=True)
        }
        success = {}
        if cfg.success is not None:
            success["success"] = rules.success(jnp, acc[-2])
            success["success_once"] = acc[-1]
        if cfg.success_at_reset:
            success["success_at_reset"] = lanes.reset_success
        return values, success

    def _faults(self, lanes: LaneState, action: jax.Array, reward: jax.Array):
        """Per-lane fault kind and value: a bad action, or a non-finite reward."""
        num_actions = self.env.num_actions
        kinds, values = rules.action_faults(jnp, action, lanes.active, num_actions)
        return rules.reward_faults(jnp, reward, lanes.active, kinds, values)

    def _emit(self, *arrays: Any) -> np.bool_:
        """Host side of the step-event callback: hands the arrays to the sink."""
        sink = self.step_sink
        if sink is None:  # no run listens (never the case under Evaluator)
            return np.bool_(True)
        return np.bool_(sink(*(np.array(a) for a in arrays)))

    def _step_events(self, lanes: LaneState, kinds, action, reward, term, trunc):
        """Sends this step's per-lane values to the host (ordered); whether the
        segment goes on.

        ``lanes`` is the lane state the step ran with (episode, t before the
        step). Only lanes that executed the step without a bad value are
        marked as stepped.
        """
        stepped = lanes.active & (kinds == tally.NO_FAULT)
        return io_callback(
            self._emit,
            jax.ShapeDtypeStruct((), jnp.bool_),
            stepped,
            lanes.episode,
            lanes.t,
            action,
            reward,
            term,
            trunc,
            ordered=True,
        )

    # The loop ----------------------------------------------------------------
    #
    # A run is an outer loop over the steps on which episodes end. Its inner
    # loop runs env steps until a lane's episode ends (or the segment's steps
    # are done, a bad value or a refused step event is met): each starts the
    # lanes that take an episode (``_begin``, in a ``cond`` that most steps
    # skip), then steps them (``_core``). The outer loop then writes the ended
    # episodes' results and hands the next ones over (``_finish``). Step by
    # step this is the order of CONTRACT 3; the inner loop, where every step
    # runs, holds per-lane state only, never the result buffers, so XLA:CPU
    # runs a few-lane step as one sequence of kernels instead of scheduling
    # them over its thread pool (it does so for any computation that touches
    # a buffer over 512 bytes).

    def _inner(self, carry: Carry) -> Inner:
        """The inner loop's state at the start of an outer iteration: the
        lanes handed an episode get its key, and the seeds stay out (a
        [capacity] buffer in the loop would have XLA:CPU spread every step's
        kernels over its thread pool)."""
        cfg = self.config
        n = cfg.agent.num_envs
        no = jnp.zeros((n,), bool)
        res = carry.results
        lanes = carry.lanes
        at = jnp.clip(lanes.episode - lanes.base, 0, lanes.seeds.shape[0] - 1)
        keys = rules.episode_keys(jnp, lanes.seeds[at])
        lanes = lanes.replace(
            key=jnp.where(lanes.start[:, None], keys, lanes.key), seeds=None
        )
        return Inner(
            lanes=lanes,
            agent=carry.agent,
            recording=res.recording,
            record_done=self._recorded_done(res.recording, carry.lanes)
            if self.config.record_slots
            else None,
            fault=res.fault,
            env_steps=res.env_steps,
            steps=jnp.int32(0),
            go_on=jnp.bool_(True),
            ended=no,
            terminated=no,
            truncated=no,
            scored=no,
        )

    @staticmethod
    def _recorded_done(rec: Any, lanes: LaneState) -> jax.Array:
        """[R] bool: each recorded episode has ended (it was handed over and
        no lane runs it or is about to begin it), so no step writes to it."""
        held = (lanes.active | lanes.start)[None, :]
        running = jnp.any((rec.episodes[:, None] == lanes.episode[None, :]) & held, 1)
        return (rec.episodes < lanes.next_episode) & ~running

    def _core(self, params: Any, c: Inner) -> Inner:
        """One env step of every active lane: plan and replay, the env step,
        frame windows, episode accounting and bad values; an episode's end is
        left to ``_finish``. With ``config.step_events`` the step's values go
        to the host through an ordered ``io_callback`` (``_step_events``)."""
        cfg = self.config
        lanes, ag = c.lanes, c.agent
        active = lanes.active
        ag, action = agent.act(
            cfg.agent, self.policy, params, ag, active, lanes.key, lanes.t
        )
        env_keys = jax.vmap(jax.random.fold_in)(lanes.env_key, lanes.t)
        if batched(self.env):  # one call steps every lane (spares for masked)
            obs, env_state, reward, term, trunc, info = self.env.step_lanes(
                active, lanes.env_state, action
            )
            if cfg.reads_info:
                lanes = lanes.replace(acc=self._accumulate(lanes, info))
        elif cfg.reads_info:
            obs, env_state, reward, term, trunc, info = jax.vmap(
                self.env.step_with_info
            )(env_keys, lanes.env_state, action)
            lanes = lanes.replace(acc=self._accumulate(lanes, info))
        else:
            obs, env_state, reward, term, trunc = jax.vmap(self.env.step)(
                env_keys, lanes.env_state, action
            )
        reward = jnp.asarray(reward, jnp.float32)
        kinds, values = self._faults(lanes, action, reward)
        ag = agent.observe(cfg.agent, ag, obs)
        t = lanes.t + 1
        trunc = trunc | rules.at_cap(jnp, t, cfg.max_steps)
        ended = active & (term | trunc)
        go_on = c.go_on
        if cfg.step_events:
            go_on = self._step_events(lanes, kinds, action, reward, term, trunc)
        rec = c.recording
        if cfg.record_slots:
            # Skipped once every recorded episode is done (most of a run).
            step_values = dict(
                obs=obs,
                states=env_state,
                actions=action,
                rewards=reward,
                terminated=term,
                truncated=trunc,
            )
            rec = jax.lax.cond(
                ~jnp.all(c.record_done),
                lambda rec: self._record_step(rec, lanes, **step_values),
                lambda rec: rec,
                rec,
            )
        return c.replace(
            lanes=lanes.replace(
                active=active & ~ended,
                t=t,
                ret=lanes.ret + reward,
                env_state=env_state,
            ),
            agent=ag,
            recording=rec,
            fault=c.fault.update(kinds, values, lanes.episode, lanes.t),
            env_steps=c.env_steps + jnp.sum(active, dtype=jnp.int32),
            steps=c.steps + 1,
            go_on=go_on,
            ended=ended,
            terminated=term,
            truncated=trunc,
            # An episode whose last step met a bad value is not a finished one.
            scored=ended & (kinds == tally.NO_FAULT),
        )

    def _finish(self, c: Inner, res: tally.Results) -> tuple[LaneState, Any]:
        """Writes the results of the episodes that ended on the inner loop's
        last step, at their own index (others drop), and hands the next
        unstarted episodes to their lanes in ascending lane order."""
        cfg = self.config
        lanes, ended = c.lanes, c.ended

        def finish(lanes, res):
            extra = {}
            if cfg.reads_info:
                extra["metrics"], success = self._episode_metrics(lanes, lanes.t)
                extra.update(success)
            at = jnp.where(c.scored, lanes.episode, cfg.capacity)
            if res.rows is not None:  # a segment's log: the next free rows
                rank = jnp.cumsum(c.scored, dtype=jnp.int32) - 1
                at = jnp.where(c.scored, res.rows + rank, cfg.capacity)
                extra["index"] = lanes.episode
                res = res.replace(rows=res.rows + jnp.sum(c.scored, dtype=jnp.int32))
            res = tally.record(
                res,
                at,
                returns=lanes.ret,
                lengths=lanes.t,
                terminated=c.terminated,
                truncated=c.truncated,
                predict_calls=c.agent.predict_calls,
                lanes=jnp.arange(cfg.agent.num_envs, dtype=jnp.int32),
                done=jnp.ones_like(ended),
                **extra,
            )
            start, new_ep, next_episode = rules.next_episodes(
                jnp, ended, lanes.next_episode, lanes.budget
            )
            lanes = lanes.replace(
                episode=jnp.where(start, new_ep, lanes.episode),
                start=start,
                next_episode=next_episode,
                n_done=lanes.n_done + jnp.sum(ended, dtype=jnp.int32),
            )
            return lanes, res

        res = res.replace(
            recording=c.recording,
            fault=c.fault,
            env_steps=c.env_steps,
            policy_rows=c.agent.rows,
        )
        # Only a segment's last outer iteration can end with no episode ended.
        return jax.lax.cond(jnp.any(ended), finish, lambda *a: a, lanes, res)

    def _begin_recorded(self, rec: Any, done, lanes: LaneState, begins, obs0) -> Any:
        """The recording after ``_begin``: the reset observations (and render
        states) of recorded episodes that began (``done``: [R] bool, each
        recorded episode was done when the inner loop began)."""
        if not self.config.record_slots:
            return rec
        return jax.lax.cond(
            ~jnp.all(done),
            lambda rec: self._record_reset(rec, lanes, begins, obs0),
            lambda rec: rec,
            rec,
        )

    def _advance(
        self, params: Any, carry: Carry, max_steps: Any, stop_at_fault: bool
    ) -> tuple[Carry, Any]:
        """Runs up to ``max_steps`` env steps (None: until the budget is done);
        stops once the budget is done, after a step that met a bad value
        (``stop_at_fault``) and after a step whose events a hook refused.

        Returns the carry and whether the run may go on (False after a
        refused step event).
        """

        def no_fault(fault):
            if not stop_at_fault:
                return jnp.bool_(True)
            return jnp.all(fault.kind == tally.NO_FAULT)

        def steps_left(steps):
            return jnp.bool_(True) if max_steps is None else steps < max_steps

        def room(res):  # a segment's log holds another step's ends
            if res.rows is None:
                return jnp.bool_(True)
            return res.rows + self.config.agent.num_envs <= self.config.capacity

        def outer_cond(o):
            steps, go_on, carry = o
            return (
                steps_left(steps)
                & go_on
                & (carry.lanes.n_done < carry.lanes.budget)
                & no_fault(carry.results.fault)
                & room(carry.results)
            )

        # A lane running or starting an episode: under vmap (a population), a
        # member whose budget is done runs the loops along with the others
        # and must not step forever.
        def inner_cond(c):
            return (
                steps_left(c.steps)
                & c.go_on
                & ~jnp.any(c.ended)
                & jnp.any(c.lanes.active | c.lanes.start)
                & no_fault(c.fault)
            )

        def inner_body(c):
            lanes, ag, obs0, begins = self._begin(c.lanes, c.agent)
            rec = self._begin_recorded(c.recording, c.record_done, lanes, begins, obs0)
            return self._core(params, c.replace(lanes=lanes, agent=ag, recording=rec))

        def outer_body(o):
            steps, _, carry = o
            inner = self._inner(carry).replace(steps=steps)
            inner = jax.lax.while_loop(inner_cond, inner_body, inner)
            inner = inner.replace(lanes=inner.lanes.replace(seeds=carry.lanes.seeds))
            lanes, res = self._finish(inner, carry.results)
            return inner.steps, inner.go_on, Carry(lanes, inner.agent, res)

        first = (jnp.int32(0), jnp.bool_(True), carry)
        _, go_on, carry = jax.lax.while_loop(outer_cond, outer_body, first)
        return carry, go_on

    def _run_segment(
        self, params: Any, state: tuple, res: tally.Results, max_steps: int
    ) -> tuple[tuple, tally.Results]:
        """Up to ``max_steps`` steps from ``state = (lanes, agent)`` (with the
        window ``with_window`` put); stops at a bad value (the host reports
        it), a step event a hook refused (the host raises the hook's exception
        after it), or when the log is full. The log's rows start at 0:
        ``res`` carries the run totals, the fault and the recording over."""
        carry = Carry(*state, res.replace(rows=jnp.zeros_like(res.rows)))
        carry, _ = self._advance(params, carry, max_steps, stop_at_fault=True)
        return (carry.lanes, carry.agent), carry.results

    def run(self, params: Any, seeds: jax.Array) -> tally.Results:
        """Runs a whole budget of ``capacity`` seeds (pure; jit or vmap it).

        It does not stop at a bad value: with no host to report to, it scores
        the whole budget and returns the fault in ``Results.fault``.
        """
        carry = self._zero_carry(log=False)
        budget = jnp.int32(self.config.capacity)
        first = _first_lanes(jnp, self.config.agent.num_envs, budget)
        carry = carry.replace(
            lanes=carry.lanes.replace(seeds=seeds, budget=budget, **first)
        )
        carry, _ = self._advance(params, carry, None, stop_at_fault=False)
        return carry.results


@struct.dataclass
class Inner:
    """The inner loop's state (``Engine._advance``): per-lane arrays and a few
    counters, never the result buffers."""

    lanes: LaneState
    agent: agent.AgentState
    recording: Any  # the recording buffers (None without ``record_slots``)
    #: [R] bool: each recorded episode was done when the loop began (None
    #: without ``record_slots``); none ends before the loop's last step.
    record_done: Any
    fault: tally.Fault
    env_steps: jax.Array  # () executed env steps of active lanes
    steps: jax.Array  # () steps of the segment so far
    go_on: jax.Array  # () no step event was refused
    #: [N] bool, of the last step: the lane's episode ended, terminated,
    #: truncated, and ended with no bad value (scored).
    ended: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    scored: jax.Array
