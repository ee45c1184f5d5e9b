"""jaxmesh.HostPolicy with every feature a JAX policy has.

Each run of a numpy policy is compared with the same policy written in jnp and
run through the same ``jaxmesh.evaluate`` settings (the JAX path has its own
reference-loop tests) and, where cheap, with the contract's plain loop
(``reference_loop``). The policies use only comparisons and products by powers
of two, so numpy and XLA compute the same bits.
"""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import plain_loop, start_serve_env
from reference_loop import assert_matches, fold, gymnax_fns, run_episode

import jaxmesh
from jaxmesh.host_policy import HostPolicy

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
SEEDS = [0, 7, 123, 5, 42, 9, 31]
#: The same env run by the scan (gymnax) and by the host loop (gymnasium).
ENVS = {"gymnax": CARTPOLE, "gymnasium": "gymnasium:CartPole-v1"}


def lean(obs):
    """[B, 4] -> [B] actions (numpy): push the way the pole leans."""
    return (obs[:, 2] * 4 + obs[:, 3] * 0.125 > 0).astype(np.int32)


def jnp_lean(obs):
    """``lean`` for one lane in jnp."""
    return (obs[2] * 4 + obs[3] * 0.125 > 0).astype(jnp.int32)


def chunk4(obs):
    """[B, 4] -> [B, 4] chunks that wobble on purpose."""
    a = lean(obs)
    return np.stack([a, a, 1 - a, a], axis=1)


def jnp_chunk4(obs):
    a = jnp_lean(obs)
    return jnp.stack([a, a, 1 - a, a])


def plain(fn, seeds, kind="gymnax", **kw):
    """The contract's plain loop over the env's own functions, ``fn`` on one row."""
    one = lambda obs, key: np.atleast_1d(fn(np.asarray(obs)[None])[0])
    if kind == "gymnasium":
        return plain_loop(gym.make("CartPole-v1"), one, seeds, **kw)
    return [run_episode(*REF, one, s, **kw) for s in seeds]


def assert_same(a, b):
    """Two results agree episode by episode."""
    for field in ("returns", "lengths", "terminated", "truncated", "predict_calls"):
        np.testing.assert_array_equal(
            getattr(a, field), getattr(b, field), err_msg=field
        )


@pytest.mark.parametrize("kind", ENVS)
def test_prefetch_lead_with_chunks(kind):
    kw = dict(
        num_envs=3, seeds=SEEDS, horizon=4, chunking=jaxmesh.Chunking(prefetch_lead=1)
    )
    host = jaxmesh.evaluate(HostPolicy(chunk4, native_chunk=4), ENVS[kind], **kw)
    assert_same(host, jaxmesh.evaluate(jnp_chunk4, ENVS[kind], **kw))
    refs = plain(chunk4, SEEDS, kind, horizon=4, lead=1)
    assert len({r.length for r in refs}) > 3
    assert_matches(host, refs)


def delay_loop(seed, h, d):
    """One episode under the delay rule: the first chunk plays chunk[0:h]; when
    d actions are left the next chunk is planned and plays new[d : d + h].
    Returns (return, length, plans)."""
    reset, step = REF
    key = jax.random.PRNGKey(seed)
    obs, state = reset(key)
    playing, offset, pos, nxt = chunk4(np.asarray(obs)[None])[0], 0, 0, None
    ret, calls, t = 0.0, 1, 0
    while True:
        if pos == h:
            playing, offset, pos = nxt, d, 0
        if pos == h - d:
            nxt = chunk4(np.asarray(obs)[None])[0]
            calls += 1
        obs, state, r, term, trunc = step(fold(key, 0, t), state, playing[offset + pos])
        pos, t, ret = pos + 1, t + 1, ret + float(r)
        if term or trunc:
            return ret, t, calls


@pytest.mark.parametrize("kind", ENVS)
def test_delay(kind):
    kw = dict(num_envs=3, seeds=SEEDS, horizon=3, chunking=jaxmesh.Chunking(delay=1))
    host = jaxmesh.evaluate(HostPolicy(chunk4, native_chunk=4), ENVS[kind], **kw)
    assert_same(host, jaxmesh.evaluate(jnp_chunk4, ENVS[kind], **kw))
    assert host.delay == 1
    if kind == "gymnax":
        refs = [delay_loop(s, 3, 1) for s in SEEDS]
        np.testing.assert_array_equal(host.returns, [r[0] for r in refs])
        np.testing.assert_array_equal(host.lengths, [r[1] for r in refs])
        np.testing.assert_array_equal(host.predict_calls, [r[2] for r in refs])


