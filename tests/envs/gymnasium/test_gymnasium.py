"""Host-stepped gymnasium envs in process: ``jaxmesh.evaluate`` against a plain loop.

The reference is the plain gymnasium loop of ``gym_reference`` (written from the
contract, not from the engine).
"""

from __future__ import annotations

import functools
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
    check,
    chunky,
    disabled_vec,
    finished_match,
    lean,
    noisy,
    per_step,
    plain_loop,
    stacked,
    stacked_inputs,
    trial_policy,
)
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from reference_loop import assert_matches, first_hit, single

import jaxmesh


# Equality with the plain loop ------------------------------------------------------
def test_per_step_policy_matches_plain_loop():
    envs = [gym.make(ID) for _ in range(2)]
    got = jaxmesh.evaluate(lean, envs, seeds=SEEDS)
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    assert len({r.length for r in refs}) > 3  # the seeds give different episodes
    check(got, refs, 2)
    assert got.num_envs == 2 and got.env == f"gymnasium:{ID}"
    assert np.all(got.predict_calls == got.lengths)


def test_a_second_run_compiles_nothing():
    from conftest import compiles

    def tilt(obs):  # a policy object of this test's own: a fresh cache entry
        return (obs[2] > 0).astype(jnp.int32)

    first = jaxmesh.evaluate(tilt, [gym.make(ID) for _ in range(2)], seeds=SEEDS[:3])
    assert first.compile_time > 0
    with compiles() as seen:
        again = jaxmesh.evaluate(tilt, disabled_vec(2), seeds=SEEDS[3:])
    assert not seen and again.compile_time == 0
    assert again.num_episodes == len(SEEDS) - 3


def test_chunked_policy_with_prefetch_lead_matches_plain_loop():
    got = jaxmesh.evaluate(
        chunky,
        f"gymnasium:{ID}",
        num_envs=3,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=2),
        seeds=SEEDS,
    )
    refs = chunky_refs(2)
    assert len({r.length for r in refs}) > 3
    check(got, refs, 3)
    assert got.chunk == 6 and got.effective_horizon == 4 and got.asynchronous


def test_stochastic_policy_matches_plain_loop():
    # A good balancer: 4 seeds capped at 200 steps (155, 200, 170 and 190 steps;
    # all 7 uncapped run 2163), still 2 lanes reused.
    seeds = SEEDS[3:]
    got = jaxmesh.evaluate(noisy, disabled_vec(2), seeds=seeds, max_episode_steps=200)
    refs = plain_loop(gym.make(ID), single(jax.jit(noisy)), seeds, cap=200)
    assert len({r.length for r in refs}) > 3 and any(r.truncated for r in refs)
    check(got, refs, 2)


@functools.cache
def chunky_refs(lead):
    """The plain loop of ``chunky`` (horizon 4) with this lead, run once."""
    fn = jax.jit(chunky)
    return plain_loop(gym.make(ID), lambda x, key: fn(x), SEEDS, horizon=4, lead=lead)


@pytest.mark.parametrize("n", [1, 3])
def test_lanes_and_env_forms_give_identical_results(n):
    refs = chunky_refs(0)
    forms = {
        "list": [gym.make(ID) for _ in range(n)],
        "vector": disabled_vec(n),
        "id": f"gymnasium:{ID}",
    }
    results = {
        name: jaxmesh.evaluate(chunky, env, num_envs=n, horizon=4, seeds=SEEDS)
        for name, env in forms.items()
    }
    for name, got in results.items():
        assert got.num_envs == n, name
        check(got, refs, n)
    if n == 3:  # more episodes than lanes: lanes were reused
        assert len(set(results["list"].lanes.tolist())) == 3


#: Leads 0 (synchronous), 1 and 4 (= h) on 3 lanes (7 episodes: lanes reused)
#: and 0 and 4 on 16 (idle lanes); one lane at lead 0 here and at lead 2 in the
#: frame-stack test below (and 3 lanes of ``chunky`` at lead 2 the prefetch test's).
@pytest.mark.parametrize("n, lead", [(1, 0), (3, 0), (3, 1), (3, 4), (16, 0), (16, 4)])
def test_every_lead_and_lane_count_match_plain_loop(n, lead):
    envs = [gym.make(ID) for _ in range(n)]
    got = jaxmesh.evaluate(
        chunky,
        envs,
        num_envs=n,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=lead),
        seeds=SEEDS,
    )
    check(got, chunky_refs(lead), n)


