"""How a chunk is executed (CONTRACT 22-24): delay and temporal ensembling.

Each mode is checked against a plain loop written here from the documented
rule (docs/contract.md, "How a chunk is executed"), not from the engine, on a
gymnax env and on a gymnasium env stepped in this process, at 3 lanes (4 seeds:
lane 0 runs two episodes) and, on the gymnasium env, at 1 lane too.
The chunks' entries differ per step (``chunk[j] = f(obs) + 0.3 * j - 1``), so an
off-by-one in the cursor, the delay or the ring changes the actions; each test
also shows that the nearest wrong rule gives other returns.
"""

from __future__ import annotations

import math

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import fold, gymnax_fns

import jaxmesh

K = 8  # chunk length
CAP = 13  # steps per episode (not a multiple of any horizon used here)
SEEDS = [5, 2, 7, 11]
#: 3 lanes over 4 seeds: lane 0 runs episodes 0 and 3, so a mode's state that a
#: new episode does not reset fails as 1 lane would; the gymnax env compiles a
#: program per lane count (slower), so 1 lane runs on the gymnasium env only.
LANES = {"gymnax": (3,), "gymnasium": (1, 3)}


def f(obs):
    return jnp.tanh(jnp.dot(obs, jnp.asarray([0.7, -1.3, 0.4], obs.dtype)))


def chunk_policy(obs):
    """K actions, each step's differing from the last by 0.3."""
    steps = 0.3 * jnp.arange(K, dtype=jnp.float32) - 1.0
    return (f(obs) + steps)[:, None]


def plan_np(obs):
    return np.asarray(jax.jit(chunk_policy)(jnp.asarray(obs, jnp.float32)))


# The reference rules ---------------------------------------------------------
class DelayRule:
    """CONTRACT 23: the episode's first chunk plays chunk[0:h]; when the playing
    chunk has d actions left, the next is planned from this step's observation
    and plays new[d : d + h] once the playing chunk is exhausted."""

    def __init__(self, h, d):
        self.h, self.d, self.calls = h, d, 0

    def plan(self, obs):
        self.calls += 1
        return plan_np(obs)

    def act(self, t, obs):
        h, d = self.h, self.d
        if t == 0:
            self.playing, self.offset, self.pos, self.next = self.plan(obs), 0, 0, None
        if self.pos == h:
            self.playing, self.offset, self.pos = self.next, d, 0
            self.next = None
        if self.pos == h - d:
            self.next = self.plan(obs)
        action = self.playing[self.offset + self.pos]
        self.pos += 1
        return action


class ChunkRule:
    """A chunk planned every h steps from that step's observation; its first h
    actions played in order (no delay, no lead)."""

    def __init__(self, h):
        self.h, self.calls = h, 0

    def act(self, t, obs):
        if t % self.h == 0:
            self.calls += 1
            self.playing = plan_np(obs)
        return self.playing[t % self.h]


class EnsembleRule:
    """CONTRACT 22: a chunk planned every step; the action at t is the weighted
    average of the chunks planned at t_i <= t that cover t, oldest first."""

    def __init__(self, weight):
        self.weight, self.calls = weight, 0  # weight(i, n) of the i-th of n

    def act(self, t, obs):
        if t == 0:
            self.planned = []
        self.planned.append((t, plan_np(obs)))
        self.calls += 1
        cover = [(ti, c) for ti, c in self.planned if t - ti < K]
        n = len(cover)
        w = np.asarray([self.weight(i, n) for i in range(n)], np.float64)
        entries = np.stack([c[t - ti] for ti, c in cover]).astype(np.float64)
        return (w[:, None] * entries).sum(0) / w.sum()


def exp_weight(m):
    return lambda i, n: math.exp(-m * i)


