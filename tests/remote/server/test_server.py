"""The env server (``jaxmesh.remote.server``) against plain gymnasium loops.

Every test starts a real server on 127.0.0.1 (port 0, the actual port read
back) and stops it, and talks to it with a small raw client written here from
the generated stub, never jaxmesh's own client. The references are plain
gymnasium loops over the env's own ``reset``/``step``, and hand-worked values.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import time
from typing import Any, NamedTuple

import grpc
import gymnasium as gym
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from jaxmesh import cli
from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.proto import jaxmesh_env_pb2_grpc as pb_grpc
from jaxmesh.remote.server import SERVICE_NAME, EnvServer, ServeOptions
from jaxmesh.remote.spaces import leaf_space, space_leaf

ID = "CartPole-v1"
BIG = 64 * 1024 * 1024
STEP_METHOD = f"/{SERVICE_NAME}/Step"


# A raw client ---------------------------------------------------------------------
class Raw:
    """The generated stub over one channel, with the token as metadata."""

    def __init__(self, address: str, token: str | None = None):
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", BIG),
                ("grpc.max_receive_message_length", BIG),
            ],
        )
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None

    def handshake(self, versions=(1,), token: str = "") -> pb.HandshakeReply:
        request = pb.HandshakeRequest(protocol_versions=versions, token=token)
        return self.stub.Handshake(request, metadata=self.metadata, timeout=10)

    def session(self) -> Session:
        return Session(self.stub.Step, self.metadata)

    def close(self) -> None:
        self.channel.close()


class Session:
    """One Step stream: ``call`` sends a request and waits for its reply."""

    def __init__(self, method, metadata=None):
        self.queue: queue.Queue = queue.Queue()
        self.replies = method(iter(self.queue.get, None), metadata=metadata)

    def call(self, request):
        self.queue.put(request)
        return next(self.replies)

    def close(self) -> None:
        self.queue.put(None)
        with contextlib.suppress(StopIteration):
            next(self.replies)


@contextlib.contextmanager
def serving(env: Any, **kwargs):
    server = EnvServer(env, "127.0.0.1:0", **kwargs).start()
    try:
        yield server
    finally:
        server.shutdown()


@contextlib.contextmanager
def client(server: EnvServer, token: str | None = None):
    raw = Raw(server.address, token)
    try:
        yield raw
    finally:
        raw.close()


def rpc_error(fn, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args)
    return info.value


def session_when_free(raw: Raw, num_lanes: int, within: float = 10.0) -> Session:
    """A session whose first call (a reset of lane 0) succeeded.

    The server frees a session when its serving thread notices the stream
    ended, which can trail the client's view of the end by a moment: retry
    while it answers "busy", for at most ``within`` seconds.
    """
    give_up = time.monotonic() + within
    while True:
        session = raw.session()
        try:
            session.call(request(num_lanes, resets=[reset(0, 0)]))
            return session
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            if time.monotonic() > give_up:
                raise
            time.sleep(0.01)


# Requests ------------------------------------------------------------------------
def reset(lane: int, seed: int, options=None, seconds: float = 0.0) -> pb.LaneReset:
    msg = pb.LaneReset(lane=lane, seed=seed, max_episode_seconds=seconds)
    for name, value in (options or {}).items():
        msg.options[name].CopyFrom(pb.Value(int_value=value))
    return msg


class Chunk(NamedTuple):
    """One lane's actions in one call (its rows of the call's ActionBatch)."""

    lane: int
    actions: np.ndarray


def act(lane: int, actions, dtype=np.int64) -> Chunk:
    return Chunk(lane, np.asarray(actions, dtype))


def action_batch(
    lanes, counts, actions: dict[str, np.ndarray], index_dtype=np.uint32
) -> pb.ActionBatch:
    """An ActionBatch as the proto describes it, field by field: lanes and
    counts as uint32 vectors, each action leaf with sum(counts) rows."""
    msg = pb.ActionBatch(
        lanes=codec.encode_array(np.asarray(lanes, index_dtype)),
        counts=codec.encode_array(np.asarray(counts, np.uint32)),
    )
    for key, x in actions.items():
        msg.actions[key].CopyFrom(codec.encode_array(x))
    return msg


def request(
    num_lanes: int,
    resets=(),
    actions=(),
    *,
    keys=("",),
    info_keys=(),
    all_observations=False,
    call_id=0,
    batch: pb.ActionBatch | None = None,
    mask=(),
) -> pb.StepRequest:
    """A StepRequest: the Chunks in ``actions`` (in the order given) make its
    batch, unless ``batch`` is given; lane_mask sets the lanes named by the
    resets, the chunks and ``mask``."""
    chunks = list(actions)
    if batch is None and chunks:
        batch = action_batch(
            [c.lane for c in chunks],
            [c.actions.shape[0] for c in chunks],
            {"": np.concatenate([c.actions for c in chunks])},
        )
    named = {r.lane for r in resets} | {c.lane for c in chunks} | set(mask)
    return pb.StepRequest(
        lane_mask=[j in named for j in range(num_lanes)],
        resets=list(resets),
        batch=batch,
        observation_keys=list(keys),
        info_keys=list(info_keys),
        all_observations=all_observations,
        call_id=call_id,
    )


class LaneStep(NamedTuple):
    """One lane's part of a reply's ResultBatch."""

    steps: int
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    observation: dict[str, np.ndarray]
    info: dict[str, np.ndarray]


def lanes_of(reply: pb.StepReply) -> dict[int, LaneStep]:
    """The reply's batch cut per lane: lane i owns the next ``steps[i]`` entries
    of the per-step vectors and the next ``rows[i]`` rows of each leaf."""
    b = codec.decode_result_batch(reply.batch)
    assert b.lanes.tolist() == sorted(set(b.lanes.tolist()))  # ascending, once
    out, s, r = {}, 0, 0
    for lane, steps, rows in zip(
        b.lanes.tolist(), b.steps.tolist(), b.rows.tolist(), strict=True
    ):
        out[lane] = LaneStep(
            steps,
            b.rewards[s : s + steps],
            b.terminated[s : s + steps],
            b.truncated[s : s + steps],
            {k: v[r : r + rows] for k, v in b.observation.items()},
            {k: v[r : r + rows] for k, v in b.info.items()},
        )
        s, r = s + steps, r + rows
    return out


# References ----------------------------------------------------------------------
def reference(env_id: str, seed: int, actions) -> dict[str, Any]:
    """A plain gymnasium loop: reset(seed), then the actions until the end."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    out = {"obs": [np.asarray(obs)], "rewards": [], "term": [], "trunc": []}
    for a in actions:
        obs, r, te, tr, _ = env.step(int(a))
        out["obs"].append(np.asarray(obs))
        out["rewards"].append(r)
        out["term"].append(te)
        out["trunc"].append(tr)
        if te or tr:
            break
    env.close()
    return out


