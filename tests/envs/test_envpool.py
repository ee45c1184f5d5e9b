"""EnvPool envs ("envpool:<id>") against a plain per-episode EnvPool loop.

The reference makes a ONE-env pool per episode with ``seed=s``, resets it and
steps it with the policy's actions (chunks and a prefetch lead replayed by
hand, CONTRACT 10 and 12), in numpy: no jaxmesh code. jaxmesh runs the same
budget on one pool for all episodes at several lane counts.
"""

from __future__ import annotations

import gc
import weakref

import envpool
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh
from jaxmesh.envs.envpool import f32_to_f64_bits, f64_bits_to_f32
from jaxmesh.results.video import episode_frames

CAP = 25  # EnvPool's max_episode_steps: short episodes, several per lane
SEEDS = [5, 9, 2, 7, 1]
H, K, LEAD = 4, 4, 2


def reference(task, seed, plan, h, lead, cap, **kwargs):
    """One episode on a one-env pool made with ``seed=seed``: returns (return,
    length, terminated, truncated). ``plan(obs) -> [K, ...] actions`` (numpy);
    the chunk playing from step t was planned from the observation of step
    ``t - min(lead, h)`` (the first from the reset observation)."""
    env = envpool.make(
        task,
        env_type="gymnasium",
        num_envs=1,
        seed=seed,
        max_episode_steps=cap,
        **kwargs,
    )
    obs, _ = env.reset()
    seen = [obs[0]]  # observation after t steps
    actions = []
    total, t, chunk = np.float32(0.0), 0, None
    while True:
        if t % h == 0:
            at = 0 if t == 0 else t - min(lead, h)
            chunk = plan(seen[at])
        action = chunk[t % h][None]
        actions.append(action[0])
        obs, reward, term, trunc, _ = env.step(action)
        total += np.float32(reward[0])
        t += 1
        seen.append(obs[0])
        if term[0] or trunc[0]:
            return total, t, bool(term[0]), bool(trunc[0]), np.stack(seen), actions


