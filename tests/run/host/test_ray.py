"""``workers=jaxmesh.Ray(...)`` on a local Ray cluster (2 CPUs): lanes stepped
by Ray actors give the plain gymnasium loop's episodes, a killed actor's
episodes run again on the others, an env's error names its episode, and no
actor outlives a run (success, error, Ctrl-C)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ray
import yaml
from gym_reference import BreaksOnSeed, lean, per_step, plain_loop, tilt_episodes
from reference_loop import assert_matches
from worker_envs import CameraEnv, KillsItself

import jaxmesh
from jaxmesh.run.cluster import Ray, workers_of
from jaxmesh.run.host import ray_actors

TESTS = str(Path(__file__).resolve().parents[2])
SEEDS = [3, 1, 4, 15, 9, 2, 6]
#: Two actors share the cluster's 2 CPUs with the Ray workers a test starts.
TWO = functools.partial(Ray, num_cpus_per_worker=0.5)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local Ray for the file (2 CPUs); the actors import the tests'
    env modules (``worker_envs``, ``gym_reference``) from ``tests/``."""
    with warnings.catch_warnings():  # Ray's fork + exec, which JAX warns of
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        for attempt in (1, 2):  # on a loaded 2-core machine, Ray's own start-up
            try:  # wait for its GCS server can time out: one more try
                ray.init(
                    num_cpus=2,
                    include_dashboard=False,
                    logging_level="ERROR",
                    runtime_env={"env_vars": {"PYTHONPATH": TESTS}},
                )
                break
            except RuntimeError as e:
                ray.shutdown()
                if attempt == 2 or "Timed out waiting for file" not in str(e):
                    raise
    yield
    ray.shutdown()


def our_actors() -> list[str]:
    """The names of the runs' actors Ray knows alive."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(ray_actors.NAME_PREFIX)
    ]


@pytest.fixture(autouse=True)
def nothing_left():
    """After every test: no actor of a run alive, and this process still
    connected (a run leaves a connection it found as it was)."""
    yield
    assert our_actors() == []
    assert ray.is_initialized()


def make_cartpole():
    return gym.make("CartPole-v1")


@functools.cache
def lean_refs():
    return plain_loop(gym.make("CartPole-v1"), per_step(lean), SEEDS)


def brightness(obs):
    base = jnp.stack(
        [obs["image"].astype(jnp.float32).mean() / 255 - 0.5, obs["state"][0]]
    )
    return jnp.clip(jnp.stack([base, -base, 0.5 * base]), -1, 1)


@functools.cache
def camera_refs(seeds: tuple):
    fn = jax.jit(brightness)

    def policy(obs, key):
        del key
        return fn({"image": obs["image"], "state": np.float32(obs["state"])})

    return plain_loop(CameraEnv(), policy, list(seeds), horizon=3, lead=1)


@pytest.mark.parametrize(
    "actors, env",
    [(1, "gymnasium:CartPole-v1"), (2, make_cartpole)],
    ids=["an id on 1 actor", "a factory on 2 actors"],
)
def test_an_id_and_a_factory_give_the_plain_loops_episodes(actors, env):
    result = jaxmesh.evaluate(
        lean, env, num_envs=3, seeds=SEEDS, workers=TWO(num_workers=actors)
    )
    assert_matches(result, lean_refs())
    assert result.env_steps == sum(r.length for r in lean_refs())


CAMERA_SEEDS = (5, 0, 7, 3, 11, 2, 8)


def camera_run(env):
    """``env`` (a CameraEnv factory) on 3 lanes over 2 actors: chunks of 3
    with a prefetch lead, seeds ``CAMERA_SEEDS``."""
    return jaxmesh.evaluate(
        brightness,
        env,
        num_envs=3,
        seeds=list(CAMERA_SEEDS),
        horizon=3,
        chunking=jaxmesh.Chunking(prefetch_lead=1),
        workers=TWO(num_workers=2),
    )


def test_dict_observations_and_chunks_match_the_plain_loop():
    """A nested Dict observation (uint8 image, float64 state, a Tuple), chunks
    of 3 with a prefetch lead, over 2 actors: the plain loop's episodes."""
    result = camera_run(CameraEnv)
    assert_matches(result, camera_refs(CAMERA_SEEDS), rtol=1e-5)


