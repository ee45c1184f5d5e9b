"""LIBERO tasks (``libero:<suite>/<i>``) against a plain loop over LIBERO's API.

The reference (``openpi_episode``) is the loop of openpi's LIBERO client
(``examples/libero/main.py``, which LeRobot and vla-evaluation-harness follow),
written here against LIBERO's own classes: ``env.seed``, ``env.reset``,
``env.set_init_state(init_states[k])``, settle steps of the dummy action, then
policy steps until ``done`` or the cap. jaxmesh runs the same policy in
process, in worker processes and served over gRPC; each episode's length,
return, success and every observation the policy saw must be the reference's.

The policy's actions take a few exact values (0.25, 0.5, ...) chosen by
comparisons, so the float rounding of a batched policy call cannot change an
action: the sims run bit for bit alike. Episodes are short (caps of 12-20
steps) and state only (no renderer), except one with 32x32 cameras.
"""

from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import pytest

pytest.importorskip(
    "libero.libero", reason="LIBERO is not installed: pip install 'jaxmesh[libero]'"
)

import jax.numpy as jnp  # noqa: E402

import jaxmesh  # noqa: E402
from jaxmesh.envs import libero  # noqa: E402

SUITE, TASK = "libero_spatial", 0
CAP = 15
KEYS = ["robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"]


def policy(obs):
    """A state policy whose actions are exact: one of a few values each."""
    p, g = obs["robot0_eef_pos"], obs["robot0_gripper_qpos"]
    dx = jnp.where(p[0] > -0.2, -0.5, 0.5)
    dz = jnp.where(p[2] > 1.15, -0.5, 0.25)
    grip = jnp.where(g[0] > 0.03, 1.0, -1.0)
    zero = jnp.zeros(())
    return jnp.stack([dx, zero + 0.25, dz, zero, zero, zero, grip]).astype(jnp.float32)


def policy_np(obs):
    """``policy`` in numpy, on the float32 observation jaxmesh passes."""
    p = np.float32(obs["robot0_eef_pos"])
    g = np.float32(obs["robot0_gripper_qpos"])
    dx = -0.5 if p[0] > np.float32(-0.2) else 0.5
    dz = -0.5 if p[2] > np.float32(1.15) else 0.25
    grip = 1.0 if g[0] > np.float32(0.03) else -1.0
    return np.array([dx, 0.25, dz, 0, 0, 0, grip], np.float32)


def image_policy(obs):
    """Moves by the agentview image's brightness (it reads both cameras)."""
    for k in ("agentview_image", "robot0_eye_in_hand_image"):  # at trace time
        assert obs[k].dtype == jnp.uint8 and obs[k].shape == (32, 32, 3), k
    a = obs["agentview_image"].astype(jnp.float32).mean()
    h = obs["robot0_eye_in_hand_image"].astype(jnp.float32).mean()
    dx = jnp.where(a > 100.0, 0.5, -0.5)
    dy = jnp.where(h > 100.0, 0.25, -0.25)
    zero = jnp.zeros(())
    return jnp.stack([dx, dy, zero, zero, zero, zero, zero - 1.0]).astype(jnp.float32)


#: The policy reads the two cameras and the end effector (only they move).
CAMERA_KEYS = ("agentview_image", "robot0_eye_in_hand_image", "robot0_eef_pos")
image_model = jaxmesh.Model(
    image_policy, spec={k: jaxmesh.adapt.State(key=k) for k in CAMERA_KEYS}
)


def image_policy_np(obs):
    a = np.float32(obs["agentview_image"]).mean(dtype=np.float32)
    h = np.float32(obs["robot0_eye_in_hand_image"]).mean(dtype=np.float32)
    return np.array(
        [0.5 if a > 100 else -0.5, 0.25 if h > 100 else -0.25, 0, 0, 0, 0, -1],
        np.float32,
    )


# The reference: openpi's LIBERO loop over LIBERO's own API --------------------
def _libero_env(suite, task, camera_size):
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv, OffScreenRenderEnv

    t = benchmark.get_benchmark_dict()[suite]().get_task(task)
    bddl = os.path.join(get_libero_path("bddl_files"), t.problem_folder, t.bddl_file)
    if camera_size is None:
        return ControlEnv(
            bddl_file_name=bddl, use_camera_obs=False, has_offscreen_renderer=False
        )
    return OffScreenRenderEnv(
        bddl_file_name=bddl, camera_heights=camera_size, camera_widths=camera_size
    )