def run_reference(env_kind, rule_of):
    """Per seed (return, length, plans) of the plain loop with a fresh rule."""
    out = []
    for seed in SEEDS:
        rule = rule_of()
        if env_kind == "gymnax":
            reset, step = GYMNAX_FNS
            key = jax.random.PRNGKey(seed)
            obs, state = reset(key)
        else:
            env = gym.make("Pendulum-v1")
            obs, _ = env.reset(seed=seed)
        ret = 0.0
        for t in range(CAP):
            action = np.asarray(rule.act(t, np.asarray(obs)), np.float32)
            if env_kind == "gymnax":
                obs, state, r, _, _ = step(fold(key, 0, t), state, jnp.asarray(action))
            else:
                obs, r, _, _, _ = env.step(action)
            ret += float(r)
        out.append((ret, CAP, rule.calls))
    return out


def assert_reference(result, ref):
    np.testing.assert_allclose(result.returns, [r[0] for r in ref], rtol=2e-5)
    np.testing.assert_array_equal(result.lengths, [r[1] for r in ref])
    np.testing.assert_array_equal(result.predict_calls, [r[2] for r in ref])


def assert_differs(result, ref):
    """The nearest wrong rule gives other returns: the test can fail."""
    assert not np.allclose(result.returns, [r[0] for r in ref], rtol=1e-4)


ENV = {"gymnax": "gymnax:Pendulum-v1", "gymnasium": "gymnasium:Pendulum-v1"}
GYMNAX_FNS = None


@pytest.fixture(scope="module", autouse=True)
def _gymnax_fns():
    global GYMNAX_FNS
    import gymnax

    GYMNAX_FNS = gymnax_fns(*gymnax.make("Pendulum-v1"))


def run(env_kind, num_envs, **kw):
    return jaxmesh.evaluate(
        chunk_policy,
        ENV[env_kind],
        num_envs=num_envs,
        seeds=SEEDS,
        max_episode_steps=CAP,
        **kw,
    )


# Delay -----------------------------------------------------------------------
@pytest.mark.parametrize("env_kind", ["gymnax", "gymnasium"])
def test_delay_matches_the_rule(env_kind):
    h, d = 4, 2
    ref = run_reference(env_kind, lambda: DelayRule(h, d))
    for n in LANES[env_kind]:
        result = run(env_kind, n, horizon=h, chunking=jaxmesh.Chunking(delay=d))
        assert_reference(result, ref)
        assert result.delay == d and result.to_dict()["settings"]["delay"] == d
    # Off by one: the delayed chunk played from d - 1 (or a lead: from 0).
    assert_differs(result, run_reference(env_kind, lambda: DelayRule(h, d - 1)))


def test_delay_other_sizes():
    """d = h - 2 with K = h + d (the chunk's last action plays). On the gymnasium
    env: the cursor and the delayed chunk are the agent's (``core.agent``), which
    both kinds of env share; test_delay_matches_the_rule runs both."""
    for h, d in ((5, 3),):
        ref = run_reference("gymnasium", lambda h=h, d=d: DelayRule(h, d))
        assert_reference(
            run("gymnasium", 3, horizon=h, chunking=jaxmesh.Chunking(delay=d)), ref
        )


# Delay in milliseconds -------------------------------------------------------
def test_delay_steps_by_hand():
    """d = ceil(delay_ms / (1000 dt)): the first step boundary at or after the
    chunk's arrival plays it."""
    from jaxmesh.run.checks import delay_steps

    assert delay_steps(0, 0.05, "e") == 0
    assert delay_steps(100, 0.05, "e") == 2  # exactly two steps of 50 ms
    assert delay_steps(101, 0.05, "e") == 3
    assert delay_steps(1, 0.05, "e") == 1
    assert delay_steps(60, 0.02, "e") == 3  # 0.06 / 0.02, not 4 by a float's ulp
    assert delay_steps(500, 0.002, "e") == 250


