"""Served envs: ``jaxmesh.evaluate(policy, "grpc://host:port")`` against a plain loop.

Real servers on 127.0.0.1 (``jaxmesh.EnvServer`` in this process, or ``jaxmesh
serve-env`` in a child process whose readiness comes through ``--ready-fd``),
started and stopped by the tests. The reference is the plain gymnasium loop of
``gym_reference`` (written from the contract). Served lanes move at their own
pace, so which lane ran an episode may differ from the in-process schedule;
every other per-episode field is the reference's.
"""

from __future__ import annotations

import math
import signal
import threading
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import (
    ID,
    SEEDS,
    SPEC,
    BreaksOnSeed,
    TrialEnv,
    chunky,
    disabled_vec,
    finished_match,
    lean,
    noisy,
    per_step,
    plain_loop,
    stacked,
    stacked_inputs,
    start_serve_env,
    trial_policy,
)
from gymnasium import spaces
from reference_loop import assert_matches, first_hit, single

import jaxmesh
from jaxmesh.remote.server import EnvServer, ServeOptions


def served(envs, **kw):
    """A started EnvServer on a free loopback port (a context manager)."""
    return EnvServer(envs, "127.0.0.1:0", **kw)


def url(server) -> str:
    return f"grpc://{server.address}"


def check_served(result, refs, n):
    """Every per-episode field but the lane equals the reference; lanes are sane."""
    assert_matches(result, refs)
    assert result.env_steps == sum(r.length for r in refs)
    lanes = result.lanes.tolist()
    assert lanes[: min(n, len(refs))] == list(range(min(n, len(refs))))
    assert all(0 <= j < n for j in lanes)


_REFS: dict = {}


def chunky_refs(lead=0, cap=100_000):
    """The plain loop's episodes for ``chunky`` at h = 4 (computed once)."""
    key = ("chunky", lead, cap)
    if key not in _REFS:
        fn = jax.jit(chunky)
        _REFS[key] = plain_loop(
            gym.make(ID), lambda x, k: fn(x), SEEDS, horizon=4, lead=lead, cap=cap
        )
    return _REFS[key]


def lean_refs():
    if "lean" not in _REFS:
        _REFS["lean"] = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    return _REFS["lean"]


def stacked_refs():
    if "stacked" not in _REFS:
        _REFS["stacked"] = plain_loop(
            gym.make(ID),
            jax.jit(stacked),
            SEEDS,
            horizon=4,
            lead=2,
            inputs=stacked_inputs,
        )
    return _REFS["stacked"]


@pytest.fixture(scope="module")
def cartpoles():
    with served([gym.make(ID) for _ in range(16)]) as server:
        yield url(server)


# Equality with the plain loop ------------------------------------------------------
# One lane, and more lanes than episodes; 2 lanes (several episodes each) run
# per step in the async, heavy-info and fault tests below, against the same loop.
@pytest.mark.parametrize("n", [1, 16])
def test_per_step_policy_matches_plain_loop(cartpoles, n):
    got = jaxmesh.evaluate(lean, cartpoles, num_envs=n, seeds=SEEDS)
    refs = lean_refs()
    assert len({r.length for r in refs}) > 3
    check_served(got, refs, n)
    assert got.num_envs == min(n, 16) and got.env == f"gymnasium:{ID}"


#: Every lead at 3 lanes (some lanes running several episodes each), and each
#: kind of lead (l = 0, 0 < l < h, l = h) and lane count twice: one lane (lead 0
#: here, its chunks counted in test_a_chunk_crosses_the_wire_once), 3 lanes, and
#: more lanes than episodes (two lane groups by default). 16 lanes at lead 2 is
#: test_lane_groups_give_the_same_results's run.
LANES_AND_LEADS = [(1, 0), (3, 0), (3, 1), (3, 2), (3, 4), (16, 4)]


@pytest.mark.parametrize(("n", "lead"), LANES_AND_LEADS)
def test_chunked_policy_every_lead_matches_plain_loop(cartpoles, n, lead):
    got = jaxmesh.evaluate(
        chunky,
        cartpoles,
        num_envs=n,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=lead),
        seeds=SEEDS,
    )
    refs = chunky_refs(lead)
    assert len({r.length for r in refs}) > 3
    check_served(got, refs, n)