def pendulum_chunks(obs):
    """[B, 3] -> [B, 4, 1]: a torque chunk by the sign of the angular speed."""
    s = np.where(obs[:, 2:3] > 0, np.float32(-1), np.float32(1))
    return (s * np.float32([2, 1, 0.5, -0.25]))[:, :, None]


def jnp_pendulum_chunks(obs):
    s = jnp.where(obs[2] > 0, -1.0, 1.0)
    return (s * jnp.float32([2, 1, 0.5, -0.25]))[:, None]


PENDULUM_FNS = gymnax_fns(*gymnax.make("Pendulum-v1"))


def ensemble_loop(seed, weights, cap):
    """One Pendulum episode of ``cap`` steps under temporal ensembling: at step
    t the chunks planned at steps t - K < s <= t, oldest first, weighted by
    ``weights[i]`` (i: the position among them). Returns the return."""
    reset, step = PENDULUM_FNS
    key = jax.random.PRNGKey(seed)
    obs, state = reset(key)
    chunks, ret = [], 0.0
    for t in range(cap):
        chunks = (chunks + [pendulum_chunks(np.asarray(obs)[None])[0]])[-4:]
        n = len(chunks)
        w = np.float64(weights[:n])
        parts = [c[n - 1 - i] for i, c in enumerate(chunks)]
        action = np.float32(
            sum(wi * a for wi, a in zip(w, parts, strict=True)) / w.sum()
        )
        obs, state, r, _, _ = step(fold(key, 0, t), state, action)
        ret += float(r)
    return ret


@pytest.mark.parametrize("aggregation", ["weighted_average", "average"])
@pytest.mark.parametrize("env", ["gymnax:Pendulum-v1", "gymnasium:Pendulum-v1"])
def test_ensemble(env, aggregation):
    ensemble = jaxmesh.Ensemble(m=0.5, aggregation=aggregation)
    kw = dict(
        num_envs=2,
        seeds=SEEDS[:3],
        max_episode_steps=30,
        chunking=jaxmesh.Chunking(execution=ensemble),
    )
    host = jaxmesh.evaluate(HostPolicy(pendulum_chunks, native_chunk=4), env, **kw)
    as_jax = jaxmesh.evaluate(jnp_pendulum_chunks, env, **kw)
    assert_same(host, as_jax)
    assert host.predict_calls.tolist() == [30] * 3  # a plan every step
    if env.startswith("gymnax"):
        w = ensemble.weights_table(4)
        refs = [ensemble_loop(s, w, 30) for s in SEEDS[:3]]
        np.testing.assert_allclose(host.returns, refs, rtol=1e-5)
        plain_h1 = jaxmesh.evaluate(
            HostPolicy(pendulum_chunks, native_chunk=4),
            env,
            **{**kw, "chunking": jaxmesh.Chunking()},
        )
        assert not np.allclose(plain_h1.returns, host.returns)  # it averaged


@pytest.mark.parametrize("kind", ENVS)
def test_sweep_over_horizons_and_delays(kind):
    kw = dict(horizon=[1, 2, 4], delay=[0, 1], num_envs=3, seeds=SEEDS)
    host = jaxmesh.sweep(HostPolicy(chunk4, native_chunk=4), ENVS[kind], **kw)
    as_jax = jaxmesh.sweep(jnp_chunk4, ENVS[kind], **kw)
    cells = [(0, 1), (0, 2), (0, 4), (1, 2)]  # d >= h or h + d > K: skipped
    assert sorted(host.cells) == sorted(as_jax.cells) == cells
    assert host.programs == 1
    for (d, h), cell in host.cells.items():
        assert_same(cell, as_jax.cells[(d, h)])
        if d == 0:
            assert_matches(cell, plain(chunk4, SEEDS, kind, horizon=h))
        elif kind == "gymnax":
            refs = [delay_loop(s, h, d) for s in SEEDS]
            np.testing.assert_array_equal(cell.lengths, [r[1] for r in refs])
            np.testing.assert_array_equal(cell.predict_calls, [r[2] for r in refs])