def openpi_episode(env, init_states, seed, trial, act, max_steps, keys, settle=10):
    """One episode as openpi's client runs it; returns what it saw and scored."""
    env.seed(seed)
    env.reset()
    obs = env.set_init_state(init_states[trial])
    seen, total, success, t = [], 0.0, False, 0
    while t < max_steps + settle:
        if t < settle:
            obs, reward, done, info = env.step([0, 0, 0, 0, 0, 0, -1])
            t += 1
            continue
        seen.append({k: np.asarray(obs[k]).copy() for k in keys})
        obs, reward, done, info = env.step(act(obs).tolist())
        total += reward
        if done:
            success = True
            break
        t += 1
    seen.append({k: np.asarray(obs[k]).copy() for k in keys})
    return {"length": len(seen) - 1, "return": total, "success": success, "seen": seen}


def reference(
    suite, task, seeds, trials, act, max_steps, keys, camera_size=None, settle=10
):
    from libero.libero import benchmark

    init = benchmark.get_benchmark_dict()[suite]().get_task_init_states(task)
    env = _libero_env(suite, task, camera_size)
    try:
        return [
            openpi_episode(env, init, s, k % len(init), act, max_steps, keys, settle)
            for s, k in zip(seeds, trials, strict=True)
        ]
    finally:
        env.close()


SEEDS = [7, 3, 11]
BASE = 48  # trials 48, 49, 50 -> init states 48, 49, 0


@pytest.fixture(scope="module")
def expected():
    trials = [BASE + i for i in range(len(SEEDS))]
    return reference(SUITE, TASK, SEEDS, trials, policy_np, CAP, KEYS)


def check_same(result, expected, keys=KEYS, exact=True):
    """Each episode's length, return, success and observations equal the
    reference's (observations as the float32 the policy reads)."""
    assert len(result.lengths) == len(expected)
    for i, ref in enumerate(expected):
        assert int(result.lengths[i]) == ref["length"], i
        np.testing.assert_allclose(result.returns[i], ref["return"], atol=1e-6)
        assert bool(result.success[i]) == ref["success"], i
    for tr in result.trajectories:
        ref = expected[tr.episode]["seen"]
        assert len(tr.rewards) == len(ref) - 1
        for k in keys:
            want = np.stack([s[k] for s in ref])
            got = np.asarray(tr.observations[k])
            if want.dtype == np.uint8:
                np.testing.assert_array_equal(got, want, err_msg=k)
            else:
                np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=k)


def run(env, **kw):
    kw.setdefault("num_envs", 2)
    return jaxmesh.evaluate(
        policy,
        env,
        seeds=SEEDS,
        starts=jaxmesh.Starts(trial_index_base=BASE),
        record=jaxmesh.Record(episodes=list(range(len(SEEDS))), keys=KEYS),
        **kw,
    )


def test_in_process_equals_openpi_loop(expected):
    result = run(
        f"libero:{SUITE}/{TASK}",
        env_config={"camera_size": None, "max_episode_steps": CAP},
        scoring=jaxmesh.Scoring(metrics="init_state"),
    )
    check_same(result, expected)
    assert np.asarray(result.metrics["init_state"]).tolist() == [48, 49, 0]
    assert not result.truncated.any() or (result.lengths == CAP).all()
    assert result.env.endswith(f"libero:{SUITE}/{TASK}")


@pytest.mark.slow  # make test: done and success on gymnasium (tests/run)
def test_libero_s_done_ends_the_episode_as_a_success(monkeypatch):
    # LIBERO's ``done`` is its task's success check (``_check_success``). No
    # short scripted policy solves a task, so the check of the task's class is
    # replaced by a physical predicate this policy reaches mid-episode (the end
    # effector below z = 1.16 m); LIBERO's own step and reward read it. In
    # process, jaxmesh must end each episode where the plain loop does, as a
    # success, with LIBERO's reward.
    def low(self):
        return bool(self.sim.data.site_xpos[self.robots[0].eef_site_id][2] < 1.16)

    env = _libero_env(SUITE, TASK, None)
    task_class = type(env.env)  # the problem's class, as LIBERO registers it
    env.close()
    monkeypatch.setattr(task_class, "_check_success", low)
    trials = [BASE + i for i in range(len(SEEDS))]
    want = reference(SUITE, TASK, SEEDS, trials, policy_np, CAP, KEYS)
    assert all(w["success"] and w["length"] < CAP for w in want)
    result = run(
        f"libero:{SUITE}/{TASK}",
        env_config={"camera_size": None, "max_episode_steps": CAP},
    )
    check_same(result, want)
    assert result.terminated.all() and not result.truncated.any()
    assert result.success.all() and (result.returns == 1.0).all()


