"""The scan engine: lane bookkeeping around the agent step and a JAX env.

For all N lanes at once, the engine resets the lanes that start an episode
(compacted tiles), plans (compacted tiles) and replays chunks
(``agent.act``), steps the env, pushes frame windows (``agent.observe``),
accounts episodes (returns, lengths, ends, results written at the episode's
index), hands the next unstarted episode to lanes that finished (ascending
lane order), masks lanes with nothing left to start, and checks for bad
values on the device (``tally.Fault``). Episode metrics
(``EngineConfig.metrics``) are reduced in the lane state on every step, and
recorded episodes (``jaxmesh.core.recording``) are written into fixed buffers,
both without a host round trip. Only ``EngineConfig.step_events`` (an
``on_step`` hook) adds one: an ordered ``io_callback`` per step that hands the
per-lane values to the host function the engine was built with.

The segment program never depends on the budget: ``Engine.run_segment``
advances up to S steps, writes the episodes that end into a *log* of
``capacity`` rows (each row names its episode, ``Results.index``) and reads
the seeds from a window of them (``jaxmesh.core.carry.window``). It stops as
soon as the budget is done, a fault is seen, or the log could not hold
another step's ends; the host then copies the rows written into its own
arrays, indexed by episode (``tally.write``). ``Engine.run`` runs a whole
budget of ``capacity`` seeds in one call, with result buffers indexed by
episode, and is the pure function behind ``make_evaluator``.

The engine holds no host state: it is its (policy, env, config) and the host
function its step events go to, fixed when it is built.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxmesh.core import agent, convs, keys, recording, rules, tally, tiles
from jaxmesh.core.carry import (
    Carry,
    EngineConfig,
    Inner,
    LaneState,
    first_lanes,
    given,
    window_size,
)
from jaxmesh.core.policy import Policy

#: Lanes reset per call of the env's reset, at most: only lanes that start an
#: episode are reset, gathered in tiles of ``min(RESET_TILE, N)``. Fewer lanes
#: get a smaller tile: a one-lane step then touches no buffer over 512 bytes,
#: which XLA:CPU needs to run a step's kernels in one sequence, and the env's
#: step runs all N lanes in one batch anyway.
RESET_TILE = 32

#: A reset of at most this many JAX equations (``env.reset``'s, counted through
#: its nested programs; gymnax's have 20-40, an MJX one thousands) is cheap:
#: when any lane starts an episode, every lane's reset is computed and the
#: starting lanes keep theirs (one ``jnp.where`` per state leaf), instead of
#: gathering the starting lanes into tiles and scattering each leaf back.
#: That compiles a few dozen fewer kernels; a lane's reset values are the same
#: either way. Only up to ``WHERE_RESET_LANES`` lanes: past them, short episodes
#: (some lane starts one on most steps) ran slower resetting every lane than
#: the starting ones in tiles (0.9x the env steps/s at 1,024 and 4,096 lanes).
CHEAP_RESET_EQUATIONS = 256
WHERE_RESET_LANES = 256


def batched(env: Any) -> bool:
    """Whether ``env`` steps all lanes in one call (an EnvPool pool,
    ``jaxmesh.envs.envpool``) instead of a one-lane step that the engine
    vmaps: it then has ``reset_lanes(begins, episode, state) -> (obs,
    state)`` and ``step_lanes(active, state, action) -> (obs, state, reward,
    terminated, truncated, info)``, over all N lanes. A lane outside
    ``begins`` (or ``active``) must leave every episode's env alone."""
    return callable(getattr(env, "step_lanes", None))


def env_stream(ep_keys: jax.Array) -> jax.Array:
    """The per-episode base of env-step keys: ``fold_in(key, STREAM_ENV)``."""
    return keys.fold_in(ep_keys, agent.STREAM_ENV)


def equations(jaxpr: Any) -> int:
    """The equations of a jaxpr, those of the programs it calls included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's
                if hasattr(sub, "eqns"):
                    count += equations(sub)
    return count


def with_step_events(engine: Engine, on_step: Callable) -> Engine:
    """The same engine with step events compiled in (``EngineConfig.step_events``),
    sent to ``on_step`` (see ``Engine``)."""
    config = dataclasses.replace(engine.config, step_events=True)
    return Engine(engine.policy, engine.env, config, on_step)


def _on_cpu(policy: Policy) -> bool:
    """Whether the policy runs on a CPU (its device, or JAX's default)."""
    return (policy.device or jax.devices()[0]).platform == "cpu"


def zero_carry(policy: Policy, env: Any, cfg: EngineConfig, log: bool = True) -> Carry:
    """A carry of the right shapes; ``begin`` fills what a lane reads.

    ``log``: a segment's (a seed window and a log); else ``run``'s
    (seeds and results indexed by episode)."""
    n = cfg.agent.num_envs
    seeds = window_size(cfg) if log else cfg.capacity
    key0 = jax.random.PRNGKey(0)  # under eval_shape: traced, never run
    obs, env_state = env.reset(key0)
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
    ag = agent.init(cfg.agent, policy, lanes_of(obs), lanes.active)
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
                recording.kept_obs(cfg, obs),
                tuple(env.action_shape),
                env.action_dtype,
                states=env.render_state(env_state) if cfg.record_states else None,
            )
        )
    return Carry(lanes, ag, res)