def test_a_killed_actor_has_its_episodes_run_again_on_the_other():
    """An actor killed (``ray.kill``) when the first episode ends: the episodes
    its lanes had not finished run again from their seeds on the other actor,
    and every episode is the plain loop's."""
    killed = []

    class KillOne:
        def on_episode_end(self, episode):
            if not killed:
                name = our_actors()[0]
                ray.kill(ray.get_actor(name, namespace=_namespace(name)))
                killed.append(name)

    result = jaxmesh.evaluate(
        lean,
        "gymnasium:CartPole-v1",
        num_envs=4,
        seeds=SEEDS,
        workers=TWO(num_workers=2),
        hooks=[KillOne()],
    )
    assert killed
    assert_matches(result, lean_refs())
    assert len(result.server_losses) == 1
    assert result.server_losses[0]["episodes_rerun"] >= 1


def test_kept_actors_serve_later_runs_and_a_lost_one_starts_anew(tmp_path):
    """Inside kept_processes (decide's batches), runs of one source, lanes and
    Ray settings share their actors: each lane's env is built once. A kept
    actor killed between runs is not reused: the next run starts new actors.
    The block's end ends them (``nothing_left``)."""
    from worker_envs import counted_cartpole

    from jaxmesh.run.kept import kept_processes

    made = tmp_path / "made"
    source = functools.partial(counted_cartpole, str(made))
    workers = TWO(num_workers=2)

    def run():
        result = jaxmesh.evaluate(
            lean, source, num_envs=3, seeds=SEEDS, workers=workers
        )
        assert_matches(result, lean_refs())

    with kept_processes():
        run()
        run()
        names = our_actors()
        assert len(names) == 2 and len(made.read_text().split()) == 3
        killed(ray.get_actor(names[0], namespace=_namespace(names[0])))
        run()
        assert len(our_actors()) == 2 and set(our_actors()).isdisjoint(names)
        assert len(made.read_text().split()) == 6


def killed(actor) -> None:
    """Kills ``actor`` and returns once it no longer answers: ``ray.kill`` is
    asynchronous, and a run that starts before the kill lands would still find
    the actor alive."""
    ray.kill(actor)
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.05)


def _namespace(name: str) -> str:
    return next(
        a["namespace"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"] == name
    )


@pytest.mark.slow
def test_an_actor_whose_env_crashes_is_replaced_and_its_episodes_rerun(tmp_path):
    """Seed 7's episode ends its actor's process (a simulator crash): its
    episodes run again on the other actor, and the result is the plain
    loop's."""
    once = str(tmp_path / "crashed")
    result = camera_run(functools.partial(CameraEnv, crash_seed=7, once=once))
    assert os.path.exists(once)
    assert_matches(result, camera_refs(CAMERA_SEEDS), rtol=1e-5)
    assert len(result.server_losses) == 1


def test_an_env_error_names_its_episode_seed_lane_and_step():
    bad = SEEDS[4]
    with pytest.raises(jaxmesh.EnvError, match="simulator broke") as e:
        jaxmesh.evaluate(
            lean,
            functools.partial(BreaksOnSeed, bad),
            num_envs=2,
            seeds=SEEDS,
            workers=TWO(num_workers=2),
        )
    err = e.value
    assert (err.episode, err.seed, err.step) == (4, bad, 5)
    assert err.lane in (0, 1)
    partial = err.partial_result
    assert 4 not in partial.indices.tolist()
    assert_matches(partial, [lean_refs()[i] for i in partial.indices])


def test_ctrl_c_in_a_run_ends_its_actors():
    """A KeyboardInterrupt in the middle of a run (from a hook, as Ctrl-C
    would raise it in the main thread) ends the actors; the connection the
    process had stays up (``nothing_left``)."""

    class Interrupt:
        def on_episode_end(self, episode):
            assert len(our_actors()) == 2
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        jaxmesh.evaluate(
            lean,
            "gymnasium:CartPole-v1",
            num_envs=2,
            seeds=SEEDS,
            workers=TWO(num_workers=2),
            hooks=[Interrupt()],
        )


def test_what_ray_cannot_step_is_refused_before_any_actor_starts():
    with pytest.raises(TypeError, match="env objects"):
        jaxmesh.evaluate(lean, gym.make("CartPole-v1"), workers=Ray(num_workers=1))
    with pytest.raises(ValueError, match="2 env factories for 3 lanes"):
        jaxmesh.evaluate(
            lean,
            [make_cartpole, make_cartpole],
            num_envs=3,
            episodes=3,
            workers=Ray(num_workers=1),
        )
    with pytest.raises(ValueError, match="check_seeds"):
        jaxmesh.evaluate(
            lean,
            "gymnasium:CartPole-v1",
            episodes=2,
            workers=Ray(num_workers=1),
            starts=jaxmesh.Starts(check_seeds=True),
        )
    with pytest.raises(ValueError, match="JAX env"):
        jaxmesh.evaluate(lean, "gymnax:CartPole-v1", workers=Ray(num_workers=1))


def test_an_env_that_cannot_be_built_raises_its_own_error():
    with pytest.raises(ValueError, match="unknown gymnasium env 'NoSuchEnv-v0'") as e:
        jaxmesh.evaluate(
            lean, "gymnasium:NoSuchEnv-v0", episodes=2, workers=Ray(num_workers=1)
        )
    assert "Ray actor 0" in "".join(getattr(e.value, "__notes__", []))


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match="num_workers=0"):
        Ray(num_workers=0)
    with pytest.raises(TypeError, match="num_workers='2'"):
        Ray(num_workers="2")
    with pytest.raises(ValueError, match="num_cpus_per_worker=0"):
        Ray(num_cpus_per_worker=0)
    with pytest.raises(TypeError, match="address=3"):
        Ray(address=3)
    with pytest.raises(TypeError, match="resources"):
        Ray(resources=["GPU"])
    with pytest.raises(ValueError, match="num_cpus_per_worker="):
        Ray(resources={"CPU": 2})
    with pytest.raises(ValueError, match="unknown key"):
        workers_of({"ray": {"workers": 2}})
    with pytest.raises(ValueError, match="a mapping names Ray actors"):
        jaxmesh.RunConfig(workers={"dask": 2})
    config = jaxmesh.RunConfig(workers={"ray": {"num_workers": 4, "resources": {}}})
    assert config.workers == Ray(num_workers=4, resources={})
    assert jaxmesh.RunConfig(workers={"ray": None}).workers == Ray()
    assert hash(Ray(resources={"GPU": 1})) == hash(Ray(resources={"GPU": 1.0}))


