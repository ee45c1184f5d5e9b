"""Served envs with Dict observations (CONTRACT 31), against the plain gymnasium loop.

``CameraEnv`` (a nested Dict: a uint8 image, a float64 state, a Tuple of a
Discrete and a Box) behind an in-process ``jaxmesh.EnvServer`` on 127.0.0.1:
the handshake declares every leaf, a run asks only for the leaves its policy
reads (and those a recording keeps), and ``RemoteEnv`` / ``RemoteVectorEnv``
return the dict of every leaf.
"""

from __future__ import annotations

import contextlib
import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import plain_loop
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from reference_loop import assert_matches, single
from worker_envs import CameraEnv

import jaxmesh
from jaxmesh.adapt import State
from jaxmesh.errors import RemoteError
from jaxmesh.remote import codec
from jaxmesh.remote import spaces as wire
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.server import EnvServer, ServeOptions
from jaxmesh.remote.session import Session

SEEDS = [5, 0, 7, 3, 11, 2, 8]
LANES = 3
READ = ("image", "state")
EVERY = ("image", "nest/0", "nest/1", "state")


def brightness(obs):
    """A chunk of 3 from the image (uint8) and the state."""
    base = jnp.stack(
        [obs["image"].astype(jnp.float32).mean() / 255 - 0.5, obs["state"][0]]
    )
    return jnp.clip(jnp.stack([base, -base, 0.5 * base]), -1, 1)


#: Reads two of the observation's leaves (its spec): only they cross the wire.
SPEC = {"image": State(key="image"), "state": State(key="state")}
chunked = jaxmesh.Model(brightness, spec=SPEC)
per_step = jaxmesh.Model(lambda obs: brightness(obs)[0], spec=SPEC)


def _read(obs):
    return {"image": obs["image"], "state": np.float32(obs["state"])}


@functools.cache
def reference(horizon: int, lead: int):
    """The plain loop: one CameraEnv, episode i reset with SEEDS[i]."""
    if horizon == 1:
        fn = jax.jit(lambda x: brightness(x)[0])
        policy = single(lambda obs, key: fn(_read(obs)))
    else:
        fn = jax.jit(brightness)

        def policy(obs, key):
            del key
            return fn(_read(obs))

    return plain_loop(CameraEnv(), policy, SEEDS, horizon=horizon, lead=lead)


#: The leaves that cross are counted on the gRPC wire (``sent``): these
#: servers offer no same-host transport (test_shm_transport.py has it).
GRPC_ONLY = ServeOptions(shared_memory=False)


@pytest.fixture(scope="module")
def server():
    envs = [CameraEnv() for _ in range(LANES)]
    with EnvServer(envs, "127.0.0.1:0", options=GRPC_ONLY) as s:
        yield s


@pytest.fixture
def sent(monkeypatch):
    """The observation leaves of every reply the server encodes (what crosses
    the wire), one sorted tuple per reply."""
    out: list[tuple[str, ...]] = []
    encode = codec.encode_result_batch

    def spy(*args, **kwargs):
        obs = kwargs["observation"] if "observation" in kwargs else args[6]
        out.append(tuple(sorted(obs)))
        return encode(*args, **kwargs)

    monkeypatch.setattr(codec, "encode_result_batch", spy)
    return out


def url(server) -> str:
    return f"grpc://{server.address}"


# Equality with the plain loop ------------------------------------------------------
@pytest.mark.parametrize(("n", "lead"), [(1, 0), (3, 1)])
def test_chunked_policy_matches_the_plain_loop(server, sent, n, lead):
    """h = 3 at one lane and at three (a lead), the image and state read, the
    Tuple never sent."""
    got = jaxmesh.evaluate(
        chunked,
        url(server),
        num_envs=n,
        seeds=SEEDS,
        horizon=3,
        chunking=jaxmesh.Chunking(prefetch_lead=lead),
        scoring=jaxmesh.Scoring(metrics={"bright": "mean"}),
    )
    refs = reference(3, lead)
    assert len({r.length for r in refs}) > 2
    assert_matches(got, refs, rtol=1e-5)
    np.testing.assert_allclose(
        got.metrics["bright"], [r.ret / r.length for r in refs], rtol=1e-5
    )
    assert got.env == "gymnasium:CameraEnv"
    assert sent and set(sent) == {READ}