@pytest.mark.slow  # make test: workers on gymnasium envs (tests/run/host)
def test_worker_processes_equal_openpi_loop(expected):
    env = jaxmesh.make_env(f"libero:{SUITE}/{TASK}", camera_size=None)
    result = run(env, workers=2, max_episode_steps=CAP)
    check_same(result, expected)


@pytest.mark.slow  # make test: served gymnasium envs (tests/run/host)
def test_served_equals_openpi_loop(expected):
    from jaxmesh.remote.server import EnvServer

    lanes = functools.partial(libero.make_envs, f"{SUITE}/{TASK}", 2, camera_size=None)
    with EnvServer(lanes, "127.0.0.1:0") as server:
        result = run(f"grpc://{server.address}", max_episode_steps=CAP)
    check_same(result, expected)


@pytest.mark.slow  # make test: serve-env of gymnasium envs (tests/remote)
def test_serve_env_command_equals_openpi_loop(expected):
    """``jaxmesh serve-env libero:... --env-config JSON`` in a child process."""
    from gym_reference import start_serve_env

    proc, address = start_serve_env(
        f"libero:{SUITE}/{TASK}",
        "--lanes",
        "1",
        "--env-config",
        json.dumps({"camera_size": None, "max_episode_steps": CAP}),
    )
    try:
        result = run(f"grpc://{address}", num_envs=1)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    check_same(result, expected)


@pytest.mark.slow  # make test: images through the agent (tests/run/host)
def test_cameras_reach_the_policy_unchanged():
    # Two settle steps, not the papers' 10: each step renders both cameras in
    # software (OSMesa, about 0.4 s a step on 2 cores), on both sides.
    keys = list(CAMERA_KEYS)
    want = reference(
        SUITE, 1, [5], [2], image_policy_np, 4, keys, camera_size=32, settle=2
    )
    result = jaxmesh.evaluate(
        image_model,
        f"libero:{SUITE}/1",
        env_config={"camera_size": 32, "settle_steps": 2},
        seeds=[5],
        starts=jaxmesh.Starts(trial_index_base=2),
        num_envs=1,
        max_episode_steps=4,
        record=jaxmesh.Record(episodes=[0], keys=keys),
    )
    check_same(result, want, keys=keys)
    img = result.trajectories[0].observations["agentview_image"]
    assert img.shape == (5, 32, 32, 3) and img.std() > 0  # a rendered scene


def test_suite_names_instructions_and_caps():
    from libero.libero import benchmark

    suite = jaxmesh.make_suite("libero:libero_goal", tasks=[3, 1], episodes=2)
    ref = benchmark.get_benchmark_dict()["libero_goal"]()
    assert list(suite.tasks) == [ref.get_task(3).name, ref.get_task(1).name]
    assert [t.instruction for t in suite.tasks.values()] == [
        ref.get_task(3).language,
        ref.get_task(1).language,
    ]
    assert suite.episodes == 2
    for name, cap in libero.SUITES.items():
        assert libero.make(f"{name}/0").keywords["max_episode_steps"] is None
        assert (
            cap
            == {
                "libero_spatial": 220,
                "libero_object": 280,
                "libero_goal": 300,
                "libero_10": 520,
                "libero_90": 400,
            }[name]
        )
    assert len(jaxmesh.make_suite("libero:libero_90").tasks) == 90