@pytest.mark.parametrize("kind", ENVS)
def test_record(kind):
    kw = dict(num_envs=3, seeds=SEEDS, record=jaxmesh.Record(episodes=[0, 2]))
    host = jaxmesh.evaluate(HostPolicy(lean), ENVS[kind], **kw)
    as_jax = jaxmesh.evaluate(jnp_lean, ENVS[kind], **kw)
    assert_same(host, as_jax)
    refs = plain(lean, SEEDS, kind)
    assert_matches(host, refs)
    assert [tr.episode for tr in host.trajectories] == [0, 2]
    for tr, other in zip(host.trajectories, as_jax.trajectories, strict=True):
        for field in ("observations", "actions", "rewards", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(tr, field), getattr(other, field))
        ref = refs[tr.episode]
        np.testing.assert_array_equal(tr.actions, np.stack(ref.actions))
        np.testing.assert_array_equal(tr.observations, np.stack(ref.observations))


def test_suite_of_two_gymnax_tasks_and_a_gymnasium_one():
    env, params = CARTPOLE
    suite = jaxmesh.Suite(
        {
            "short": (env, params.replace(max_steps_in_episode=20)),
            "long": jaxmesh.Task(
                (env, params.replace(max_steps_in_episode=40)), seeds=[7, 8]
            ),
            "host": jaxmesh.Task("gymnasium:CartPole-v1", seeds=[3, 1, 4]),
        },
        seeds=SEEDS[:4],
    )
    host = jaxmesh.evaluate(HostPolicy(lean), suite, num_envs=2)
    as_jax = jaxmesh.evaluate(jnp_lean, suite, num_envs=2)
    assert list(host.tasks) == ["short", "long", "host"]
    for name, r in host.tasks.items():
        assert_same(r, as_jax.tasks[name])
    for name, seeds in (("short", SEEDS[:4]), ("long", [7, 8])):
        task_params = suite.tasks[name].env[1]
        reset = jax.jit(lambda key, p=task_params: env.reset_env(key, p))

        @jax.jit
        def step(key, state, action, p=task_params):
            obs, state, r, term, _ = env.step_env(key, state, action, p)
            return obs, state, r, term, env.is_truncated(state, p)

        one = lambda obs, key: lean(np.asarray(obs)[None])
        assert_matches(
            host.tasks[name], [run_episode(reset, step, one, s) for s in seeds]
        )
    assert_matches(host.tasks["host"], plain(lean, [3, 1, 4], "gymnasium"))


def test_evaluator_runs_twice_on_one_compile():
    rows = []

    def counted(obs):
        rows.append(obs.shape[0])
        return lean(obs)

    ev = jaxmesh.Evaluator(HostPolicy(counted), CARTPOLE, num_envs=1)
    first = ev.run(seeds=SEEDS[:3])
    assert rows[0] == 1  # the shape probe on one row of zeros
    assert sum(rows[1:]) == first.lengths.sum()  # one lane: one row a step
    rows.clear()
    second = ev.run(seeds=SEEDS[3:])
    assert len(ev.programs()) == 1
    assert rows == [1] * int(second.lengths.sum())  # no probe, no retrace
    assert_matches(second, plain(lean, SEEDS[3:]))


def test_make_evaluator():
    run = jaxmesh.make_evaluator(HostPolicy(lean), CARTPOLE, num_envs=3, seeds=SEEDS)
    as_jax = jaxmesh.make_evaluator(
        lambda params, obs: jnp_lean(obs), CARTPOLE, num_envs=3, seeds=SEEDS
    )
    got = jax.jit(run)(None)
    assert_same(got, as_jax(None))
    assert_matches(got, plain(lean, SEEDS))


def test_envpool():
    pytest.importorskip("envpool")
    kw = dict(
        num_envs=3,
        seeds=SEEDS[:5],
        max_episode_steps=40,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=2),
    )
    host = jaxmesh.evaluate(
        HostPolicy(chunk4, native_chunk=4), "envpool:CartPole-v1", **kw
    )
    as_jax = jaxmesh.evaluate(jnp_chunk4, "envpool:CartPole-v1", **kw)
    assert_same(host, as_jax)
    assert len(set(host.lengths.tolist())) > 1


