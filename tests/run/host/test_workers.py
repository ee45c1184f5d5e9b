"""Host-stepped envs with Dict observations, in process and in worker processes
(CONTRACT 30, 31), against the plain gymnasium loop."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import children_of
from gym_reference import lean, per_step, plain_loop
from reference_loop import assert_matches
from worker_envs import CameraEnv, RaisesOnSeed, ShiftedDiscreteEnv

import jaxmesh
from jaxmesh.envs.gymnasium.workers import (
    WorkerPool,
    cores,
    default_workers,
    workers_for,
)

SEEDS = [5, 0, 7, 3, 11, 2, 8]


def brightness(obs):
    """A chunk of 3 from the image (uint8) and the state: reads two of the
    observation's leaves."""
    base = jnp.stack(
        [obs["image"].astype(jnp.float32).mean() / 255 - 0.5, obs["state"][0]]
    )
    return jnp.clip(jnp.stack([base, -base, 0.5 * base]), -1, 1)


@functools.cache
def reference(horizon: int, lead: int):
    """The plain loop: one CameraEnv, episode i reset with SEEDS[i]."""
    fn = jax.jit(brightness)

    def policy(obs, key):
        del key
        return fn({"image": obs["image"], "state": np.float32(obs["state"])})

    return plain_loop(CameraEnv(), policy, SEEDS, horizon=horizon, lead=lead)


def children() -> list[int]:
    """This process's child processes (from /proc: any kind of child)."""
    return children_of(os.getpid())


@pytest.fixture(autouse=True)
def alive_before():
    """The threads and child processes alive before a test (a test runner's,
    or those of tests that ran before it in this process)."""
    BEFORE["threads"] = set(threading.enumerate())
    BEFORE["children"] = set(children())
    yield


BEFORE: dict = {}


def no_leftovers():
    """No worker process, no shared-memory segment of a run, no extra thread."""
    assert set(children()) <= BEFORE["children"]
    mine = f"jaxmesh_{os.getpid()}_"
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(mine)]
    assert set(threading.enumerate()) <= BEFORE["threads"]


@pytest.mark.parametrize("workers, lanes", [(0, 3), (1, 2), (2, 3), (3, 5)])
def test_dict_observations_match_the_plain_loop(workers, lanes):
    """A nested Dict observation (uint8 image, float64 state, a Tuple) is read
    leaf by leaf, chunked with a lead, the same at every worker count."""
    result = jaxmesh.evaluate(
        brightness,
        CameraEnv,
        num_envs=lanes,
        seeds=SEEDS,
        horizon=3,
        chunking=jaxmesh.Chunking(prefetch_lead=1),
        workers=workers,
        scoring=jaxmesh.Scoring(metrics={"bright": "mean"}),
    )
    assert_matches(result, reference(3, 1), rtol=1e-5)
    assert result.policy_rows > 0
    np.testing.assert_allclose(
        result.metrics["bright"],
        [r.ret / r.length for r in reference(3, 1)],
        rtol=1e-5,
    )
    if workers:
        no_leftovers()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_discrete_action_reaches_the_env_shifted_by_start_once(workers):
    """The agent's action 1 of Discrete(3, start=5) is the env's 6, in process
    and in workers: 4 steps of reward 6 make a return of 24 (worked by hand)."""

    def second(obs):
        del obs
        return jnp.int32(1)

    result = jaxmesh.evaluate(
        second, ShiftedDiscreteEnv, num_envs=2, seeds=[0, 1, 2], workers=workers
    )
    np.testing.assert_array_equal(result.returns, [24.0, 24.0, 24.0])
    np.testing.assert_array_equal(result.lengths, [4, 4, 4])
    if workers:
        no_leftovers()


