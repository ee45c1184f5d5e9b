"""MuJoCo Playground (MJX) envs against a plain loop over Playground's own
``env.reset(key)`` / ``env.step(state, action)``.

The reference resets episode s with ``jax.random.PRNGKey(s)`` (CONTRACT 5),
applies the episode length itself (``t >= length`` is truncated; Playground's
``done`` is termination) and, for domain randomization, draws the model from
``fold_in(PRNGKey(s), 7)`` and swaps it into the env the way Playground's own
randomization wrapper does (``env._mjx_model``). It is built on its own
Playground env, and one compile of its reset and step (the model an argument)
serves every episode.

MJX compiles slowly on a CPU (tens of seconds per program), so the file
compiles two jaxmesh programs, each once, in module fixtures: the shipped
config (the trained policy, no randomizer, its 100 episodes), which the plain
loop and the README's figures are checked against, and a randomized run of
short episodes on 4 lanes, run twice with the seeds in another order.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")

import jaxmesh  # noqa: E402
from jaxmesh.cli.build import build_run  # noqa: E402
from jaxmesh.cli.checks import check_run_config  # noqa: E402
from jaxmesh.cli.config import load_config  # noqa: E402
from jaxmesh.envs import make_env, playground  # noqa: E402
from jaxmesh.results import stats  # noqa: E402
from jaxmesh.zoo import playground_cartpole  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "playground_cartpole.yaml"
LENGTH = 20
SEEDS = [3, 0, 7, 11, 5]
#: The config's episodes that the plain loop replays (1000 steps each).
CONFIG_SEEDS = [0, 3]
#: A fixed linear policy on CartpoleBalance's 5 observations.
W = jnp.array([[0.3, -0.5, 2.0, 0.4, 0.6]])


def policy(obs):
    return jnp.tanh(W @ obs)


def heavier_pole(model, key):
    """Scales the pole's mass (body 2) by a factor in [0.5, 3)."""
    scale = jax.random.uniform(key, (), minval=0.5, maxval=3.0)
    return model.replace(body_mass=model.body_mass.at[2].multiply(scale))


@pytest.fixture(scope="module")
def env():
    return make_env(
        "playground:CartpoleBalance", config_overrides={"episode_length": LENGTH}
    )


@pytest.fixture(scope="module")
def reference():
    """``run(act, seed, length, randomize=None) -> (return, length, terminated,
    truncated, sum of reward/upright, body_mass[2])``: a plain loop, one
    episode, with ``act`` a jitted policy.

    The reference's randomizers change ``body_mass`` only: its reset and step
    take that field and hold the rest of the model as constants, which XLA
    folds (a step runs about 10 times faster than with the whole model an
    argument).
    """
    from mujoco_playground import registry

    pg = registry.load("CartpoleBalance", config_overrides={"impl": "jax"})
    base = pg.mjx_model

    def swapped(fn):
        def call(body_mass, *args):
            old = pg._mjx_model
            pg._mjx_model = base.replace(body_mass=body_mass)
            try:
                return fn(*args)
            finally:
                pg._mjx_model = old

        return jax.jit(call)

    reset, step = swapped(pg.reset), swapped(pg.step)

    def run(act, seed, length, randomize=None, qpos=None):
        """``qpos``: a list that gets the reset's and every step's qpos."""
        key = jax.random.PRNGKey(seed)
        model = base
        if randomize is not None:
            model = randomize(base, jax.random.fold_in(key, 7))
            same = jax.tree.map(lambda a, b: a is b, model, base)
            assert not same.body_mass and all(
                jax.tree.leaves(same.replace(body_mass=True))
            ), "the reference's randomizers change body_mass only"
        mass = model.body_mass
        state = reset(mass, key)
        ret, upright, t = 0.0, 0.0, 0
        trace = [] if qpos is None else qpos
        trace.append(np.asarray(state.data.qpos))
        while True:
            state = step(mass, state, act(state.obs))
            trace.append(np.asarray(state.data.qpos))
            t += 1
            ret += float(state.reward)
            upright += float(state.metrics["reward/upright"])
            term, trunc = bool(state.done > 0.5), t >= length
            if term or trunc:
                return ret, t, term, trunc, upright, float(mass[2])

    return run


