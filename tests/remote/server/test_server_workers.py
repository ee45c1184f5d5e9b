"""``jaxmesh serve-env --workers N``: what a worker that segfaults or hangs
does to a real server process and its clients.

Each test starts ``jaxmesh serve-env`` on 127.0.0.1 (port 0, readiness through
``--ready-fd``) with an env registered in tests/worker_envs.py, drives it with
``jaxmesh.evaluate`` and stops it with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import children_of
from gym_reference import lean, per_step, plain_loop, start_serve_env
from reference_loop import assert_matches

import jaxmesh

TESTS = Path(__file__).resolve().parents[2]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def serve_env(monkeypatch):
    """Starts ``jaxmesh serve-env ARGS`` (tests/ importable, so the workers
    find worker_envs); stops it with SIGTERM at the end and checks that it
    leaves no worker process behind."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    started = []

    def start(*args):
        proc, address = start_serve_env(*args)
        started.append(proc)
        return proc, address

    yield start
    for proc in started:
        workers = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
        deadline = time.monotonic() + 30
        while not all(map(gone, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(map(gone, workers)), "serve-env left a worker process behind"
        left = [
            f for f in os.listdir("/dev/shm") if f.startswith(f"jaxmesh_{proc.pid}_")
        ]
        assert left == [], "serve-env left a shared-memory segment behind"


def reference(seeds):
    return plain_loop(gym.make("CartPole-v1"), per_step(lean), seeds)


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_worker_segfault_names_the_worker_lane_and_episode(serve_env, transport):
    """Seed 13's episode segfaults its worker at step 2: the client's error
    names the worker, its lanes, the signal, and the episode (from the lane
    whose env call was under way); the server replaced the worker, and the
    next run scores the plain loop's episodes."""
    proc, address = serve_env(
        "gymnasium:worker_envs:SegfaultsAtSeed13-v0", "--lanes", "4", "--workers", "2"
    )
    served = jaxmesh.Served(transport=transport)
    with pytest.raises(jaxmesh.errors.RemoteEnvError) as e:
        jaxmesh.evaluate(
            lean, f"grpc://{address}", num_envs=4, seeds=[1, 13, 2, 3], served=served
        )
    message = str(e.value)
    assert "worker process 0 (pid " in message and "lanes 0..1) died" in message
    assert "killed by SIGSEGV" in message and "in lane 1's env call" in message
    assert (e.value.episode, e.value.seed, e.value.lane, e.value.step) == (1, 13, 1, 1)
    seeds = [1, 2, 3, 4, 5]
    result = jaxmesh.evaluate(
        lean, f"grpc://{address}", num_envs=4, seeds=seeds, served=served
    )
    assert_matches(result, reference(seeds))


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_hung_worker_is_killed_when_its_client_gives_up(serve_env, transport):
    """Seed 13's episode hangs its worker: the client gives up after its
    reply timeout; the server kills the hung worker, starts a new one and
    frees the session, so the next client runs (it scores the plain loop's
    episodes); SIGTERM then stops the server, leaving no worker (fixture)."""
    proc, address = serve_env(
        "gymnasium:worker_envs:HangsAtSeed13-v0",
        "--lanes",
        "4",
        "--workers",
        "2",
        "--idle-timeout",
        "5",
    )
    url = f"grpc://{address}"
    with pytest.raises(jaxmesh.errors.RemoteConnectionError, match="reply_timeout"):
        jaxmesh.evaluate(
            lean,
            url,
            num_envs=4,
            seeds=[1, 13, 2, 3],
            served=jaxmesh.Served(reply_timeout=3, transport=transport),
        )
    seeds = [1, 2, 3, 4, 5]
    deadline = time.monotonic() + 60
    while True:  # the session is freed once the server has seen the client go
        try:
            result = jaxmesh.evaluate(lean, url, num_envs=4, seeds=seeds)
            break
        except jaxmesh.errors.RemoteConnectionError as exc:
            if "busy with another client's session" not in str(exc):
                raise
            assert time.monotonic() < deadline, "the hung session was never freed"
            time.sleep(0.1)
    assert_matches(result, reference(seeds))


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_sigterm_stops_a_server_whose_worker_hangs(
    serve_env, tmp_path, monkeypatch, transport
):
    """SIGTERM while a worker's env hangs under a client's call: the server
    exits (status 0) and leaves no worker process; the client's run fails."""
    mark = tmp_path / "hung"
    monkeypatch.setenv("WORKER_ENVS_HANG_MARK", str(mark))
    proc, address = serve_env(
        "gymnasium:worker_envs:HangsAtSeed13-v0", "--lanes", "2", "--workers", "2"
    )
    workers = children_of(proc.pid)
    assert len(workers) == 2
    failed: list = []

    def run():
        try:
            jaxmesh.evaluate(
                lean,
                f"grpc://{address}",
                num_envs=2,
                seeds=[1, 13],
                served=jaxmesh.Served(transport=transport),
            )
        except Exception as exc:  # noqa: BLE001 - the test reads it
            failed.append(exc)

    client = threading.Thread(target=run)
    client.start()
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert time.monotonic() < deadline, "the env never hung"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    client.join(timeout=60)
    assert not client.is_alive()
    assert failed and isinstance(failed[0], jaxmesh.errors.RemoteError)
    deadline = time.monotonic() + 30
    while not all(map(gone, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(map(gone, workers)), "serve-env left a worker process behind"
