"""The scan engine: lane bookkeeping around the agent step and a JAX env.

``Engine.run_segment`` advances up to S steps, logging the episodes that end
(``Results.index``) for the host to copy (``tally.write``); ``Engine.run`` runs
a whole budget in one call (``make_evaluator``). docs/evaluation.md, "The
engine" and "Compiling once".
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

#: Lanes reset per call of the env's reset, at most: a one-lane step then
#: touches no buffer over 512 bytes, which XLA:CPU needs to run a step's
#: kernels in one sequence.
RESET_TILE = 32

#: A reset of at most this many JAX equations (gymnax's have 20-40, an MJX one
#: thousands) runs on every lane and the starting lanes keep theirs: fewer
#: kernels than tiles, the same values. Only up to ``WHERE_RESET_LANES`` lanes:
#: past them short episodes ran slower (0.9x at 1,024 and 4,096 lanes).
CHEAP_RESET_EQUATIONS = 256
WHERE_RESET_LANES = 256


def batched(env: Any) -> bool:
    """Whether ``env`` steps all N lanes in one call (``reset_lanes`` and
    ``step_lanes``: an EnvPool pool, ``jaxmesh.envs.envpool``)."""
    return callable(getattr(env, "step_lanes", None))


def env_stream(ep_keys: jax.Array) -> jax.Array:
    """The per-episode base of env-step keys."""
    return keys.fold_in(ep_keys, agent.STREAM_ENV)


def equations(jaxpr: Any) -> int:
    """The equations of a jaxpr, those of the programs it calls included."""
    params = [p for eqn in jaxpr.eqns for p in eqn.params.values()]
    subs = [s for p in params for s in (p if isinstance(p, (tuple, list)) else (p,))]
    subs = [getattr(s, "jaxpr", s) for s in subs]  # a ClosedJaxpr's
    return len(jaxpr.eqns) + sum(equations(s) for s in subs if hasattr(s, "eqns"))


def with_step_events(engine: Engine, on_step: Callable) -> Engine:
    """The same engine with step events compiled in, sent to ``on_step``."""
    config = dataclasses.replace(engine.config, step_events=True)
    return Engine(engine.policy, engine.env, config, on_step)


def zero_carry(policy: Policy, env: Any, cfg: EngineConfig, log: bool = True) -> Carry:
    """A carry of the right shapes: a segment's (``log``: a seed window and a
    log) or ``run``'s (seeds and results indexed by episode)."""
    n = cfg.agent.num_envs
    seeds = window_size(cfg) if log else cfg.capacity
    key0 = jax.random.PRNGKey(0)  # under eval_shape: traced, never run
    obs, env_state = env.reset(key0)
    lanes_of = lambda tree: jax.tree.map(
        lambda x: jnp.zeros((n,) + jnp.shape(x), jnp.result_type(x)), tree
    )
    per_lane = dict(episode=jnp.int32, active=bool, start=bool, t=jnp.int32)
    lanes = LaneState(
        **{f: jnp.zeros((n,), dtype) for f, dtype in per_lane.items()},
        ret=jnp.zeros((n,), jnp.float32),
        key=lanes_of(key0),
        env_state=lanes_of(env_state),
        seeds=jnp.zeros((seeds,), jnp.int32),
        **dict.fromkeys(("budget", "base", "next_episode", "n_done"), jnp.int32(0)),
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


class Engine:
    """The jitted engine for one (policy, env, configuration).

    ``on_step``: with ``config.step_events``, ``on_step(stepped, episode, t,
    action, reward, terminated, truncated) -> bool`` (all [N] numpy; False
    stops the segment), called from the compiled program.
    """

    def __init__(
        self,
        policy: Policy,
        env: Any,
        config: EngineConfig,
        on_step: Callable | None = None,
    ):
        # In a loop body XLA:CPU runs a non-NHWC convolution on a naive loop.
        on_cpu = (policy.device or jax.devices()[0]).platform == "cpu"
        self.policy = convs.canonical_convs(policy) if on_cpu else policy
        self.env, self.config, self.on_step = env, config, on_step
        # The results are not donated: a failure inside a segment loses
        # nothing the last one finished.
        self.run_segment = jax.jit(
            self._run_segment, static_argnums=(3,), donate_argnums=(1,)
        )

    @functools.cached_property
    def _reset_probe(self) -> tuple[bool, Any]:
        """Whether the env's reset is cheap, and one lane's reset shapes."""
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        jaxpr, shapes = jax.make_jaxpr(self.env.reset, return_shape=True)(key)
        return equations(jaxpr.jaxpr) <= CHEAP_RESET_EQUATIONS, shapes

    @functools.cached_property
    def _carry_shape(self) -> Carry:
        return jax.eval_shape(
            functools.partial(zero_carry, self.policy, self.env, self.config)
        )

    def carry_shape(self) -> Carry:
        """Shapes and dtypes of the carry (compiles nothing)."""
        return self._carry_shape

    def first_carry(
        self,
        seeds: np.ndarray,
        device: Any = None,
        record: Any = None,
        trials: tuple | None = None,
        texts: Any = None,
    ) -> Carry:
        """The carry a run of ``seeds`` starts from, built on the host and put
        on ``device``, with the recorded episodes, ``(trial_of, data)`` and
        each ``jaxmesh.adapt.Text`` input's encoding per lane."""
        zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self.carry_shape())
        carry = given(self.config, zeros, seeds, record, trials, texts)
        return jax.device_put(carry, device)

    def _begin(self, lanes: LaneState, ag: agent.AgentState):
        """Resets the lanes in ``lanes.start``; also returns the reset
        observations, the lanes that begin and how many lanes are active."""
        cfg = self.config
        start = lanes.start
        begins = start & (lanes.episode < lanes.budget)
        cheap, (obs_shape, _) = self._reset_probe
        n = cfg.agent.num_envs
        obs = jax.tree.map(lambda s: jnp.zeros((n,) + s.shape, s.dtype), obs_shape)

        def body(rows, c):
            env_state, obs, at_reset = c
            k = rows.take(lanes.key)  # set at the hand-over (_inner)
            at = rows.put
            if cfg.success_at_reset:  # never with trials (build.py)
                obs0, state0, info0 = jax.vmap(self.env.reset_with_info)(k)
                flag = tally.info_leaves(info0)[cfg.success]
                at_reset = at(at_reset, rules.success(jnp, jnp.reshape(flag, (-1,))))
            elif cfg.trials is None:
                obs0, state0 = jax.vmap(self.env.reset)(k)
            else:  # from each episode's trial
                trial_of, data = lanes.trials
                i = rows.take(lanes.episode) - lanes.base
                i = jnp.clip(i, 0, trial_of.shape[0] - 1)
                reset = jax.vmap(cfg.trials.reset, in_axes=(0, 0, None))
                obs0, state0 = reset(k, trial_of[i], data)
            return (
                jax.tree.map(at, env_state, state0),
                jax.tree.map(at, obs, obs0),
                at_reset,
            )

        tile = n if cheap and n <= WHERE_RESET_LANES else min(RESET_TILE, n)

        def start_lanes(c):
            resets, ag, t, ret, acc = c
            if batched(self.env):  # one call starts every lane that begins
                env_state, _, at_reset = resets
                obs, env_state = self.env.reset_lanes(begins, lanes.episode, env_state)
                resets = env_state, obs, at_reset
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
        # One reduction for both counts (XLA:CPU compiles each to two kernels).
        starting, stepping = jnp.sum(
            jnp.stack([start, active]), axis=1, dtype=jnp.int32
        )
        first = (lanes.env_state, obs, lanes.reset_success)
        first = (first, ag, lanes.t, lanes.ret, lanes.acc)
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

    # An inner loop of env steps (``_begin``, ``_core``) until a lane's episode
    # ends, inside an outer one that writes the results and hands the next
    # episodes over (``_finish``). The inner loop holds no result buffer, so
    # XLA:CPU runs a few-lane step as one kernel sequence.

    def _inner(self, carry: Carry) -> Inner:
        """The inner loop's state: handed-over lanes get their episode's key."""
        no = jnp.zeros((self.config.agent.num_envs,), bool)
        res, lanes = carry.results, carry.lanes
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
            **dict.fromkeys(("ended", "terminated", "truncated", "scored"), no),
        )

    def _core(self, params: Any, c: Inner, stepping: jax.Array) -> Inner:
        """One env step of every active lane (``stepping`` of them)."""
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
        # Derived anew each step: an env that reads no key compiles no hash.
        env_keys = keys.fold_in(env_stream(lanes.key), lanes.t)
        if batched(self.env):  # one call steps every lane (spares for masked)
            out = self.env.step_lanes(active, lanes.env_state, action)
        elif cfg.reads_info:
            step = jax.vmap(self.env.step_with_info)
            out = step(env_keys, lanes.env_state, action)
        else:
            out = (*jax.vmap(self.env.step)(env_keys, lanes.env_state, action), None)
        obs, env_state, reward, term, trunc, info = out
        if cfg.reads_info:  # a JAX env's info has every key on every step
            leaves = tally.info_leaves(info)
            acc = tuple(
                rules.accumulate_metric(
                    jnp, red, a, None, jnp.reshape(leaves[name], active.shape), active
                )[0]
                for a, (name, red) in zip(lanes.acc, cfg.accumulators, strict=True)
            )
            lanes = lanes.replace(acc=acc)
        reward = jnp.asarray(reward, jnp.float32)
        # A bad action, or a non-finite reward (the action's fault first).
        kinds, values = rules.action_faults(jnp, action, active, self.env.num_actions)
        kinds, values = rules.reward_faults(jnp, reward, active, kinds, values)
        ag = agent.observe(cfg.agent, ag, obs)
        t = lanes.t + 1
        trunc = trunc | rules.at_cap(jnp, t, cfg.max_steps)
        ended = active & (term | trunc)
        go_on = c.go_on
        if cfg.step_events:  # episode and t before the step
            on_step = self.on_step

            def emit(*arrays: Any) -> np.bool_:
                return np.bool_(on_step(*(np.array(a) for a in arrays)))

            stepped = active & (kinds == tally.NO_FAULT)
            per_lane = (stepped, lanes.episode, lanes.t, action, reward, term, trunc)
            go_on = io_callback(
                emit, jax.ShapeDtypeStruct((), jnp.bool_), *per_lane, ordered=True
            )
        rec = c.recording
        if cfg.record_slots:  # skipped once every recorded episode is done
            v = dict(actions=action, rewards=reward, terminated=term, truncated=trunc)

            def write(r):
                return recording.step(self.env, cfg, r, lanes, obs, env_state, **v)

            rec = jax.lax.cond(~jnp.all(c.record_done), write, lambda r: r, rec)
        return c.replace(
            lanes=lanes.replace(
                active=active & ~ended, t=t, ret=lanes.ret + reward, env_state=env_state
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
        """Writes the episodes that ended and hands the next ones over."""
        cfg = self.config
        lanes, ended = c.lanes, c.ended

        def finish(lanes, res):
            extra = {}
            if cfg.reads_info:
                acc, t = lanes.acc, lanes.t
                metrics = zip(acc[: len(cfg.metrics)], cfg.metrics, strict=True)
                extra["metrics"] = {
                    name: rules.finalize_metric(jnp, red, a, t)
                    for a, (name, red) in metrics
                }
                if cfg.success is not None:
                    extra["success"] = rules.success(jnp, acc[-2])
                    extra["success_once"] = acc[-1]
                if cfg.success_at_reset:
                    extra["success_at_reset"] = lanes.reset_success
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

    def _advance(
        self, params: Any, carry: Carry, max_steps: Any, stop_at_fault: bool
    ) -> tuple[Carry, Any]:
        """Runs up to ``max_steps`` env steps (None: no limit) while the run
        may go on (budget, faults, step events), and whether it may."""
        cfg = self.config

        def steps_left(steps):
            return jnp.bool_(True) if max_steps is None else steps < max_steps

        def outer_cond(o):
            steps, go_on, carry = o
            lanes, res = carry.lanes, carry.results
            ok = steps_left(steps) & go_on & (lanes.n_done < lanes.budget)
            if stop_at_fault:
                ok = ok & jnp.all(res.fault.kind == tally.NO_FAULT)
            if res.rows is not None:  # a segment's log holds another step's ends
                ok = ok & (res.rows + cfg.agent.num_envs <= cfg.capacity)
            return ok

        # Under vmap (a population) a member whose budget is done runs the
        # loops with the others: it must see no lane running.
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
            rec = c.recording
            if cfg.record_slots:  # skipped once every recorded one is done
                reset = lambda r: recording.reset(self.env, cfg, r, lanes, begins, obs0)
                rec = jax.lax.cond(~jnp.all(c.record_done), reset, lambda r: r, rec)
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
        """Up to ``max_steps`` steps from ``state = (lanes, agent)``, stopping
        at a bad value, a refused step event or a full log; ``res`` carries
        the totals, fault and recording over."""
        carry = Carry(*state, res.replace(rows=jnp.zeros_like(res.rows)))
        carry, _ = self._advance(params, carry, max_steps, stop_at_fault=True)
        return (carry.lanes, carry.agent), carry.results

    def run(self, params: Any, seeds: jax.Array) -> tally.Results:
        """Runs a budget of ``capacity`` seeds, through bad values (pure)."""
        carry = zero_carry(self.policy, self.env, self.config, log=False)
        budget = jnp.int32(self.config.capacity)
        first = first_lanes(jnp, self.config.agent.num_envs, budget)
        carry = carry.replace(
            lanes=carry.lanes.replace(seeds=seeds, budget=budget, **first)
        )
        carry, _ = self._advance(params, carry, None, stop_at_fault=False)
        return carry.results