def test_no_ray_is_a_clear_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"jaxmesh\[ray\]"):
        jaxmesh.evaluate(
            lean, "gymnasium:CartPole-v1", episodes=2, workers=Ray(num_workers=1)
        )


def test_the_cli_runs_a_config_on_ray(tmp_path, capsys, no_compile_cache):
    """``workers: {ray: {...}}`` in YAML, and ``--workers ray:N`` on the
    command line: the plain loop's episodes."""
    from jaxmesh.cli import main

    config = {
        "policy": "cli_policies:tilt",
        "env": "gymnasium:CartPole-v1",
        "episodes": 5,
        "num_envs": 2,
        "workers": {"ray": {"num_workers": 2, "num_cpus_per_worker": 0.5}},
        "output": str(tmp_path / "r.json"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["eval", str(path), "--no-progress"]) == 0
    eps = json.loads((tmp_path / "r.json").read_text())["episodes"]
    assert [(ep["return"], ep["length"]) for ep in eps] == tilt_episodes(range(5))
    assert (
        "lanes stepped by            2 Ray actors on 1 node" in capsys.readouterr().out
    )
    del config["workers"]
    path.write_text(yaml.safe_dump(config))
    args = ["eval", str(path), "--no-progress", "--workers", "ray:1"]
    assert main(args) == 0
    eps = json.loads((tmp_path / "r.json").read_text())["episodes"]
    assert [(ep["return"], ep["length"]) for ep in eps] == tilt_episodes(range(5))
    capsys.readouterr()


SCRIPT = textwrap.dedent(
    """
    import sys, time
    import gymnasium as gym
    import ray
    import jaxmesh

    def lean(obs):
        return (obs[2] > 0).astype("int32")

    class Slow(gym.Wrapper):
        def __init__(self):
            super().__init__(gym.make("CartPole-v1"))

        def step(self, action):
            time.sleep(0.05)
            return self.env.step(action)

    class Tell:
        def on_episode_end(self, episode):
            print("running", flush=True)

    workers = jaxmesh.Ray(num_workers=1, num_cpus_per_worker=0.5)
    r = jaxmesh.evaluate(lean, "gymnasium:CartPole-v1", episodes=2, workers=workers)
    print("done", r.num_episodes, ray.is_initialized(), flush=True)
    if sys.argv[1] == "interrupt":
        jaxmesh.evaluate(
            lean, Slow, num_envs=1, seeds=range(50), workers=workers, hooks=[Tell()]
        )
    """
)


def _actor_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
    return [
        line for line in out.stdout.splitlines() if line.startswith("ray::EnvActor")
    ]


@pytest.mark.slow
def test_a_run_that_started_ray_shuts_it_down_and_ctrl_c_leaves_no_actor(tmp_path):
    """In a fresh process: a run starts a local Ray and shuts it down after
    (``ray.is_initialized()`` False); a run interrupted with SIGINT ends with
    KeyboardInterrupt and leaves no actor process."""
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    child = subprocess.Popen(
        [sys.executable, str(script), "interrupt"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert child.stdout.readline().split() == ["done", "2", "False"]
        assert child.stdout.readline().strip() == "running"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 30  # Ray's processes end as the child's session does
    while _actor_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _actor_processes() == []


@pytest.mark.slow
def test_libero_over_ray_equals_libero_in_process():
    """A LIBERO task (state only, 15-step cap) over 2 actors: each episode's
    length, return, success and recorded observations are the in-process
    run's (tests/envs/test_libero.py checks that one against openpi's loop)."""
    from jaxmesh.zoo.libero import KEYS, scripted

    kw = dict(
        env_config={"camera_size": None, "max_episode_steps": 15},
        num_envs=2,
        seeds=[7, 3, 11],
        horizon=5,
        starts=jaxmesh.Starts(trial_index_base=48),
        record=jaxmesh.Record(episodes=[0, 1, 2], keys=list(KEYS)),
    )
    env = "libero:libero_spatial/0"
    here = jaxmesh.evaluate(scripted, env, workers=0, **kw)
    there = jaxmesh.evaluate(scripted, env, workers=TWO(num_workers=2), **kw)
    np.testing.assert_array_equal(there.lengths, here.lengths)
    np.testing.assert_array_equal(there.returns, here.returns)
    np.testing.assert_array_equal(there.success, here.success)
    for a, b in zip(there.trajectories, here.trajectories, strict=True):
        for k in KEYS:
            np.testing.assert_array_equal(a.observations[k], b.observations[k])


def test_the_workers_flags_are_overrides_in_either_order():
    from jaxmesh.cli.config import apply_overrides
    from jaxmesh.cli.parser import make_parser

    parse = lambda *flags: make_parser().parse_args(["eval", "c.yaml", *flags]).set
    both = ["workers={ray: {num_workers: 64}}", 'workers.ray.address="head:6379"']
    assert parse("--workers", "ray:64", "--ray-address", "head:6379") == both
    assert parse("--ray-address", "head:6379", "--workers", "ray:64") == both
    config = apply_overrides({"workers": 2}, both)
    assert workers_of(config["workers"]) == Ray(num_workers=64, address="head:6379")
    assert parse("--workers", "3") == ["workers=3"]
    assert parse("--workers", "ray") == ["workers={ray: null}"]
    with pytest.raises(SystemExit):
        parse("--workers", "dask:3")


@pytest.mark.slow
def test_an_actor_ray_restarts_rejoins_at_its_old_address(tmp_path):
    """Seed 4's episode SIGKILLs its actor's process (a crash, not
    ``ray.kill``): Ray starts it again, it serves at its old address and its
    lanes rejoin the run; every episode is the plain loop's."""
    seeds = list(range(120))
    back = []

    class WaitForRestart:
        def on_fault(self, event):
            if event["event"] == "rejoined":
                back.append(event)
            if event["event"] != "lost":
                return
            handles = [
                ray.get_actor(name, namespace=_namespace(name)) for name in our_actors()
            ]
            deadline = time.monotonic() + 60
            while True:  # until the restarted actor answers again
                try:
                    ray.get([h.__ray_ready__.remote() for h in handles], timeout=5)
                    break
                except ray.exceptions.RayError:
                    assert time.monotonic() < deadline, "the actor was not restarted"
                    time.sleep(0.2)
            time.sleep(5)  # the run's next try to rejoin it finds it

    env = functools.partial(KillsItself, 4, "step", str(tmp_path / "killed"))
    result = jaxmesh.evaluate(
        lean,
        env,
        num_envs=4,
        seeds=seeds,
        workers=TWO(num_workers=2),
        hooks=[WaitForRestart()],
    )
    refs = plain_loop(gym.make("CartPole-v1"), per_step(lean), seeds)
    assert_matches(result, refs)
    (loss,) = result.server_losses
    assert back and back[0]["server"] == loss["server"]
    assert loss["rejoined_at_seconds"] is not None