@pytest.mark.parametrize("env_kind", ["gymnax", "gymnasium"])
def test_delay_ms_is_the_delay_in_steps_of_the_envs_dt(env_kind):
    """Pendulum's dt is 0.05 s (gymnax ``params.dt``, gymnasium
    ``unwrapped.dt``): 60 ms and 100 ms are both a 2-step delay. (On gymnax,
    60 ms runs in test_make_evaluator_takes_the_execution_modes: a program of
    its own for the same 2 steps.)"""
    ref = run_reference(env_kind, lambda: DelayRule(4, 2))
    for ms in (60, 100) if env_kind == "gymnasium" else (100,):
        result = run(env_kind, 3, horizon=4, chunking=jaxmesh.Chunking(delay_ms=ms))
        assert_reference(result, ref)
        assert (result.delay, result.delay_ms) == (2, float(ms))
    settings = result.to_dict()["settings"]
    assert (settings["delay"], settings["delay_ms"]) == (2, 100.0)
    back = jaxmesh.RunResult.from_dict(result.to_dict())
    assert (back.delay, back.delay_ms) == (2, 100.0)
    assert "delay_ms=100" in result.summary()


def test_delay_ms_errors():
    with pytest.raises(ValueError, match="has no step time"):
        jaxmesh.evaluate(
            chunk_policy,
            "gymnax:MountainCarContinuous-v0",
            horizon=4,
            chunking=jaxmesh.Chunking(delay_ms=50),
        )
    with pytest.raises(ValueError, match="give the delay once"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay=2, delay_ms=100))
    with pytest.raises(ValueError, match="drop prefetch_lead"):
        run(
            "gymnax",
            1,
            horizon=4,
            chunking=jaxmesh.Chunking(prefetch_lead=1, delay_ms=100),
        )
    with pytest.raises(ValueError, match=">= 0"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay_ms=-5))
    with pytest.raises(TypeError, match="milliseconds"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay_ms="100ms"))
    # 200 ms is 4 steps: more than h = 4 allows, and the message says so.
    with pytest.raises(ValueError, match="delay=4 \\(delay_ms=200"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay_ms=200))


def test_make_evaluator_takes_the_execution_modes():
    """The pure evaluator executes chunks by the same rules (delay, delay_ms,
    ensembling), checked against the plain loops; 60 ms on the gymnax env's
    dt of 0.05 s rounds up to 2 steps."""

    def apply(scale, obs):
        return chunk_policy(obs) * scale

    kw = dict(seeds=SEEDS, num_envs=3, max_episode_steps=CAP)
    one = jnp.float32(1.0)
    for mode, rule in (
        (dict(horizon=4, chunking=jaxmesh.Chunking(delay=2)), lambda: DelayRule(4, 2)),
        (
            dict(horizon=4, chunking=jaxmesh.Chunking(delay_ms=60)),
            lambda: DelayRule(4, 2),
        ),
        (dict(chunking=jaxmesh.Chunking(execution=ENSEMBLES["m=0.5"][0])), None),
    ):
        if rule is None:
            rule = lambda: EnsembleRule(ENSEMBLES["m=0.5"][1])  # noqa: E731
        ev = jaxmesh.make_evaluator(apply, ENV["gymnax"], **kw, **mode)
        res = ev(one)
        ref = run_reference("gymnax", rule)
        np.testing.assert_allclose(res.returns, [r[0] for r in ref], rtol=2e-5)
        np.testing.assert_array_equal(res.predict_calls, [r[2] for r in ref])


# Ensembling ------------------------------------------------------------------
ENSEMBLES = {
    "m=0.5": (jaxmesh.Ensemble(m=0.5), exp_weight(0.5)),
    "average": (jaxmesh.Ensemble(aggregation="average"), lambda i, n: 1.0),
    "latest_only": (
        jaxmesh.Ensemble(aggregation="latest_only"),
        lambda i, n: float(i == n - 1),
    ),
    "weights": (
        jaxmesh.Ensemble(weights=[1, 2, 3, 4, 0, 0, 0, 5]),
        lambda i, n: [1, 2, 3, 4, 0, 0, 0, 5][i],
    ),
}