# One round trip per plan (right after the runs above: their agents are
# still cached) -----------------------------------------------------------
def test_a_chunk_crosses_the_wire_once(cartpoles):
    """One lane, h = 4, no lead: a reset per episode, then one call per chunk."""
    got = jaxmesh.evaluate(chunky, cartpoles, num_envs=1, horizon=4, seeds=SEEDS)
    calls = len(SEEDS) + sum(math.ceil(n / 4) for n in got.lengths.tolist())
    assert got.telemetry["request_bytes"]["count"] == calls
    per_step_run = jaxmesh.evaluate(lean, cartpoles, num_envs=1, seeds=SEEDS)
    assert per_step_run.telemetry["request_bytes"]["count"] == len(SEEDS) + int(
        per_step_run.lengths.sum()
    )


def test_telemetry_has_every_series(cartpoles):
    got = jaxmesh.evaluate(chunky, cartpoles, num_envs=3, horizon=4, seeds=SEEDS)
    for name in ("predict", "env_step", "encode", "decode", "wire", "queue"):
        s = got.telemetry[name]
        assert s["count"] > 0 and 0 <= s["p50"] <= s["p95"] <= s["p99"]
    table = got.format_telemetry()
    assert "env_step" in table and "p99" in table


# 3 lanes run several episodes each (a window starts afresh on a lane's next
# episode); 16 lanes, more than episodes, plan in two lane groups.
@pytest.mark.parametrize("n", [3, 16])
def test_frame_stack_previous_and_lead_match_plain_loop(cartpoles, n):
    model = jaxmesh.Model(stacked, spec=SPEC)
    got = jaxmesh.evaluate(
        model,
        cartpoles,
        num_envs=n,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=2),
        seeds=SEEDS,
    )
    check_served(got, stacked_refs(), n)


def test_stochastic_policy_matches_plain_loop(cartpoles):
    got = jaxmesh.evaluate(noisy, cartpoles, num_envs=3, seeds=SEEDS)
    check_served(got, plain_loop(gym.make(ID), single(jax.jit(noisy)), SEEDS), 3)


def test_two_servers_give_the_results_of_one():
    with (
        served([gym.make(ID) for _ in range(2)]) as a,
        served([gym.make(ID) for _ in range(2)]) as b,
    ):
        got = jaxmesh.evaluate(
            chunky,
            [url(a), url(b)],
            num_envs=3,
            horizon=4,
            chunking=jaxmesh.Chunking(prefetch_lead=2),
            seeds=SEEDS,
        )
    check_served(got, chunky_refs(2), 3)


@pytest.mark.parametrize("lead", [0, 2])
def test_a_served_vector_env_steps_in_lockstep_with_the_same_results(lead):
    """A VectorEnv server steps every lane at once ('lockstep'): the client
    cuts every lane's actions to one count per call; episodes capped at 40
    steps leave the server's env mid-episode, and are reset all the same."""
    with served(disabled_vec(3)) as server:
        got = jaxmesh.evaluate(
            chunky,
            url(server),
            num_envs=3,
            horizon=4,
            chunking=jaxmesh.Chunking(prefetch_lead=lead),
            max_episode_steps=40,
            seeds=SEEDS,
        )
    refs = chunky_refs(lead, cap=40)
    assert any(r.truncated for r in refs) and any(r.terminated for r in refs)
    check_served(got, refs, 3)


# 3 groups do not split 16 lanes evenly. (2 groups, the default from 8 lanes on,
# with the tile of all lanes: the 16-lane runs above.)
@pytest.mark.parametrize("groups", [3])
def test_lane_groups_give_the_same_results(cartpoles, groups):
    """Pipelined lane groups plan one group while the server steps another."""
    got = jaxmesh.evaluate(
        chunky,
        cartpoles,
        num_envs=16,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=2),
        seeds=SEEDS,
        served=jaxmesh.Served(lane_groups=groups),
    )
    check_served(got, chunky_refs(2), 16)
    # A group plans alone: the default tile is one group's (8 rows at least).
    assert got.plan_tile == 8


@pytest.mark.parametrize("groups", [3])
def test_per_step_lane_groups_give_the_same_results(cartpoles, groups):
    """h = 1: groups take turns, each group's replies awaited at its next turn."""
    got = jaxmesh.evaluate(
        lean,
        cartpoles,
        num_envs=16,
        seeds=SEEDS,
        served=jaxmesh.Served(lane_groups=groups),
    )
    check_served(got, lean_refs(), 16)
    assert got.plan_tile == 8  # one group's default tile (8 rows at least)


