"""The serving tests' check that a test leaves no thread behind (a server's
shutdown joins everything it started, and each test closes its clients), and
a real ``jaxmesh serve-policy`` process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxmesh.cli.cache import CACHE_SWITCH_ENV

#: tests/, on the server process's path: it imports the policy from a test module.
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_thread_left():
    """Fails a test that leaves a thread running (servers, batchers and
    clients must all be shut down and joined)."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in left:
        t.join(5.0)
    left = [t.name for t in left if t.is_alive()]
    assert not left, f"threads left running after the test: {left}"


@contextlib.contextmanager
def serve_policy_process(*args: str) -> Iterator[str]:
    """A ``jaxmesh serve-policy ARGS`` child process, serving: yields the
    address it announced on ``--ready-fd``; at the end it is sent SIGTERM and
    must exit with status 0 (it is killed if it is still running)."""
    with serve_policy_child(*args) as (address, _):
        yield address


@contextlib.contextmanager
def serve_policy_child(*args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``serve_policy_process``, yielding the address and the process."""
    read, write = os.pipe()
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmesh.cli", "serve-policy", *args]
        + ["--ready-fd", str(write)],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, CACHE_SWITCH_ENV: "0", "PYTHONPATH": path},
    )
    os.close(write)
    try:
        with os.fdopen(read, "rb") as ready:
            line = ready.readline().decode()
        assert line.endswith("\n"), f"never served: {proc.communicate()[1]}"
        yield line.strip(), proc
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def memory_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's memory as ``/proc/PID/status`` reports it, bytes:
    ``VmRSS`` (resident now) or ``VmHWM`` (its peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/PID/status")
