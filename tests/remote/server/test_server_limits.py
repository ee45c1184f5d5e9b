"""What a client cannot make the env server do: hold it past its idle timeout,
make it allocate from an unbounded request, or make the client hang on close.

Real servers on 127.0.0.1 (port 0), driven by the raw stub client of
tests/remote/server/test_server.py or by jaxmesh's own clients, and stopped by
each test.
Times are checked against generous bounds only.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import grpc
import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxmesh
from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.server import ServeOptions

from .test_server import (
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


@pytest.mark.parametrize(
    "options, code, words",
    [
        # The receive limit (1 MiB for one CartPole lane) refuses it unread.
        (ServeOptions(), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
        # Under a larger receive limit, the handshake's own 1 MiB cap does.
        (
            ServeOptions(max_request_bytes=8 << 20),
            grpc.StatusCode.INVALID_ARGUMENT,
            "handshake",
        ),
    ],
)
def test_a_handshake_over_its_byte_limit_is_refused_before_parsing(
    options, code, words
):
    with serving(f"gymnasium:{ID}", options=options) as server, client(server) as raw:
        request_ = pb.HandshakeRequest(token="x" * (2 * 1024 * 1024))
        err = rpc_error(raw.stub.Handshake, request_)
        assert err.code() == code
        assert words in err.details().lower() and len(err.details()) < 400
        assert raw.handshake().protocol_version == 1


# Authentication before bytes --------------------------------------------------------
SERVE_WITH_TOKEN = """
import gymnasium as gym
from jaxmesh.remote.server import EnvServer, ServeOptions
server = EnvServer([gym.make("CartPole-v1")], "127.0.0.1:0",
                   options=ServeOptions(token="sekret"))
print(server.start().address, flush=True)
server.serve()
"""


def _megabytes(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def test_unauthenticated_calls_cannot_make_the_server_hold_their_bytes():
    # Eight concurrent 64 MiB calls with no token, a wrong one or to the health
    # service: each is refused before its message is read, so the server's
    # peak memory grows by far less than one of them (it grew by their sum).
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_TOKEN], stdout=subprocess.PIPE, text=True
    )
    try:
        address = proc.stdout.readline().strip()
        assert address, "the server did not start"
        peak_before = _megabytes(proc.pid, "VmHWM")
        channel = grpc.insecure_channel(
            address, options=[("grpc.max_send_message_length", 2**31 - 1)]
        )
        payload = b"\x0a\x80\x80\x80\x20" + b"x" * (64 << 20)  # field 1, 64 MiB
        calls = [
            ("/jaxmesh.env.v1.EnvService/Handshake", ()),
            ("/jaxmesh.env.v1.EnvService/Handshake", (("authorization", "Bearer no"),)),
            # The right token with a space more: tokens are compared exactly.
            (
                "/jaxmesh.env.v1.EnvService/Handshake",
                (("authorization", "Bearer sekret "),),
            ),
            ("/jaxmesh.env.v1.EnvService/Shutdown", ()),
            ("/grpc.health.v1.Health/Check", ()),
        ]
        codes: dict = {}

        def call(i: int) -> None:
            method, metadata = calls[i % len(calls)]
            try:
                channel.unary_unary(method)(payload, timeout=60, metadata=metadata)
            except grpc.RpcError as err:
                codes.setdefault(method.rsplit("/", 1)[1], set()).add(err.code())

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        channel.close()
        grew = _megabytes(proc.pid, "VmHWM") - peak_before
        assert codes == {
            "Handshake": {grpc.StatusCode.UNAUTHENTICATED},
            "Shutdown": {grpc.StatusCode.UNAUTHENTICATED},
            "Check": {grpc.StatusCode.RESOURCE_EXHAUSTED},
        }
        assert grew < 16, f"the server's peak memory grew by {grew:.0f} MiB"
        # The server serves on, for the right token.
        with jaxmesh.RemoteEnv(address, token="sekret") as env:
            env.reset(seed=0)
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_token_with_spaces_around_it_is_refused_by_the_client():
    with serving(f"gymnasium:{ID}", options=ServeOptions(token="sekret")) as server:
        with pytest.raises(ValueError, match="compared exactly"):
            jaxmesh.RemoteEnv(server.address, token=" sekret\n")
        with jaxmesh.RemoteEnv(server.address, token="sekret") as env:
            env.reset(seed=0)


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
                    served=jaxmesh.Served(reply_timeout=timeout),
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