def test_per_step_lane_groups_with_windows_and_keys_match_one_group(cartpoles):
    """h = 1 in two lane groups taking turns: a stochastic policy over a
    3-frame window and the previous action gives the plain loop's episodes,
    and one group's bit for bit, while lanes run several episodes each."""
    model = jaxmesh.Model(stacked, spec=SPEC)
    kw = dict(num_envs=4, horizon=1, seeds=SEEDS)
    two = jaxmesh.evaluate(model, cartpoles, served=jaxmesh.Served(lane_groups=2), **kw)
    one = jaxmesh.evaluate(model, cartpoles, served=jaxmesh.Served(lane_groups=1), **kw)
    refs = plain_loop(
        gym.make(ID), jax.jit(stacked), SEEDS, horizon=1, inputs=stacked_inputs
    )
    assert len({r.length for r in refs}) > 3
    check_served(two, refs, 4)
    np.testing.assert_array_equal(two.returns, one.returns)
    np.testing.assert_array_equal(two.lengths, one.lengths)
    np.testing.assert_array_equal(two.predict_calls, one.predict_calls)
    # Two groups take turns: more agent steps than one group's.
    assert two.telemetry["predict"]["count"] > one.telemetry["predict"]["count"]


def test_per_step_lane_groups_over_two_servers():
    """Replies of two servers and two groups come in any order; same episodes."""
    with served([gym.make(ID) for _ in range(5)]) as a:
        with served([gym.make(ID) for _ in range(4)]) as b:
            got = jaxmesh.evaluate(
                lean,
                [url(a), url(b)],
                num_envs=9,
                seeds=SEEDS,
                served=jaxmesh.Served(lane_groups=2),
            )
    check_served(got, lean_refs(), 9)