def test_per_step_policy_matches_the_plain_loop(server, sent):
    """h = 1 (the per-step pacing) on two lanes."""
    got = jaxmesh.evaluate(per_step, url(server), num_envs=2, seeds=SEEDS)
    assert_matches(got, reference(1, 0), rtol=1e-5)
    assert set(sent) == {READ}


def test_a_lockstep_server_of_a_vector_env(sent):
    """A VectorEnv served in lockstep reads its rows leaf by leaf (crash_seed
    -1: a CameraEnv never reset with a seed would match crash_seed=None)."""
    make = functools.partial(CameraEnv, crash_seed=-1)
    vec = SyncVectorEnv([make] * LANES, autoreset_mode=AutoresetMode.DISABLED)
    with EnvServer(vec, "127.0.0.1:0", options=GRPC_ONLY) as s:
        got = jaxmesh.evaluate(
            chunked,
            url(s),
            num_envs=LANES,
            seeds=SEEDS,
            horizon=3,
            chunking=jaxmesh.Chunking(prefetch_lead=1),
        )
    vec.close()
    assert_matches(got, reference(3, 1), rtol=1e-5)
    assert set(sent) == {READ}


def test_leaves_the_policy_does_not_read_never_cross(server, sent):
    """A policy without a spec reads the whole observation: every leaf
    crosses, and the replies are larger than those of the spec's run."""
    whole = jaxmesh.evaluate(brightness, url(server), num_envs=1, seeds=SEEDS[:3])
    assert set(sent) == {EVERY}
    sent.clear()
    pruned = jaxmesh.evaluate(chunked, url(server), num_envs=1, seeds=SEEDS[:3])
    assert set(sent) == {READ}
    np.testing.assert_array_equal(pruned.returns, whole.returns)
    big = whole.telemetry["reply_bytes"]["mean"]
    small = pruned.telemetry["reply_bytes"]["mean"]
    # nest/0 (int64) and nest/1 (2 float32) per row: 16 bytes and their keys.
    assert big - small >= 16 + len("nest/0") + len("nest/1")


def test_a_recording_gets_the_leaves_it_keeps(server, sent):
    """Record(keys=["nest"]) adds the Tuple's leaves to the policy's; the
    trajectories are those of the in-process run."""
    rec = jaxmesh.Record(episodes=[0, 2], keys=["nest"])
    kw = dict(num_envs=2, seeds=SEEDS[:4], horizon=3, record=rec)
    got = jaxmesh.evaluate(chunked, url(server), **kw)
    assert set(sent) == {EVERY}
    here = jaxmesh.evaluate(chunked, CameraEnv, workers=0, **kw)
    for a, b in zip(got.trajectories, here.trajectories, strict=True):
        assert set(a.observations) == {"nest"}
        for x, y in zip(
            jax.tree.leaves(a.observations),
            jax.tree.leaves(b.observations),
            strict=True,
        ):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.actions, b.actions)


# Gymnasium clients ---------------------------------------------------------------
def _equal(a, b):
    assert type(a) is type(b) or isinstance(a, np.ndarray | np.generic)
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _equal(a[k], b[k])
    elif isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype or np.ndim(b) == 0


def test_remote_env_returns_the_dict(server):
    local = CameraEnv()
    with jaxmesh.RemoteEnv(url(server), lane=1) as env:
        assert env.observation_space == local.observation_space
        obs, _ = env.reset(seed=7)
        ref, _ = local.reset(seed=7)
        assert env.observation_space.contains(obs)
        _equal(obs, ref)
        assert obs["nest"][0] == ref["nest"][0]
        assert obs["state"].dtype == np.float64 and obs["image"].dtype == np.uint8
        action = np.array([0.25, -0.5], np.float32)
        obs, r, te, tr, _ = env.step(action)
        ref, r_ref, te_ref, tr_ref, _ = local.step(action)
        _equal(obs, ref)
        assert (r, te, tr) == (r_ref, te_ref, tr_ref)