def actions_for(seed: int, n: int = 600) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, n)


# Small envs of our own -------------------------------------------------------------
class Counter(gym.Env):
    """Observation [seed, trial, t]; never ends; info {"t": t, "name": "x"}.

    Declares the ``trial_index`` reset option when ``trial`` is set; records
    the keyword arguments of every reset. Steps sleep ``sleep`` seconds.
    """

    def __init__(self, trial: bool = False, sleep: float = 0.0, fail_at: int = -1):
        self.observation_space = spaces.Box(-1e9, 1e9, (3,), np.float64)
        self.action_space = spaces.Discrete(3, start=-1)
        self.metadata = {"reset_options": ["trial_index"]} if trial else {}
        self.sleep, self.fail_at = sleep, fail_at
        self.resets: list[dict] = []
        self.actions: list[int] = []

    def reset(self, **kwargs):
        self.resets.append(kwargs)
        self.seed_ = kwargs.get("seed")
        self.trial = (kwargs.get("options") or {}).get("trial_index", -1)
        self.t = 0
        return self._obs(), {"t": 0, "name": "x"}

    def _obs(self):
        return np.array([self.seed_, self.trial, self.t], np.float64)

    def step(self, action):
        assert isinstance(action, int), type(action)
        if self.t == self.fail_at:
            raise ValueError(f"boom at step {self.t}")
        if self.sleep:
            time.sleep(self.sleep)
        self.actions.append(action)
        self.t += 1
        return self._obs(), float(action), False, False, {"t": self.t, "name": "x"}


class Big(gym.Env):
    """An observation of 512 x 600 float32 (1.2 MB)."""

    observation_space = spaces.Box(0, 1, (512, 600), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, **kwargs):
        super().reset(**kwargs)
        return np.zeros((512, 600), np.float32), {}

    def step(self, action):
        return np.zeros((512, 600), np.float32), 0.0, False, False, {}


# Spaces ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "space",
    [
        gym.make("CartPole-v1").observation_space,
        gym.make("CartPole-v1").action_space,
        gym.make("Pendulum-v1").observation_space,
        gym.make("Pendulum-v1").action_space,
        gym.make("HalfCheetah-v5").observation_space,
        gym.make("HalfCheetah-v5").action_space,
        spaces.Discrete(5, start=3),
        spaces.Box(0, 255, (4, 4, 3), np.uint8),
    ],
    ids=repr,
)
def test_spaces_round_trip(space):
    msg = space_leaf(space)
    again = leaf_space(pb.LeafSpec.FromString(msg.SerializeToString()))
    assert again == space
    assert again.dtype == space.dtype


def test_space_leaf_fields_and_refusal():
    msg = space_leaf(spaces.Discrete(5, start=3))
    assert (msg.space, msg.dtype, list(msg.shape), msg.n, msg.start) == (
        "discrete",
        "int64",
        [],
        5,
        3,
    )
    box = space_leaf(spaces.Box(-2.0, 2.0, (2,), np.float32))
    assert (box.space, box.dtype, list(box.shape)) == ("box", "float32", [2])
    # A bound whose entries are all equal travels as one scalar; others whole.
    assert codec.decode_array(box.low).tolist() == -2.0
    box = space_leaf(spaces.Box(np.array([-1, -2], np.float32), 2.0, (2,), np.float32))
    assert codec.decode_array(box.low).tolist() == [-1.0, -2.0]
    assert codec.decode_array(box.high).tolist() == 2.0
    with pytest.raises(TypeError, match="MultiBinary.*Box or Discrete"):
        space_leaf(spaces.MultiBinary(3))
    with pytest.raises(codec.ProtocolError, match="'cube'"):
        leaf_space(pb.LeafSpec(key="", dtype="int64", space="cube"))