@pytest.fixture(scope="module")
def shipped():
    """The shipped config run as ``jaxmesh eval`` builds it: (config, result),
    with its episodes ``CONFIG_SEEDS`` recorded (1000 steps each)."""
    config = check_run_config(load_config(CONFIG))
    model, env, run, kwargs = build_run(config)
    assert isinstance(model, playground_cartpole.CartpoleMLP)
    record = jaxmesh.Record(episodes=CONFIG_SEEDS, max_steps=1000)
    kwargs["record"] = record
    return config, jaxmesh.evaluate(model, env, run, **kwargs)


@pytest.fixture(scope="module")
def shipped_refs(shipped, reference):
    """The plain loop of the shipped checkpoint on ``CONFIG_SEEDS`` (each run
    once, 1000 steps): (episodes, qpos of the reset and every step of each)."""
    config, _ = shipped
    length = config["env_config"]["config_overrides"]["episode_length"]
    params = jaxmesh.load_params(playground_cartpole.DEFAULT_PATH)
    act = jax.jit(lambda obs: playground_cartpole.apply(params, obs))
    qpos = {s: [] for s in CONFIG_SEEDS}
    ref = [reference(act, s, length, qpos=qpos[s]) for s in CONFIG_SEEDS]
    return ref, qpos


def test_matches_plain_loop(shipped, shipped_refs):
    config, r = shipped
    assert r.env == "playground:CartpoleBalance"
    ref, _ = shipped_refs
    np.testing.assert_allclose(r.returns[CONFIG_SEEDS], [x[0] for x in ref], rtol=1e-5)
    np.testing.assert_array_equal(r.lengths[CONFIG_SEEDS], [x[1] for x in ref])
    np.testing.assert_array_equal(r.terminated[CONFIG_SEEDS], [x[2] for x in ref])
    np.testing.assert_array_equal(r.truncated[CONFIG_SEEDS], [x[3] for x in ref])
    # The config asks for the per-step mean of reward/upright.
    assert config["metrics"] == {"reward/upright": "mean"}
    np.testing.assert_allclose(
        r.metrics["reward/upright"][CONFIG_SEEDS],
        [x[4] / x[1] for x in ref],
        rtol=1e-5,
    )


def test_shipped_policy_scores_its_recorded_interval(shipped):
    # The README states the config's mean return and its 95% interval; the
    # shipped checkpoint must score them on the config's own episodes.
    config, r = shipped
    text = (ROOT / "README.md").read_text()
    found = re.search(
        r"configs/playground_cartpole\.yaml`.*?mean return ([\d.]+) of at most\s+"
        r"1000,\s+95%\s+interval\s+\[([\d.]+), ([\d.]+)\],\s+on\s+(\d+)",
        text,
        re.S,
    )
    assert found, "README.md: the playground_cartpole.yaml score is not stated"
    mean, low, high, episodes = map(float, found.groups())
    assert r.num_episodes == config["episodes"] == episodes
    assert low <= r.returns.mean() <= high
    assert abs(r.returns.mean() - mean) < 0.05
    interval = stats.describe(r.returns)["returns"]["mean_interval"]
    np.testing.assert_allclose(interval, [low, high], atol=0.05)
    # Better than the hand-made controller's 0.9 (what the docs compare with).
    assert r.returns.mean() > 900


@pytest.fixture(scope="module")
def randomized(env):
    """The randomized run on 4 lanes (lane turnover), and the same program
    with the seeds reversed: other lanes run each episode."""
    run = lambda seeds: jaxmesh.evaluate(  # noqa: E731
        policy,
        env,
        num_envs=4,
        seeds=seeds,
        starts=jaxmesh.Starts(randomize=heavier_pole),
        scoring=jaxmesh.Scoring(
            metrics={"model/body_mass/2": "last", "reward/upright": "sum"}
        ),
        record=jaxmesh.Record(episodes=[0]),
    )
    return run(SEEDS), run(SEEDS[::-1])