@pytest.mark.parametrize("spare_core", [False, True])
def test_workers_give_the_in_process_bits_on_a_mujoco_env(spare_core, monkeypatch):
    """gymnasium's HalfCheetah (MuJoCo) in 2 worker processes, paced a worker's
    lanes at a time (h = 1): every episode's return, length and info metrics
    are the in-process run's, bit for bit."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    w1 = jax.random.normal(k1, (17, 32)) * 0.3
    w2 = jax.random.normal(k2, (32, 6)) * 0.3

    def mlp(obs):
        return jnp.tanh(jnp.tanh(obs @ w1) @ w2)

    kw = dict(
        num_envs=3,
        seeds=[4, 9, 1, 7, 2],
        max_episode_steps=25,
        scoring=jaxmesh.Scoring(metrics={"reward_ctrl": "sum", "x_velocity": "mean"}),
    )
    here = jaxmesh.evaluate(mlp, "gymnasium:HalfCheetah-v5", workers=0, **kw)
    # With a core to spare the workers' lanes are paced as groups (GroupedRun),
    # else in lockstep (LocalRun): both give the in-process bits.
    from jaxmesh.envs.gymnasium import workers as pool
    from jaxmesh.run.host import loop

    monkeypatch.setattr(pool, "cores", lambda: 4 if spare_core else 2)
    ran = []
    for cls in (loop.GroupedRun, loop.LocalRun):
        monkeypatch.setattr(cls, "run", _spy(cls.run, cls.__name__, ran))
    there = jaxmesh.evaluate(mlp, "gymnasium:HalfCheetah-v5", workers=2, **kw)
    assert ran == ["GroupedRun" if spare_core else "LocalRun"]
    np.testing.assert_array_equal(there.returns, here.returns)
    np.testing.assert_array_equal(there.lengths, here.lengths)
    for key in kw["scoring"].metrics:
        np.testing.assert_array_equal(there.metrics[key], here.metrics[key])
    assert there.env_steps == here.env_steps == 5 * 25
    no_leftovers()


def _spy(run, name, ran):
    def spied(self):
        if type(self).__name__ == name:
            ran.append(name)
        return run(self)

    return spied


def test_a_worker_that_dies_is_replaced_and_its_episodes_run_again(tmp_path):
    """Seed 7's episode kills its worker once: a new worker takes the lanes,
    the episodes they held run again from their seeds, and the result is the
    unfaulted one; the hook hears of it."""
    faults = []

    class Hook:
        def on_fault(self, event):
            faults.append(event)

    once = str(tmp_path / "crashed")
    env = functools.partial(CameraEnv, crash_seed=7, once=once)
    result = jaxmesh.evaluate(
        brightness, env, num_envs=3, seeds=SEEDS, horizon=3, workers=2, hooks=[Hook()]
    )
    assert os.path.exists(once)
    assert_matches(result, reference(3, 0), rtol=1e-5)
    assert [f["event"] for f in faults] == ["worker lost"]
    assert 2 in faults[0]["episodes_rerun"]  # seed 7 is episode 2
    no_leftovers()


def test_a_worker_that_dies_twice_on_an_episode_ends_the_run_naming_it():
    env = functools.partial(CameraEnv, crash_seed=3)  # episode 3, every time
    with pytest.raises(jaxmesh.errors.WorkerError) as e:
        jaxmesh.evaluate(brightness, env, num_envs=3, seeds=SEEDS, workers=2)
    assert e.value.episode == 3 and e.value.seed == 3
    assert "episode 3 (seed 3)" in str(e.value)
    partial = e.value.partial_result
    refs = reference(1, 0)
    assert len(partial.indices) > 0
    assert_matches(partial, [refs[i] for i in partial.indices], rtol=1e-5)
    no_leftovers()


def test_an_env_error_in_a_worker_reaches_the_caller_as_raised():
    # An EnvError naming the episode, whose cause is the env's own exception
    # with the worker's traceback in a note.
    with pytest.raises(jaxmesh.EnvError, match="simulator broke") as e:
        jaxmesh.evaluate(brightness, RaisesOnSeed, num_envs=2, seeds=[1, 2], workers=2)
    assert (e.value.episode, e.value.seed, e.value.step) == (1, 2, 1)
    cause = e.value.__cause__
    assert isinstance(cause, RuntimeError)
    assert "worker process" in "".join(getattr(cause, "__notes__", []))
    no_leftovers()


def test_bad_worker_input_is_refused_before_anything_starts():
    envs = [CameraEnv() for _ in range(2)]
    with pytest.raises(TypeError, match="picklable zero-argument factory"):
        jaxmesh.evaluate(brightness, envs, workers=2)
    local = lambda: CameraEnv()  # noqa: E731 - a lambda does not pickle
    with pytest.raises(TypeError, match="cannot be pickled"):
        jaxmesh.evaluate(brightness, local, workers=2)
    with pytest.raises(ValueError, match="worker processes step a gymnasium"):
        jaxmesh.evaluate(lambda o: 0, "gymnax:CartPole-v1", workers=2)
    with pytest.raises(ValueError, match="workers"):
        jaxmesh.evaluate(brightness, CameraEnv, workers=-1)
    assert set(children()) <= BEFORE["children"]


def test_a_factory_that_does_not_build_an_env_is_a_clear_error():
    with pytest.raises(TypeError, match="must return a gymnasium.Env"):
        WorkerPool(functools.partial(dict, a=1), 2, 1)
    no_leftovers()


def test_the_default_rule_worked_by_hand():
    """workers=None: one worker per core (at most one per lane) once the lanes'
    steps cost 5 ms together; in process below, on one core or one lane."""
    assert workers_for(3e-3, 8, 2) == 2  # a 3 ms sim: 24 ms a lockstep
    assert workers_for(73e-6, 16, 2) == 0  # HalfCheetah: 1.2 ms
    assert workers_for(5e-6, 16, 2) == 0  # CartPole: 80 us
    assert workers_for(320e-6, 16, 2) == 2  # 5.1 ms
    assert workers_for(3e-3, 3, 8) == 3  # no more workers than lanes
    assert workers_for(3e-3, 16, 1) == 0
    assert workers_for(3e-3, 1, 8) == 0
    # The probe builds one env, steps it and closes it; nothing is left.
    assert default_workers("gymnasium:CartPole-v1", 1) == 0
    assert default_workers("gymnasium:CartPole-v1", 4) in (0, min(4, cores()))
    assert set(children()) <= BEFORE["children"]


def test_process_lanes_answer_every_op_as_list_lanes_do():
    """The server's lanes in worker processes (serve-env --workers): resets,
    chunk replays stopping at an episode's end, releases and single steps
    give the ResultBatch of the same envs in this process."""
    from jaxmesh.envs.gymnasium.lanes import EnvListStepper
    from jaxmesh.envs.gymnasium.workers import ProcessStepper

    here = EnvListStepper([gym.make("CartPole-v1") for _ in range(5)])
    there = ProcessStepper("gymnasium:CartPole-v1", 5, 2)
    try:
        got = []
        for lanes in (here, there):
            first = lanes.reset([0, 1, 2, 3, 4], [1, 2, 3, 4, 5])
            chunk = lanes.replay([0, 2, 3, 4], [3, 50, 1, 2], np.ones(56, np.int64))
            lanes.release([1])
            step = lanes.step([0, 2, 3, 4], np.zeros(4, np.int64))
            got.append((first, chunk, step, lanes.ended.copy()))
        for a, b in zip(got[0][:3], got[1][:3], strict=True):
            for field in ("lanes", "steps", "rows", "rewards", "terminated"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
            np.testing.assert_array_equal(a.observation[""], b.observation[""])
        np.testing.assert_array_equal(got[0][3], got[1][3])
        assert got[0][1].steps.tolist()[1] < 50  # the episode ended mid-chunk
    finally:
        here.close()
        there.close()
    no_leftovers()


SCRIPT = """
import os, sys, time
import jax.numpy as jnp
import jaxmesh
from worker_envs import CameraEnv