@pytest.mark.parametrize(
    "value, error", [(0, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_bad_lane_groups_are_refused(cartpoles, value, error, no_compile):
    with pytest.raises(error, match="lane_groups"):
        jaxmesh.evaluate(
            lean, cartpoles, episodes=2, served=jaxmesh.Served(lane_groups=value)
        )


def test_lane_groups_are_refused_for_envs_in_this_process(no_compile):
    with pytest.raises(ValueError, match="drop lane_groups"):
        jaxmesh.evaluate(
            lean, gym.make(ID), episodes=2, served=jaxmesh.Served(lane_groups=2)
        )
    with pytest.raises(ValueError, match="drop lane_groups"):
        jaxmesh.evaluate(
            lean, "gymnax:CartPole-v1", episodes=2, served=jaxmesh.Served(lane_groups=2)
        )


def test_a_served_async_vector_env_gives_the_plain_loops_results():
    """gymnasium's AsyncVectorEnv (one process per lane) behind a server."""
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    # spawn, not fork: this process runs JAX's threads.
    vec = AsyncVectorEnv(
        [lambda: gym.make(ID)] * 2,
        autoreset_mode=AutoresetMode.DISABLED,
        context="spawn",
    )
    try:
        with served(vec) as server:
            got = jaxmesh.evaluate(lean, url(server), num_envs=2, seeds=SEEDS)
    finally:
        vec.close()
    check_served(got, lean_refs(), 2)


def test_max_episode_steps_truncates_like_the_plain_loop(cartpoles):
    got = jaxmesh.evaluate(
        chunky, cartpoles, num_envs=3, horizon=4, max_episode_steps=30, seeds=SEEDS
    )
    refs = chunky_refs(0, cap=30)
    assert any(r.truncated for r in refs)
    check_served(got, refs, 3)


# Continuous actions: MuJoCo ------------------------------------------------------
def test_halfcheetah_float_mlp_served_equals_in_process_and_plain_loop():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    w1 = jax.random.normal(k1, (17, 32)) * 0.3
    w2 = jax.random.normal(k2, (32, 6)) * 0.3

    def mlp(obs):
        return jnp.tanh(jnp.tanh(obs @ w1) @ w2)

    seeds = [0, 1, 2, 3]
    kw = dict(num_envs=3, seeds=seeds)
    with served("gymnasium:HalfCheetah-v5", lanes=3) as server:
        got = jaxmesh.evaluate(mlp, url(server), max_episode_steps=60, **kw)
        short = jaxmesh.evaluate(mlp, url(server), max_episode_steps=10, **kw)
    # The same rows through the same program: bit-identical to in process.
    here = jaxmesh.evaluate(mlp, "gymnasium:HalfCheetah-v5", max_episode_steps=60, **kw)
    np.testing.assert_array_equal(got.returns, here.returns)
    assert got.env == "gymnasium:HalfCheetah-v5" and np.all(got.truncated)
    # The plain loop plans one row at a time, which rounds differently (about
    # 1e-7 in the actions, CONTRACT 4); this flailing cheetah amplifies that
    # about tenfold every 3 steps (1e-5 after 10 steps, 0.1 after 30), so the
    # loop is compared over 10 steps.
    refs = plain_loop(gym.make("HalfCheetah-v5"), per_step(mlp), seeds, cap=10)
    assert_matches(short, refs, rtol=1e-4)


# Reset options and caps -----------------------------------------------------------
def test_trial_index_reaches_a_served_env_that_declares_it():
    log = []
    with served([TrialEnv(log) for _ in range(2)]) as server:
        got = jaxmesh.evaluate(trial_policy, url(server), num_envs=2, seeds=SEEDS)
    seen = sorted((s, o["trial_index"]) for s, o in log)
    assert seen == sorted((s, i) for i, s in enumerate(SEEDS))
    np.testing.assert_array_equal(
        got.returns, [(1 + i) * (2 + s % 3) for i, s in enumerate(SEEDS)]
    )


class SlowEnv(gym.Env):
    """Never ends by itself; each step sleeps 20 ms."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        import time

        time.sleep(0.02)
        return np.zeros(1, np.float32), 1.0, False, False, {}


def test_max_episode_seconds_truncates_a_slow_served_episode():
    with served([SlowEnv() for _ in range(2)]) as server:
        got = jaxmesh.evaluate(
            lambda o: jnp.int32(0),
            url(server),
            num_envs=2,
            episodes=2,
            max_episode_seconds=0.1,
        )
    assert np.all(got.truncated) and not np.any(got.terminated)
    assert np.all(got.lengths >= 1) and np.all(got.lengths < 1000)
    assert got.max_episode_seconds == 0.1


# Faults: nothing finished is lost ---------------------------------------------------
def test_an_env_exception_reaches_the_client_with_its_traceback():
    bad = SEEDS[4]
    with served([BreaksOnSeed(bad) for _ in range(2)]) as server:
        with pytest.raises(jaxmesh.RemoteEnvError, match="simulator broke") as e:
            jaxmesh.evaluate(lean, url(server), num_envs=2, seeds=SEEDS)
        assert "in step" in e.value.remote_traceback
        partial = e.value.partial_result
        assert 4 not in partial.indices.tolist() and partial.num_episodes >= 3
        finished_match(partial, lean_refs())
        # The server serves the next session.
        again = jaxmesh.evaluate(lean, url(server), num_envs=2, seeds=SEEDS[:4])
        assert again.num_episodes == 4


class HangsAtStep(gym.Env):
    """One float observation; 5-step episodes; seed ``hang``'s episode sleeps
    ``seconds`` in its third step (an env that hangs without dying)."""

    observation_space = spaces.Box(-1, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, hang: int, seconds: float):
        self.hang, self.seconds = hang, seconds
        self.released = threading.Event()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = seed, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.seed_ == self.hang and self.t == 3:
            self.released.wait(self.seconds)
        return np.zeros(1, np.float32), 1.0, False, self.t >= 5, {}


def test_reply_timeout_ends_a_run_whose_env_hangs():
    envs = [HangsAtStep(hang=2, seconds=30.0)]
    with served(envs) as server:
        t0 = time.monotonic()
        with pytest.raises(jaxmesh.RemoteConnectionError, match="reply_timeout") as e:
            jaxmesh.evaluate(
                lambda o: jnp.int32(0),
                url(server),
                num_envs=1,
                episodes=4,
                served=jaxmesh.Served(reply_timeout=1.0),
            )
        assert time.monotonic() - t0 < 20  # not the 30 s the env hangs
        # Episodes 0 and 1 finished before episode 2 hung; nothing else counts.
        assert e.value.partial_result.indices.tolist() == [0, 1]
        assert e.value.partial_result.lengths.tolist() == [5, 5]
        envs[0].released.set()  # let the server's step return and end
    with pytest.raises(ValueError, match="reply_timeout=0"):
        jaxmesh.evaluate(lean, url(server), served=jaxmesh.Served(reply_timeout=0))
    with pytest.raises(ValueError, match="drop reply_timeout="):
        jaxmesh.evaluate(lean, [gym.make(ID)], served=jaxmesh.Served(reply_timeout=1.0))


def test_a_bad_action_raises_bad_value_error_at_its_step(cartpoles):
    def overshoot(obs):
        return jnp.where(obs[2] > 0.05, 2, lean(obs)).astype(jnp.int32)

    refs = lean_refs()
    episode, step = first_hit(refs, lambda o: o[2] > 0.05)
    with pytest.raises(jaxmesh.BadValueError) as e:
        jaxmesh.evaluate(overshoot, cartpoles, num_envs=1, seeds=SEEDS)
    assert (e.value.episode, e.value.step, e.value.value) == (episode, step, 2.0)
    assert e.value.partial_result.indices.tolist() == list(range(episode))


def test_a_server_killed_mid_run_ends_the_run_with_finished_episodes():
    proc, address = start_serve_env(f"gymnasium:{ID}", "--lanes", "2")
    try:

        class Kill:
            def on_episode_end(self, ep):
                if ep.index == 2:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()

        with pytest.raises(jaxmesh.RemoteConnectionError, match=address) as e:
            jaxmesh.evaluate(
                lean, f"grpc://{address}", num_envs=2, seeds=SEEDS, hooks=Kill()
            )
        partial = e.value.partial_result
        assert {0, 1, 2} <= set(partial.indices.tolist())
        finished_match(partial, lean_refs())
    finally:
        proc.kill()
        proc.wait()


def test_a_bad_address_fails_fast_naming_it():
    with pytest.raises(jaxmesh.RemoteConnectionError, match="127.0.0.1:1"):
        jaxmesh.evaluate(lean, "grpc://127.0.0.1:1", episodes=1)
    with pytest.raises(ValueError, match="grpc://nowhere"):
        jaxmesh.evaluate(lean, "grpc://nowhere", episodes=1)


def test_a_token_is_required_and_taken_from_the_argument_or_environment(
    monkeypatch,
):
    monkeypatch.delenv("JAXMESH_TOKEN", raising=False)
    opts = ServeOptions(token="s3cret")
    with served([gym.make(ID) for _ in range(2)], options=opts) as server:
        with pytest.raises(jaxmesh.RemoteConnectionError, match="UNAUTHENTICATED"):
            jaxmesh.evaluate(lean, url(server), episodes=2)
        assert jaxmesh.evaluate(
            lean, url(server), episodes=2, served=jaxmesh.Served(token="s3cret")
        )
        monkeypatch.setenv("JAXMESH_TOKEN", "s3cret")
        assert jaxmesh.evaluate(lean, url(server), episodes=2).num_episodes == 2


# Only what the policy reads crosses the wire (CONTRACT 19) -----------------------
class HeavyInfo(gym.Wrapper):
    """CartPole that also reports a 1 MB array in every step's info."""

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        return obs, r, te, tr, {**info, "camera": np.zeros(1 << 20, np.uint8)}


def test_info_the_policy_does_not_read_never_crosses_the_wire():
    with served([HeavyInfo(gym.make(ID)) for _ in range(2)]) as server:
        got = jaxmesh.evaluate(lean, url(server), num_envs=2, seeds=SEEDS)
    check_served(got, lean_refs(), 2)
    # A reply carries rewards, ends and 4 float32 observations per lane.
    assert got.telemetry["reply_bytes"]["p99"] < 1024
    assert got.telemetry["request_bytes"]["p99"] < 1024


def test_a_reply_over_the_message_cap_names_size_limit_and_fix():
    class Big(gym.Env):
        observation_space = spaces.Box(0, 1, (600_000,), np.float32)
        action_space = spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(600_000, np.float32), {}

        def step(self, action):
            return np.zeros(600_000, np.float32), 0.0, True, False, {}

    opts = ServeOptions(max_message_bytes=1 << 20)
    with served([Big(), Big()], options=opts) as server:
        with pytest.raises(jaxmesh.RemoteError, match="fewer lanes") as e:
            jaxmesh.evaluate(lambda o: jnp.int32(0), url(server), episodes=2)
    assert e.value.code == "RESOURCE_EXHAUSTED"


def test_default_lane_groups_split_many_lanes_and_change_no_result():
    """From 8 lanes on a run takes two groups by default, with the tile of all
    its lanes: the same returns bit for bit as one group, float actions too."""
    from jaxmesh.run.host.served import default_lane_groups

    assert [default_lane_groups(n) for n in (1, 7, 8, 64)] == [1, 1, 2, 2]
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    w1 = jax.random.normal(k1, (3, 32)) * 0.5
    w2 = jax.random.normal(k2, (32, 1)) * 0.5

    def mlp(obs):
        return 2.0 * jnp.tanh(jnp.tanh(obs @ w1) @ w2)

    kw = dict(num_envs=8, seeds=list(range(12)), max_episode_steps=40)
    with served([gym.make("Pendulum-v1") for _ in range(8)]) as server:
        default = jaxmesh.evaluate(mlp, url(server), **kw)
        one = jaxmesh.evaluate(
            mlp, url(server), served=jaxmesh.Served(lane_groups=1), **kw
        )
    np.testing.assert_array_equal(default.returns, one.returns)
    # Two groups take turns: more agent steps than one group's, same env steps.
    assert default.env_steps == one.env_steps
    assert default.telemetry["predict"]["count"] > one.telemetry["predict"]["count"]