# Handshake ------------------------------------------------------------------------
def test_handshake_declares_the_env():
    envs = [gym.make(ID) for _ in range(3)]
    with serving(envs) as server, client(server) as raw:
        reply = raw.handshake()
        assert reply.protocol_version == 1
        assert list(reply.server_protocol_versions) == [1]
        assert reply.server_version.startswith("jaxmesh ")
        assert reply.num_lanes == 3
        assert reply.env_name == "gymnasium:CartPole-v1"
        assert leaf_space(reply.observation[0]) == envs[0].observation_space
        assert leaf_space(reply.action[0]) == envs[0].action_space
        assert reply.observation[0].key == "" and reply.action[0].key == ""
        assert list(reply.reset_options) == []
        assert set(reply.capabilities) == {
            "chunk_replay",
            "info_keys",
            "info_every_step",
            "max_episode_seconds",
            "shared_memory",
        }
        err = rpc_error(raw.handshake, (7, 8))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "[7, 8]" in err.details() and "[1]" in err.details()


# Replay against a plain loop ---------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7])
def test_replay_matches_plain_loop(chunk):
    seed, actions = 5, actions_for(5)
    ref = reference(ID, seed, actions)
    length = len(ref["rewards"])
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        session = raw.session()
        first = lanes_of(session.call(request(1, [reset(0, seed)])))[0]
        assert first.steps == 0 and first.rewards.shape == (0,)
        np.testing.assert_array_equal(first.observation[""][0], ref["obs"][0])
        rewards, term, trunc, obs = [], [], [], []
        t, call_id = 0, 1
        while t < length:
            reply = session.call(
                request(
                    1,
                    actions=[act(0, actions[t : t + chunk])],
                    all_observations=True,
                    call_id=call_id,
                )
            )
            assert reply.call_id == call_id
            assert reply.server_step_seconds >= 0
            lane = lanes_of(reply)[0]
            assert 1 <= lane.steps <= chunk
            assert lane.observation[""].shape == (lane.steps, 4)
            rewards += lane.rewards.tolist()
            term += lane.terminated.tolist()
            trunc += lane.truncated.tolist()
            obs += list(lane.observation[""])
            t += lane.steps
            call_id += 1
        # It stopped at the episode's end, exactly.
        assert t == length
        assert rewards == ref["rewards"]
        assert term == ref["term"] and trunc == ref["trunc"]
        np.testing.assert_array_equal(np.stack(obs), np.stack(ref["obs"][1:]))
        # After the end nothing executes until a reset, in later calls too.
        for _ in range(2):
            lane = lanes_of(session.call(request(1, actions=[act(0, [0, 1, 0])])))[0]
            assert lane.steps == 0 and lane.rewards.shape == (0,)
            assert lane.observation[""].shape == (0, 4)
        lane = lanes_of(session.call(request(1, [reset(0, seed)])))[0]
        np.testing.assert_array_equal(lane.observation[""][0], ref["obs"][0])
        lane = lanes_of(session.call(request(1, actions=[act(0, actions[:3])])))[0]
        assert lane.steps == 3
        session.close()


def test_all_observations_off_sends_the_last_only():
    seed, actions = 2, actions_for(2)
    ref = reference(ID, seed, actions)
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        session = raw.session()
        session.call(request(1, [reset(0, seed)]))
        lane = lanes_of(session.call(request(1, actions=[act(0, actions[:5])])))[0]
        assert lane.steps == 5 and lane.observation[""].shape == (1, 4)
        np.testing.assert_array_equal(lane.observation[""][0], ref["obs"][5])
        both = session.call(
            request(1, actions=[act(0, actions[5:9])], all_observations=True)
        )
        lane = lanes_of(both)[0]
        np.testing.assert_array_equal(lane.observation[""], np.stack(ref["obs"][6:10]))
        # No observation key asked for: none crosses the wire.
        lane = lanes_of(session.call(request(1, actions=[act(0, [0])], keys=())))[0]
        assert lane.observation == {} and lane.steps == 1
        session.close()


def drive(raw: Raw, num_lanes: int, seeds_per_lane: list[list[int]], chunk: int):
    """Runs each lane's episodes (its seeds, in order) with every live lane in
    every call with ``chunk`` actions, and the lanes whose episode ended reset
    in the same call as the others' actions (as a lockstep server needs);
    returns per (lane, episode) the rewards, terminated, truncated and
    observations seen."""
    session = raw.session()
    done: dict[tuple[int, int], dict] = {}
    episode = [0] * num_lanes
    t = [0] * num_lanes
    live: dict[int, dict] = {}
    starting = list(range(num_lanes))
    while live or starting:
        resets = [reset(j, seeds_per_lane[j][episode[j]]) for j in starting]
        acts = []
        for j in sorted(live):
            seq = actions_for(seeds_per_lane[j][episode[j]])
            acts.append(act(j, seq[t[j] : t[j] + chunk]))
        reply = session.call(request(num_lanes, resets, acts, all_observations=True))
        results = lanes_of(reply)
        assert sorted(results) == sorted(starting + [c.lane for c in acts])
        for j in starting:
            res = results.pop(j)
            assert res.steps == 0 and res.observation[""].shape == (1, 4)
            t[j] = 0
            live[j] = {
                "obs": [res.observation[""][0]],
                "rewards": [],
                "term": [],
                "trunc": [],
            }
        starting = []
        for j, res in results.items():
            rec = live[j]
            rec["rewards"] += res.rewards.tolist()
            rec["term"] += res.terminated.tolist()
            rec["trunc"] += res.truncated.tolist()
            rec["obs"] += list(res.observation[""])
            t[j] += res.steps
            if res.steps and (res.terminated[-1] or res.truncated[-1]):
                done[(j, episode[j])] = live.pop(j)
                episode[j] += 1
                if episode[j] < len(seeds_per_lane[j]):
                    starting.append(j)
    session.close()
    return done