class Slow(CameraEnv):  # defined in the main script: workers must run it
    def step(self, action):
        time.sleep(0.01)
        return super().step(action)


def kids():
    me = os.getpid()
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                stat = open(f"/proc/{e}/stat").read()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == me:
                out.append(e)
    return out


class Tell:
    said = False

    def on_step(self, event):
        if not self.said:
            self.said = True
            print("children", *kids(), flush=True)


if __name__ == "__main__":
    r = jaxmesh.evaluate(
        lambda o: jnp.zeros(2), Slow, num_envs=2, episodes=int(sys.argv[1]),
        workers=2, hooks=[Tell()],
    )
    print("returns", *r.returns.round(4), flush=True)
"""


def _script(tmp_path):
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    tests = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    env = dict(os.environ, PYTHONPATH=tests)
    return path, env


def _gone(pid: str) -> bool:
    """No such process, or a zombie (exited; an init that reaps late holds it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow  # three scripts of 3 processes; make test: workers in process
def test_a_factory_in_the_main_script_and_ctrl_c_leave_nothing(tmp_path):
    """A user's script: its env class, defined in the script itself, is built
    in the workers (which run the script as multiprocessing does); the run
    scores the plain loop's returns. Interrupted with Ctrl-C, or its process
    group sent SIGTERM, the script leaves no worker process and no
    shared-memory segment."""
    path, env = _script(tmp_path)
    done = subprocess.run(
        [sys.executable, str(path), "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    want = [
        r.ret for r in plain_loop(CameraEnv(), lambda o, k: np.zeros((1, 2)), [0, 1, 2])
    ]
    np.testing.assert_allclose(np.float64(lines["returns"].split()), want, atol=1e-3)
    assert len(lines["children"].split()) == 2
    proc = subprocess.Popen(
        [sys.executable, str(path), "100000"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline().split()
        assert first[0] == "children" and len(first) == 3
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert all(_gone(pid) for pid in first[1:])
    left = [f for f in os.listdir("/dev/shm") if f.startswith(f"jaxmesh_{proc.pid}_")]
    assert left == []
    # SIGTERM to the script's whole process group (a job scheduler's kill): the
    # script dies at once; its workers see their pipe close, unlink the
    # segment and exit.
    proc = subprocess.Popen(
        [sys.executable, str(path), "100000"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        first = proc.stdout.readline().split()
        assert first[0] == "children"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in first[1:]) and time.monotonic() < deadline:
        time.sleep(0.05)  # the orphaned workers exit on their own
    assert all(_gone(pid) for pid in first[1:])
    left = [f for f in os.listdir("/dev/shm") if f.startswith(f"jaxmesh_{proc.pid}_")]
    assert left == []


def test_only_the_leaves_the_policy_reads_leave_the_workers():
    """CONTRACT 31: a policy whose spec reads the image alone gets the image
    from the workers; the state and the Tuple stay there (no slot for them in
    the shared segment), and the run is the plain loop's."""
    from jaxmesh.adapt import State
    from jaxmesh.envs.gymnasium.local import WorkerEnvLanes

    lanes = WorkerEnvLanes(CameraEnv, 2, 1)
    try:
        lanes.carry(["image"])
        first = lanes.reset([1, 0], [5, 4], [0, 1])
        assert list(first) == ["image"] and first["image"].dtype == np.uint8
        assert [f for f in lanes.pool.fields if f.startswith("obs:")] == ["obs:image"]
        want = CameraEnv().reset(seed=4)[0]["image"]
        np.testing.assert_array_equal(first["image"][1], want)
    finally:
        lanes.close()

    def bright(inputs):
        return jnp.stack([inputs["img"].astype(jnp.float32).mean() / 255 - 0.5, 0.0])

    model = jaxmesh.Model(bright, spec={"img": State(key="image")})
    result = jaxmesh.evaluate(model, CameraEnv, num_envs=2, seeds=SEEDS, workers=2)
    fn = jax.jit(lambda img: bright({"img": img}))
    refs = plain_loop(CameraEnv(), lambda o, k: fn(o["image"])[None], SEEDS)
    assert_matches(result, refs, rtol=1e-5)
    no_leftovers()


def test_kept_processes_serve_later_runs_with_the_leaves_each_reads(tmp_path):
    """Inside kept_processes (decide's batches), runs of one source, lane count
    and workers take the first run's processes and envs: each env is built
    once. A run that reads other leaves gets them (a new shared segment), each
    run equals the plain loop, and nothing is left once it exits."""
    from worker_envs import CountedCameraEnv

    from jaxmesh.adapt import State
    from jaxmesh.run.kept import kept_processes

    made = tmp_path / "made"
    source = functools.partial(CountedCameraEnv, str(made))

    def bright(inputs):
        return jnp.stack([inputs["img"].astype(jnp.float32).mean() / 255 - 0.5, 0.0])

    image_only = jaxmesh.Model(bright, spec={"img": State(key="image")})
    fn = jax.jit(lambda img: bright({"img": img}))
    image_refs = plain_loop(CameraEnv(), lambda o, k: fn(o["image"])[None], SEEDS)
    with kept_processes():
        for policy, horizon, refs in (
            (image_only, 1, image_refs),
            (brightness, 3, reference(3, 0)),
            (image_only, 1, image_refs),
        ):
            result = jaxmesh.evaluate(
                policy, source, num_envs=2, seeds=SEEDS, workers=2, horizon=horizon
            )
            assert_matches(result, refs, rtol=1e-5)
        pids = made.read_text().split()
        assert len(pids) == len(set(pids)) == 2  # a lane per worker, built once
    assert all(_gone(pid) for pid in pids)
    no_leftovers()


@functools.cache
def cartpole_reference():
    """The plain loop on gymnasium's own CartPole, no kill."""
    return plain_loop(gym.make("CartPole-v1"), per_step(lean), list(range(12)))


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("at", ["reset", "step"])
def test_a_worker_killed_at_a_reset_or_a_step_is_replaced_and_its_episodes_rerun(
    tmp_path, at, grouped, monkeypatch
):
    """gymnasium's CartPole (under the order check gymnasium.make puts around
    it) SIGKILLs its worker at the reset of seed 9, or at step 5 of its
    episode, once: the new worker's envs are reset before they step (the
    episodes in flight on the dead worker run again from their seeds), every
    episode equals the plain loop's, and the result says a worker was lost
    and replaced."""
    from worker_envs import KillsItself

    from jaxmesh.envs.gymnasium import workers as workers_mod
    from jaxmesh.run.host import loop

    if grouped:  # each worker's lanes paced as a group (GroupedRun), as on 3+ cores
        monkeypatch.setattr(workers_mod, "cores", lambda: 8)
    ran = []
    take_next = loop.HostLoop.take_next

    def spied(self, free):
        ran.append(type(self).__name__)
        return take_next(self, free)

    monkeypatch.setattr(loop.HostLoop, "take_next", spied)
    once = str(tmp_path / "killed")
    env = functools.partial(KillsItself, seed=9, at=at, once=once)
    result = jaxmesh.evaluate(lean, env, num_envs=4, seeds=range(12), workers=2)
    assert os.path.exists(once)  # the kill happened
    assert_matches(result, cartpole_reference())
    assert result.telemetry["worker_lost"]["count"] == 1
    assert "1 worker process lost and replaced" in result.summary()
    assert set(ran) == {"GroupedRun" if grouped else "LocalRun"}
    no_leftovers()


def test_a_reset_that_kills_its_worker_twice_ends_the_run_naming_the_episode():
    """Seed 9's reset kills its worker every time: the reset is tried once on
    a new worker, then the run ends with an EnvError naming episode 9 and its
    reset, every finished episode on its partial result."""
    from worker_envs import KillsItself

    env = functools.partial(KillsItself, seed=9, at="reset", once=None)
    with pytest.raises(jaxmesh.EnvError, match="killed by SIGKILL") as e:
        jaxmesh.evaluate(lean, env, num_envs=4, seeds=range(12), workers=2)
    assert (e.value.episode, e.value.seed, e.value.step) == (9, 9, None)
    assert "while resetting episode 9 (seed 9)" in str(e.value)
    partial = e.value.partial_result
    assert_matches(partial, [cartpole_reference()[i] for i in partial.indices])
    no_leftovers()


def test_workers_are_named_in_ps():
    """``ps -e``, top and pgrep show a worker as ``jaxmesh-worker`` (its comm);
    ``ps aux`` shows its number, lanes and parent, not the boot code."""
    pool = WorkerPool("gymnasium:CartPole-v1", 3, 2)
    try:
        for k, pid in enumerate(pool.pids):
            with open(f"/proc/{pid}/comm") as f:
                assert f.read() == "jaxmesh-worker\n"
            with open(f"/proc/{pid}/cmdline") as f:
                args = f.read().split("\0")
            lanes = f"lanes={pool.blocks[k][0]}..{pool.blocks[k][-1]}"
            assert args[3:7] == [
                "jaxmesh-worker",
                str(k),
                lanes,
                f"parent={os.getpid()}",
            ]
            assert len("".join(args)) < 200 + len(sys.executable)
    finally:
        pool.close()
    no_leftovers()


HUNG_SCRIPT = """
import functools, sys
import jax.numpy as jnp
import jaxmesh
from worker_envs import HangsOnSeed

if __name__ == "__main__":
    env = functools.partial(HangsOnSeed, bad=2, mark=sys.argv[1])
    jaxmesh.evaluate(lambda o: jnp.zeros(2), env, num_envs=2, episodes=4, workers=2)
"""


def test_a_hung_worker_does_not_outlive_its_run_on_sigterm(tmp_path):
    """A script's env hangs in one worker; SIGTERM to the script (its default
    action: the process ends at once) leaves no worker process, the hung one
    included, and no shared-memory segment."""
    path, env = _script(tmp_path)
    path.write_text(HUNG_SCRIPT)
    mark = tmp_path / "hung"
    proc = subprocess.Popen([sys.executable, str(path), str(mark)], env=env)
    workers: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the env never hung"
            time.sleep(0.05)
        workers = [str(p) for p in children_of(proc.pid)]
        assert len(workers) == 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not all(map(_gone, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)  # orphaned, they see their parent gone and exit
        assert all(map(_gone, workers)), "a worker outlived its run"
        left = [
            f for f in os.listdir("/dev/shm") if f.startswith(f"jaxmesh_{proc.pid}_")
        ]
        assert left == []
    finally:
        proc.kill()
        for pid in workers:  # the test's own leftovers, if it failed
            if not _gone(pid):
                os.kill(int(pid), signal.SIGKILL)
