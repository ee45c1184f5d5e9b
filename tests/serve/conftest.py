"""The serving tests' check that a test leaves no thread behind: a server's
shutdown joins everything it started, and each test closes its clients."""

from __future__ import annotations

import threading

import pytest


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