def test_remote_vector_env_returns_the_dict_per_leaf(server):
    locals_ = [CameraEnv() for _ in range(LANES)]
    with contextlib.closing(jaxmesh.RemoteVectorEnv(url(server))) as vec:
        assert vec.single_observation_space == locals_[0].observation_space
        obs, _ = vec.reset(seed=4)
        assert vec.observation_space.contains(obs)
        refs = [e.reset(seed=4 + i)[0] for i, e in enumerate(locals_)]
        np.testing.assert_array_equal(obs["image"], [r["image"] for r in refs])
        np.testing.assert_array_equal(obs["nest"][0], [r["nest"][0] for r in refs])
        actions = np.full((LANES, 2), 0.1, np.float32)
        obs, rewards, *_ = vec.step(actions)
        refs = [e.step(a) for e, a in zip(locals_, actions, strict=True)]
        np.testing.assert_array_equal(obs["state"], [r[0]["state"] for r in refs])
        np.testing.assert_array_equal(obs["nest"][1], [r[0]["nest"][1] for r in refs])
        np.testing.assert_array_equal(rewards, [r[1] for r in refs])


def test_a_session_asks_only_for_declared_leaves(server):
    with Session(server.address) as session:
        assert list(session.obs_specs) == list(EVERY)
        with pytest.raises(ValueError, match="'pixels'.*not leaves"):
            session.open(observation_keys=["pixels"])
        session.open(observation_keys=["state"])
        session.send(reset_lanes=[0], seeds=[3])
        batch = session.receive().batch
        assert list(batch.observation) == ["state"]
        ref, _ = CameraEnv().reset(seed=3)
        np.testing.assert_array_equal(batch.observation["state"][0], ref["state"])
        # The server refuses a key it did not declare (nothing stepped).
        session.observation_keys = ("nest",)
        session.send(reset_lanes=[0], seeds=[3])
        with pytest.raises(RemoteError, match="'nest'.*not all declared"):
            session.receive()


# The handshake's spaces ------------------------------------------------------------
NESTED = [
    CameraEnv().observation_space,
    spaces.Tuple(
        (
            spaces.Dict({"a": spaces.Discrete(3, start=1), "b": spaces.Box(0, 1)}),
            spaces.Box(-2.0, 2.0, (2, 2), np.float32),
        )
    ),
    spaces.Dict([("z", spaces.Box(0, 255, (2,), np.uint8)), ("a", spaces.Discrete(2))]),
]


@pytest.mark.parametrize("space", NESTED, ids=repr)
def test_nested_spaces_round_trip(space):
    msgs = wire.space_leaves(space)
    again = [pb.LeafSpec.FromString(m.SerializeToString()) for m in msgs]
    rebuilt = wire.observation_space(again)
    assert rebuilt == space
    assert repr(rebuilt) == repr(space)  # the Dict keys in the env's order
    assert all(m.nest and len(m.nest) == len(m.key.split("/")) for m in msgs)


def test_a_single_array_is_declared_as_before():
    box = gym.make("CartPole-v1").observation_space
    (msg,) = wire.space_leaves(box)
    assert msg == wire.space_leaf(box)
    assert (msg.key, msg.nest) == ("", "")
    assert wire.observation_space([msg]) == box


def _leaf(key, nest):
    msg = wire.space_leaf(spaces.Discrete(2), key)
    msg.nest = nest
    return msg


@pytest.mark.parametrize(
    ("msgs", "match"),
    [
        ([], "no observation leaf"),
        ([_leaf("a", "")], "without a nest"),
        ([_leaf("a/b", "d")], "one letter per part"),
        ([_leaf("a", "x")], "one letter per part"),
        ([_leaf("a", "d"), _leaf("a", "d")], "declared twice"),
        ([_leaf("a", "d"), _leaf("a/b", "dd")], "declared twice"),
        ([_leaf("a/0", "dt"), _leaf("a/b", "dd")], "both a Dict and a Tuple"),
        ([_leaf("0", "t"), _leaf("2", "t")], "expected 0 .. n - 1"),
        ([_leaf("01", "t")], "Tuple index"),
        ([_leaf("", "d")], "one letter per part"),
    ],
)
def test_a_malformed_declaration_is_refused(msgs, match):
    with pytest.raises(codec.ProtocolError, match=match):
        wire.observation_space(msgs)


def test_a_server_refuses_spaces_it_cannot_declare():
    bad = spaces.Dict({"a": spaces.MultiBinary(3)})
    with pytest.raises(TypeError, match="leaf 'a'.*MultiBinary"):
        wire.space_leaves(bad)
    with pytest.raises(TypeError, match="empty Tuple"):
        wire.space_leaves(spaces.Dict({"a": spaces.Tuple(())}))