def test_randomize_per_episode_matches_plain_loop(randomized, reference):
    r, _ = randomized
    act = jax.jit(policy)
    ref = [reference(act, s, LENGTH, heavier_pole) for s in SEEDS]
    masses = [x[5] for x in ref]
    np.testing.assert_allclose(r.metrics["model/body_mass/2"], masses, rtol=1e-6)
    np.testing.assert_allclose(r.returns, [x[0] for x in ref], rtol=1e-5)
    np.testing.assert_array_equal(r.lengths, [x[1] for x in ref])
    np.testing.assert_array_equal(r.terminated, [x[2] for x in ref])
    np.testing.assert_array_equal(r.truncated, [x[3] for x in ref])
    np.testing.assert_allclose(
        r.metrics["reward/upright"], [x[4] for x in ref], rtol=1e-5
    )
    # Lane j started episode j; the fifth went to the first lane to finish.
    assert list(r.lanes[:4]) == [0, 1, 2, 3]
    # The draws differ per episode and change the physics.
    assert len(set(np.round(masses, 6))) == len(SEEDS)
    plain = [reference(act, s, LENGTH)[0] for s in SEEDS]
    assert not np.allclose(r.returns, plain, rtol=1e-4)


def test_randomized_episode_depends_on_its_seed_only(randomized):
    # Reversed seeds: each episode runs on another lane, after other episodes.
    r, rev = randomized
    assert list(rev.seeds) == SEEDS[::-1]
    assert [int(x) for x in rev.lanes] != [int(x) for x in r.lanes[::-1]]
    np.testing.assert_allclose(rev.returns[::-1], r.returns, rtol=1e-6)
    np.testing.assert_array_equal(rev.lengths[::-1], r.lengths)
    np.testing.assert_array_equal(
        rev.metrics["model/body_mass/2"][::-1], r.metrics["model/body_mass/2"]
    )


def test_env_object_takes_its_config(env):
    from mujoco_playground import registry

    pg = registry.load(
        "CartpoleBalance",
        config_overrides={"impl": "jax", "episode_length": 7, "action_repeat": 2},
    )
    adapted = make_env(pg)
    assert isinstance(adapted, playground.PlaygroundEnv)
    assert (adapted.episode_length, adapted.action_repeat, adapted.limit) == (7, 2, 4)
    assert adapted.action_shape == (1,) and adapted.num_actions is None


def test_bad_input_is_refused_before_compiling():
    with pytest.raises(ValueError, match="did you mean 'CartpoleBalance'"):
        make_env("playground:CartpoleBalanc")
    with pytest.raises(ValueError, match="episode_lenght.*did you mean"):
        make_env("playground:CartpoleBalance", config_overrides={"episode_lenght": 5})
    with pytest.raises(TypeError, match="config_overrides"):
        make_env("playground:CartpoleBalance", episode_lenght=5)
    with pytest.raises(TypeError, match="randomize= is for MuJoCo Playground"):
        jaxmesh.evaluate(
            policy, "gymnax:Pendulum-v1", starts=jaxmesh.Starts(randomize=heavier_pole)
        )
    with pytest.raises(TypeError, match="randomize= is for MuJoCo Playground"):
        jaxmesh.evaluate(
            policy,
            "gymnasium:Pendulum-v1",
            starts=jaxmesh.Starts(randomize=heavier_pole),
        )


def test_bad_randomizer_is_refused(env):
    with pytest.raises(TypeError, match="expected a function"):
        playground.randomized(env, 3)
    with pytest.raises(TypeError, match="shape and dtype"):
        playground.randomized(
            env, lambda m, k: m.replace(body_mass=jnp.zeros(7, jnp.float32))
        )


