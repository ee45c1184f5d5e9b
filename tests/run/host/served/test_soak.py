"""A bounded soak: three served envs, 2,000 short episodes, two servers lost.

Real ``jaxmesh serve-env`` child processes on 127.0.0.1. Mid-run one server is
killed (SIGKILL) and started again at the same address (the run rejoins it),
and another one stops answering (SIGSTOP, caught by ``reply_timeout``).
The unfaulted run is the same budget stepped in this process (its episodes
equal a plain gymnasium loop's: tests/envs/gymnasium/test_gymnasium.py): every
episode must equal it bit for bit, and the run must leave no thread or socket behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from gym_reference import ID, lean, start_serve_env, start_serve_envs

import jaxmesh

EPISODES = 2000
CAP = 8


def serve(address: str = "127.0.0.1:0"):
    return start_serve_env(f"gymnasium:{ID}", "--lanes", "4", "--address", address)


def sockets() -> int:
    """Open sockets of this process."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


class Faults:
    """Kills server 0 at episode 400 and starts it again; stops server 1 at 900."""

    def __init__(self, procs):
        self.procs = procs
        self.faults: list[dict] = []

    def on_episode_end(self, ep):
        if ep.index == 400:
            proc, address = self.procs[0]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.procs[0] = serve(address)  # back at the same address
        elif ep.index == 900:
            self.procs[1][0].send_signal(signal.SIGSTOP)

    def on_fault(self, info):
        self.faults.append(info)


@pytest.mark.slow  # make test: one lost server at a time (test_server_loss.py)
def test_a_run_that_loses_two_of_three_servers_equals_the_unfaulted_run():
    seeds = list(range(EPISODES))
    want = jaxmesh.evaluate(
        lean, f"gymnasium:{ID}", num_envs=12, seeds=seeds, max_episode_steps=CAP
    )
    threads, socks = threading.active_count(), sockets()
    args = (f"gymnasium:{ID}", "--lanes", "4", "--address", "127.0.0.1:0")
    procs = start_serve_envs(args, args, args)
    try:
        hook = Faults(procs)
        t0 = time.perf_counter()
        got = jaxmesh.evaluate(
            lean,
            [f"grpc://{a}" for _, a in procs],
            num_envs=12,
            seeds=seeds,
            max_episode_steps=CAP,
            hooks=hook,
            served=jaxmesh.Served(reply_timeout=1.0),
        )
        wall = time.perf_counter() - t0
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()
    assert got.indices.tolist() == list(range(EPISODES))
    for f in ("seeds", "returns", "lengths", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    np.testing.assert_array_equal(got.predict_calls, want.predict_calls)
    losses = got.server_losses
    assert [x["server"] for x in losses] == [procs[0][1], procs[1][1]]
    assert "DEADLINE_EXCEEDED" in losses[1]["error"] or "within" in losses[1]["error"]
    # The restarted server was rejoined and ran episodes again; the stopped one
    # never answered again.
    assert losses[0]["rejoined_at_seconds"] > losses[0]["at_seconds"]
    assert losses[1]["rejoined_at_seconds"] is None
    assert sorted(f["event"] for f in hook.faults) == ["lost", "lost", "rejoined"]
    assert got.telemetry["server_rejoined"]["count"] == 1
    assert set(got.lanes[got.indices > 1500].tolist()) & {0, 3, 6, 9}
    assert wall < 60
    # Nothing left behind: reader threads and channels end with the run.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        threading.active_count() > threads or sockets() > socks
    ):
        time.sleep(0.05)
    assert threading.active_count() <= threads
    assert sockets() <= socks