#: One lane, and 3 lanes over 7 episodes (windows reset on a reused lane while
#: others run on); idle lanes are test_every_lead_and_lane_count_...'s.
@pytest.mark.parametrize("n", [1, 3])
def test_frame_stack_and_previous_match_plain_loop_at_any_lane_count(n):
    model = jaxmesh.Model(stacked, spec=SPEC)
    envs = [gym.make(ID) for _ in range(n)]
    got = jaxmesh.evaluate(
        model, envs, horizon=4, chunking=jaxmesh.Chunking(prefetch_lead=2), seeds=SEEDS
    )
    refs = stacked_refs()
    assert len({r.length for r in refs}) > 3
    check(got, refs, n)


@functools.cache
def stacked_refs():
    """The plain loop of ``stacked`` (horizon 4, lead 2, SPEC's inputs), run once."""
    return plain_loop(
        gym.make(ID), jax.jit(stacked), SEEDS, horizon=4, lead=2, inputs=stacked_inputs
    )


def test_max_episode_steps_truncates_like_the_plain_loop():
    # 2 lanes: the agent step of test_per_step_policy_matches_plain_loop
    got = jaxmesh.evaluate(lean, disabled_vec(2), seeds=SEEDS, max_episode_steps=12)
    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS, cap=12)
    check(got, refs, 2)
    assert got.truncated.any() and got.lengths.max() == 12


def torque(obs):
    """Continuous actions (Pendulum's Box(-2, 2, (1,)))."""
    return jnp.clip(-2.0 * obs[1] - 0.5 * obs[2], -2.0, 2.0)[None]


def test_box_actions_match_plain_loop():
    seeds = [0, 5, 9]
    refs = plain_loop(gym.make("Pendulum-v1"), per_step(torque), seeds, cap=30)
    forms = (
        [gym.make("Pendulum-v1") for _ in range(2)],
        "gymnasium:Pendulum-v1",
        # 4 vector lanes, 2 used: lanes 2 and 3 play the idle action throughout
        disabled_vec(4, lambda: gym.make("Pendulum-v1")),
    )
    for env in forms:
        got = jaxmesh.evaluate(
            torque, env, num_envs=2, seeds=seeds, max_episode_steps=30
        )
        # float rewards: jaxmesh sums in float32, the plain loop in float64
        assert_matches(got, refs, rtol=1e-5)
        assert len(set(np.round(got.returns, 3))) == 3
        assert got.num_envs == 2 and got.lanes.tolist() == [0, 1, 0]


# trial_index (CONTRACT 6) ------------------------------------------------------------
@pytest.mark.parametrize("form", ["list", "vector"])
def test_trial_index_reaches_only_an_env_that_declares_it(form):
    seeds = [0, 3, 5, 7, 1, 11]  # episodes 0 and 1 end on the same step (a tie)
    for declares in (True, False):
        log: list = []
        make = lambda log=log, declares=declares: TrialEnv(log, declares)
        if form == "list":
            env = [make() for _ in range(2)]
        else:
            env = SyncVectorEnv([make] * 2, autoreset_mode=AutoresetMode.DISABLED)
        got = jaxmesh.evaluate(trial_policy, env, seeds=seeds)
        refs = plain_loop(TrialEnv([], declares), per_step(trial_policy), seeds)
        check(got, refs, 2)
        episode_resets = [(s, o) for s, o in log if s is not None]
        assert sorted(s for s, _ in episode_resets) == sorted(seeds)
        trials = {s: (o or {}).get("trial_index") for s, o in episode_resets}
        if declares:
            assert trials == {s: i for i, s in enumerate(seeds)}
            assert got.returns.tolist() == [
                (1 + i) * (2 + s % 3) for i, s in enumerate(seeds)
            ]
        else:
            assert all("trial_index" not in (o or {}) for _, o in log)
            assert got.returns.tolist() == [2 + s % 3 for s in seeds]


# Refusals ---------------------------------------------------------------------------
def test_a_next_step_vector_env_is_refused_with_the_fix(no_compile):
    vec = gym.make_vec(ID, num_envs=2, vectorization_mode="sync")
    with pytest.raises(ValueError, match="AutoresetMode.DISABLED") as e:
        jaxmesh.evaluate(lean, vec, episodes=2)
    assert "make_vec" in str(e.value) and "NEXT_STEP" in str(e.value)


