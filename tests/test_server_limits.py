"""What a client cannot make the env server do: hold it past its idle timeout,
make it allocate from an unbounded request, or make the client hang on close.

Real servers on 127.0.0.1 (port 0), driven by the raw stub client of
tests/test_server.py or by jaxmesh's own clients, and stopped by each test.
Times are checked against generous bounds only.
"""

from __future__ import annotations

import threading
import time

import grpc
import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces
from test_server import (
    Raw,
    act,
    client,
    lanes_of,
    request,
    reset,
    rpc_error,
    serving,
    session_when_free,
)

import jaxmesh
from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.server import ServeOptions

ID = "CartPole-v1"


class Wide(gym.Env):
    """A 256 KiB observation: a few unread replies fill the flow-control window."""

    observation_space = spaces.Box(0, 255, (256 * 1024,), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, **kwargs):
        super().reset(**kwargs)
        return np.zeros(256 * 1024, np.uint8), {}

    def step(self, action):
        return np.zeros(256 * 1024, np.uint8), 0.0, False, False, {}


# The idle watchdog -----------------------------------------------------------------
def test_a_client_that_never_reads_its_replies_is_ended_within_the_idle_timeout():
    idle = 2.0
    options = ServeOptions(idle_timeout_seconds=idle)
    stop = threading.Event()

    def flood():
        """A reset, then steps for as long as gRPC takes them (never a read)."""
        yield request(1, [reset(0, 0)])
        step = request(1, actions=[act(0, [1])])
        while not stop.is_set():
            yield step

    with serving(Wide(), options=options) as server, client(server) as raw:
        greedy = Raw(server.address)
        try:
            replies = greedy.stub.Step(flood())  # never read
            time.sleep(0.5)  # let it fill the windows
            t0 = time.monotonic()
            # A second client gets the server within the idle timeout and a few
            # seconds, although the first one neither reads nor closes.
            new = session_when_free(raw, 1, within=idle + 6.0)
            assert time.monotonic() - t0 < idle + 6.0
            assert lanes_of(new.call(request(1, actions=[act(0, [1])])))[0].steps == 1
            new.close()
        finally:
            stop.set()
            replies.cancel()
            greedy.close()


# Bounded handshakes and requests -------------------------------------------------
@pytest.mark.parametrize("with_one", [False, True], ids=["none-spoken", "one-spoken"])
def test_a_handshake_with_very_many_versions_is_refused_short_and_fast(with_one):
    versions = list(range(2, 100_002))
    if with_one:
        versions[-1] = 1  # a version the server speaks, at the end of the list
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        t0 = time.monotonic()
        err = rpc_error(raw.handshake, versions)
        assert time.monotonic() - t0 < 5.0
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.details()
        assert len(details) < 400, details
        assert "100000 protocol versions" in details
        assert "[2, 3, 4" in details  # the first few, not the list
        # The server serves on.
        assert raw.handshake().protocol_version == 1


def test_a_handshake_over_its_byte_limit_is_refused_before_parsing():
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        request_ = pb.HandshakeRequest(token="x" * (2 * 1024 * 1024))
        err = rpc_error(raw.stub.Handshake, request_)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "handshake" in err.details().lower() and len(err.details()) < 400
        assert raw.handshake().protocol_version == 1