def _accumulate(config: EngineConfig, lanes: LaneState, info: Any) -> tuple:
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
        for a, (name, red) in zip(lanes.acc, config.accumulators, strict=True)
    )


def _episode_metrics(
    cfg: EngineConfig, lanes: LaneState, t: jax.Array
) -> tuple[dict, dict]:
    """The per-lane metric values of an episode ending now (after ``t``
    steps), and its success fields (``Results``' names; {} without a
    success key)."""
    acc = lanes.acc
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


class Engine:
    """The jitted engine for one (policy, env, configuration).

    Args:
      policy: the resolved policy.
      env: a jaxmesh single-lane env.
      config: static configuration.
      on_step: with ``config.step_events``, the host function each step's
        arrays go to: ``on_step(stepped, episode, t, action, reward,
        terminated, truncated) -> bool`` (all [N] numpy; False stops the
        segment). The compiled program calls it, so a run that listens holds
        what it reads.
    """

    def __init__(
        self,
        policy: Policy,
        env: Any,
        config: EngineConfig,
        on_step: Callable | None = None,
    ):
        # On a CPU the policy runs inside the loops' bodies, where XLA runs a
        # non-NHWC convolution on a naive loop (``jaxmesh.core.convs``).
        self.policy = convs.canonical_convs(policy) if _on_cpu(policy) else policy
        self.env = env
        self.config = config
        self.on_step = on_step
        # The lanes and agent state are donated (updated in place); the results
        # are not, so the host keeps the last segment's results alive until the
        # next segment returns: a failure inside a segment loses nothing finished.
        self.run_segment = jax.jit(
            self._run_segment, static_argnums=(3,), donate_argnums=(1,)
        )

    @functools.cached_property
    def _carry_shape(self) -> Carry:
        return jax.eval_shape(
            functools.partial(zero_carry, self.policy, self.env, self.config)
        )

    @functools.cached_property
    def _reset_probe(self) -> tuple[bool, Any]:
        """Whether the env's reset is cheap (``CHEAP_RESET_EQUATIONS``: its
        lanes then reset under one ``jnp.where`` instead of tiles), and the
        shapes of one lane's reset ``(obs, state)``. Traces the reset once."""
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        jaxpr, shapes = jax.make_jaxpr(self.env.reset, return_shape=True)(key)
        return equations(jaxpr.jaxpr) <= CHEAP_RESET_EQUATIONS, shapes

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
        carry = given(self.config, zeros, seeds, record, trials, texts)
        return jax.device_put(carry, device)

    # The step -----------------------------------------------------------------
    def _begin(self, lanes: LaneState, ag: agent.AgentState):
        """Resets the lanes in ``lanes.start``; those with an episode begin it.

        The reset runs only as many tiles as lanes start, and it and the
        agent's ``begin`` sit in ``cond``s that most steps skip. Returns the
        lanes, the agent state, the reset observations ([N]; zeros for lanes
        that do not start), the lanes that begin an episode and how many lanes
        run one now (the active ones, which the next step steps).
        """
        cfg = self.config
        start = lanes.start
        begins = start & (lanes.episode < lanes.budget)
        cheap, (obs_shape, _) = self._reset_probe
        obs = jax.tree.map(
            lambda s: jnp.zeros((cfg.agent.num_envs,) + s.shape, s.dtype), obs_shape
        )

        def body(rows, c):
            env_state, obs, at_reset = c
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
                jax.tree.map(at, env_state, state0),
                jax.tree.map(at, obs, obs0),
                at_reset,
            )

        n = cfg.agent.num_envs
        tile = n if cheap and n <= WHERE_RESET_LANES else min(RESET_TILE, n)

        def start_lanes(c):
            # Every piece of an episode's start, in the one branch that runs
            # on the steps where a lane starts (a lane that starts none: no
            # change but its reset).
            resets, ag, t, ret, acc = c
            if batched(self.env):  # one call starts every lane that begins
                resets = self._reset_lanes(lanes, begins, resets)
            else:
                resets = tiles.each(start, tile, body, resets)
            obs = resets[1]
            ag = agent.begin(cfg.agent, self.policy, ag, begins, obs, lanes.episode)
            acc = tuple(
                rules.begin_metric(jnp, red, a, None, begins)[0]
                for a, (_, red) in zip(acc, cfg.accumulators, strict=True)
            )
            return resets, ag, jnp.where(begins, 0, t), jnp.where(begins, 0.0, ret), acc

        active = lanes.active | begins
        # One reduction for the step's two counts (XLA:CPU compiles each
        # reduction over the lanes to two kernels).
        starting, stepping = jnp.sum(
            jnp.stack([start, active]), axis=1, dtype=jnp.int32
        )
        first = (
            (lanes.env_state, obs, lanes.reset_success),
            ag,
            lanes.t,
            lanes.ret,
            lanes.acc,
        )
        resets, ag, t, ret, acc = jax.lax.cond(
            starting > 0, start_lanes, lambda c: c, first
        )
        env_state, obs, reset_success = resets
        lanes = lanes.replace(
            env_state=env_state,
            active=active,
            start=jnp.zeros_like(start),
            t=t,
            ret=ret,
            acc=acc,
            reset_success=reset_success,
        )
        return lanes, ag, obs, begins, stepping

    def _reset_lanes(self, lanes: LaneState, begins: jax.Array, c: tuple) -> tuple:
        """``_begin``'s reset for a batched env (``batched``): one
        ``env.reset_lanes`` call for all lanes, kept for the lanes that
        begin."""
        env_state, _, reset_success = c
        obs, env_state = self.env.reset_lanes(begins, lanes.episode, env_state)
        return env_state, obs, reset_success

    def _reset(self, lanes: LaneState, ep_keys: jax.Array, episodes: jax.Array):
        """The reset of a tile of lanes starting ``episodes`` with these keys:
        ``env.reset(key)``, or with ``config.trials`` its reset from each
        episode's trial index (read from the window at ``lanes.base``)."""
        trials = self.config.trials
        if trials is None:
            return jax.vmap(self.env.reset)(ep_keys)
        trial_of, data = lanes.trials
        at = jnp.clip(episodes - lanes.base, 0, trial_of.shape[0] - 1)
        reset = jax.vmap(trials.reset, in_axes=(0, 0, None))
        return reset(ep_keys, trial_of[at], data)

    def _faults(self, lanes: LaneState, action: jax.Array, reward: jax.Array):
        """Per-lane fault kind and value: a bad action, or a non-finite reward."""
        num_actions = self.env.num_actions
        kinds, values = rules.action_faults(jnp, action, lanes.active, num_actions)
        return rules.reward_faults(jnp, reward, lanes.active, kinds, values)

    def _step_events(self, lanes: LaneState, kinds, action, reward, term, trunc):
        """Sends this step's per-lane values to ``on_step`` (ordered); whether
        the segment goes on. ``lanes`` is the lane state the step ran with
        (episode, t before the step); only lanes that executed the step
        without a bad value are marked as stepped."""
        on_step = self.on_step

        def emit(*arrays: Any) -> np.bool_:
            return np.bool_(on_step(*(np.array(a) for a in arrays)))

        stepped = lanes.active & (kinds == tally.NO_FAULT)
        return io_callback(
            emit,
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
    # lanes that take an episode (``_begin``), then steps them (``_core``).
    # The outer loop writes the ended episodes' results and hands the next
    # ones over (``_finish``): CONTRACT 3's order. The inner loop holds
    # per-lane state only, never the result buffers, so XLA:CPU runs a
    # few-lane step as one sequence of kernels instead of spreading it over
    # its thread pool (as it does for any buffer over 512 bytes).

    def _inner(self, carry: Carry) -> Inner:
        """The inner loop's state at the start of an outer iteration: the
        lanes handed an episode get its key, and the seeds stay out."""
        cfg = self.config
        n = cfg.agent.num_envs
        no = jnp.zeros((n,), bool)
        res = carry.results
        lanes = carry.lanes
        at = jnp.clip(lanes.episode - lanes.base, 0, lanes.seeds.shape[0] - 1)
        ep_keys = rules.episode_keys(jnp, lanes.seeds[at])
        lanes = lanes.replace(
            key=jnp.where(lanes.start[:, None], ep_keys, lanes.key), seeds=None
        )
        return Inner(
            lanes=lanes,
            agent=carry.agent,
            recording=res.recording,
            record_done=recording.done(res.recording, carry.lanes)
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

    def _core(self, params: Any, c: Inner, stepping: jax.Array) -> Inner:
        """One env step of every active lane (``stepping`` of them): plan and
        replay, the env step, frame windows, episode accounting and bad
        values; an episode's end is left to ``_finish``. With
        ``config.step_events`` the step's values go to the host through an
        ordered ``io_callback`` (``_step_events``)."""
        cfg = self.config
        lanes, ag = c.lanes, c.agent
        active = lanes.active
        ag, action = agent.act(
            cfg.agent,
            self.policy,
            params,
            ag,
            active,
            lanes.key,
            lanes.t,
            lanes.episode if self.policy.takes_rows else None,
        )
        # Derived anew each step, not kept per episode: an env that reads no
        # key (most) then compiles no hash at all.
        env_keys = keys.fold_in(env_stream(lanes.key), lanes.t)
        if batched(self.env):  # one call steps every lane (spares for masked)
            obs, env_state, reward, term, trunc, info = self.env.step_lanes(
                active, lanes.env_state, action
            )
            if cfg.reads_info:
                lanes = lanes.replace(acc=_accumulate(cfg, lanes, info))
        elif cfg.reads_info:
            obs, env_state, reward, term, trunc, info = jax.vmap(
                self.env.step_with_info
            )(env_keys, lanes.env_state, action)
            lanes = lanes.replace(acc=_accumulate(cfg, lanes, info))
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
                lambda rec: recording.step(self.env, cfg, rec, lanes, **step_values),
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
            env_steps=c.env_steps + stepping,
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
                extra["metrics"], success = _episode_metrics(cfg, lanes, lanes.t)
                extra.update(success)
            at = jnp.where(c.scored, lanes.episode, cfg.capacity)
            # One prefix count for both: the ended lanes' and the scored ones'.
            ranks = tiles.prefix_count(jnp.stack([ended, c.scored]))
            if res.rows is not None:  # a segment's log: the next free rows
                rank = ranks[1] - 1
                at = jnp.where(c.scored, res.rows + rank, cfg.capacity)
                extra["index"] = lanes.episode
                res = res.replace(rows=res.rows + ranks[1, -1])
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
                jnp, ended, lanes.next_episode, lanes.budget, ranks[0]
            )
            lanes = lanes.replace(
                episode=jnp.where(start, new_ep, lanes.episode),
                start=start,
                next_episode=next_episode,
                n_done=lanes.n_done + ranks[0, -1],
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
        cfg = self.config
        if not cfg.record_slots:
            return rec
        return jax.lax.cond(
            ~jnp.all(done),
            lambda rec: recording.reset(self.env, cfg, rec, lanes, begins, obs0),
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
            flags = [c.ended, c.lanes.active | c.lanes.start]
            if stop_at_fault:
                flags.append(c.fault.kind != tally.NO_FAULT)
            # One reduction over the lanes for all the flags.
            ended, running, *faulty = jnp.any(jnp.stack(flags), axis=1)
            go_on = steps_left(c.steps) & c.go_on & ~ended & running
            return go_on & ~faulty[0] if faulty else go_on

        def inner_body(c):
            lanes, ag, obs0, begins, stepping = self._begin(c.lanes, c.agent)
            rec = self._begin_recorded(c.recording, c.record_done, lanes, begins, obs0)
            c = c.replace(lanes=lanes, agent=ag, recording=rec)
            return self._core(params, c, stepping)

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
        """Up to ``max_steps`` steps from ``state = (lanes, agent)`` (its seed
        window put, ``jaxmesh.core.carry.with_window``); stops at a bad value
        (the host reports it), a step event a hook refused (the host raises
        the hook's exception after it), or when the log is full. The log's
        rows start at 0: ``res`` carries the run totals, the fault and the
        recording over."""
        carry = Carry(*state, res.replace(rows=jnp.zeros_like(res.rows)))
        carry, _ = self._advance(params, carry, max_steps, stop_at_fault=True)
        return (carry.lanes, carry.agent), carry.results

    def run(self, params: Any, seeds: jax.Array) -> tally.Results:
        """Runs a whole budget of ``capacity`` seeds (pure; jit or vmap it).

        It does not stop at a bad value: with no host to report to, it scores
        the whole budget and returns the fault in ``Results.fault``.
        """
        carry = zero_carry(self.policy, self.env, self.config, log=False)
        budget = jnp.int32(self.config.capacity)
        first = first_lanes(jnp, self.config.agent.num_envs, budget)
        carry = carry.replace(
            lanes=carry.lanes.replace(seeds=seeds, budget=budget, **first)
        )
        carry, _ = self._advance(params, carry, None, stop_at_fault=False)
        return carry.results