def test_max_episode_seconds_is_refused_for_a_jax_env(no_compile):
    with pytest.raises(ValueError, match="max_episode_steps"):
        jaxmesh.evaluate(lean, "gymnax:CartPole-v1", max_episode_seconds=1.0)


class TextInDictObs(gym.Env):
    observation_space = spaces.Dict(
        {"x": spaces.Box(-1, 1, (2,), np.float32), "words": spaces.Text(5)}
    )
    action_space = spaces.Discrete(2)


def narrow_cartpole():
    """CartPole whose observation bounds differ from the others' in one place."""
    env = gym.make(ID)
    space = env.observation_space
    high = space.high.copy()
    high[0] = 1.0
    return gym.wrappers.TransformObservation(
        env, lambda o: o, spaces.Box(-high, high, space.shape, space.dtype)
    )


@pytest.mark.parametrize(
    "env, error, words",
    [
        (TextInDictObs(), TypeError, ["Text", "Box", "Dict"]),
        ("gymnasium:CartPol-v1", ValueError, ["CartPole-v1"]),
        (lambda: [gym.make(ID)] * 2, ValueError, ["same Env object"]),
        (lambda: [gym.make(ID), "CartPole"], TypeError, ["entry 1", "str"]),
        (lambda: [gym.make(ID), narrow_cartpole()], TypeError, ["entry 1", "same"]),
    ],
)
def test_bad_host_envs_are_refused_before_anything_runs(env, error, words, no_compile):
    env = env() if callable(env) else env
    with pytest.raises(error) as e:
        jaxmesh.evaluate(lean, env, episodes=2)
    for w in words:
        assert w in str(e.value)


# max_episode_seconds (CONTRACT 18) -------------------------------------------------
class SlowEnv(gym.Env):
    """Each step sleeps ``delay`` seconds; an episode terminates after 20 steps."""

    observation_space = spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay=0.01):
        self.delay = delay

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        time.sleep(self.delay)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= 20, False, {}


def zero(obs):
    return jnp.int32(0)


def test_max_episode_seconds_truncates_a_slow_episode():
    free = jaxmesh.evaluate(zero, SlowEnv(), episodes=2)
    assert free.terminated.all() and free.lengths.tolist() == [20, 20]
    capped = jaxmesh.evaluate(zero, SlowEnv(), episodes=2, max_episode_seconds=0.05)
    assert capped.truncated.all() and not capped.terminated.any()
    assert np.all(capped.lengths < free.lengths) and np.all(capped.lengths >= 1)
    assert "depend on timing" in capped.summary()
    assert "depend on timing" not in free.summary()
    assert capped.to_dict()["settings"]["max_episode_seconds"] == 0.05


# Failures keep what finished (CONTRACT 20) ------------------------------------------
def test_a_hook_exception_keeps_finished_episodes():
    class Boom:
        def __init__(self):
            self.seen = []

        def on_episode_end(self, ep):
            self.seen.append(ep.index)
            if len(self.seen) == 3:
                raise RuntimeError("hook failed")

    hook = Boom()
    with pytest.raises(RuntimeError, match="hook failed") as e:
        jaxmesh.evaluate(
            lean, [gym.make(ID) for _ in range(2)], seeds=SEEDS, hooks=hook
        )
    partial = e.value.partial_result
    assert hook.seen == [0, 1, 2]
    assert {0, 1, 2} <= set(partial.indices.tolist())
    finished_match(partial, plain_loop(gym.make(ID), per_step(lean), SEEDS))


def test_an_env_exception_propagates_with_finished_episodes():
    bad = SEEDS[4]
    with pytest.raises(RuntimeError, match="simulator broke") as e:
        jaxmesh.evaluate(lean, [BreaksOnSeed(bad) for _ in range(2)], seeds=SEEDS)
    partial = e.value.partial_result
    assert 4 not in partial.indices.tolist()
    assert partial.num_episodes >= 3
    assert any("partial_result" in note for note in e.value.__notes__)
    finished_match(partial, plain_loop(gym.make(ID), per_step(lean), SEEDS))