def check_drive(done, seeds_per_lane):
    for (j, e), rec in done.items():
        seed = seeds_per_lane[j][e]
        ref = reference(ID, seed, actions_for(seed))
        assert rec["rewards"] == ref["rewards"], (j, e)
        assert rec["term"] == ref["term"] and rec["trunc"] == ref["trunc"]
        np.testing.assert_array_equal(np.stack(rec["obs"]), np.stack(ref["obs"]))
    assert len(done) == sum(len(s) for s in seeds_per_lane)


SEEDS_16 = [[3 * j + 1, 3 * j + 100] for j in range(16)]


@pytest.mark.parametrize("workers", [None, 4])
def test_sixteen_lanes_match_separate_loops(workers):
    envs = [gym.make(ID) for _ in range(16)]
    options = ServeOptions(workers=workers)
    with serving(envs, options=options) as server, client(server) as raw:
        done = drive(raw, 16, SEEDS_16, chunk=6)
    check_drive(done, SEEDS_16)


def test_worker_processes_serve_sixteen_lanes_as_separate_loops():
    """serve-env --workers 2 on an id: the lanes live in two worker processes
    (``ProcessStepper``); chunk replays, ends mid-chunk and resets give the
    separate plain loops' results."""
    options = ServeOptions(workers=2)
    env = f"gymnasium:{ID}"
    with serving(env, lanes=16, options=options) as server, client(server) as raw:
        assert type(server._lanes.lanes).__name__ == "ProcessStepper"
        done = drive(raw, 16, SEEDS_16, chunk=6)
    check_drive(done, SEEDS_16)


def test_disabled_vector_env_matches_separate_loops():
    vec = SyncVectorEnv(
        [lambda: gym.make(ID) for _ in range(16)],
        autoreset_mode=AutoresetMode.DISABLED,
    )
    with serving(vec) as server, client(server) as raw:
        assert raw.handshake().num_lanes == 16
        done = drive(raw, 16, SEEDS_16, chunk=5)
    check_drive(done, SEEDS_16)
    vec.close()


def test_vector_env_in_another_mode_is_refused():
    vec = SyncVectorEnv([lambda: gym.make(ID)] * 2)
    with pytest.raises(ValueError, match="AutoresetMode.DISABLED"):
        EnvServer(vec).start()
    vec.close()


def disabled_vector(n: int) -> SyncVectorEnv:
    return SyncVectorEnv(
        [lambda: gym.make(ID) for _ in range(n)],
        autoreset_mode=AutoresetMode.DISABLED,
    )


def check_step(res: LaneStep, ref: dict, t: int) -> None:
    """One replayed step of a lane equals step t of the plain loop ``ref``."""
    assert res.steps == 1
    np.testing.assert_array_equal(res.observation[""][0], ref["obs"][t + 1])
    assert res.rewards.tolist() == [ref["rewards"][t]]
    assert res.terminated.tolist() == [ref["term"][t]]
    assert res.truncated.tolist() == [ref["trunc"][t]]