@pytest.mark.parametrize("env_kind", ["gymnax", "gymnasium"])
def test_ensemble_matches_the_rule(env_kind):
    ens, weight = ENSEMBLES["m=0.5"]
    ref = run_reference(env_kind, lambda: EnsembleRule(weight))
    for n in LANES[env_kind]:
        result = run(env_kind, n, chunking=jaxmesh.Chunking(execution=ens))
        assert_reference(result, ref)
        assert result.execution == "ensemble(m=0.5)"
    # Newest first instead of oldest first.
    flipped = run_reference(
        env_kind, lambda: EnsembleRule(lambda i, n: weight(n - 1 - i, n))
    )
    assert_differs(result, flipped)


@pytest.mark.parametrize("name", ["average", "latest_only", "weights"])
def test_ensemble_aggregations(name):
    """On the gymnasium env: the weights are the agent's (``core.agent``), which
    both kinds of env share; test_ensemble_matches_the_rule runs both."""
    ens, weight = ENSEMBLES[name]
    ref = run_reference("gymnasium", lambda: EnsembleRule(weight))
    assert_reference(run("gymnasium", 3, chunking=jaxmesh.Chunking(execution=ens)), ref)


# Errors (before anything compiles) -------------------------------------------
def test_delay_errors():
    with pytest.raises(ValueError, match="0 < d < h and K >= h"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay=4))
    with pytest.raises(ValueError, match="K >= h \\+ d"):
        run("gymnax", 1, horizon=7, chunking=jaxmesh.Chunking(delay=2))  # K = 8 < 9
    with pytest.raises(ValueError, match="K >= h \\+ d"):
        jaxmesh.evaluate(
            lambda obs: chunk_policy(obs)[0],
            ENV["gymnax"],
            horizon=1,
            chunking=jaxmesh.Chunking(delay=1),
        )
    with pytest.raises(ValueError, match="give one of them"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay=1, prefetch_lead=1))
    with pytest.raises(ValueError, match="delay=-1"):
        run("gymnax", 1, horizon=4, chunking=jaxmesh.Chunking(delay=-1))
    with pytest.raises(ValueError, match="0 < d < h"):
        run("gymnasium", 1, horizon=2, chunking=jaxmesh.Chunking(delay=3))


def test_ensemble_errors():
    ens = jaxmesh.Ensemble()
    with pytest.raises(ValueError, match="discrete actions"):
        jaxmesh.evaluate(
            lambda obs: jnp.zeros((K,), jnp.int32),
            "gymnax:CartPole-v1",
            chunking=jaxmesh.Chunking(execution=ens),
        )
    with pytest.raises(ValueError, match="single actions"):
        jaxmesh.evaluate(
            lambda obs: chunk_policy(obs)[0],
            ENV["gymnax"],
            chunking=jaxmesh.Chunking(execution=ens),
        )
    with pytest.raises(ValueError, match="drop horizon="):
        run("gymnax", 1, horizon=2, chunking=jaxmesh.Chunking(execution=ens))
    with pytest.raises(ValueError, match="8 of them"):
        run(
            "gymnax",
            1,
            chunking=jaxmesh.Chunking(execution=jaxmesh.Ensemble(weights=[1.0, 2.0])),
        )
    with pytest.raises(TypeError, match="jaxmesh.Ensemble"):
        run("gymnax", 1, chunking=jaxmesh.Chunking(execution="ensemble"))
    with pytest.raises(ValueError, match="aggregation"):
        jaxmesh.Ensemble(aggregation="median")
    with pytest.raises(ValueError, match="weights are for"):
        jaxmesh.Ensemble(aggregation="average", weights=[1.0])
    with pytest.raises(ValueError, match="positive first"):
        jaxmesh.Ensemble(weights=[0.0, 1.0])
    with pytest.raises(ValueError, match="m=-1"):
        jaxmesh.Ensemble(m=-1)


# Chunk corners told how much will run (CONTRACT 24) ----------------------------
def test_execution_horizon_plain_function_under_delay():
    seen = []

    def head(obs, execution_horizon=K):  # decodes only what will run
        seen.append(execution_horizon)
        steps = 0.3 * jnp.arange(execution_horizon, dtype=jnp.float32) - 1.0
        return (f(obs) + steps)[:, None]

    result = jaxmesh.evaluate(
        head,
        ENV["gymnax"],
        num_envs=3,
        seeds=SEEDS,
        max_episode_steps=CAP,
        horizon=4,
        chunking=jaxmesh.Chunking(delay=2),
    )
    assert set(seen) == {6}  # the probe is told what the run is: h + d
    assert_reference(result, run_reference("gymnax", lambda: DelayRule(4, 2)))