def test_a_refused_version_list_names_its_count_and_first_few():
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        err = rpc_error(raw.handshake, list(range(2, 42)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "40 versions" in err.details() and "[2, 3, 4" in err.details()
        assert "41" not in err.details()
        assert len(err.details()) < 400


def _too_many():
    long = "k" * 100_000
    return {
        "info_keys": (
            request(2, [reset(0, 0)], info_keys=[f"k{i}" for i in range(100_000)]),
            "100000 info keys",
        ),
        "observation_keys": (
            request(2, [reset(0, 0)], keys=[f"k{i}" for i in range(100_000)]),
            "100000 observation keys",
        ),
        "a long info key": (request(2, [reset(0, 0)], info_keys=[long]), "info key"),
        "a long observation key": (request(2, [reset(0, 0)], keys=[long]), "kkk"),
        "release": (
            pb.StepRequest(lane_mask=[True, True], release=[0] * 100_000),
            "release names 100000 lanes",
        ),
        "batch lanes": (
            pb.StepRequest(
                lane_mask=[True, True],
                batch=pb.ActionBatch(
                    lanes=codec.encode_array(np.arange(100_000, dtype=np.uint32)),
                    counts=codec.encode_array(np.ones(100_000, np.uint32)),
                ),
            ),
            "100000 lanes",
        ),
        "tensor dims": (
            pb.StepRequest(
                lane_mask=[True, True],
                batch=pb.ActionBatch(
                    lanes=pb.Tensor(dtype="uint32", shape=[1] * 100_000),
                ),
            ),
            "100000 dimensions",
        ),
        "action keys": (
            pb.StepRequest(
                lane_mask=[True, True],
                batch=pb.ActionBatch(
                    lanes=codec.encode_array(np.zeros(1, np.uint32)),
                    counts=codec.encode_array(np.ones(1, np.uint32)),
                    actions={long: codec.encode_array(np.zeros(1, np.int64))},
                ),
            ),
            "kkk",
        ),
    }


@pytest.mark.parametrize("name", list(_too_many()))
def test_unbounded_request_fields_are_refused_short(name):
    bad, words = _too_many()[name]
    with serving(f"gymnasium:{ID}", lanes=2) as server, client(server) as raw:
        session = raw.session()
        session.call(request(2, [reset(0, 0)]))
        t0 = time.monotonic()
        err = rpc_error(session.call, bad)
        assert time.monotonic() - t0 < 5.0
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert words in err.details(), err.details()
        assert len(err.details()) < 600, err.details()
        session = session_when_free(raw, 2)
        assert lanes_of(session.call(request(2, actions=[act(0, [1])])))[0].steps == 1
        session.close()


# reply_timeout and close ---------------------------------------------------------
class Sleepy(gym.Wrapper):
    """CartPole whose 3rd step sleeps ``seconds`` (until released): an env that
    hangs without dying. ``hung_at`` is when the sleep began."""

    def __init__(self, seconds: float):
        super().__init__(gym.make(ID))
        self.seconds = seconds
        self.released = threading.Event()
        self.hung_at: float | None = None
        self.t = 0

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self.t += 1
        if self.t == 3:
            self.hung_at = time.monotonic()
            self.released.wait(self.seconds)
        return self.env.step(action)


def test_reply_timeout_raises_within_the_timeout_and_a_second():
    env = Sleepy(seconds=30.0)
    timeout = 0.5
    with serving(env) as server:
        try:
            with pytest.raises(jaxmesh.RemoteConnectionError, match="reply_timeout"):
                jaxmesh.evaluate(
                    lambda o: jnp.int32(0),
                    f"grpc://{server.address}",
                    num_envs=1,
                    episodes=2,
                    reply_timeout=timeout,
                )
            raised = time.monotonic()
            assert env.hung_at is not None
            assert raised - env.hung_at < timeout + 1.5
        finally:
            env.released.set()


def test_remote_env_close_after_a_timed_out_step_does_not_wait_for_the_server():
    env = Sleepy(seconds=30.0)
    with serving(env) as server:
        try:
            remote = jaxmesh.RemoteEnv(f"grpc://{server.address}", reply_timeout=0.5)
            remote.reset(seed=0)
            remote.step(0)
            remote.step(0)
            t0 = time.monotonic()
            with pytest.raises(jaxmesh.RemoteConnectionError, match="reply_timeout"):
                remote.step(0)
            assert time.monotonic() - t0 < 0.5 + 1.5
            t0 = time.monotonic()
            remote.close()
            assert time.monotonic() - t0 < 1.5
        finally:
            env.released.set()
