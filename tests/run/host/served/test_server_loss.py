"""A served run that loses a server: the others run its unfinished episodes again.

Real servers: ``jaxmesh serve-env`` child processes on 127.0.0.1, one of them
killed (SIGKILL) from a hook in the middle of the run. The reference is the
plain gymnasium loop of ``gym_reference`` (written from the contract): every
episode of the budget must equal it, the lost server's unfinished ones
included, as if nothing had happened.
"""

from __future__ import annotations

import io
import signal
import threading

import gymnasium as gym
import jax
import pytest
from gym_reference import ID, chunky, lean, per_step, plain_loop, start_serve_envs
from reference_loop import assert_matches

import jaxmesh
from jaxmesh.cli.hooks import Progress

SEEDS = list(range(24))
_REFS: dict = {}


def refs(kind: str) -> list:
    if kind not in _REFS:
        if kind == "lean":
            _REFS[kind] = plain_loop(gym.make(ID), per_step(lean), SEEDS)
        else:
            fn = jax.jit(chunky)
            _REFS[kind] = plain_loop(
                gym.make(ID), lambda x, k: fn(x), SEEDS, horizon=4, lead=2
            )
    return _REFS[kind]


@pytest.fixture
def two_servers():
    lanes = (f"gymnasium:{ID}", "--lanes", "2")
    procs = start_serve_envs(lanes, lanes)
    yield procs
    for proc, _ in procs:
        proc.kill()
        proc.wait()


class KillAt:
    """Kills a server when episode ``index`` ends; records ``on_fault``."""

    def __init__(self, proc, index: int):
        self.proc, self.index = proc, index
        self.faults: list[dict] = []

    def on_episode_end(self, ep):
        if ep.index == self.index and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def on_fault(self, info):
        self.faults.append(info)


@pytest.mark.parametrize(
    "policy, kind, kw",
    [
        (lean, "lean", {}),  # h = 1: the per-step road
        # segments
        (
            chunky,
            "chunky",
            {"horizon": 4, "chunking": jaxmesh.Chunking(prefetch_lead=2)},
        ),
    ],
)
def test_a_lost_server_s_episodes_run_again_on_the_other(two_servers, policy, kind, kw):
    (victim, lost), (_, kept) = two_servers
    hook = KillAt(victim, 5)
    got = jaxmesh.evaluate(
        policy,
        [f"grpc://{lost}", f"grpc://{kept}"],
        num_envs=4,
        seeds=SEEDS,
        hooks=hook,
        **kw,
    )
    want = refs(kind)
    assert got.indices.tolist() == list(range(len(SEEDS)))
    assert_matches(got, want)
    assert got.env_steps >= sum(r.length for r in want)
    # Lanes 0 and 2 were the lost server's (lanes are dealt round-robin); the
    # episodes that started after the loss ran on lanes 1 and 3.
    assert len(got.server_losses) == 1
    loss = got.server_losses[0]
    assert loss["server"] == lost and loss["lanes"] == 2
    assert 1 <= loss["episodes_rerun"] <= 2
    assert hook.faults == [loss]
    assert got.telemetry["server_lost"]["count"] == 1
    assert set(got.lanes[got.indices > 8].tolist()) <= {1, 3}
    # The record survives a round trip through the results JSON.
    again = jaxmesh.RunResult.from_dict(got.to_dict())
    assert again.server_losses == got.server_losses


def test_on_server_loss_raise_ends_the_run_with_finished_episodes(two_servers):
    (victim, lost), (_, kept) = two_servers
    with pytest.raises(jaxmesh.RemoteConnectionError, match=lost) as e:
        jaxmesh.evaluate(
            lean,
            [f"grpc://{lost}", f"grpc://{kept}"],
            num_envs=4,
            seeds=SEEDS,
            hooks=KillAt(victim, 5),
            served=jaxmesh.Served(on_server_loss="raise"),
        )
    partial = e.value.partial_result
    assert set(range(6)) <= set(partial.indices.tolist())
    assert_matches(partial, [refs("lean")[i] for i in partial.indices])


def test_on_server_loss_is_checked_before_anything_starts():
    with pytest.raises(ValueError, match="on_server_loss='retry'.*'rerun'"):
        jaxmesh.evaluate(
            lean, "grpc://127.0.0.1:1", served=jaxmesh.Served(on_server_loss="retry")
        )
    with pytest.raises(ValueError, match="drop on_server_loss="):
        jaxmesh.evaluate(
            lean, [gym.make(ID)], served=jaxmesh.Served(on_server_loss="rerun")
        )


class StopAt(KillAt):
    """Stops a server (SIGSTOP: it lives, holds its connections and answers
    nothing) when episode ``index`` ends."""

    def on_episode_end(self, ep):
        if ep.index == self.index and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)


@pytest.mark.parametrize(
    "policy, kind, kw",
    [
        (lean, "lean", {}),
        (
            chunky,
            "chunky",
            {"horizon": 4, "chunking": jaxmesh.Chunking(prefetch_lead=2)},
        ),
    ],
)
def test_a_hung_server_is_dropped_by_the_default_reply_timeout(
    two_servers, policy, kind, kw, monkeypatch
):
    # The default rule: a server that owes a reply and sends nothing for 10x
    # the slowest reply of the run (here, at least 1 s instead of 10 s, to keep
    # the test short) is dropped; the other runs its episodes again.
    from jaxmesh.run import backend

    monkeypatch.setattr(backend, "AUTO_FLOOR_SECONDS", 1.0)
    (victim, hung), (_, kept) = two_servers
    hook = StopAt(victim, 5)
    try:
        got = jaxmesh.evaluate(
            policy,
            [f"grpc://{hung}", f"grpc://{kept}"],
            num_envs=4,
            seeds=SEEDS,
            hooks=hook,
            **kw,
        )
    finally:
        victim.send_signal(signal.SIGCONT)
    assert_matches(got, refs(kind))
    assert got.indices.tolist() == list(range(len(SEEDS)))
    assert len(got.server_losses) == 1
    loss = got.server_losses[0]
    assert loss["server"] == hung and "default reply timeout" in loss["error"]
    assert hook.faults[0] == dict(loss, rejoined_at_seconds=None)
    # The summary and the CLI's progress say so.
    row = next(line for line in got.summary().splitlines() if "server lost" in line)
    assert hung in row and "2 lanes out" in row
    out = io.StringIO()
    Progress(enabled=False, stream=out).on_fault(hook.faults[0])
    assert out.getvalue().startswith(f"jaxmesh: lost the env server {hung} (")
    assert "run again" in out.getvalue()


def test_reply_timeout_none_still_waits_for_a_stopped_server(two_servers):
    # reply_timeout=None waits as long as the server takes: stopped for 1.5 s
    # (past a 1 s default), it is kept, and no episode runs again.
    (victim, slow), (_, kept) = two_servers

    class Pause(StopAt):
        def on_episode_end(self, ep):
            if ep.index == self.index:
                self.proc.send_signal(signal.SIGSTOP)
                threading.Timer(1.5, self.proc.send_signal, (signal.SIGCONT,)).start()

    got = jaxmesh.evaluate(
        lean,
        [f"grpc://{slow}", f"grpc://{kept}"],
        num_envs=4,
        seeds=SEEDS,
        hooks=Pause(victim, 5),
        served=jaxmesh.Served(reply_timeout=None),
    )
    assert_matches(got, refs("lean"))
    assert got.server_losses == []
