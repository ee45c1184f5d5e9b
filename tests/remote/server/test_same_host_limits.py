"""The same-host data path's socket (``jaxmesh.remote.shm``) against clients
that do not play by its rules: another user, connections that send nothing
or dribble their HELLO, malformed HELLOs, a server killed while a client
attaches.

Every test talks to a real ``EnvServer`` in a child process over its real
abstract Unix socket, with frames written here by hand (the header is
``<IBBxx``: payload bytes, kind, ring slot). The server's threads and memory
are read from ``/proc``; ``/dev/shm`` is listed before and after.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from jaxmesh.remote.server import ServeOptions
from jaxmesh.remote.server.same_host import peer_refusal
from jaxmesh.remote.session import Session

from .test_server import Raw

HEADER = struct.Struct("<IBBxx")
HELLO, ATTACH, REFUSE = 1, 2, 4

SERVE = """
import sys
import gymnasium as gym
from jaxmesh.remote.server import EnvServer, ServeOptions
options = ServeOptions(handshake_timeout_seconds=float(sys.argv[1]))
server = EnvServer([gym.make("CartPole-v1")], "127.0.0.1:0", options=options)
server.start()
if sys.argv[2] == "other-user":  # as if this server ran as another user
    server._same_host.uid += 1
print(server.address, flush=True)
server.serve()
"""


@contextlib.contextmanager
def serving(deadline: float = 10.0, who: str = "me"):
    """A server process: ``(process, address, socket name)``; stopped after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(deadline), who],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = proc.stdout.readline().strip()
        assert address, proc.stderr.read()
        raw = Raw(address)
        name = raw.handshake().shared_memory
        raw.channel.close()
        assert name, "the server offers no same-host path"
        yield proc, address, name
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def connect(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + name)  # blocking: waits while the backlog is full
    sock.settimeout(30)
    return sock


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind, 255) + payload


def read_frame(sock: socket.socket) -> tuple[int, dict] | None:
    """The next frame as ``(kind, JSON payload)``; None: the server closed."""
    head = b""
    while len(head) < HEADER.size:
        try:
            got = sock.recv(HEADER.size - len(head))
        except ConnectionResetError:
            got = b""
        if not got:
            return None
        head += got
    size, kind, _ = HEADER.unpack(head)
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return kind, json.loads(data)


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def peak_megabytes(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (waits for it; a refusal it sent
    first is read past)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_only_the_servers_user_may_attach():
    assert peer_refusal(1000, 1000) is None
    why = peer_refusal(1001, 1000)
    assert "uid 1000" in why and "uid 1001" in why and "transport='grpc'" in why


def first_frame_as_nobody(name: str) -> tuple[int, dict] | None:
    """What a client running as user ``nobody`` (65534) reads first from the
    socket ``name`` without sending anything (a forked child; needs root)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plain socket calls, then out
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            sock = connect(name)
            os.write(write, json.dumps(read_frame(sock)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)


def test_another_users_client_is_refused_before_its_hello_is_read():
    # The client sends nothing: the refusal comes at the accept, before the
    # server reads a byte (it read and sized the HELLO first, then sat waiting
    # for the bytes of a declared 1 MiB HELLO). As root, the client really is
    # another user; else the server takes this user for another one.
    if os.geteuid() == 0:
        with serving() as (_, _, name):
            kind, status = first_frame_as_nobody(name)
        assert (kind, status["code"]) == (REFUSE, "PERMISSION_DENIED")
        assert "runs as uid 65534" in status["details"]
    with serving(who="other-user") as (_, _, name):
        sock = connect(name)
        kind, status = read_frame(sock)
        assert kind == REFUSE
        assert status["code"] == "PERMISSION_DENIED"
        assert "server's user" in status["details"]
        assert closed(sock)
        sock.close()


def test_idle_and_dribbling_connections_hold_no_threads_and_no_memory():
    # 200 connections declare a HELLO and send a byte of it (every tenth
    # declares 1 MiB); a client that sends its HELLO at once still attaches
    # meanwhile, and every one of them is closed: the oversized at once, the
    # rest by the deadline or to make room. The server had a thread and a
    # buffer of the declared size for each.
    with serving(deadline=2.0) as (proc, address, name):
        with Session(address, transport="shm") as session:  # warmed up
            session.open()
        before_threads, before_peak = threads(proc.pid), peak_megabytes(proc.pid)
        socks = []
        for i in range(200):
            sock = connect(name)
            size = 1 << 20 if i % 10 == 0 else 2000
            with contextlib.suppress(OSError):
                sock.sendall(HEADER.pack(size, HELLO, 255) + b"{")
            socks.append(sock)
        with Session(address, transport="shm") as session:
            session.open()
            assert session.transport == "shm"
        most_threads = threads(proc.pid)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(b" ")
        assert all(closed(sock) for sock in socks)
        for sock in socks:
            sock.close()
        grew = peak_megabytes(proc.pid) - before_peak
        # The session's own thread and its reader may come and go.
        assert most_threads <= before_threads + 2, (before_threads, most_threads)
        assert grew < 16, f"the server's peak memory grew by {grew:.0f} MiB"


def test_a_hello_sent_a_byte_at_a_time_is_cut_off_at_the_deadline():
    # A byte every 0.25 s keeps any timeout per read from firing; the deadline
    # (1 s from the accept) closes the connection long before 40 bytes.
    with serving(deadline=1.0) as (_, _, name):
        sock = connect(name)
        sent = 0
        with contextlib.suppress(OSError):
            sock.sendall(HEADER.pack(40, HELLO, 255))
            for _ in range(40):
                time.sleep(0.25)
                sock.sendall(b" ")
                sent += 1
        assert sent < 40
        assert closed(sock)
        sock.close()


@pytest.mark.parametrize(
    "payload, says",
    [
        (frame(HELLO, b"[1, 2]"), "not a map"),
        (frame(HELLO, b"\xff\xfe"), "not UTF-8 JSON"),
        (frame(HELLO, json.dumps({"keys": [[1]]}).encode()), "list of strings"),
        (frame(HELLO, json.dumps({"keys": [], "token": 3}).encode()), "token is"),
        (frame(7, b"{}"), "kind 7, not HELLO"),
        (HEADER.pack(1 << 20, HELLO, 255), "over the"),
    ],
)
def test_a_malformed_hello_is_refused_in_one_frame_and_no_traceback(payload, says):
    with serving() as (proc, address, name):
        sock = connect(name)
        sock.sendall(payload)
        kind, status = read_frame(sock)
        assert (kind, status["code"]) == (REFUSE, "INVALID_ARGUMENT")
        assert says in status["details"]
        assert closed(sock)
        sock.close()
        with Session(address, transport="shm") as session:  # serves on
            session.open()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err


def test_a_server_killed_while_a_client_attaches_leaves_nothing_in_dev_shm():
    with serving() as (proc, _, name):
        sock = connect(name)
        hello = {"token": "", "keys": [], "frames": []}
        sock.sendall(frame(HELLO, json.dumps(hello).encode()))
        head = b""
        while len(head) < HEADER.size:  # ATTACH: the client sits here
            head += sock.recv(HEADER.size - len(head))
        assert HEADER.unpack(head)[1] == ATTACH
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        sock.close()
        left = [f for f in os.listdir("/dev/shm") if f"_{proc.pid}_" in f]
        assert left == []


def test_the_handshake_deadline_is_checked():
    with pytest.raises(ValueError, match="handshake_timeout_seconds=0"):
        ServeOptions(handshake_timeout_seconds=0)
    assert ServeOptions().handshake_timeout_seconds == 10.0