def check_trajectories(result, refs, exact):
    """Every step's observation and action against the reference's."""
    for traj, ref in zip(result.trajectories, refs, strict=True):
        obs, actions = np.asarray(traj.observations), np.asarray(traj.actions)
        assert obs.shape == ref[4].shape and actions.shape[0] == len(ref[5])
        if exact:
            assert obs.dtype == ref[4].dtype == np.uint8
            np.testing.assert_array_equal(obs, ref[4])
            np.testing.assert_array_equal(actions, np.stack(ref[5]))
        else:
            np.testing.assert_allclose(obs, ref[4], rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(actions, np.stack(ref[5]), rtol=1e-3, atol=1e-3)


def check(result, refs, exact):
    returns = np.array([r[0] for r in refs], np.float32)
    lengths = np.array([r[1] for r in refs])
    np.testing.assert_array_equal(result.lengths, lengths)
    np.testing.assert_array_equal(result.terminated, [r[2] for r in refs])
    np.testing.assert_array_equal(result.truncated, [r[3] for r in refs])
    np.testing.assert_array_equal(result.seeds, SEEDS)
    if exact:
        np.testing.assert_array_equal(result.returns, returns)
    else:
        np.testing.assert_allclose(result.returns, returns, rtol=1e-4, atol=1e-4)


# MuJoCo HalfCheetah: continuous actions, a float MLP ----------------------------
_rng = np.random.default_rng(0)
W1 = (_rng.normal(size=(17, 32)) * 0.3).astype(np.float32)
W2 = (_rng.normal(size=(32, K * 6)) * 0.3).astype(np.float32)


def mlp(obs):
    """[17] float32 -> a [K, 6] chunk in [-1, 1] (jax.numpy)."""
    return jnp.tanh(jnp.tanh(obs @ W1) @ W2).reshape(K, 6)


_mlp_row = jax.jit(mlp)


def mlp_numpy(obs):
    # The reference's policy: the same function on one row, float32 in,
    # float64 out (EnvPool's action dtype).
    return np.asarray(_mlp_row(obs.astype(np.float32)), np.float64)


@pytest.fixture(scope="module")
def cheetah():
    return jaxmesh.make_env("envpool:HalfCheetah-v5", max_episode_steps=CAP)


@pytest.fixture(scope="module")
def cheetah_refs():
    return [reference("HalfCheetah-v5", s, mlp_numpy, H, LEAD, CAP) for s in SEEDS]


def run(policy, env, n, pool_episodes=1000):
    """The test budget on ``n`` lanes, chunked with a lead, every episode
    recorded step by step (across pieces when ``pool_episodes`` splits it)."""
    del pool_episodes
    record = jaxmesh.Record(range(len(SEEDS)), max_steps=CAP)
    return jaxmesh.evaluate(
        policy,
        env,
        num_envs=n,
        seeds=SEEDS,
        horizon=H,
        chunking=jaxmesh.Chunking(prefetch_lead=LEAD),
        record=record,
    )


@pytest.mark.parametrize(
    "n, pool_episodes",
    [
        (1, 1000),
        (3, 3),  # two pools: episodes 0-2, then 3-4
        pytest.param(8, 1000, marks=pytest.mark.slow),  # masked lanes from the start
    ],
)
def test_halfcheetah_matches_per_episode_pools(cheetah_refs, n, pool_episodes):
    env = jaxmesh.make_env(
        "envpool:HalfCheetah-v5", max_episode_steps=CAP, pool_episodes=pool_episodes
    )
    r = run(mlp, env, n, pool_episodes)
    check(r, cheetah_refs, exact=False)
    check_trajectories(r, cheetah_refs, exact=False)
    with pytest.raises(ValueError, match="pass frames=fn"):
        episode_frames(r, 0)  # state vectors are no frames
    assert r.env_steps == sum(x[1] for x in cheetah_refs)
    assert [rec.index for rec in r.episodes] == list(range(len(SEEDS)))


# Atari Pong: discrete actions, uint8 frames --------------------------------------
def frames_policy(obs):
    """[4, 84, 84] uint8 -> a [K] int32 chunk, integer arithmetic only (so
    that both sides compute the same actions bit for bit)."""
    s = jnp.sum(obs.astype(jnp.int32), axis=(1, 2))
    return (s + jnp.arange(K, dtype=jnp.int32) * 7) % 6


def frames_numpy(obs):
    assert obs.dtype == np.uint8 and obs.shape == (4, 84, 84)
    s = obs.astype(np.int64).sum(axis=(1, 2))
    return ((s + np.arange(K) * 7) % 6).astype(np.int32)


@pytest.fixture(scope="module")
def pong_refs():
    return [
        reference(
            "Pong-v5",
            s,
            frames_numpy,
            H,
            LEAD,
            CAP,
            episodic_life=False,
            reward_clip=False,
        )
        for s in SEEDS
    ]


@pytest.mark.parametrize(
    "n, pool_episodes",
    [
        (3, 1000),
        pytest.param(1, 1000, marks=pytest.mark.slow),
        pytest.param(8, 1000, marks=pytest.mark.slow),
        pytest.param(2, 1, marks=pytest.mark.slow),  # a pool per episode
    ],
)
def test_pong_matches_per_episode_pools(pong_refs, n, pool_episodes):
    env = jaxmesh.make_env(
        "envpool:Pong-v5", max_episode_steps=CAP, pool_episodes=pool_episodes
    )
    assert env.num_actions == 6
    pools = []  # weak references to each pool the run builds
    bind = env.bind

    def tracked(*args):
        pool = bind(*args)
        pools.append(weakref.ref(pool))
        return pool

    env.bind = tracked
    r = run(frames_policy, env, n, pool_episodes)
    gc.collect()
    assert len(pools) == -(-len(SEEDS) // pool_episodes)
    assert all(p() is None for p in pools), "a finished run keeps its pool"
    check(r, pong_refs, exact=True)
    check_trajectories(r, pong_refs, exact=True)
    # EnvPool has no renderer: a video shows the newest frame of each
    # observation's stack, in gray.
    seen = pong_refs[1][4][:, -1]
    want = np.repeat(seen[..., None], 3, axis=-1)
    np.testing.assert_array_equal(np.stack(episode_frames(r, 1)), want)
    assert r.env_steps == sum(x[1] for x in pong_refs)


def test_record_across_pieces_keeps_only_the_asked_episodes():
    """Two of five episodes recorded, over pools of three (episodes 0-2, then
    3-4): each slot holds its own episode (the one-env-pool loop's), whichever
    piece ran it."""
    env = jaxmesh.make_env("envpool:Pong-v5", max_episode_steps=4, pool_episodes=3)
    r = jaxmesh.evaluate(
        lambda obs: frames_policy(obs)[0],
        env,
        num_envs=2,
        seeds=SEEDS,
        record=jaxmesh.Record([3, 0], max_steps=4),
    )
    one = lambda obs: frames_numpy(obs)[:1]
    assert [traj.episode for traj in r.trajectories] == [0, 3]
    for traj in r.trajectories:
        episode = traj.episode
        ref = reference(
            "Pong-v5",
            SEEDS[episode],
            one,
            1,
            0,
            4,
            episodic_life=False,
            reward_clip=False,
        )
        np.testing.assert_array_equal(np.asarray(traj.observations), ref[4])
        np.testing.assert_array_equal(np.asarray(traj.actions), np.stack(ref[5]))


@pytest.mark.slow
def test_pong_frames_stay_uint8():
    seen = []

    def policy(obs):
        seen.append((obs.shape, obs.dtype))
        return jnp.int32(0)

    env = jaxmesh.make_env("envpool:Pong-v5", max_episode_steps=3)
    jaxmesh.evaluate(policy, env, num_envs=2, episodes=2)
    assert seen and all(s == ((4, 84, 84), jnp.uint8) for s in seen)


@pytest.mark.slow
def test_pong_frame_stack_and_previous_action(pong_refs):
    """``State(stack=2)`` over EnvPool's uint8 frames and ``Previous()``,
    against a plain loop that keeps the same window by hand."""
    from jaxmesh.adapt import Previous, State

    def pol(inp):
        frames, prev = inp["obs"], inp["prev"]  # [2, 4, 84, 84] uint8, ()
        s = jnp.sum(frames[-1].astype(jnp.int32)) - jnp.sum(frames[0].astype(jnp.int32))
        return (jnp.abs(s) + prev) % 6

    model = jaxmesh.Model(pol, spec={"obs": State(stack=2), "prev": Previous()})

    def reference_stacked(seed):
        env = envpool.make(
            "Pong-v5",
            env_type="gymnasium",
            num_envs=1,
            seed=seed,
            max_episode_steps=CAP,
            episodic_life=False,
            reward_clip=False,
        )
        obs, _ = env.reset()
        window, prev, total, t = [obs[0], obs[0]], 0, np.float32(0), 0
        while True:
            s = window[-1].astype(np.int64).sum() - window[0].astype(np.int64).sum()
            prev = int((abs(s) + prev) % 6)
            obs, reward, term, trunc, _ = env.step(np.array([prev], np.int32))
            window = [window[-1], obs[0]]
            total += np.float32(reward[0])
            t += 1
            if term[0] or trunc[0]:
                return total, t, bool(term[0]), bool(trunc[0])

    refs = [reference_stacked(s) for s in SEEDS]
    env = jaxmesh.make_env("envpool:Pong-v5", max_episode_steps=CAP)
    r = jaxmesh.evaluate(model, env, num_envs=2, seeds=SEEDS)
    check(r, refs, exact=True)


# What is passed to EnvPool, and bad input ------------------------------------------
def test_atari_evaluation_defaults_and_user_kwargs():
    env = jaxmesh.make_env("envpool:Pong-v5")
    assert env.kwargs == {"episodic_life": False, "reward_clip": False}
    env = jaxmesh.make_env("envpool:Pong-v5", episodic_life=True, noop_max=1)
    assert env.kwargs == {"episodic_life": True, "reward_clip": False, "noop_max": 1}
    assert jaxmesh.make_env("envpool:HalfCheetah-v5").kwargs == {}


def test_env_digest_tells_option_sets_apart():
    from jaxmesh.run.identity import env_digest

    plain = env_digest(jaxmesh.make_env("envpool:Pong-v5"))
    assert plain == env_digest(jaxmesh.make_env("envpool:Pong-v5"))
    sticky = jaxmesh.make_env("envpool:Pong-v5", repeat_action_probability=0.25)
    assert env_digest(sticky) != plain


def test_bad_ids_and_kwargs_name_what_to_do():
    with pytest.raises(ValueError, match="HalfCheetah-v5"):
        jaxmesh.make_env("envpool:HalfCheeta-v5")
    with pytest.raises(TypeError, match="num_envs"):
        jaxmesh.make_env("envpool:Pong-v5", num_envs=4)
    with pytest.raises(TypeError, match="make_spec"):
        jaxmesh.make_env("envpool:Pong-v5", no_such_option=1)


# The 64-bit conversions (float64 observations, float64 actions) --------------------
def test_float64_to_float32_rounds_as_numpy():
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.integers(0, 2**64, 20000, dtype=np.uint64).view(np.float64),
            rng.normal(size=5000),
            rng.normal(size=5000) * 1e-40,  # float32 subnormals
            [
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                3.4028235e38,
                3.4028236e38,
                7.006492321624085e-46,
            ],
        ]
    )
    f = rng.normal(size=5000).astype(np.float32)
    up = np.nextafter(f, np.float32(np.inf)).astype(np.float64)
    x = np.concatenate([x, (f.astype(np.float64) + up) / 2])  # ties to even
    words = x.view(np.uint32).reshape(-1, 2)
    got = np.asarray(jax.jit(f64_bits_to_f32)(words[:, 0], words[:, 1]))
    with np.errstate(all="ignore"):
        want = x.astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (
        np.isnan(got) & np.isnan(want)
    )
    assert same.all(), x[~same][:5]


def test_float32_to_float64_is_exact():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([x.view(np.float32), np.float32([0, -0.0, 1e-45, -3e-39])])
    x = x[~np.isnan(x)]
    lo, hi = jax.jit(f32_to_f64_bits)(x)
    got = np.stack([np.asarray(lo), np.asarray(hi)], -1).reshape(-1).view(np.float64)
    np.testing.assert_array_equal(got, x.astype(np.float64))


@pytest.mark.slow
def test_pure_evaluator_refuses_an_envpool_env(cheetah):
    with pytest.raises(TypeError, match="jaxmesh.evaluate or jaxmesh.Evaluator"):
        ev = jaxmesh.make_evaluator(
            lambda p, o: jnp.tanh(o[:6]), cheetah, num_envs=2, episodes=2
        )
        ev(None)
