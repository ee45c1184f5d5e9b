"""Frames a stranger sends to a real ``jaxmesh serve-policy`` process, over
both protocols: a small frame that would unpack into millions of Python
objects is refused with the reason, the server's memory (its peak resident
set, read from /proc) stays bounded, and a normal frame still works."""

from __future__ import annotations

import socket
import struct

import grpc
import msgpack
import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy
from serve_models import linear_reference

from jaxmesh.serve.grpc_service import METHOD

from .conftest import memory_bytes, serve_policy_child

#: 4 MB: an array of four million empty maps (one byte each).
EMPTY_MAPS = b"\xdd" + (4_000_000).to_bytes(4, "big") + b"\x80" * 4_000_000
#: 4 MB of nested arrays of empty maps, no list longer than 2,000.
NESTED = msgpack.packb([[{}] * 2000] * 2000)
#: The most the server's peak memory may grow for one such frame (it was
#: about 300 MB before decoding was bounded).
GROWTH_BYTES = 64 << 20


def test_openpi_refuses_a_frame_of_millions_of_containers_in_bounded_memory():
    with serve_policy_child("serve_models:LINEAR") as (address, proc):
        url = f"ws://{address}"
        with websockets.sync.client.connect(url, max_size=None) as ws:
            ws.recv(timeout=10)  # the metadata
            state = np.array([1.0, -2.0, 0.5], np.float32)
            ws.send(msgpack_numpy.packb({"observation/state": state}))
            reply = msgpack_numpy.unpackb(ws.recv(timeout=60))  # warm
            np.testing.assert_allclose(reply["actions"], linear_reference(state))
        before = memory_bytes(proc.pid, "VmHWM")
        for frame, why in ((EMPTY_MAPS, "max_array_len"), (NESTED, "65536")):
            with websockets.sync.client.connect(url, max_size=None) as ws:
                ws.recv(timeout=10)
                ws.send(frame)
                text = ws.recv(timeout=60)
                assert isinstance(text, str) and "CodecError" in text and why in text
        assert memory_bytes(proc.pid, "VmHWM") - before < GROWTH_BYTES
        with websockets.sync.client.connect(url) as ws:  # served on
            ws.recv(timeout=10)
            ws.send(msgpack_numpy.packb({"observation/state": state}))
            reply = msgpack_numpy.unpackb(ws.recv(timeout=60))
            np.testing.assert_allclose(reply["actions"], linear_reference(state))


def test_grpc_refuses_a_message_of_millions_of_containers_in_bounded_memory():
    with serve_policy_child("serve_models:LINEAR", "--protocol", "grpc") as (
        address,
        proc,
    ):
        before = memory_bytes(proc.pid, "VmHWM")
        with grpc.insecure_channel(address) as channel:
            call = channel.stream_stream(METHOD)
            for frame, why in ((EMPTY_MAPS, "max_array_len"), (NESTED, "65536")):
                with pytest.raises(grpc.RpcError) as refused:
                    next(call(iter([frame]), timeout=60))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert why in refused.value.details()
            assert memory_bytes(proc.pid, "VmHWM") - before < GROWTH_BYTES
            # A message of the protocol is still read (and this one refused
            # for what it says, not for its bytes).
            with pytest.raises(grpc.RpcError) as refused:
                next(call(iter([msgpack.packb({"open": {}})]), timeout=60))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "needs 'env'" in refused.value.details()


def _frame(payload: bytes) -> bytes:
    """``payload`` as one masked binary websocket frame (a zero mask)."""
    n = len(payload)
    if n < 126:
        size = bytes([0x80 | n])
    elif n < 1 << 16:
        size = b"\xfe" + struct.pack(">H", n)
    else:
        size = b"\xff" + struct.pack(">Q", n)
    return b"\x82" + size + b"\0\0\0\0" + payload


def test_a_client_that_never_reads_its_replies_is_held_back_not_buffered():
    # Each request is 8 MB; each reply 4 MiB, which the client never reads:
    # the server waits on the first reply, and reads at most one more frame,
    # so TCP stops the client. (It buffered 16 frames, +145 MB, before.)
    request = msgpack_numpy.packb(
        {"observation/state": np.ones(3, np.float32), "pad": np.zeros(2_000_000, "f4")}
    )
    with serve_policy_child("serve_models:BIG_REPLY") as (address, proc):
        host, port = address.rsplit(":", 1)
        with websockets.sync.client.connect(f"ws://{address}", max_size=None) as ws:
            ws.recv(timeout=10)  # the metadata
            ws.send(request)
            ws.recv(timeout=60)  # compiled and answered: warm
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            )
            before = memory_bytes(proc.pid)
            sock.settimeout(5)  # sendall stalls once the server stops reading
            sent = 0
            with pytest.raises(TimeoutError):
                for _ in range(40):
                    sock.sendall(_frame(request))
                    sent += 1
            assert sent < 40
            assert memory_bytes(proc.pid) - before < GROWTH_BYTES