def run_gl_script(script, *args):
    """Runs ``script`` in a Python child under ``MUJOCO_GL=egl``; it prints
    ``ok`` at the end (status 77: no headless OpenGL, a skip)."""
    import os
    import subprocess
    import sys

    # PyOpenGL's platform too: a LIBERO import earlier in this process set
    # both to osmesa (jaxmesh.envs.libero), and MuJoCo's EGL fails under it.
    env = dict(
        os.environ, MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl", PYTHONPATH=str(ROOT)
    )
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode == 77:
        pytest.skip(f"no headless OpenGL (EGL) here: {run.stdout.strip()}")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.strip().endswith("ok")


# Recorded states: videos of long episodes -------------------------------------
def cartpole_obs(mj, qpos, qvel):
    """CartpoleBalance's observation at each step, worked out from the states
    with plain MuJoCo (float64 forward kinematics in C): the cart position,
    the pole's cos and sin (its frame's zz and xz entries, which Playground's
    ``_get_obs`` reads), then the joint velocities.

    A step's frames are those of its forward pass, before the integration
    (MuJoCo's ``mj_step``): after step t the pole's frame is that of state
    t - 1, while ``qpos`` and ``qvel`` are state t's. The reset's frame is
    its own state's.
    """
    import mujoco

    d = mujoco.MjData(mj)
    out = []
    for t, (q, v) in enumerate(zip(qpos, qvel, strict=True)):
        d.qpos[:] = qpos[max(t - 1, 0)]
        mujoco.mj_kinematics(mj, d)
        out.append([q[0], d.xmat[2, 8], d.xmat[2, 2], *v])
    return np.array(out)


def test_recorded_states_are_the_runs_own(shipped, shipped_refs):
    # 1000 steps: far past where an open-loop replay of this episode drifts
    # from the run (docs/playground.md#videos).
    _, r = shipped
    tr = r.trajectory(0)
    assert tr.length == tr.steps == 1000 and not tr.cut
    shapes = {k: v.shape for k, v in tr.states.items()}
    assert shapes == {
        "qpos": (1001, 2),
        "qvel": (1001, 2),
        "mocap_pos": (1001, 0, 3),
        "mocap_quat": (1001, 0, 4),
        "xfrc_applied": (1001, 3, 6),
    }
    # Every recorded state, the last ones included, is the state of the
    # observation the policy saw at that step.
    mj = make_env("playground:CartpoleBalance").env.mj_model
    obs = cartpole_obs(mj, tr.states["qpos"], tr.states["qvel"])
    np.testing.assert_allclose(obs, tr.observations, atol=1e-6)
    # A plain loop over Playground's own reset/step gives the same states
    # while float rounding has not yet parted the two.
    qpos = shipped_refs[1][0]
    assert len(qpos) == 1001
    np.testing.assert_allclose(np.stack(qpos[:101]), tr.states["qpos"][:101], atol=1e-5)
    assert np.abs(np.diff(tr.states["qpos"][:101], axis=0)).max() > 1e-3  # it moves


def test_long_episode_is_drawn_from_its_recorded_states(shipped, monkeypatch):
    from jaxmesh.results import video

    _, r = shipped
    tr = r.trajectory(3)

    def no_replay(*args):
        raise AssertionError("a recorded episode's states were replayed")

    def qpos_of(env, states):  # stands in for the OpenGL drawing
        return [np.asarray(s[0].data.qpos) for s in states]

    monkeypatch.setattr(video, "replay_states", no_replay)
    monkeypatch.setattr(video, "playground_frames", qpos_of)
    frames = video.episode_frames(r, episode=3)
    np.testing.assert_array_equal(np.stack(frames), tr.states["qpos"])
    # States of another env are refused, naming it.
    with pytest.raises(ValueError, match="not those of env"):
        video.episode_frames(r, episode=3, env="playground:PendulumSwingup")


