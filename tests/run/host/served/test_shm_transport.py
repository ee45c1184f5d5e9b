"""The same-host data path (``transport=``) against the plain gymnasium loop.

Real servers on 127.0.0.1 (in this process, or ``jaxmesh serve-env`` children
killed mid-run); real Unix sockets and shared memory. Every run is checked
against the plain loop's episodes with both transports, and which transport a
run took is read from its telemetry (``transport_shm``: 1 per session on
shared memory, 0 per session on gRPC).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from gym_reference import ID, SEEDS, BreaksOnSeed, chunky, lean, start_serve_envs
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from reference_loop import assert_matches
from worker_envs import CameraEnv

import jaxmesh
from jaxmesh.remote.server import EnvServer, ServeOptions
from jaxmesh.remote.session import Session

from .test_served import chunky_refs, lean_refs
from .test_served_dict import LANES, chunked, per_step, reference
from .test_served_dict import SEEDS as CAMERA_SEEDS


def url(server) -> str:
    return f"grpc://{server.address}"


def shm_sessions(result) -> list[float]:
    stats = result.telemetry["transport_shm"]
    return [stats["count"], stats["mean"]]


def leftovers() -> tuple[list[str], list[str]]:
    """This process's segments and its same-host threads other than the
    servers' accepting ones (a session's end on the server side follows the
    client's by a moment: waited for)."""
    mine = f"jaxmesh_{os.getpid()}_"
    for _ in range(100):
        segments = [f for f in os.listdir("/dev/shm") if f.startswith(mine)]
        threads = [
            t.name
            for t in threading.enumerate()
            if t.name.startswith("jaxmesh-shm") and t.name != "jaxmesh-shm-accept"
        ]
        if not segments and not threads:
            break
        time.sleep(0.02)
    return segments, threads


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    assert leftovers() == ([], [])


@pytest.fixture(scope="module")
def cartpoles():
    with EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=4) as s:
        yield s


@pytest.fixture(scope="module")
def cameras():
    with EnvServer([CameraEnv() for _ in range(LANES)], "127.0.0.1:0") as s:
        yield s


@pytest.mark.parametrize("transport", ["auto", "grpc", "shm"])
def test_per_step_and_chunked_policies_match_the_plain_loop(cartpoles, transport):
    """h = 1 and a chunk of 4 (a lead of 2): the plain loop's episodes; auto
    and shm take shared memory on 127.0.0.1, grpc the gRPC stream."""
    got = jaxmesh.evaluate(
        lean,
        url(cartpoles),
        num_envs=3,
        seeds=SEEDS,
        served=jaxmesh.Served(transport=transport),
    )
    assert_matches(got, lean_refs())
    want = 0.0 if transport == "grpc" else 1.0
    assert shm_sessions(got) == [1, want]
    got = jaxmesh.evaluate(
        chunky,
        url(cartpoles),
        num_envs=4,
        seeds=SEEDS,
        horizon=4,
        chunking=jaxmesh.Chunking(prefetch_lead=2),
        served=jaxmesh.Served(transport=transport),
    )
    assert_matches(got, chunky_refs(lead=2))
    assert shm_sessions(got) == [1, want]


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_a_dict_observation_with_a_uint8_image(cameras, transport):
    """A uint8 image leaf and a float state leaf, h = 1 and h = 3."""
    got = jaxmesh.evaluate(
        per_step,
        url(cameras),
        num_envs=2,
        seeds=CAMERA_SEEDS,
        served=jaxmesh.Served(transport=transport),
    )
    assert_matches(got, reference(1, 0), rtol=1e-5)
    got = jaxmesh.evaluate(
        chunked,
        url(cameras),
        num_envs=3,
        seeds=CAMERA_SEEDS,
        horizon=3,
        chunking=jaxmesh.Chunking(prefetch_lead=1),
        served=jaxmesh.Served(transport=transport),
    )
    assert_matches(got, reference(3, 1), rtol=1e-5)
    assert shm_sessions(got) == [1, 1.0 if transport == "auto" else 0.0]


def test_the_shared_image_rows_are_the_env_s_own_bytes(cameras):
    """A reset's uint8 rows through shared memory equal the env's, byte for byte."""
    with Session(cameras.address, transport="shm") as s:
        s.open(reader=False)
        assert s.transport == "shm"
        s.send(reset_lanes=[0, 2], seeds=[5, 7])
        batch = s.receive().batch
    image = batch.observation["image"]
    assert image.dtype == np.uint8
    for row, seed in zip(image, [5, 7], strict=True):
        want, _ = CameraEnv().reset(seed=seed)
        np.testing.assert_array_equal(row, want["image"])


