"""The agent step driven by a host loop gives the scan engine's results.

The host loop here does what a loop over remote simulators does: more episodes
than lanes, a lane that finishes takes the next episode (ascending lane order),
is reset with ``PRNGKey(seed)`` and passed as ``started``; lanes with nothing
left are masked. Its results are compared with the scan and with the
independent reference loop.
"""

from __future__ import annotations

import types

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from reference_loop import assert_matches, gymnax_fns, run_episode, schedule

import jaxmesh
from jaxmesh import make_agent
from jaxmesh.adapt import Previous, State

ENV, PARAMS = gymnax.make("CartPole-v1")
SPEC = {"obs": State(stack=3), "prev": Previous()}


def policy(inp, key):
    frames, prev = inp["obs"], inp["prev"]
    logit = 20 * frames[-1, 2] + 5 * (frames[-1, 3] - frames[0, 3]) + 0.1 * prev
    return jax.random.bernoulli(key, jax.nn.sigmoid(logit), (6,)).astype(jnp.int32)


def inputs(obs_h, act_h, t):
    """What the spec shows at step t: the last 3 observations, the last action."""
    frames = jnp.stack([obs_h[max(i, 0)] for i in range(t - 2, t + 1)])
    prev = act_h[t - 1] if t > 0 else jnp.int32(0)
    return {"obs": frames, "prev": prev}


def host_loop(agent, seeds, n):
    """Runs the budget on n lanes with the agent's jitted step; per-episode dicts."""
    e = len(seeds)
    reset = jax.jit(lambda k: ENV.reset_env(k, PARAMS))
    step = jax.jit(jax.vmap(lambda k, s, a: ENV.step_env(k, s, a, PARAMS)))
    truncated = jax.jit(jax.vmap(lambda s: ENV.is_truncated(s, PARAMS)))
    fold = jax.jit(
        jax.vmap(lambda k, t: jax.random.fold_in(jax.random.fold_in(k, 0), t))
    )

    episode = [j if j < e else -1 for j in range(n)]
    keys = np.stack([jax.random.PRNGKey(seeds[i] if i >= 0 else 0) for i in episode])
    first = [reset(jnp.asarray(k)) for k in keys]
    obs = jnp.stack([o for o, _ in first])
    state = jax.tree.map(lambda *x: jnp.stack(x), *[s for _, s in first])
    active = np.array([i >= 0 for i in episode])
    started = active.copy()
    t = np.zeros(n, np.int32)
    ret = np.zeros(n, np.float32)
    nxt = min(n, e)
    out: dict[int, dict] = {}
    mid_run_starts = 0
    ag = agent.init(obs, jnp.asarray(active))
    while active.any():
        ag, actions = agent.step(
            agent.params,
            ag,
            obs,
            jnp.asarray(started),
            jnp.asarray(active),
            jnp.asarray(keys),
            jnp.asarray(t),
        )
        calls = np.asarray(ag.predict_calls)
        obs, state, reward, term, _ = step(fold(jnp.asarray(keys), t), state, actions)
        term, trunc = np.asarray(term), np.asarray(truncated(state))
        ret = ret + np.where(active, np.asarray(reward), 0.0).astype(np.float32)
        t = t + active
        started[:] = False
        for j in np.flatnonzero(active & (term | trunc)):  # ascending lane order
            out[episode[j]] = {
                "returns": ret[j],
                "lengths": t[j],
                "terminated": term[j],
                "truncated": trunc[j],
                "predict_calls": calls[j],
                "lanes": j,
            }
            if nxt == e:
                active[j] = False
                continue
            mid_run_starts += (active & ~(term | trunc)).any()
            episode[j], nxt = nxt, nxt + 1
            keys[j] = np.asarray(jax.random.PRNGKey(seeds[episode[j]]))
            o, s = reset(jnp.asarray(keys[j]))
            obs = obs.at[j].set(o)
            state = jax.tree.map(lambda a, v, j=j: a.at[j].set(v), state, s)
            t[j], ret[j], started[j] = 0, 0.0, True
    fields = ("returns", "lengths", "terminated", "truncated", "predict_calls", "lanes")
    result = {f: np.array([out[i][f] for i in range(e)]) for f in fields}
    return result, mid_run_starts


def test_host_loop_reuses_lanes_and_matches_scan_and_reference():
    model = jaxmesh.Model(policy, spec=SPEC)
    seeds = [3, 1, 4, 1, 5, 9, 2, 6]
    n, horizon, lead = 3, 4, 2
    agent = make_agent(
        model, (ENV, PARAMS), num_envs=n, horizon=horizon, prefetch_lead=lead
    )
    got, mid_run_starts = host_loop(agent, seeds, n)
    assert mid_run_starts > 0  # lanes began episodes while others ran

    scan = jaxmesh.evaluate(
        model,
        (ENV, PARAMS),
        horizon=horizon,
        chunking=jaxmesh.Chunking(prefetch_lead=lead),
        num_envs=n,
        seeds=seeds,
    )
    for f, v in got.items():
        np.testing.assert_array_equal(v, getattr(scan, f), err_msg=f)

    refs = [
        run_episode(
            *gymnax_fns(ENV, PARAMS),
            policy,
            s,
            horizon=horizon,
            lead=lead,
            inputs=inputs,
        )
        for s in seeds
    ]
    assert len({r.length for r in refs}) > 3
    assert_matches(types.SimpleNamespace(**got), refs)
    lanes, _ = schedule([r.length for r in refs], n)
    assert got["lanes"].tolist() == lanes
    assert len(set(lanes)) == n and len(lanes) > n  # lanes were reused
