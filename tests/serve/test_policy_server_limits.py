"""``PolicyServer(protocol="grpc")`` against clients that hold what they do
not use: streams that send nothing, sessions of very many lanes, sessions of
ever new lane counts. Real servers on 127.0.0.1; the streams are raw gRPC
calls of the service's one method, and a real ``jaxmesh.RemotePolicy`` run is
checked against the plain loop (``test_remote_policy.plain_stacked``)."""

from __future__ import annotations

import threading
import time

import grpc
import gymnasium
import jax
import numpy as np
import pytest

import jaxmesh
from jaxmesh.envs.gymnasium.spec import spec_for
from jaxmesh.serve import codec
from jaxmesh.serve.agents import MAX_PROGRAMS, spec_to_wire
from jaxmesh.serve.grpc_service import METHOD

from .test_remote_policy import SEEDS, Stacked, plain_stacked, run

CARTPOLE = "gymnasium:CartPole-v1"


class Streams:
    """``n`` raw Session streams on one channel; ``messages`` each sends
    (then nothing more until ``close``)."""

    def __init__(self, address: str, n: int, messages: list[bytes] = ()):
        self.channel = grpc.insecure_channel(address)
        self.gate = threading.Event()

        def requests():
            yield from messages
            self.gate.wait()

        call = self.channel.stream_stream(METHOD)
        self.calls = [call(requests()) for _ in range(n)]

    def ends(self, wait: float = 60.0) -> list:
        """Each stream's end, ``(code, details)`` (None: still open after
        ``wait`` s); the replies before it are skipped."""
        out: list = [None] * len(self.calls)

        def watch(i: int) -> None:
            try:
                for _ in self.calls[i]:
                    pass
            except grpc.RpcError as e:
                out[i] = (e.code(), e.details())

        threads = [
            threading.Thread(target=watch, args=(i,), daemon=True)
            for i in range(len(self.calls))
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + wait
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return list(out)  # as they were by now

    def close(self) -> None:
        self.gate.set()
        for call in self.calls:
            call.cancel()
        self.channel.close()


def open_message(num_envs: int) -> bytes:
    env = gymnasium.make("CartPole-v1")
    spec = spec_for("CartPole-v1", env.observation_space, env.action_space, "test")
    env.close()
    settings = {"num_envs": num_envs}
    return codec.packb({"open": {"env": spec_to_wire(spec), "settings": settings}})


def test_streams_that_send_nothing_are_ended_and_free_the_server():
    # Four streams hold all four of the server's streams and send nothing: a
    # real client would be refused (RESOURCE_EXHAUSTED) for as long as they
    # stay. Each is ended after the idle timeout, saying why, and the real
    # client's run then gives the plain loop's episodes.
    with jaxmesh.PolicyServer(
        Stacked(), protocol="grpc", max_connections=4, idle_timeout=1.0
    ) as server:
        idle = Streams(server.address, 4)
        try:
            ends = idle.ends()
        finally:
            idle.close()
        assert all(end is not None for end in ends), ends
        for code, details in ends:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "idle_timeout" in details and "1 s" in details
        got = run(jaxmesh.RemotePolicy(server.url), CARTPOLE, 2)
    returns, lengths, _ = plain_stacked(SEEDS)
    np.testing.assert_array_equal(got.returns, returns)
    np.testing.assert_array_equal(got.lengths, lengths)


def test_an_opened_session_that_goes_quiet_is_ended():
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc", idle_timeout=1.0) as server:
        quiet = Streams(server.address, 1, [open_message(2)])
        try:
            ((code, details),) = quiet.ends()
        finally:
            quiet.close()
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "heard nothing" in details


def test_a_session_of_more_lanes_than_the_server_opens_is_refused_by_name():
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc") as server:
        # 20 million lanes, sent by hand: refused before anything is sized.
        big = Streams(server.address, 1, [open_message(20_000_000)])
        try:
            ((code, details),) = big.ends()
        finally:
            big.close()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "num_envs=20000000" in details and "4096" in details
        assert "--max-lanes" in details
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc", max_lanes=2) as server:
        with pytest.raises(ValueError, match="num_envs=3.*at most 2 lanes"):
            run(jaxmesh.RemotePolicy(server.url), CARTPOLE, 3)
        got = run(jaxmesh.RemotePolicy(server.url), CARTPOLE, 2)
    np.testing.assert_array_equal(got.returns, plain_stacked(SEEDS)[0])


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="idle_timeout=0"):
        jaxmesh.PolicyServer(Stacked(), protocol="grpc", idle_timeout=0)
    with pytest.raises(ValueError, match="max_lanes=0"):
        jaxmesh.PolicyServer(Stacked(), protocol="grpc", max_lanes=0)


def live_bytes() -> int:
    return sum(x.nbytes for x in jax.live_arrays())


def test_a_closed_session_frees_its_lanes():
    # One session of a million lanes: its state is tens of MB of device
    # arrays, held by the server while the session is open and freed after.
    with jaxmesh.PolicyServer(
        Stacked(), protocol="grpc", max_lanes=1_000_000
    ) as server:
        before = live_bytes()
        big = Streams(server.address, 1, [open_message(1_000_000)])
        try:
            reply = next(big.calls[0])
            assert "opened" in codec.unpackb(reply, max_bytes=1 << 20)
            held = live_bytes() - before
        finally:
            big.close()
        for _ in range(600):  # the server sees the stream end a moment later
            if live_bytes() - before < held / 10:
                break
            time.sleep(0.05)
        left = live_bytes() - before
    assert held > 20e6, f"the open session holds {held} bytes"
    assert left < held / 10, f"{left} of the session's {held} bytes left"


def test_sessions_of_ever_new_lane_counts_keep_a_bounded_number_of_programs():
    returns = plain_stacked(SEEDS)[0]
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc") as server:
        for lanes in range(1, MAX_PROGRAMS + 3):
            got = run(jaxmesh.RemotePolicy(server.url), CARTPOLE, lanes)
            np.testing.assert_array_equal(got.returns, returns)
            assert server.compiled <= MAX_PROGRAMS
        assert server.compiled == MAX_PROGRAMS


def test_serve_policy_takes_the_limits_from_its_command_line():
    from .conftest import serve_policy_process

    with serve_policy_process(
        "serve.test_remote_policy:Stacked",
        "--protocol",
        "grpc",
        "--idle-timeout",
        "1",
        "--max-lanes",
        "2",
    ) as address:
        quiet = Streams(address, 1)
        try:
            ((code, details),) = quiet.ends()
        finally:
            quiet.close()
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "1 s" in details
        with pytest.raises(ValueError, match="num_envs=3.*at most 2 lanes"):
            run(jaxmesh.RemotePolicy(address), CARTPOLE, 3)