def test_lockstep_vector_env_refuses_lanes_left_out_or_uneven():
    vec = disabled_vector(3)
    with serving(vec) as server, client(server) as raw:
        assert "lockstep" in raw.handshake().capabilities
        session = raw.session()
        session.call(request(3, [reset(j, j) for j in range(3)]))
        # Lane 2 is mid-episode and left out.
        err = rpc_error(session.call, request(3, actions=[act(0, [1]), act(1, [1])]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "lanes [2]" in err.details() and "'lockstep'" in err.details()
        # Every lane, but not the same count.
        session = session_when_free(raw, 3)  # lane 0 reset
        session.call(request(3, [reset(1, 1), reset(2, 2)], [act(0, [1])]))
        uneven = [act(0, [1, 0]), act(1, [1, 0, 1]), act(2, [0, 1])]
        err = rpc_error(session.call, request(3, actions=uneven))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "counts [2, 3]" in err.details() and "'lockstep'" in err.details()
        # A call that only resets steps nothing, so it may leave lanes out
        # (gymnasium's own partial reset with reset_mask).
        session = session_when_free(raw, 3)
        session.call(request(3, [reset(1, 1)], [act(0, [1])]))
        assert lanes_of(session.call(request(3, [reset(2, 5)])))[2].steps == 0
        # Released lanes are left out of later calls (they count as ended).
        released = request(3, actions=[act(0, [1])])
        released.release.extend([1, 2])
        released.lane_mask[1] = released.lane_mask[2] = True
        assert lanes_of(session.call(released))[0].steps == 1
        assert lanes_of(session.call(request(3, actions=[act(0, [1])])))[0].steps == 1
        session.close()
        # The server lives on.
        session = session_when_free(raw, 3)
        assert lanes_of(session.call(request(3, actions=[act(0, [1])])))[0].steps == 1
        session.close()
    vec.close()


def test_lockstep_reset_of_an_ended_lane_is_not_stepped():
    # Lane 0 pushes right until its pole falls; lanes 1 and 2 alternate and
    # last longer. Lane 0 is then reset in the call that steps lanes 1 and 2:
    # its next step must be the plain loop's first step after that reset, and
    # lanes 1 and 2 must not notice.
    alt = np.arange(600) % 2
    right = np.ones(600, np.int64)
    ref0, ref0b = reference(ID, 21, right), reference(ID, 24, right)
    ref = {1: reference(ID, 22, alt), 2: reference(ID, 23, alt)}
    n0 = len(ref0["rewards"])
    assert n0 + 2 < min(len(r["rewards"]) for r in ref.values())  # the premise
    vec = disabled_vector(3)
    with serving(vec) as server, client(server) as raw:
        session = raw.session()
        first = lanes_of(
            session.call(request(3, [reset(0, 21), reset(1, 22), reset(2, 23)]))
        )
        np.testing.assert_array_equal(first[0].observation[""][0], ref0["obs"][0])
        for t in range(n0):
            step = [act(0, [1]), act(1, [alt[t]]), act(2, [alt[t]])]
            got = lanes_of(session.call(request(3, actions=step)))
            check_step(got[0], ref0, t)
            check_step(got[1], ref[1], t)
            check_step(got[2], ref[2], t)
        assert got[0].terminated[-1]  # lane 0's episode ended at step n0
        t = n0
        step = [act(1, [alt[t]]), act(2, [alt[t]])]
        got = lanes_of(session.call(request(3, [reset(0, 24)], step)))
        assert got[0].steps == 0
        np.testing.assert_array_equal(got[0].observation[""][0], ref0b["obs"][0])
        check_step(got[1], ref[1], t)
        check_step(got[2], ref[2], t)
        t += 1
        step = [act(0, [1]), act(1, [alt[t]]), act(2, [alt[t]])]
        got = lanes_of(session.call(request(3, actions=step)))
        check_step(got[0], ref0b, 0)
        check_step(got[1], ref[1], t)
        check_step(got[2], ref[2], t)
        session.close()
    vec.close()


def test_lockstep_reset_abandons_an_episode_mid_way():
    # A client that caps an episode (max_episode_steps) resets its lane while
    # the env has not ended it: that lane needs no actions in that call.
    alt = np.arange(600) % 2
    seeds = {0: 31, 1: 32, 2: 33}
    ref = {j: reference(ID, s, alt) for j, s in seeds.items()}
    ref1b = reference(ID, 34, alt)
    vec = disabled_vector(3)
    with serving(vec) as server, client(server) as raw:
        session = raw.session()
        session.call(request(3, [reset(j, s) for j, s in seeds.items()]))
        for t in range(3):
            step = [act(j, [alt[t]]) for j in range(3)]
            got = lanes_of(session.call(request(3, actions=step)))
            assert not any(got[j].terminated[-1] for j in range(3))
        step = [act(0, [alt[3]]), act(2, [alt[3]])]
        got = lanes_of(session.call(request(3, [reset(1, 34)], step)))
        np.testing.assert_array_equal(got[1].observation[""][0], ref1b["obs"][0])
        check_step(got[0], ref[0], 3)
        check_step(got[2], ref[2], 3)
        step = [act(0, [alt[4]]), act(1, [alt[0]]), act(2, [alt[4]])]
        got = lanes_of(session.call(request(3, actions=step)))
        check_step(got[0], ref[0], 4)
        check_step(got[1], ref1b, 0)
        check_step(got[2], ref[2], 4)
        session.close()
    vec.close()


def test_an_empty_action_batch_steps_nothing():
    with serving(f"gymnasium:{ID}", lanes=2) as server, client(server) as raw:
        session = raw.session()
        session.call(request(2, [reset(0, 0)]))
        empty = action_batch([], [], {"": np.zeros(0, np.int64)})
        assert lanes_of(session.call(request(2, batch=empty))) == {}
        got = lanes_of(session.call(request(2, [reset(1, 1)], batch=empty)))
        assert list(got) == [1] and got[1].steps == 0
        session.close()


# Reset options, clocks, infos ---------------------------------------------------------
def test_trial_index_and_infos():
    env = Counter(trial=True)
    with serving(env) as server, client(server) as raw:
        reply = raw.handshake()
        (option,) = reply.reset_options
        assert option.name == "trial_index" and option.value.int_value == 0
        session = raw.session()
        lane = lanes_of(session.call(request(1, [reset(0, 11, {"trial_index": 7})])))
        assert lane[0].observation[""][0].tolist() == [11, 7, 0]
        assert env.resets[-1] == {"seed": 11, "options": {"trial_index": 7}}
        session.call(request(1, [reset(0, 12)]))
        assert env.resets[-1] == {"seed": 12}  # no options argument at all
        reply = session.call(
            request(
                1,
                actions=[act(0, [1, -1, 0, 1])],
                info_keys=("t", "name", "absent"),
                all_observations=True,
            )
        )
        lane = lanes_of(reply)[0]
        assert env.actions == [1, -1, 0, 1]  # the env's own values, as ints
        assert lane.rewards.tolist() == [1.0, -1.0, 0.0, 1.0]
        assert lane.rewards.dtype == np.float64
        assert list(lane.info) == ["t"]  # numeric keys asked for only
        assert lane.info["t"].tolist() == [1, 2, 3, 4]
        # Without observation keys the info rows follow all_observations too.
        for every, rows in ((True, [5, 6, 7]), (False, [10])):
            reply = session.call(
                request(
                    1,
                    actions=[act(0, [0, 0, 0])],
                    keys=(),
                    info_keys=("t",),
                    all_observations=every,
                )
            )
            lane = lanes_of(reply)[0]
            assert lane.observation == {} and lane.info["t"].tolist() == rows
        session.close()


class Sometimes(Counter):
    """A Counter whose step info has ``is_success`` on even steps only."""

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if self.t % 2 == 0:
            info = {**info, "is_success": self.t % 4 == 0}
        return obs, reward, term, trunc, info


@pytest.mark.parametrize("chunk", [1, 3])
def test_info_keys_some_rows_lack_are_sent_with_a_presence_mask(chunk):
    # Two lanes stepped together (chunk 1 takes the server's one-step path):
    # rows without the key hold zeros and are marked absent; a key no row has
    # ("absent") is left out; a key every row has needs no mask.
    envs = [Sometimes(), Sometimes()]
    with serving(envs) as server, client(server) as raw:
        raw.handshake()
        session = raw.session()
        session.call(request(2, [reset(0, 1), reset(1, 2)]))
        want = {0: [], 1: []}
        for call in range(4):
            # Lane 1 is one step ahead of lane 0 after the first call.
            lanes = [0, 1] if call else [1]
            reply = session.call(
                request(
                    2,
                    actions=[act(j, [0] * chunk) for j in lanes],
                    info_keys=("is_success", "t", "absent"),
                    all_observations=True,
                )
            )
            b = codec.decode_result_batch(reply.batch)
            assert "absent" not in b.info and "t" not in b.info_present
            ts = b.info["t"].tolist()
            if not any(t % 2 == 0 for t in ts):  # no row has it: left out
                assert "is_success" not in b.info
            else:
                rows = np.ones(len(ts), bool)
                have = b.info_present.get("is_success", rows).tolist()
                assert have == [t % 2 == 0 for t in ts]
                assert b.info["is_success"].tolist() == [
                    (t % 4 == 0) if t % 2 == 0 else False for t in ts
                ]
            for j in lanes:
                want[j] += [0] * chunk
        assert envs[0].actions == want[0] and envs[1].actions == want[1]
        session.close()


def test_max_episode_seconds_truncates():
    with serving(Counter(sleep=0.01)) as server, client(server) as raw:
        session = raw.session()
        session.call(request(1, [reset(0, 1, seconds=0.05)]))
        lane = lanes_of(session.call(request(1, actions=[act(0, [1] * 1000)])))[0]
        assert 1 <= lane.steps < 1000
        assert lane.truncated[-1] and not lane.truncated[:-1].any()
        assert not lane.terminated.any()
        lane = lanes_of(session.call(request(1, actions=[act(0, [1])])))[0]
        assert lane.steps == 0
        session.close()


# Sessions ----------------------------------------------------------------------------
def test_second_session_is_busy_and_the_first_lives_on():
    with serving(f"gymnasium:{ID}", lanes=2) as server, client(server) as raw:
        first = raw.session()
        first.call(request(2, [reset(0, 0)]))
        second = raw.session()
        err = rpc_error(second.call, request(2, [reset(1, 0)]))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "busy" in err.details() and server.address in err.details()
        assert lanes_of(first.call(request(2, actions=[act(0, [1])])))[0].steps == 1
        first.close()
        session_when_free(raw, 2).close()


def test_idle_timeout_frees_the_session():
    options = ServeOptions(idle_timeout_seconds=0.5)
    with (
        serving(f"gymnasium:{ID}", lanes=2, options=options) as server,
        client(server) as raw,
    ):
        session = raw.session()
        session.call(request(2, [reset(0, 0), reset(1, 0)]))
        err = rpc_error(next, session.replies)  # the server ends it, idle
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "idle" in err.details()
        new = session_when_free(raw, 2)  # it resets lane 0
        # A new session starts with every lane "not reset" again.
        err = rpc_error(new.call, request(2, actions=[act(1, [1])]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reset lane 1 first" in err.details()


def test_a_client_that_cancels_frees_the_session():
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        session = raw.session()
        session.call(request(1, [reset(0, 0)]))
        session.replies.cancel()
        new = session_when_free(raw, 1)
        assert lanes_of(new.call(request(1, actions=[act(0, [1])])))[0].steps == 1
        new.close()


def test_env_exception_is_internal_with_traceback_and_server_lives():
    env = Counter(fail_at=2)
    with serving(env) as server, client(server) as raw:
        session = raw.session()
        session.call(request(1, [reset(0, 0)]))
        err = rpc_error(session.call, request(1, actions=[act(0, [1, 1, 1, 1])]))
        assert err.code() == grpc.StatusCode.INTERNAL
        assert err.details() == (
            "env lane 0 raised ValueError: boom at step 2 (while stepping)"
        )
        trailing = dict(err.trailing_metadata())
        assert trailing["jaxmesh-env-error"] == "ValueError: boom at step 2"
        text = trailing["jaxmesh-traceback-bin"].decode()
        assert "Traceback" in text and "boom at step 2" in text and "in step" in text
        new = session_when_free(raw, 1)
        lane = lanes_of(new.call(request(1, actions=[act(0, [1])])))[0]
        assert lane.steps == 1
        new.close()


class Misshapen(Counter):
    """A Counter whose observation loses an entry from step ``bad_at`` on."""

    def __init__(self, bad_at: int):
        super().__init__()
        self.bad_at = bad_at

    def _obs(self):
        obs = super()._obs()
        return obs[:2] if self.t >= self.bad_at else obs


@pytest.mark.parametrize("chunk", [1, 4])
def test_a_misshapen_observation_names_its_lane_and_server_lives(chunk):
    """One action per lane (the fast path) or a replayed chunk alike."""
    with serving([Counter(), Misshapen(bad_at=3)]) as server, client(server) as raw:
        session = raw.session()
        session.call(request(2, [reset(0, 0), reset(1, 1)]))
        for _ in range(2 if chunk == 1 else 0):  # steps 1, 2: fine
            session.call(request(2, actions=[act(0, [1]), act(1, [1])]))
        acts = [act(0, [1] * chunk), act(1, [1] * chunk)]
        err = rpc_error(session.call, request(2, actions=acts))
        assert err.code() == grpc.StatusCode.INTERNAL
        assert "env lane 1 raised ValueError" in err.details()
        assert "shape (2,)" in err.details() and "(3,)" in err.details()
        new = session_when_free(raw, 2)
        new.call(request(2, [reset(0, 0)]))
        assert lanes_of(new.call(request(2, actions=[act(0, [1])])))[0].steps == 1
        new.close()


def test_reply_over_the_size_limit_is_refused():
    options = ServeOptions(max_message_bytes=1024 * 1024)
    with serving(Big(), options=options) as server, client(server) as raw:
        session = raw.session()
        err = rpc_error(session.call, request(1, [reset(0, 0)]))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1048576 byte" in err.details() and "fewer lanes" in err.details()
        size = int(err.details().split(" bytes")[0].split()[-1])
        assert size > 512 * 600 * 4
        # Asking for no observation fits.
        session = raw.session()
        lane = lanes_of(session.call(request(1, [reset(0, 0)], keys=())))[0]
        assert lane.observation == {}
        session.close()


# Malformed requests ------------------------------------------------------------------
def _bad_requests():
    good = act(0, [1, 0])
    two = np.array([1, 0])
    short = action_batch([0], [2], {})
    short.actions[""].CopyFrom(pb.Tensor(dtype="int64", shape=[2], data=b"\0" * 9))

    def bad(batch: pb.ActionBatch) -> pb.StepRequest:
        return request(2, batch=batch, mask=(0,))

    return {
        "lane_mask": (request(1, actions=[good]), "lane_mask"),
        "lane >= num_lanes": (request(2, [reset(0, 0), reset(5, 0)]), "lane 5"),
        "not in mask": (
            pb.StepRequest(lane_mask=[False, True], batch=request(2, [], [good]).batch),
            "lane_mask",
        ),
        "reset twice": (request(2, [reset(1, 0), reset(1, 2)]), "more than once"),
        "actions twice": (request(2, actions=[good, good]), "strictly ascending"),
        "lanes descending": (
            request(2, actions=[act(1, [0]), act(0, [1])]),
            "strictly ascending",
        ),
        "batch lane >= num_lanes": (
            bad(action_batch([0, 5], [1, 1], {"": two})),
            "lane 5, but the session has 2 lanes",
        ),
        "lanes not uint32": (
            bad(action_batch([0], [2], {"": two}, index_dtype=np.int64)),
            "uint32",
        ),
        "counts per lane": (
            bad(action_batch([0], [1, 1], {"": two})),
            "one count per lane",
        ),
        "reset and step": (request(2, [reset(0, 0)], [good]), "both"),
        "shape": (
            bad(action_batch([0], [2], {"": two[:, None]})),
            "expected int64[2]",
        ),
        "dtype": (request(2, actions=[act(0, [1, 0], np.int32)]), "expected int64"),
        "bytes": (bad(short), "bytes"),
        "count": (bad(action_batch([0], [3], {"": two})), "expected int64[3]"),
        "count 0": (request(2, actions=[act(0, np.zeros(0))]), "counts from 0"),
        "action key": (bad(action_batch([0], [2], {"x": two})), "'x'"),
        "out of range": (request(2, actions=[act(0, [1, 2])]), "Discrete"),
        "obs key": (request(2, actions=[good], keys=("", "pixels")), "pixels"),
        "option": (request(2, [reset(1, 0, {"trial_index": 1})]), "trial_index"),
        "seed": (request(2, [reset(1, -3)]), "seed -3"),
        "never reset": (request(2, actions=[act(1, [0])]), "reset lane 1 first"),
    }


def test_malformed_requests_are_invalid_argument_and_server_lives():
    with serving(f"gymnasium:{ID}", lanes=2) as server, client(server) as raw:
        for name, (bad, words) in _bad_requests().items():
            session = raw.session()
            session.call(request(2, [reset(0, 0)]))
            err = rpc_error(session.call, bad)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert words in err.details(), (name, err.details())
        raw_step = raw.channel.stream_stream(STEP_METHOD)
        session = Session(raw_step)
        err = rpc_error(session.call, b"\xff\xff\xff")
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        session = session_when_free(raw, 2)
        assert lanes_of(session.call(request(2, actions=[act(0, [1])])))[0].steps == 1
        session.close()


@pytest.mark.slow  # make test: the malformed requests above
def test_fuzzed_requests_get_invalid_argument_or_a_reply():
    rng = np.random.default_rng(0)
    seeds = [request(3, [reset(j, j) for j in range(3)]).SerializeToString()]
    seeds += [
        request(
            3, actions=[act(j, rng.integers(0, 2, 4)) for j in range(k)]
        ).SerializeToString()
        for k in (1, 2, 3)
    ]
    seeds.append(request(3, [reset(1, 4)], [act(0, [1])]).SerializeToString())
    prime = request(3, [reset(j, j) for j in range(3)]).SerializeToString()

    def mutate(data: bytes) -> bytes:
        b = bytearray(data)
        kind = rng.integers(0, 5)
        if kind == 0:
            return rng.bytes(int(rng.integers(0, 64)))
        if kind == 1 and b:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        elif kind == 2:
            b = b[: int(rng.integers(0, len(b) + 1))]
        elif kind == 3:
            i = int(rng.integers(0, len(b) + 1))
            b[i:i] = rng.bytes(int(rng.integers(1, 8)))
        else:
            b += seeds[int(rng.integers(0, len(seeds)))]
        return bytes(b)

    outcomes = {"reply": 0, "invalid": 0}
    with serving(f"gymnasium:{ID}", lanes=3) as server, client(server) as raw:
        method = raw.channel.stream_stream(STEP_METHOD)
        session = None
        for _ in range(2000):
            if session is None:
                session = Session(method)
                codec.parse_step_reply(session.call(prime))
            data = mutate(seeds[int(rng.integers(0, len(seeds)))])
            try:
                codec.parse_step_reply(session.call(data))
                outcomes["reply"] += 1
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
                outcomes["invalid"] += 1
                session = None
        assert outcomes["reply"] > 0 and outcomes["invalid"] > 0
        stub = health_pb2_grpc.HealthStub(raw.channel)
        status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING


# Security, health, shutdown ----------------------------------------------------
def test_token_missing_wrong_right():
    options = ServeOptions(token="s3cret")
    with serving(f"gymnasium:{ID}", options=options) as server:
        with client(server) as raw:
            err = rpc_error(raw.handshake)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "token=" in err.details() and "JAXMESH_TOKEN" in err.details()
            err = rpc_error(raw.session().call, request(1, [reset(0, 0)]))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            # The token in the handshake's message alone does not do: the
            # metadata is checked before any message is read.
            err = rpc_error(raw.handshake, (1,), "s3cret")
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        with client(server, token="wrong") as raw:
            err = rpc_error(raw.handshake)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            err = rpc_error(raw.session().call, request(1, [reset(0, 0)]))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        with client(server, token="s3cret") as raw:
            assert raw.handshake().num_lanes == 1
            assert raw.handshake(token="s3cret").num_lanes == 1
            err = rpc_error(raw.handshake, (1,), "wrong")  # both must match
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            session = raw.session()
            session.call(request(1, [reset(0, 0)]))
            session.close()


def test_bind_refusals():
    with pytest.raises(ValueError, match=r"'0\.0\.0\.0:0'.*token.*TLS.*insecure"):
        EnvServer(f"gymnasium:{ID}", "0.0.0.0:0")
    with pytest.raises(ValueError, match="'nonsense'.*HOST:PORT"):
        EnvServer(f"gymnasium:{ID}", "nonsense")
    server = EnvServer(f"gymnasium:{ID}", "0.0.0.0:0", insecure=True).start()
    try:
        port = server.address.rpartition(":")[2]
        with client(server) as raw:
            raw.close()
        raw = Raw(f"127.0.0.1:{port}")
        assert raw.handshake().num_lanes == 1
        raw.close()
        with pytest.raises(OSError, match=f"127.0.0.1:{port}.*in use"):
            EnvServer(f"gymnasium:{ID}", f"127.0.0.1:{port}").start()
    finally:
        server.shutdown()


def test_options_are_checked():
    with pytest.raises(ValueError, match="idle_timeout_seconds=0"):
        ServeOptions(idle_timeout_seconds=0)
    with pytest.raises(ValueError, match="workers=0"):
        ServeOptions(workers=0)
    with pytest.raises(ValueError, match="token"):
        ServeOptions(token="")


def test_health_and_remote_shutdown():
    with serving(f"gymnasium:{ID}") as server, client(server) as raw:
        stub = health_pb2_grpc.HealthStub(raw.channel)
        for service in ("", SERVICE_NAME):
            status = stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert status.status == health_pb2.HealthCheckResponse.SERVING
        err = rpc_error(raw.stub.Shutdown, pb.ShutdownRequest())
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "allow_remote_shutdown" in err.details()
        assert not server.wait(0)
    options = ServeOptions(allow_remote_shutdown=True, drain_timeout_seconds=0.1)
    server = EnvServer(f"gymnasium:{ID}", options=options).start()
    with client(server) as raw:
        raw.stub.Shutdown(pb.ShutdownRequest(), timeout=10)
        assert server.wait(30)


def test_shutdown_ends_an_open_session():
    server = EnvServer(f"gymnasium:{ID}").start()
    with client(server) as raw:
        session = raw.session()
        session.call(request(1, [reset(0, 0)]))
        server.shutdown()
        assert server.wait(0)
        err = rpc_error(next, session.replies)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in err.details()


class Closing(Counter):
    closed = 0

    def close(self):
        Closing.closed += 1


def test_factory_is_called_at_start_and_its_envs_closed():
    made = []

    def factory():
        made.append([Closing() for _ in range(2)])
        return made[-1]

    server = EnvServer(factory)
    assert made == []
    with server, client(server) as raw:
        assert raw.handshake().num_lanes == 2
    assert len(made) == 1 and Closing.closed == 2


# The command line -------------------------------------------------------------
def test_serve_env_cli_ready_fd_handshake_sigterm():
    read, write = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxmesh.cli",
            "serve-env",
            f"gymnasium:{ID}",
            "--lanes",
            "4",
            "--ready-fd",
            str(write),
        ],
        pass_fds=(write,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(write)
    try:
        with os.fdopen(read, "rb") as ready:
            line = ready.readline().decode()
        assert line.endswith("\n"), proc.stderr.read() if not line else line
        address = line.strip()
        raw = Raw(address)
        assert raw.handshake().num_lanes == 4
        raw.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert address in out.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_env_cli_bad_input(capsys):
    assert cli.main(["serve-env", "gymnasium:NoSuchEnv-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NoSuchEnv-v0" in err
    assert cli.main(["serve-env", ID, "--address", "0.0.0.0:0"]) == 2
    assert "insecure" in capsys.readouterr().err