def test_execution_horizon_model_under_ensembling_and_replay():
    seen = []

    class Head(jaxmesh.Model):
        native_chunk = None

        def predict_chunk(self, obs, execution_horizon=K):
            seen.append(execution_horizon)
            steps = 0.3 * jnp.arange(execution_horizon, dtype=jnp.float32) - 1.0
            return (f(obs) + steps)[:, None]

    ens, weight = ENSEMBLES["m=0.5"]
    result = jaxmesh.evaluate(
        Head(),
        ENV["gymnasium"],
        num_envs=3,
        seeds=SEEDS,
        max_episode_steps=CAP,
        chunking=jaxmesh.Chunking(execution=ens),
    )
    assert seen[-1] == K
    assert_reference(result, run_reference("gymnasium", lambda: EnsembleRule(weight)))
    seen.clear()
    jaxmesh.evaluate(
        Head(), ENV["gymnasium"], num_envs=1, episodes=1, horizon=3, max_episode_steps=4
    )
    assert seen[-1] == 3


@pytest.mark.parametrize("kind", ["gymnax", "gymnasium"])
def test_execution_horizon_default_of_one_is_told_the_horizon(kind):
    """A corner with RLMesh's signature (``execution_horizon: int = 1``)
    decodes as many actions as it is told: probed and run with h = 4, it plays
    4-action chunks, not single actions."""
    seen = []

    def head(obs, execution_horizon=1):
        seen.append(execution_horizon)
        steps = 0.3 * jnp.arange(execution_horizon, dtype=jnp.float32) - 1.0
        return (f(obs) + steps)[:, None]

    result = jaxmesh.evaluate(
        head, ENV[kind], num_envs=3, seeds=SEEDS, max_episode_steps=CAP, horizon=4
    )
    assert set(seen) == {4}
    assert_reference(result, run_reference(kind, lambda: ChunkRule(4)))


def test_execution_horizon_short_chunk_is_refused():
    def short(obs, execution_horizon=K):
        return jnp.zeros((execution_horizon - 1, 1))  # one short of what it is told

    with pytest.raises(ValueError, match="executes 4 actions"):
        jaxmesh.evaluate(short, ENV["gymnasium"], num_envs=1, episodes=1, horizon=4)


# Served (a real serve-env child) ---------------------------------------------------
def test_delay_and_ensembling_served_equal_in_process():
    """Each mode on a served gymnasium Pendulum: every episode equal to the
    in-process run's (the same jitted agent step; only the env step moves)."""
    from gym_reference import start_serve_env

    proc, address = start_serve_env("gymnasium:Pendulum-v1", "--lanes", "3")
    try:
        modes = (
            dict(horizon=4, chunking=jaxmesh.Chunking(delay=2)),
            # the server sends Pendulum's dt
            dict(horizon=4, chunking=jaxmesh.Chunking(delay_ms=100)),
            dict(chunking=jaxmesh.Chunking(execution=ENSEMBLES["m=0.5"][0])),
        )
        for mode in modes:
            served = jaxmesh.evaluate(
                chunk_policy,
                f"grpc://{address}",
                num_envs=3,
                seeds=SEEDS,
                max_episode_steps=CAP,
                **mode,
            )
            here = run("gymnasium", 3, **mode)
            np.testing.assert_array_equal(served.returns, here.returns)
            np.testing.assert_array_equal(served.lengths, here.lengths)
            np.testing.assert_array_equal(served.predict_calls, here.predict_calls)
            assert served.delay == here.delay and served.execution == here.execution
            assert served.delay_ms == mode["chunking"].delay_ms
    finally:
        proc.kill()
        proc.wait()