def test_a_bad_action_raises_bad_value_error_at_its_step():
    def overshoot(obs):  # action 2 of Discrete(2) once the pole leans far
        return jnp.where(obs[2] > 0.05, 2, lean(obs)).astype(jnp.int32)

    refs = plain_loop(gym.make(ID), per_step(lean), SEEDS)
    episode, step = first_hit(refs, lambda o: o[2] > 0.05)
    with pytest.raises(jaxmesh.BadValueError) as e:
        jaxmesh.evaluate(overshoot, gym.make(ID), seeds=SEEDS)
    assert (e.value.episode, e.value.step, e.value.value) == (episode, step, 2.0)
    assert e.value.partial_result.indices.tolist() == list(range(episode))


def test_host_episode_keys_are_jax_prng_keys():
    """The host loops build episode keys without a jax call per episode."""
    from jaxmesh.core.rules import episode_keys
    from jaxmesh.run.checks import MAX_SEED

    seeds = [0, 1, 7, 65_536, 123_456_789, MAX_SEED, *range(1000, 1010)]
    want = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])
    got = episode_keys(np, np.asarray(seeds))
    assert got.dtype == want.dtype and np.array_equal(got, want)


# The shared lanes' replay against a plain gymnasium loop ---------------------------
class Tagged(gym.Wrapper):
    """CartPole whose info has ``x`` (the cart position) on every step and
    ``lean`` (int8) only while the pole leans right: an info key some rows lack."""

    def step(self, action):
        obs, reward, term, trunc, info = self.env.step(action)
        info = dict(info, x=float(obs[0]))
        if obs[2] > 0:
            info["lean"] = np.int8(1)
        return obs, reward, term, trunc, info


def plain_replay(env, seed, chunks):
    """``env.reset(seed)``, then each chunk's actions until the episode ends.

    Returns per chunk: (rewards, terminated, truncated, observations, infos) of
    the steps executed (an empty chunk once the episode has ended).
    """
    env.reset(seed=seed)
    out, ended = [], False
    for chunk in chunks:
        steps = ([], [], [], [], [])
        for action in [] if ended else chunk:
            obs, reward, term, trunc, info = env.step(int(action))
            for rows, value in zip(
                steps, (reward, term, trunc, obs, info), strict=True
            ):
                rows.append(value)
            if term or trunc:
                ended = True
                break
        out.append(steps)
    return out


def lane_rows(batch, i):
    """Lane i's slices of a ResultBatch: (steps, rows) ranges."""
    s0, r0 = int(batch.steps[:i].sum()), int(batch.rows[:i].sum())
    return slice(s0, s0 + int(batch.steps[i])), slice(r0, r0 + int(batch.rows[i]))