def test_lanes_dealt_over_two_servers(cartpoles):
    with EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=2) as other:
        got = jaxmesh.evaluate(
            chunky,
            [url(cartpoles), url(other)],
            num_envs=4,
            seeds=SEEDS,
            horizon=4,
            chunking=jaxmesh.Chunking(prefetch_lead=2),
        )
    assert_matches(got, chunky_refs(lead=2))
    assert shm_sessions(got) == [2, 1.0]


def test_a_lockstep_vector_env_server():
    make = functools.partial(CameraEnv, crash_seed=-1)
    vec = SyncVectorEnv([make] * LANES, autoreset_mode=AutoresetMode.DISABLED)
    with EnvServer(vec, "127.0.0.1:0") as s:
        got = jaxmesh.evaluate(
            chunked, url(s), num_envs=LANES, seeds=CAMERA_SEEDS, horizon=3,
            chunking=jaxmesh.Chunking(prefetch_lead=1),
        )  # fmt: skip
    vec.close()
    assert_matches(got, reference(3, 1), rtol=1e-5)
    assert shm_sessions(got) == [1, 1.0]


def test_an_env_error_is_the_same_remote_env_error():
    bad = SEEDS[4]
    with EnvServer([BreaksOnSeed(bad) for _ in range(2)], "127.0.0.1:0") as server:
        errors = {}
        for transport in ("shm", "grpc"):
            with pytest.raises(jaxmesh.RemoteEnvError, match="simulator broke") as e:
                jaxmesh.evaluate(
                    lean,
                    url(server),
                    num_envs=2,
                    seeds=SEEDS,
                    served=jaxmesh.Served(transport=transport),
                )
            errors[transport] = e.value
        again = jaxmesh.evaluate(lean, url(server), num_envs=2, seeds=SEEDS[:4])
    assert again.num_episodes == 4
    shm, grpc = errors["shm"], errors["grpc"]
    assert "in step" in shm.remote_traceback
    for field in ("lane", "step", "seed", "episode", "phase", "summary"):
        assert getattr(shm, field, None) == getattr(grpc, field, None), field


def test_a_server_killed_mid_run_is_rerun_on_the_other():
    lanes = (f"gymnasium:{ID}", "--lanes", "2")
    procs = start_serve_envs(lanes, lanes)
    try:
        (victim, lost), (_, kept) = procs

        class KillAt:
            def on_episode_end(self, ep):
                if ep.index == 5 and victim.poll() is None:
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()

        got = jaxmesh.evaluate(
            lean,
            [f"grpc://{lost}", f"grpc://{kept}"],
            num_envs=4,
            seeds=SEEDS,
            hooks=KillAt(),
        )
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    assert_matches(got, lean_refs())
    assert len(got.server_losses) == 1 and got.server_losses[0]["server"] == lost
    assert shm_sessions(got)[1] == 1.0


