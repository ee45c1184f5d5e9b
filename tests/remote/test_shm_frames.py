"""The same-host control frames (``jaxmesh.remote.shm``) read off a real Unix
socket pair: a frame header packed by hand (``<IBBxx``: payload size, kind,
slot), its payload, and the two ways a frame is refused."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from jaxmesh.remote import codec, shm

HEADER = struct.Struct("<IBBxx")


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_a_frame_is_read_whole(pair):
    a, b = pair
    a.sendall(HEADER.pack(5, 7, 2) + b"hello")
    assert shm.recv_frame(b, limit=5) == (7, 2, b"hello")
    a.sendall(HEADER.pack(0, 3, 255))
    assert shm.recv_frame(b, limit=5) == (3, 255, b"")
    a.close()
    assert shm.recv_frame(b, limit=5) is None


def test_a_frame_over_the_limit_is_refused(pair):
    a, b = pair
    a.sendall(HEADER.pack(100, 7, 2) + b"x" * 100)
    with pytest.raises(
        codec.ProtocolError, match=r"^a frame of 100 bytes is over the 10 byte limit$"
    ):
        shm.recv_frame(b, limit=10)


def test_a_frame_cut_short_says_so(pair):
    a, b = pair
    a.sendall(HEADER.pack(10, 7, 2) + b"abc")
    a.close()
    with pytest.raises(ConnectionResetError, match="mid-frame"):
        shm.recv_frame(b, limit=10)


def test_an_attach_frame_carries_its_descriptor(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        shm.send_attach(a, b"payload", w)
        (kind, slot, payload), fd = shm.recv_attach(b)
    finally:
        os.close(w)
    try:
        assert (slot, payload) == (255, b"payload")
        assert fd >= 0 and fd != w
        os.write(fd, b"!")  # the received descriptor is the pipe's write end
        assert os.read(r, 1) == b"!"
    finally:
        os.close(fd)
        os.close(r)


def test_an_answer_to_hello_over_a_mebibyte_is_refused(pair):
    a, b = pair
    a.sendall(HEADER.pack((1 << 20) + 1, 7, 2))
    with pytest.raises(
        codec.ProtocolError,
        match=r"^a frame of 1048577 bytes is over the 1048576 byte limit$",
    ):
        shm.recv_attach(b)


def test_an_answer_to_hello_cut_short_says_so(pair):
    a, b = pair
    a.sendall(HEADER.pack(10, 7, 2) + b"abc")
    a.close()
    with pytest.raises(ConnectionResetError, match="mid-frame"):
        shm.recv_attach(b)