@pytest.mark.parametrize("keep_all_obs", [False, True])
@pytest.mark.parametrize("form", ["list", "vector"])
def test_replay_matches_a_plain_gymnasium_loop(form, keep_all_obs):
    from jaxmesh.envs.gymnasium import lanes as shared

    seeds, n, calls = [3, 1, 4], 3, 12
    rng = np.random.default_rng(0)
    if form == "list":
        lanes = shared.EnvListStepper([Tagged(gym.make(ID)) for _ in range(n)])
        counts = rng.integers(1, 9, (calls, n))  # lanes move on their own
    else:
        make = lambda: Tagged(gym.make(ID))  # noqa: E731
        vec = SyncVectorEnv([make] * n, autoreset_mode=AutoresetMode.DISABLED)
        lanes = shared.VectorEnvStepper(vec)
        counts = np.repeat(rng.integers(1, 9, (calls, 1)), n, axis=1)  # lockstep
    actions = [[rng.integers(0, 2, c) for c in row] for row in counts]
    first = lanes.reset(range(n), seeds)
    assert first.lanes.tolist() == list(range(n)) and first.steps.tolist() == [0] * n
    for j, s in enumerate(seeds):  # the reset observation of env.reset(seed=s)
        assert np.array_equal(first.observation[""][j], gym.make(ID).reset(seed=s)[0])
    refs = [
        plain_replay(Tagged(gym.make(ID)), s, [a[j] for a in actions])
        for j, s in enumerate(seeds)
    ]
    keys = ("x", "lean", "missing")
    for c in range(calls):
        live = [j for j in range(n) if not lanes.ended[j]]
        if not live:
            break
        flat = np.concatenate([actions[c][j] for j in live]).astype(np.int64)
        got = lanes.replay(
            live, counts[c][live], flat, keep_all_obs=keep_all_obs, info_keys=keys
        )
        assert got.lanes.tolist() == live
        assert "missing" not in got.info  # no row has it: left out
        for i, j in enumerate(live):
            rewards, term, trunc, obs, infos = refs[j][c]
            steps, rows = lane_rows(got, i)
            assert got.steps[i] == len(rewards) > 0
            assert got.rewards[steps].tolist() == rewards
            assert got.terminated[steps].tolist() == term
            assert got.truncated[steps].tolist() == trunc
            want_obs = obs if keep_all_obs else obs[-1:]
            want_info = infos if keep_all_obs else infos[-1:]
            assert got.rows[i] == len(want_obs)
            assert np.array_equal(got.observation[""][rows], np.stack(want_obs))
            assert got.observation[""].dtype == np.float32  # the space's own
            assert got.info["x"][rows].tolist() == [f["x"] for f in want_info]
            has = np.zeros(got.rows.sum(), bool)  # no row has it: left out
            if "lean" in got.info:
                assert got.info["lean"].dtype == np.int8  # the value's own
                has = (got.info_present or {}).get("lean", ~has)
            assert has[rows].tolist() == ["lean" in f for f in want_info]
    assert lanes.ended.all()  # every episode ran to its end within the calls
    # Once ended, a lane executes nothing until it is reset.
    again = lanes.replay([0], [3], np.zeros(3, np.int64))
    assert again.steps.tolist() == [0] and again.rows.tolist() == [0]
    lanes.reset([0], [seeds[0]])
    assert lanes.replay([0], [1], np.zeros(1, np.int64)).steps.tolist() == [1]


def test_step_is_replay_by_one_and_matches_a_plain_loop():
    from jaxmesh.envs.gymnasium import lanes as shared

    lanes = shared.EnvListStepper([gym.make(ID) for _ in range(2)])
    refs = [gym.make(ID) for _ in range(2)]
    lanes.reset([0, 1], [5, 6])
    for env, s in zip(refs, [5, 6], strict=True):
        env.reset(seed=s)
    for t in range(6):
        acts = np.array([t % 2, 1 - t % 2], np.int64)
        got = lanes.step([0, 1], acts, info_keys=("x",))
        want = [env.step(int(a)) for env, a in zip(refs, acts, strict=True)]
        assert got.steps.tolist() == got.rows.tolist() == [1, 1]
        assert np.array_equal(got.observation[""], np.stack([w[0] for w in want]))
        assert got.rewards.tolist() == [w[1] for w in want]
        assert "x" not in got.info  # CartPole's info is empty


def test_reset_options_and_wall_clock_cap():
    from jaxmesh.envs.gymnasium import lanes as shared

    log: list = []
    lanes = shared.EnvListStepper([TrialEnv(log) for _ in range(2)])
    assert lanes.declares_trial_index
    got = lanes.reset([0, 1], [4, 9], [{"trial_index": 7}, None], [0.0, 1e-9])
    assert log == [(4, {"trial_index": 7}), (9, None)]
    assert got.observation[""][:, 0].tolist() == [7, -1]  # the trial it saw
    # Lane 1's cap (a nanosecond) is past after its first step: truncated there.
    out = lanes.replay([0, 1], [2, 2], np.zeros(4, np.int64))
    assert out.steps.tolist() == [2, 1]
    assert out.truncated.tolist() == [False, False, True]


def test_host_adapter_replays_in_the_agent_dtype():
    lanes = jaxmesh.envs.gymnasium.make_lanes(f"gymnasium:{ID}", 2, 2)
    try:
        assert (
            lanes.reset([1, 0], [8, 7], [0, 1])[""].dtype
            == lanes.spec.layout.dtypes[""]
        )
        got = lanes.replay([0, 1], [3, 3], np.ones(6, np.int64))
        env = gym.make(ID)
        env.reset(seed=7)
        want = [env.step(1)[0] for _ in range(3)]
        assert np.array_equal(got.observation[""][0], want[-1])
        assert got.steps.tolist() == [3, 3]
        # A wall-clock cap given at reset truncates the replay (a nanosecond:
        # past after the first step).
        lanes.reset([0], [7], [0], max_episode_seconds=1e-9)
        capped = lanes.replay([0], [3], np.ones(3, np.int64))
        assert capped.steps.tolist() == [1] and capped.truncated.tolist() == [True]
        # An env error reaches the host loop as the env raised it.
        broken = jaxmesh.envs.gymnasium.make_lanes([BreaksOnSeed(2)], 1, 1)
        broken.reset([0], [2], [0])
        with pytest.raises(RuntimeError, match="simulator broke"):
            broken.replay([0], [100], np.ones(100, np.int64))
    finally:
        lanes.close()