_CLIENT = """
import sys, os, signal
from jaxmesh.remote.session import Session
s = Session(sys.argv[1], transport="shm")
s.open(reader=False)
s.send(reset_lanes=[0], seeds=[1])
s.receive()
print("attached", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_client_that_dies_frees_the_server(cartpoles):
    proc = subprocess.run(
        [sys.executable, "-c", _CLIENT, cartpoles.address],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "attached" in proc.stdout, proc.stderr
    got = jaxmesh.evaluate(lean, url(cartpoles), num_envs=2, seeds=SEEDS[:4])
    assert got.num_episodes == 4 and shm_sessions(got) == [1, 1.0]


def test_a_server_without_shared_memory_falls_back_or_refuses():
    opts = ServeOptions(shared_memory=False)
    with EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=2, options=opts) as s:
        got = jaxmesh.evaluate(lean, url(s), num_envs=2, seeds=SEEDS)
        assert_matches(got, lean_refs())
        assert shm_sessions(got) == [1, 0.0]
        with pytest.raises(jaxmesh.RemoteConnectionError, match="transport='shm'"):
            jaxmesh.evaluate(
                lean,
                url(s),
                num_envs=2,
                seeds=SEEDS,
                served=jaxmesh.Served(transport="shm"),
            )


def test_a_token_is_checked_on_the_same_host_path():
    opts = ServeOptions(token="right")
    with EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=2, options=opts) as s:
        with Session(s.address, token="right", transport="shm") as session:
            session.open()
            assert session.transport == "shm"
        # A wrong token is refused by the handshake before any attaching.
        with pytest.raises(jaxmesh.RemoteConnectionError, match="token"):
            Session(s.address, token="wrong", transport="shm")


def test_bad_transports_are_refused(no_compile):
    with pytest.raises(ValueError, match="transport='udp'"):
        jaxmesh.evaluate(
            lean,
            "grpc://127.0.0.1:1",
            seeds=[0],
            served=jaxmesh.Served(transport="udp"),
        )
    with pytest.raises(ValueError, match="transport='shm'.*drop transport="):
        jaxmesh.evaluate(
            lean, f"gymnasium:{ID}", seeds=[0], served=jaxmesh.Served(transport="shm")
        )


def test_steps_travel_as_binary_frames_with_the_env_s_own_values(cartpoles):
    """Calls that only step lanes go as STEP frames and come back as RESULT
    frames; rewards, ends and observation rows are gymnasium's own, for one
    action per lane and for a run of actions on one lane."""
    import gymnasium as gym

    from jaxmesh.remote import shm

    envs = [gym.make(ID) for _ in range(2)]
    with Session(cartpoles.address, transport="shm") as s:
        s.open(reader=False)
        assert s.stream.binary
        s.send(reset_lanes=[0, 1], seeds=[5, 7])
        s.receive()
        for e, seed in zip(envs, [5, 7], strict=True):
            e.reset(seed=seed)
        lanes, counts = np.array([0, 1]), np.array([1, 3])
        actions = np.array([1, 0, 1, 1], np.int64)
        size = s.send(lanes=lanes, counts=counts, actions=actions)
        assert size == len(shm.pack_step(2, lanes, counts, actions, 0, b""))
        batch = s.receive().batch
    want = [envs[0].step(1), *[envs[1].step(int(a)) for a in actions[1:]]]
    np.testing.assert_array_equal(batch.lanes, [0, 1])
    np.testing.assert_array_equal(batch.steps, [1, 3])
    np.testing.assert_array_equal(batch.rewards, [w[1] for w in want])
    np.testing.assert_array_equal(batch.terminated, [w[2] for w in want])
    np.testing.assert_array_equal(batch.truncated, [w[3] for w in want])
    np.testing.assert_array_equal(batch.observation[""], [want[0][0], want[3][0]])
    for e in envs:
        e.close()


def test_a_step_frame_for_a_lane_never_reset_is_refused(cartpoles):
    with Session(cartpoles.address, transport="shm") as s:
        s.open(reader=False)
        s.send(lanes=np.array([2]), counts=np.array([1]), actions=np.array([1]))
        with pytest.raises(jaxmesh.RemoteError, match="reset lane 2 first"):
            s.receive()


def test_malformed_binary_frames_are_refused_by_name():
    from jaxmesh.remote import codec, shm

    spec = codec.LeafSpec("", "float32", (2,))
    acts = np.zeros((2, 2), np.float32)
    ok = shm.pack_step(9, np.array([0, 3]), np.array([1, 1]), acts, 1, b"a\0b")
    call_id, flags, info, batch = shm.unpack_step(ok, spec, num_lanes=4, max_count=8)
    assert (call_id, flags, info) == (9, 1, b"a\0b")
    np.testing.assert_array_equal(batch.lanes, [0, 3])
    kw = {"num_lanes": 4, "max_count": 8}
    with pytest.raises(codec.ProtocolError, match="too short"):
        shm.unpack_step(ok[:5], spec, **kw)
    with pytest.raises(codec.ProtocolError, match="needs 16 bytes"):
        shm.unpack_step(ok[:-1], spec, **kw)
    with pytest.raises(codec.ProtocolError, match="not strictly ascending"):
        shm.unpack_step(
            shm.pack_step(1, np.array([3, 0]), np.array([1, 1]), acts), spec, **kw
        )
    with pytest.raises(codec.ProtocolError, match="names 5 lanes"):
        shm.unpack_step(
            shm.pack_step(1, np.arange(5), np.ones(5), np.zeros((5, 2), np.float32)),
            spec,
            **kw,
        )
    result = codec.ResultBatch(
        np.array([1]), np.array([1]), np.array([1]), np.array([0.5]),
        np.array([True]), np.array([False]), {}, {}, {}, None,
    )  # fmt: skip
    data = shm.pack_result(4, 0.25, result)
    reply, got = shm.unpack_result(data, num_lanes=2)
    assert (reply.call_id, reply.server_step_seconds, reply.ByteSize()) == (
        4,
        0.25,
        len(data),
    )
    np.testing.assert_array_equal(got.rewards, [0.5])
    np.testing.assert_array_equal(got.terminated, [True])
    with pytest.raises(codec.ProtocolError, match="names lane 1"):
        shm.unpack_result(data, num_lanes=1)
    with pytest.raises(codec.ProtocolError, match="does not hold"):
        shm.unpack_result(data[:-1], num_lanes=2)
    with pytest.raises(codec.ProtocolError, match="other than 0 and 1"):
        shm.unpack_result(data[:-1] + b"\x02", num_lanes=2)