@pytest.mark.slow  # make test: suites (tests/test_suite.py)
def test_suite_over_worker_processes_equals_openpi_loop():
    suite = jaxmesh.make_suite(
        f"libero:{SUITE}",
        tasks=[2, 0],
        episodes=2,
        camera_size=None,
        max_episode_steps=12,
    )
    result = jaxmesh.evaluate(policy, suite, num_envs=2, workers=2)
    for name, task in zip(suite.tasks, (2, 0), strict=True):
        want = reference(SUITE, task, [0, 1], [0, 1], policy_np, 12, KEYS)
        got = result.tasks[name]
        assert got.lengths.tolist() == [w["length"] for w in want]
        assert got.success.tolist() == [w["success"] for w in want]
    assert "pick_up_the_black_bowl" in result.summary()


@pytest.mark.parametrize(
    ("env_id", "options", "match"),
    [
        (
            "libero:libero_spatail/0",
            {},
            r"unknown LIBERO suite 'libero_spatail'.*"
            r"libero_spatial",
        ),
        ("libero:libero_10/10", {}, r"libero_10 has tasks 0\.\.9; got task index 10"),
        ("libero:libero_goal", {}, r"expected 'libero:<suite>/<task index>'"),
        ("libero:libero_goal/0", {"camera_size": 0}, r"camera_size=0: expected"),
        ("libero:libero_goal/0", {"settle_steps": -1}, r"settle_steps=-1"),
        ("libero:libero_goal/0", {"cameras": 2}, r"does not take \['cameras'\]"),
    ],
)
def test_bad_ids_and_options(env_id, options, match):
    with pytest.raises((ValueError, TypeError), match=match):
        jaxmesh.make_env(env_id, **options)


def test_bad_suites():
    with pytest.raises(ValueError, match=r"expected one of \['libero_spatial'"):
        jaxmesh.make_suite("libero:libero_100")
    with pytest.raises(ValueError, match=r"0\.\.9"):
        jaxmesh.make_suite("libero:libero_object", tasks=[12])
    with pytest.raises(ValueError, match=r"'PREFIX:SUITE'"):
        jaxmesh.make_suite("libero_object")
    with pytest.raises(TypeError, match="env_config only applies"):
        jaxmesh.evaluate(policy, "gymnasium:CartPole-v1", env_config={"x": 1})


def test_missing_gl_library_names_package_and_variable(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setattr(libero.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(RuntimeError, match=r"libosmesa6.*MUJOCO_GL"):
        libero._gl_backend()


def test_missing_package_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "libero.libero", None)
    with pytest.raises(ImportError, match=r"jaxmesh\[libero\]"):
        libero._libero()


@pytest.mark.slow  # make test: every shipped config is checked (tests/cli)
def test_config_runs_from_the_command_line(tmp_path, capsys):
    """configs/libero_spatial.yaml, cut short: the per-task table, the JSON,
    a video per task (from worker processes) and the report embedding them."""
    from pathlib import Path

    from jaxmesh.cli import main

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "libero.json"
    sets = [
        "suite.tasks=[3]",
        "suite.camera_size=32",
        "suite.max_episode_steps=6",
        "episodes=1",
        f"output={out}",
    ]
    argv = ["eval", str(root / "configs" / "libero_spatial.yaml"), "--no-progress"]
    argv += [a for s in sets for a in ("--set", s)]
    argv += ["--report", str(tmp_path / "libero.html"), "--video"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    name = "pick_up_the_black_bowl_on_the_cookie_box_and_place_it_on_the_plate"
    assert name in printed and "interval" in printed
    task = json.loads(out.read_text())["tasks"][name]
    assert len(task["episodes"]) == 1 and task["env"].endswith("libero_spatial/3")
    video = tmp_path / f"libero.{name}.ep0.mp4"
    assert video.stat().st_size > 0
    html = (tmp_path / "libero.html").read_text()
    assert name in html and f"data-video='{video.name}'" in html


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["suite=libero:libero_100"], r"unknown LIBERO suite 'libero_100'"),
        (["suite.tasks=[10]"], r"libero_spatial has tasks 0\.\.9"),
        (["suite.cameras=2"], r"does not take \['cameras'\]"),
        (["env=libero:libero_spatial/0"], r"suite=.* and env: a suite names its tasks"),
        (["suite=[1]"], r"expected a suite id"),
    ],
)
def test_bad_suite_configs(sets, match, capsys):
    from pathlib import Path

    from jaxmesh.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "libero_spatial.yaml"
    argv = ["eval", str(config)] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.slow  # make test: suites resumed (tests/test_suite.py)