#: Run with MUJOCO_GL=egl in a fresh process (the suite's MuJoCo may have
#: chosen another GL backend at import), once for both checks of drawing.
#: First Playground's renderer through ``jaxmesh.video.playground_frames``
#: against plain ``mujoco.Renderer`` frames of the same states, with no MJX
#: program compiled: the states are ``mjx.put_data`` of MuJoCo data with set
#: joint positions. Then recorded states read back from the results files,
#: drawn by ``jaxmesh.video`` (no replay) and by plain ``mujoco.Renderer``.
#: Argv: the two results files' stems. Exit 77: no EGL.
GL_SCRIPT = """
import json
import sys

import mujoco
import numpy as np
from mujoco import mjx

import jaxmesh
from jaxmesh.results import video
from jaxmesh.envs import make_env

env = make_env("playground:CartpoleBalance")
mj = env.env.mj_model
try:
    plain = mujoco.Renderer(mj, 240, 320)
except Exception as e:
    print("no EGL:", type(e).__name__, e)
    sys.exit(77)

# Set states: the renderer draws exactly what plain MuJoCo draws.
states, want = [], []
for angle in (0.0, 0.6, -0.6):
    d = mujoco.MjData(mj)
    d.qpos[:] = [0.1, angle]
    mujoco.mj_forward(mj, d)
    plain.update_scene(d, camera=-1)
    want.append(plain.render().copy())
    data = mjx.put_data(mj, d)
    states.append((type("S", (), {"data": data})(), 0, ()))
got = video.playground_frames(env, states)
assert [f.shape for f in got] == [(240, 320, 3)] * 3, [f.shape for f in got]
for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
assert not np.array_equal(got[1], got[2])  # the pole leans both ways


# Recorded states, read back from the files and never replayed.
def no_replay(*args):
    raise AssertionError("a recorded episode's states were replayed")


video.replay_states = no_replay


def draw(tr, t):
    d = mujoco.MjData(mj)
    d.qpos[:], d.qvel[:] = tr.states["qpos"][t], tr.states["qvel"][t]
    mujoco.mj_forward(mj, d)
    plain.update_scene(d, camera=-1)
    return plain.render().copy()


def load(stem):
    with open(stem + ".json") as f:
        r = jaxmesh.RunResult.from_dict(json.load(f))
    return r.load_trajectories(stem + ".npz")


# The 1000-step episode: states at its end (drawing all 1001 frames with a
# software renderer takes minutes).
tr = load(sys.argv[1]).trajectory(0)
views = video.recorded_states(env, tr)
assert len(views) == 1001, len(views)
steps = [0, 650, 1000]
for t, got in zip(steps, video.playground_frames(env, [views[t] for t in steps])):
    np.testing.assert_array_equal(got, draw(tr, t))
# A randomized run's 20-step episode, end to end, without env=: the drawing
# is of the env's own model, which its name gives.
short = load(sys.argv[2])
assert "+randomize:" in short.env, short.env
tr = short.trajectory(0)
frames = video.episode_frames(short, episode=0)
assert len(frames) == tr.steps + 1 == 21, len(frames)
for t in (0, 10, 20):
    np.testing.assert_array_equal(frames[t], draw(tr, t))
assert not np.array_equal(frames[0], frames[20])
print("ok")
"""


@pytest.mark.slow  # a child renders with MuJoCo; make test: the states (above)
def test_set_and_recorded_states_are_drawn(shipped, randomized, tmp_path):
    # One child process draws both: the set states and the saved runs' states.
    import json

    stems = []
    for name, r in (("long", shipped[1]), ("short", randomized[0])):
        stem = tmp_path / name
        (tmp_path / f"{name}.json").write_text(json.dumps(r.to_dict()))
        r.save_trajectories(tmp_path / f"{name}.npz")
        back = jaxmesh.RunResult.from_dict(r.to_dict())
        back = back.load_trajectories(tmp_path / f"{name}.npz")
        for a, b in zip(r.trajectories, back.trajectories, strict=True):
            assert sorted(b.states) == sorted(playground.RENDER_FIELDS)
            for k, v in a.states.items():
                np.testing.assert_array_equal(v, b.states[k])
        stems.append(str(stem))
    run_gl_script(GL_SCRIPT, *stems)