def test_replay_errors_name_the_lane_and_the_input():
    from jaxmesh.envs.gymnasium import lanes as shared

    class Misshapen(gym.Wrapper):
        def step(self, action):
            obs, *rest = self.env.step(action)
            return obs[:3], *rest

    lanes = shared.EnvListStepper([gym.make(ID), Misshapen(gym.make(ID))])
    with pytest.raises(ValueError, match="lane 1 was never reset"):
        lanes.replay([1], [1], np.zeros(1, np.int64))
    lanes.reset([0, 1], [0, 1])
    with pytest.raises(ValueError, match="not strictly ascending"):
        lanes.replay([1, 0], [1, 1], np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="counts summing to 3"):
        lanes.replay([0, 1], [1, 2], np.zeros(2, np.int64))
    for keep_all in (False, True):
        with pytest.raises(shared.LaneError, match="lane 1 returned an obs") as e:
            lanes.replay([0, 1], [1, 1], np.zeros(2, np.int64), keep_all_obs=keep_all)
        assert e.value.lane == 1 and isinstance(e.value.exc, ValueError)
    with pytest.raises(shared.LaneError, match="lane 1 returned an obs"):
        lanes.step([0, 1], np.zeros(2, np.int64))


def test_adapters_hold_their_own_info_state():
    a = jaxmesh.envs.gymnasium.make_lanes([gym.make(ID)], 1, 1)
    b = jaxmesh.envs.gymnasium.make_lanes([gym.make(ID)], 1, 1)
    a.info_seen.add("x")
    a.info["x"] = None
    assert b.info == {} and b.info_seen == set()


def test_shared_lanes_agree_with_the_wire_and_import_no_jax():
    """The lanes' ResultBatch is the codec's field for field, their info dtypes
    its allow-list; the lanes, workers, shared memory and the server import no
    JAX (parsed, not run: importing jaxmesh itself loads JAX)."""
    import ast
    from pathlib import Path

    from jaxmesh.envs.gymnasium import lanes as shared
    from jaxmesh.remote import codec

    assert shared.ResultBatch is codec.ResultBatch  # one class, the wire's
    assert shared.NUMBER_DTYPES == set(codec.DTYPES)
    root = Path(jaxmesh.__file__).parent
    for path, banned in (
        ("envs/gymnasium/lanes.py", ("jax", "flax", "grpc", "google", "jaxmesh")),
        ("envs/gymnasium/leaves.py", ("jax", "flax", "grpc", "google", "jaxmesh")),
        ("envs/gymnasium/workers.py", ("jax", "flax", "grpc", "google", "jaxmesh")),
        ("envs/gymnasium/shm.py", ("jax", "flax", "grpc", "google", "jaxmesh")),
        ("envs/gymnasium/batch.py", ("jax", "flax", "grpc", "google", "jaxmesh")),
        *(  # the server package, every module of it
            (f"remote/server/{p.name}", ("jax", "flax"))
            for p in sorted((root / "remote" / "server").glob("*.py"))
        ),
    ):
        for node in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in banned or name in (
                    "jaxmesh.envs.names",  # lanes.py: unknown_id, error path
                    "jaxmesh.envs.timing",  # a step's seconds: imports only math
                    "jaxmesh.envs.gymnasium",
                    "jaxmesh.envs.gymnasium.leaves",  # numpy only
                    "jaxmesh.envs.gymnasium.shm",  # numpy and the standard library
                    "jaxmesh.envs.gymnasium.batch",  # numpy only
                    "jaxmesh.remote",
                    "jaxmesh.remote.proto",
                    "jaxmesh.remote.protocol",  # constants; imports nothing
                ), f"{path} imports {name}"