def test_workers_with_a_prefetch_lead():
    kw = dict(
        num_envs=3,
        seeds=SEEDS,
        horizon=4,
        workers=2,
        chunking=jaxmesh.Chunking(prefetch_lead=1),
    )
    host = jaxmesh.evaluate(
        HostPolicy(chunk4, native_chunk=4), "gymnasium:CartPole-v1", **kw
    )
    assert_matches(host, plain(chunk4, SEEDS, "gymnasium", horizon=4, lead=1))


def test_a_served_env_with_a_delay():
    kw = dict(num_envs=3, seeds=SEEDS, horizon=3, chunking=jaxmesh.Chunking(delay=1))
    proc, address = start_serve_env("gymnasium:CartPole-v1", "--lanes", "3")
    try:
        host = jaxmesh.evaluate(
            HostPolicy(chunk4, native_chunk=4), f"grpc://{address}", **kw
        )
    finally:
        proc.kill()
        proc.wait()
    assert_same(host, jaxmesh.evaluate(jnp_chunk4, "gymnasium:CartPole-v1", **kw))


@pytest.mark.parametrize("kind", ENVS)
def test_resume_a_chunked_run_with_a_delay(kind):
    planned = []

    def breaks(obs):
        planned.append(obs.shape[0])
        if sum(planned) > 120:
            raise ValueError("out of memory")
        return chunk4(obs)

    kw = dict(
        num_envs=2,
        seeds=SEEDS,
        horizon=3,
        chunking=jaxmesh.Chunking(delay=1),
        layout=jaxmesh.Layout(segment_steps=8),
    )
    with pytest.raises(jaxmesh.HostPolicyError, match="out of memory") as e:
        jaxmesh.evaluate(HostPolicy(breaks, native_chunk=4), ENVS[kind], **kw)
    partial = e.value.partial_result
    assert partial is not None and 1 <= partial.num_episodes < len(SEEDS)
    if kind == "gymnasium":  # the host loop names the episodes that planned
        assert e.value.seeds == [SEEDS[i] for i in e.value.episodes]
        assert e.value.episodes and not set(e.value.episodes) & set(partial.indices)
    whole = jaxmesh.evaluate(jnp_chunk4, ENVS[kind], **kw)
    planned.append(-(10**6))  # the same policy, now far from its failure
    rest = jaxmesh.evaluate(
        HostPolicy(breaks, native_chunk=4), ENVS[kind], resume=partial, **kw
    )
    assert_same(rest, whole)


def coin(obs, seeds):
    """Stochastic chunks: the lean action, flipped on the chunk's odd seeds."""
    a = lean(obs) ^ (seeds & 1).astype(np.int32)
    return np.stack([a, a, 1 - a, a], axis=1)


def jnp_coin(obs, key):
    a = jnp_lean(obs) ^ (jax.random.bits(key, dtype=jnp.uint32) & 1).astype(jnp.int32)
    return jnp.stack([a, a, 1 - a, a])


@pytest.mark.parametrize("kind", ENVS)
def test_stochastic_seeds_with_a_prefetch_lead(kind):
    kw = dict(
        num_envs=3, seeds=SEEDS, horizon=4, chunking=jaxmesh.Chunking(prefetch_lead=2)
    )
    pol = HostPolicy(coin, native_chunk=4, stochastic=True)
    host = jaxmesh.evaluate(pol, ENVS[kind], **kw)
    assert_same(host, jaxmesh.evaluate(jnp_coin, ENVS[kind], **kw))
    if kind == "gymnax":
        bits = lambda key: np.asarray(jax.random.bits(key, dtype=jnp.uint32))[None]
        one = lambda obs, key: coin(np.asarray(obs)[None], bits(key))[0]
        refs = [run_episode(*REF, one, s, horizon=4, lead=2) for s in SEEDS]
        assert_matches(host, refs)
        deterministic = jaxmesh.evaluate(
            HostPolicy(chunk4, native_chunk=4), CARTPOLE, **kw
        )
        assert not np.array_equal(deterministic.lengths, host.lengths)


def test_make_evaluator_vmapped_over_a_population():
    run = jaxmesh.make_evaluator(HostPolicy(lean), CARTPOLE, num_envs=3, seeds=SEEDS)
    got = jax.jit(jax.vmap(run))(jnp.zeros(2))
    lengths = [r.length for r in plain(lean, SEEDS)]
    np.testing.assert_array_equal(got.lengths, [lengths, lengths])