def test_suite_resumes_after_a_failure():
    """A suite run stopped after its first episode resumes with the rest: each
    episode keeps its own seed and initial state (trial_index_base + index)."""

    class StopAfterFirst:
        def on_episode_end(self, episode):
            raise RuntimeError("stopped on purpose")

    suite = jaxmesh.make_suite(
        f"libero:{SUITE}",
        tasks=[TASK],
        episodes=3,
        camera_size=None,
        max_episode_steps=8,
    )
    with pytest.raises(Exception, match="stopped on purpose") as info:
        jaxmesh.evaluate(
            policy,
            suite,
            num_envs=1,
            starts=jaxmesh.Starts(trial_index_base=BASE),
            hooks=[StopAfterFirst()],
            scoring=jaxmesh.Scoring(metrics="init_state"),
        )
    partial = info.value.partial_result
    assert isinstance(partial, jaxmesh.SuiteResult)
    (name,) = suite.tasks
    assert partial.tasks[name].num_episodes == 1
    result = jaxmesh.evaluate(
        policy,
        suite,
        num_envs=1,
        starts=jaxmesh.Starts(trial_index_base=BASE),
        resume=partial,
        scoring=jaxmesh.Scoring(metrics="init_state"),
    )
    want = reference(SUITE, TASK, [0, 1, 2], [48, 49, 50], policy_np, 8, KEYS)
    got = result.tasks[name]
    assert got.lengths.tolist() == [w["length"] for w in want]
    np.testing.assert_allclose(got.returns, [w["return"] for w in want], atol=1e-6)
    assert np.asarray(got.metrics["init_state"]).tolist() == [48, 49, 0]


@pytest.mark.slow  # make test: other resumes refused (tests/run)
def test_a_resume_with_other_settle_steps_is_refused():
    # Settle steps other than the papers' 10 change the episodes: they are in
    # the env's name, so resuming a run with other settle steps is refused.
    options = {"camera_size": None, "max_episode_steps": 3}
    env_id = f"libero:{SUITE}/{TASK}"
    first = jaxmesh.evaluate(
        policy, env_id, env_config={**options, "settle_steps": 5}, seeds=[7], num_envs=1
    )
    assert first.env.endswith(f"{env_id}-settle5")
    with pytest.raises(ValueError, match="settle5"):
        jaxmesh.evaluate(
            policy, env_id, env_config=options, seeds=[7, 3], num_envs=1, resume=first
        )


QUIET_RUN = """
import logging, jax.numpy as jnp, jaxmesh
result = jaxmesh.evaluate(
    lambda obs: jnp.zeros(7), "libero:libero_spatial/0", episodes=1,
    env_config={"camera_size": None, "max_episode_steps": 2, "settle_steps": 1},
)
print("episodes", result.num_episodes)
logging.getLogger("robosuite_logs").warning("a real robosuite warning")
"""


def test_a_libero_run_prints_no_task_order_nor_macro_advice(tmp_path):
    """LIBERO's "[info] Applying task order index 0 ..." and robosuite's
    "No private macro file found!" advice are not printed; robosuite's own
    warnings still are. A fresh process, as a user's run imports them."""
    import subprocess
    import sys

    env = dict(
        os.environ, MUJOCO_GL="osmesa", PYOPENGL_PLATFORM="osmesa", JAX_PLATFORMS="cpu"
    )  # both: a LIBERO env made earlier in this process set PYOPENGL_PLATFORM
    done = subprocess.run(
        [sys.executable, "-c", QUIET_RUN],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    both = done.stdout + done.stderr
    assert "episodes 1" in done.stdout
    assert "Applying task order" not in both
    assert "macro file" not in both and "setup_macros" not in both
    assert "[robosuite WARNING] a real robosuite warning" in done.stderr


def test_libero_s_other_lines_still_reach_stderr(monkeypatch, capsys):
    lib = libero._libero()

    class Suite:
        def __init__(self):
            print("[info] Applying task order index 0 (permutation: [0]) ...")
            print("[warning] No tasks found for benchmark: nowhere")

    monkeypatch.setattr(lib.benchmark, "get_benchmark_dict", lambda: {"x": Suite})
    assert isinstance(libero._suite.__wrapped__("x"), Suite)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "[warning] No tasks found for benchmark: nowhere\n"
