"""The wire codec (jaxmesh/remote/codec.py) and the generated protocol code.

References are numpy itself (``np.frombuffer`` / ``tobytes`` / ``==``) and
hand-built messages; the fuzz test feeds 100,000+ random and mutated serialized
messages and accepts only a decoded value or ProtocolError.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from jaxmesh.remote import codec
from jaxmesh.remote.codec import LeafSpec, ProtocolError
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "jaxmesh" / "remote" / "proto"
PROTO = "jaxmesh/remote/proto/jaxmesh_env.proto"

ALLOWED = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
SHAPES = [(), (0,), (1,), (5,), (2, 3), (3, 0, 2), (2, 1, 3, 2)]


def _sample(dtype: str, shape: tuple[int, ...], rng) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith("float"):
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


# -- generated code ---------------------------------------------------------


def test_regenerating_the_proto_code_changes_nothing(tmp_path):
    # grpcio-tools is in [test] (so in [dev], which `make test` installs): an
    # ImportError here is a failure, never a skip.
    from grpc_tools import protoc

    # The same command as `make proto`, into a temporary folder.
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        str(ROOT / PROTO),
    ]
    assert protoc.main(args) == 0, f"protoc failed on {PROTO}"
    made = sorted(p.name for p in (tmp_path / PROTO).parent.iterdir())
    assert made == [
        "jaxmesh_env_pb2.py",
        "jaxmesh_env_pb2.pyi",
        "jaxmesh_env_pb2_grpc.py",
    ]
    stale = [
        name
        for name in made
        if (tmp_path / PROTO).parent.joinpath(name).read_bytes()
        != (PROTO_DIR / name).read_bytes()
    ]
    assert not stale, f"{stale} differ from {PROTO}: run `make proto` and commit"


def test_protocol_is_versioned_and_declares_the_service():
    assert pb.DESCRIPTOR.package == "jaxmesh.env.v1"
    service = pb.DESCRIPTOR.services_by_name["EnvService"]
    assert {m.name for m in service.methods} == {"Handshake", "Step", "Shutdown"}
    # Arrays are raw bytes with dtype and shape: no string/JSON payload field.
    fields = {f.name: f.type for f in pb.Tensor.DESCRIPTOR.fields}
    assert fields == {
        "dtype": pb.Tensor.DESCRIPTOR.fields_by_name["dtype"].TYPE_STRING,
        "shape": pb.Tensor.DESCRIPTOR.fields_by_name["shape"].TYPE_INT64,
        "data": pb.Tensor.DESCRIPTOR.fields_by_name["data"].TYPE_BYTES,
    }


def test_grpc_module_imports():
    from jaxmesh.remote.proto import jaxmesh_env_pb2_grpc as rpc

    assert hasattr(rpc, "EnvServiceStub") and hasattr(rpc, "EnvServiceServicer")


# -- round trips ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALLOWED)
def test_round_trip_every_dtype_and_shape(dtype):
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = _sample(dtype, shape, rng)
        t = codec.encode_array(x)
        assert t.dtype == dtype and tuple(t.shape) == shape
        # Reference: numpy's own little-endian bytes.
        assert t.data == x.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
        wire = pb.Tensor.FromString(t.SerializeToString())
        y = codec.decode_array(wire, LeafSpec("x", dtype, shape))
        assert y.dtype == np.dtype(dtype) and y.shape == shape
        np.testing.assert_array_equal(y, x)
        assert y.tobytes() == x.tobytes()


def test_scalar_python_values_and_non_contiguous_arrays():
    assert codec.decode_array(codec.encode_array(3.5)).tolist() == 3.5
    x = np.arange(24, dtype=np.int16).reshape(4, 6)[::2, ::3]
    y = codec.decode_array(codec.encode_array(x))
    assert y.tolist() == [[0, 3], [12, 15]]


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">u2", ">f8", ">f2"])
def test_big_endian_input_goes_out_little_endian(dtype):
    x = np.array([[1.0, -2.0], [3.0, 250.0]]).astype(dtype)
    t = codec.encode_array(x)
    assert t.dtype == np.dtype(dtype).newbyteorder("=").name
    le = np.dtype(dtype).newbyteorder("<")
    assert t.data == x.astype(le).tobytes() != x.tobytes()
    np.testing.assert_array_equal(codec.decode_array(t), x)


def test_leaves_round_trip_and_key_checks():
    leaves = {"pos": np.ones((3,), np.float32), "img": np.zeros((2, 2, 3), np.uint8)}
    msgs = codec.encode_leaves(leaves)
    spec = {k: LeafSpec(k, v.dtype.name, v.shape) for k, v in leaves.items()}
    back = codec.decode_leaves(msgs, spec)
    assert list(back) == ["pos", "img"]
    for k in leaves:
        np.testing.assert_array_equal(back[k], leaves[k])
    with pytest.raises(ProtocolError, match=r"missing \['img'\]"):
        codec.decode_leaves({"pos": msgs["pos"]}, spec)
    with pytest.raises(ProtocolError, match=r"unexpected \['extra'\]"):
        codec.decode_leaves({**msgs, "extra": msgs["pos"]}, spec)
    # A leading (steps) axis.
    stacked = codec.encode_leaves({k: np.stack([v] * 4) for k, v in leaves.items()})
    assert codec.decode_leaves(stacked, spec, lead=4)["img"].shape == (4, 2, 2, 3)
    with pytest.raises(ProtocolError, match="leaf 'pos'"):
        codec.decode_leaves(stacked, spec, lead=3)


def test_leaf_spec_round_trip():
    spec = LeafSpec("obs", "float32", (4, 2))
    assert codec.leaf_spec_from_proto(codec.leaf_spec_to_proto(spec)) == spec
    with pytest.raises(ProtocolError, match="leaf 'obs'.*'complex64'"):
        codec.leaf_spec_from_proto(pb.LeafSpec(key="obs", dtype="complex64"))
    with pytest.raises(ProtocolError, match=r"\[-1\]"):
        codec.leaf_spec_from_proto(pb.LeafSpec(key="obs", dtype="int8", shape=[-1]))


# -- malformed input ----------------------------------------------------------


def test_unknown_dtype_names_the_leaf():
    for bad in ["complex64", "object", "float128", "<f4", "", "int"]:
        t = pb.Tensor(dtype=bad, shape=[1], data=b"\0" * 4)
        with pytest.raises(ProtocolError, match=r"leaf 'obs' has dtype"):
            codec.decode_array(t, key="obs")


def test_unsupported_dtype_refused_when_encoding():
    for x in [np.zeros(2, np.complex64), np.array(["a"]), np.array([None])]:
        with pytest.raises(ProtocolError, match="leaf 'act'.*cast it"):
            codec.encode_array(x, key="act")


def test_negative_or_huge_dims_refused():
    for shape in [[-1], [2, -3], [0, 2**62], [1] * 33]:
        with pytest.raises(ProtocolError, match="leaf 'obs' has shape"):
            codec.decode_array(pb.Tensor(dtype="uint8", shape=shape), key="obs")


def test_bytes_not_matching_the_shape_refused():
    t = pb.Tensor(dtype="float32", shape=[2, 3], data=b"\0" * 23)
    with pytest.raises(ProtocolError, match=r"needs 24 bytes.*holds 23"):
        codec.decode_array(t, key="obs")
    with pytest.raises(ProtocolError, match=r"needs 0 bytes.*holds 1"):
        codec.decode_array(pb.Tensor(dtype="int8", shape=[0], data=b"x"))


def test_bool_bytes_other_than_0_and_1_refused():
    with pytest.raises(ProtocolError, match="other than 0 and 1"):
        codec.decode_array(pb.Tensor(dtype="bool", shape=[2], data=b"\x01\x02"))


def test_expected_dtype_or_shape_mismatch_refused():
    t = codec.encode_array(np.zeros((2, 3), np.float32))
    with pytest.raises(ProtocolError, match=r"leaf 'obs' is float32\[2, 3\], exp"):
        codec.decode_array(t, LeafSpec("obs", "float32", (3, 2)))
    with pytest.raises(ProtocolError, match=r"expected float64\[2, 3\]"):
        codec.decode_array(t, LeafSpec("obs", "float64", (2, 3)))


def test_size_cap_names_size_limit_and_fix():
    codec.check_size(codec.MAX_MESSAGE_BYTES)
    assert codec.MAX_MESSAGE_BYTES == 256 * 2**20
    with pytest.raises(ProtocolError) as info:
        codec.check_size(codec.MAX_MESSAGE_BYTES + 1)
    msg = str(info.value)
    assert str(256 * 2**20 + 1) in msg and "256.0 MiB" in msg
    assert "fewer lanes" in msg and "smaller declared observation" in msg
    data = codec.encode_array(np.zeros(100, np.uint8)).SerializeToString()
    with pytest.raises(ProtocolError, match=f"{len(data)} bytes.*over the 50 byte"):
        codec.parse_tensor(data, limit=50)


def test_parse_wraps_decode_error():
    with pytest.raises(DecodeError):
        pb.Tensor.FromString(b"\xff\xff")  # what protobuf itself raises
    with pytest.raises(ProtocolError, match="not a valid jaxmesh.env.v1.Tensor"):
        codec.parse_tensor(b"\xff\xff")
    for parse in [
        codec.parse_step_reply,
        codec.parse_step_request,
        codec.parse_handshake_request,
        codec.parse_handshake_reply,
    ]:
        with pytest.raises(ProtocolError):
            parse(b"\x0a\x05ab")  # a field cut short


# -- batches ------------------------------------------------------------------

ACT = {"a": LeafSpec("a", "float32", (2,))}
OBS = {"pos": LeafSpec("pos", "float32", (4,))}
INFO = {"x": LeafSpec("x", "int64", ())}
# A hand-worked action batch: lanes 0, 2, 5 replay 2, 1 and 3 actions; their
# chunks start at rows 0, 2 and 3 of the 6 concatenated rows.
LANES, COUNTS, OFFSETS = [0, 2, 5], [2, 1, 3], [0, 2, 3]
ACTIONS = np.arange(12, dtype=np.float32).reshape(6, 2)


def _vec(x, dtype=np.uint32) -> pb.Tensor:
    """A Tensor of ``x``: as given when it is an array, else as uint32."""
    return codec.encode_array(x if isinstance(x, np.ndarray) else np.asarray(x, dtype))


def _action_msg(lanes=LANES, counts=COUNTS, actions=None) -> pb.ActionBatch:
    """An ActionBatch built field by field (None leaves a field out)."""
    msg = pb.ActionBatch()
    if lanes is not None:
        msg.lanes.CopyFrom(_vec(lanes))
    if counts is not None:
        msg.counts.CopyFrom(_vec(counts))
    for key, x in ({"a": ACTIONS} if actions is None else actions).items():
        msg.actions[key].CopyFrom(codec.encode_array(x))
    return msg


# A hand-worked result batch: lane 0 was reset (0 steps, 1 row), lane 1
# replayed 3 steps with every observation (3 rows), lane 3 replayed 2 steps
# with the last observation only (1 row): 5 steps, 5 rows.
RESULT = {
    "lanes": [0, 1, 3],
    "steps": [0, 3, 2],
    "rows": [1, 3, 1],
    "rewards": np.array([1.0, 2.0, 3.0, 4.5, 5.0]),
    "terminated": np.array([False, False, True, False, False]),
    "truncated": np.array([False, False, False, False, True]),
}
POS = np.arange(20, dtype=np.float32).reshape(5, 4)
X = np.array([10, 11, 12, 13, 14], np.int64)


def _result_msg(observation=None, info=None, **fields) -> pb.ResultBatch:
    """A ResultBatch built field by field from RESULT, with ``fields`` changed
    (None leaves a field out)."""
    msg = pb.ResultBatch()
    for name, value in {**RESULT, **fields}.items():
        if value is not None:
            getattr(msg, name).CopyFrom(_vec(value))
    for key, x in ({"pos": POS} if observation is None else observation).items():
        msg.observation[key].CopyFrom(codec.encode_array(x))
    for key, x in ({"x": X} if info is None else info).items():
        msg.info[key].CopyFrom(codec.encode_array(x))
    return msg


def test_action_batch_round_trip():
    msg = codec.encode_action_batch(LANES, COUNTS, {"a": ACTIONS})
    assert msg == _action_msg()  # the fields the proto describes, nothing else
    wire = codec.parse_step_request(pb.StepRequest(batch=msg).SerializeToString())
    out = codec.decode_action_batch(wire.batch, ACT, num_lanes=6)
    assert out.lanes.tolist() == LANES and out.counts.tolist() == COUNTS
    assert out.offsets.tolist() == OFFSETS
    assert out.actions["a"].dtype == np.float32
    assert out.actions["a"].tobytes() == ACTIONS.tobytes()
    # Lane 5's chunk: rows 3, 4, 5.
    lane5 = out.actions["a"][out.offsets[2] : out.offsets[2] + out.counts[2]]
    assert lane5.tolist() == [[6, 7], [8, 9], [10, 11]]


def test_empty_action_batch_has_no_offsets():
    empty = {"a": np.zeros((0, 2), np.float32)}
    for msg in (
        codec.encode_action_batch([], [], empty),
        _action_msg(lanes=None, counts=None, actions=empty),
    ):
        out = codec.decode_action_batch(msg, ACT, num_lanes=1)
        assert out.lanes.shape == out.counts.shape == out.offsets.shape == (0,)
        assert out.actions["a"].shape == (0, 2)


def test_result_batch_round_trip():
    msg = codec.encode_result_batch(**RESULT, observation={"pos": POS}, info={"x": X})
    assert msg == _result_msg()
    wire = codec.parse_step_reply(pb.StepReply(batch=msg).SerializeToString())
    for obs, info in ((OBS, INFO), (None, None)):  # checked, and as sent
        out = codec.decode_result_batch(wire.batch, obs, info, num_lanes=4)
        assert out.lanes.tolist() == [0, 1, 3]
        assert out.steps.tolist() == [0, 3, 2] and out.rows.tolist() == [1, 3, 1]
        assert out.rewards.dtype == np.float64
        assert out.rewards.tolist() == [1.0, 2.0, 3.0, 4.5, 5.0]
        assert out.terminated.tolist() == [False, False, True, False, False]
        assert out.truncated.tolist() == [False, False, False, False, True]
        assert list(out.observation) == ["pos"] and list(out.info) == ["x"]
        assert out.observation["pos"].tobytes() == POS.tobytes()
        assert out.observation["pos"].shape == (5, 4)
        assert out.info["x"].tolist() == [10, 11, 12, 13, 14]


def test_result_batch_info_presence_round_trip_and_checks():
    # Rows 0 and 3 lack info "x": zeros there, and a presence mask.
    present = np.array([False, True, True, False, True])
    msg = codec.encode_result_batch(
        **RESULT,
        observation={"pos": POS},
        info={"x": X * present},
        info_present={"x": present},
    )
    wire = codec.parse_step_reply(pb.StepReply(batch=msg).SerializeToString())
    out = codec.decode_result_batch(wire.batch, OBS, INFO, num_lanes=4)
    assert out.info["x"].tolist() == [0, 11, 12, 0, 14]
    assert out.info_present["x"].tolist() == present.tolist()
    # Without a mask every row has the key.
    plain = codec.encode_result_batch(**RESULT, observation={"pos": POS}, info={"x": X})
    assert codec.decode_result_batch(plain, OBS, INFO).info_present == {}
    # A mask for a key not sent, or not one bool per row, is refused.
    for info, mask, match in (
        ({}, {"x": present}, "no such info leaf"),
        ({"x": X}, {"x": present[:4]}, r"expected bool\[5\]"),
        ({"x": X}, {"x": present.astype(np.uint8)}, r"expected bool\[5\]"),
    ):
        bad = codec.encode_result_batch(**RESULT, observation={"pos": POS}, info=info)
        for key, x in mask.items():
            bad.info_present[key].CopyFrom(codec.encode_array(np.asarray(x), key))
        with pytest.raises(codec.ProtocolError, match=match):
            codec.decode_result_batch(bad, OBS, None)


def test_result_batch_of_resets_needs_no_step_vectors():
    # Two resets: no step, one observation row each, no per-step vector sent.
    msg = _result_msg(
        lanes=[0, 2],
        steps=[0, 0],
        rows=[1, 1],
        rewards=None,
        terminated=None,
        truncated=None,
        observation={"pos": POS[:2]},
        info={},
    )
    out = codec.decode_result_batch(msg, OBS, {})
    assert out.rewards.shape == out.terminated.shape == out.truncated.shape == (0,)
    assert out.rewards.dtype == np.float64 and out.terminated.dtype == bool
    assert out.observation["pos"].tolist() == POS[:2].tolist()
    # Float32 rewards are widened exactly; a lane that had ended replays 0
    # steps and sends 0 rows.
    msg = _result_msg(
        lanes=[4],
        steps=[2],
        rows=[1],
        rewards=np.array([0.5, -1.25], np.float32),
        terminated=np.array([False, True]),
        truncated=np.array([False, False]),
        observation={"pos": POS[:1]},
        info={},
    )
    out = codec.decode_result_batch(msg, OBS, {})
    assert out.rewards.dtype == np.float64 and out.rewards.tolist() == [0.5, -1.25]
    ended = _result_msg(
        lanes=[1],
        steps=[0],
        rows=[0],
        rewards=None,
        terminated=None,
        truncated=None,
        observation={"pos": POS[:0]},
        info={},
    )
    assert codec.decode_result_batch(ended, OBS, {}).rows.tolist() == [0]


BAD_ACTIONS = {
    "lanes descending": (_action_msg(lanes=[0, 5, 2]), r"lanes \[0, 5, 2\] are not"),
    "lane repeated": (_action_msg(lanes=[0, 2, 2]), r"\[0, 2, 2\] are not strictly"),
    "lane past num_lanes": (
        _action_msg(lanes=[0, 2, 6]),
        "names lane 6, but the session has 6 lanes",
    ),
    "count 0": (
        _action_msg(counts=[2, 0, 4]),
        r"counts from 0 to 4, expected each in 1\.\.100",
    ),
    "count over max": (
        _action_msg(counts=[2, 101, 3], actions={"a": np.zeros((106, 2), "f4")}),
        r"counts from 2 to 101, expected each in 1\.\.100",
    ),
    "more lanes than counts": (
        _action_msg(counts=[2, 1]),
        "3 lanes and 2 counts; expected one count per lane",
    ),
    "lanes missing": (_action_msg(lanes=None), "0 lanes and 3 counts"),
    "lanes int64": (
        _action_msg(lanes=np.array([0, 2, 5])),
        r"leaf 'batch lanes' is int64\[3\], expected a uint32 vector",
    ),
    "counts 2-d": (
        _action_msg(counts=np.array([[2], [1], [3]], np.uint32)),
        r"leaf 'batch counts' is uint32\[3, 1\], expected a uint32 vector",
    ),
    "rows not sum(counts)": (
        _action_msg(actions={"a": ACTIONS[:5]}),
        r"leaf 'a' is float32\[5, 2\], expected float32\[6, 2\]",
    ),
    "action dtype": (
        _action_msg(actions={"a": ACTIONS.astype(np.float64)}),
        r"leaf 'a' is float64\[6, 2\], expected float32\[6, 2\]",
    ),
    "unexpected key": (
        _action_msg(actions={"a": ACTIONS, "b": ACTIONS}),
        r"unexpected \['b'\]",
    ),
    "missing key": (_action_msg(actions={}), r"missing \['a'\]"),
}


@pytest.mark.parametrize("case", list(BAD_ACTIONS))
def test_action_batch_malformed_refused(case):
    msg, words = BAD_ACTIONS[case]
    wire = pb.ActionBatch.FromString(msg.SerializeToString())
    with pytest.raises(ProtocolError, match=words):
        codec.decode_action_batch(wire, ACT, num_lanes=6, max_count=100)


BAD_RESULTS = {
    "lanes descending": (_result_msg(lanes=[0, 3, 1]), r"lanes \[0, 3, 1\] are not"),
    "lane repeated": (_result_msg(lanes=[1, 1, 3]), r"\[1, 1, 3\] are not strictly"),
    "lane past num_lanes": (
        _result_msg(lanes=[0, 1, 4]),
        "names lane 4, but the session has 4 lanes",
    ),
    "vectors of different lengths": (
        _result_msg(steps=[0, 3]),
        "3 lanes, 2 step counts and 3 row counts; expected one of each per lane",
    ),
    "rows missing": (_result_msg(rows=None), "3 lanes, 3 step counts and 0 row"),
    "steps uint64": (
        _result_msg(steps=np.array([0, 3, 2], np.uint64)),
        r"leaf 'result steps' is uint64\[3\], expected a uint32 vector",
    ),
    "rows over steps": (
        _result_msg(rows=[1, 4, 1]),
        "result lane 1 has 4 observation rows for 3 steps; expected 1 to 3",
    ),
    "no row for steps": (
        _result_msg(rows=[1, 3, 0]),
        "result lane 3 has 0 observation rows for 2 steps; expected 1 to 2",
    ),
    "two rows for a reset": (
        _result_msg(rows=[2, 3, 1]),
        "result lane 0 has 2 observation rows for 0 steps; expected 0 to 1",
    ),
    "rewards short": (
        _result_msg(rewards=np.array([1.0, 2.0, 3.0, 4.0])),
        r"leaf 'rewards' is float64\[4\], expected a float dtype of shape \[5\]",
    ),
    "rewards int": (
        _result_msg(rewards=np.arange(5, dtype=np.int32)),
        r"leaf 'rewards' is int32\[5\], expected a float dtype of shape \[5\]",
    ),
    "rewards missing": (_result_msg(rewards=None), "leaf 'rewards' has dtype ''"),
    "terminated uint8": (
        _result_msg(terminated=np.zeros(5, np.uint8)),
        r"leaf 'terminated' is uint8\[5\], expected bool of shape \[5\]",
    ),
    "truncated long": (
        _result_msg(truncated=np.zeros(6, bool)),
        r"leaf 'truncated' is bool\[6\], expected bool of shape \[5\]",
    ),
    "observation rows not sum(rows)": (
        _result_msg(observation={"pos": POS[:4]}),
        r"leaf 'pos' is float32\[4, 4\], expected float32\[5, 4\]",
    ),
    "info rows not sum(rows)": (
        _result_msg(info={"x": X[:4]}),
        r"leaf 'x' is int64\[4\], expected int64\[5\]",
    ),
    "unexpected observation key": (
        _result_msg(observation={"pos": POS, "vel": POS}),
        r"unexpected \['vel'\]",
    ),
    "missing observation key": (_result_msg(observation={}), r"missing \['pos'\]"),
    "missing info key": (_result_msg(info={}), r"missing \['x'\]"),
}


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_result_batch_malformed_refused(case):
    msg, words = BAD_RESULTS[case]
    wire = pb.ResultBatch.FromString(msg.SerializeToString())
    with pytest.raises(ProtocolError, match=words):
        codec.decode_result_batch(wire, OBS, INFO, num_lanes=4)


def test_result_batch_as_sent_still_checks_rows():
    # Without specs, any keys are taken, but each leaf must have sum(rows) rows.
    msg = _result_msg(observation={"pos": POS[:4]}, info={})
    with pytest.raises(ProtocolError, match=r"'pos' has shape \[4, 4\], expected 5"):
        codec.decode_result_batch(msg)
    msg = _result_msg(observation={"pos": POS}, info={"x": np.int64(3)})
    with pytest.raises(ProtocolError, match=r"'x' has shape \[\], expected 5 rows"):
        codec.decode_result_batch(msg)


# -- versions -----------------------------------------------------------------


def test_choose_version():
    assert codec.choose_version([1]) == 1
    assert codec.choose_version([3, 1, 2], [2, 4, 1]) == 2
    with pytest.raises(ProtocolError) as info:
        codec.choose_version([2, 3], [1])
    assert "client speaks [2, 3]" in str(info.value)
    assert "server speaks [1]" in str(info.value)
    with pytest.raises(ProtocolError, match=r"client speaks \[\]"):
        codec.choose_version([], [1])


# -- fuzz ---------------------------------------------------------------------

FUZZ_LANES = 8
FUZZ_MAX_COUNT = 64
#: A phrase of each check of the two batch decoders: the fuzz must reach them all.
BATCH_CHECKS = [
    "not strictly ascending",
    "but the session has",
    "expected one count per lane",
    "expected each in 1..",
    "expected one of each per lane",
    "observation rows for",
    "expected a float dtype",
    "expected bool of shape",
    "expected a uint32 vector",
    "as declared in the handshake",
    "missing [",
    "unexpected [",
    "not a valid",
]


def _fuzz_request(rng) -> bytes:
    """A valid StepRequest: resets of some lanes, chunks for others."""
    lanes = rng.permutation(FUZZ_LANES)
    stepped = np.sort(lanes[: int(rng.integers(0, 5))])
    reset = lanes[stepped.size : stepped.size + int(rng.integers(0, 3))]
    counts = rng.integers(1, 5, size=stepped.size)
    actions = rng.normal(size=(int(counts.sum()), 2)).astype(np.float32)
    msg = pb.StepRequest(
        lane_mask=np.isin(np.arange(FUZZ_LANES), lanes[: stepped.size + reset.size]),
        resets=[pb.LaneReset(lane=int(j), seed=int(j) + 7) for j in np.sort(reset)],
        observation_keys=["pos"],
        call_id=int(rng.integers(1, 1000)),
        batch=codec.encode_action_batch(stepped, counts, {"a": actions}),
    )
    return msg.SerializeToString()


def _fuzz_reply(rng) -> bytes:
    """A valid StepReply: lanes reset (0 steps) or replayed, all or last rows."""
    lanes = np.sort(rng.choice(FUZZ_LANES, size=int(rng.integers(0, 5)), replace=False))
    steps = rng.integers(0, 4, size=lanes.size)
    every = rng.integers(0, 2, size=lanes.size).astype(bool)
    rows = np.where(every, np.maximum(steps, 1), np.minimum(steps, 1))
    n, k = int(steps.sum()), int(rows.sum())
    batch = codec.encode_result_batch(
        lanes,
        steps,
        rows,
        rng.normal(size=n),
        rng.integers(0, 2, size=n).astype(bool),
        rng.integers(0, 2, size=n).astype(bool),
        {"pos": rng.normal(size=(k, 4)).astype(np.float32)},
        {"x": rng.integers(0, 100, size=k)},
    )
    return pb.StepReply(
        server_step_seconds=1e-3, call_id=3, batch=batch
    ).SerializeToString()


KINDS = ("tensor", "request", "reply", "request", "reply")


def _corpus(rng) -> dict[str, list[bytes]]:
    """Valid serialized Tensor, StepRequest and StepReply messages to mutate."""
    return {
        "tensor": [
            codec.encode_array(_sample(dtype, shape, rng)).SerializeToString()
            for dtype in ALLOWED
            for shape in SHAPES
        ],
        "request": [_fuzz_request(rng) for _ in range(40)],
        "reply": [_fuzz_reply(rng) for _ in range(40)],
    }


def _decode(kind: str, data: bytes) -> None:
    """Decodes as a server (requests) or a client (replies) would; an invariant
    that a decoded value breaks raises AssertionError, a crash."""
    if kind == "tensor":
        codec.decode_array(codec.parse_tensor(data), key="fuzz")
        return
    if kind == "request":
        batch = codec.parse_step_request(data).batch
        out = codec.decode_action_batch(
            batch, ACT, num_lanes=FUZZ_LANES, max_count=FUZZ_MAX_COUNT
        )
        n = out.actions["a"].shape[0]
        for lane, start, count in zip(out.lanes, out.offsets, out.counts, strict=True):
            assert 0 <= lane < FUZZ_LANES and 1 <= count <= FUZZ_MAX_COUNT
            assert 0 <= start and start + count <= n
        return
    batch = codec.parse_step_reply(data).batch
    with contextlib.suppress(ProtocolError):
        loose = codec.decode_result_batch(batch)  # any keys, as sent
        assert all(x.shape[0] == loose.rows.sum() for x in loose.observation.values())
    out = codec.decode_result_batch(batch, OBS, INFO, num_lanes=FUZZ_LANES)
    assert out.rewards.shape == out.terminated.shape == (out.steps.sum(),)
    assert out.rewards.dtype == np.float64 and out.truncated.dtype == bool
    assert out.observation["pos"].shape == (out.rows.sum(), 4)
    assert np.all(out.rows <= np.maximum(out.steps, 1))


def _index_values(rng) -> np.ndarray:
    """A uint32 vector of lane indices or counts: often plausible, sometimes not."""
    n = int(rng.integers(0, 6))
    high = [2, 5, FUZZ_LANES + 1, 2**32][int(rng.integers(4))]
    x = rng.integers(0, high, size=n, dtype=np.uint64)
    return (np.sort(x) if rng.integers(2) else x).astype(np.uint32)


def _field_change(kind: str, data: bytes, rng) -> bytes:
    """A valid message with one field set to a random, often wrong, value."""
    if kind == "tensor":
        msg = pb.Tensor.FromString(data)
        fields = [msg]
    elif kind == "request":
        msg = pb.StepRequest.FromString(data)
        b = msg.batch
        fields = [b.lanes, b.counts, b.actions["a"]]
    else:
        msg = pb.StepReply.FromString(data)
        b = msg.batch
        fields = [b.lanes, b.steps, b.rows, b.rewards, b.terminated, b.truncated]
        fields += [b.observation["pos"], b.info["x"]]
    t = fields[int(rng.integers(len(fields)))]
    choice = int(rng.integers(6 if kind == "tensor" else 7))
    if choice == 0:
        t.dtype = str(rng.choice([*ALLOWED, "complex64", "f4", "", "object"]))
    elif choice == 1:
        t.shape[:] = rng.integers(-3, 2**40, size=int(rng.integers(0, 4))).tolist()
    elif choice == 2:
        t.shape[:] = rng.integers(-1, 5, size=int(rng.integers(0, 4))).tolist()
    elif choice == 3:
        t.data = t.data[: int(rng.integers(0, len(t.data) + 1))] + b"\x02"
    elif choice in (4, 5):
        t.CopyFrom(codec.encode_array(_index_values(rng)))
    elif kind == "request":
        if rng.integers(2):
            b.actions["b"].CopyFrom(b.actions["a"])
        else:
            b.ClearField(str(rng.choice(["lanes", "counts", "actions"])))
    else:
        if rng.integers(2):
            b.observation["vel"].CopyFrom(b.observation["pos"])
        else:
            names = ["lanes", "steps", "rows", "rewards", "observation", "info"]
            b.ClearField(str(rng.choice(names)))
    return msg.SerializeToString()


def test_fuzz_decoder_only_decodes_or_raises_protocol_error():
    # 100,000+ messages: random bytes, bit flips, truncations, insertions,
    # splices and field changes of valid Tensor / StepRequest / StepReply
    # messages. Anything but a decoded value or ProtocolError is a crash.
    rng = np.random.default_rng(20261130)
    corpus = _corpus(rng)
    outcomes = {
        kind: {"decoded": 0, "refused": 0} for kind in ("tensor", "request", "reply")
    }
    reached: set[str] = set()
    crashes = []
    start = time.perf_counter()
    total = 100_000
    for i in range(total):
        # Batches are what the fuzz is for: 2 in 5 requests, 2 in 5 replies.
        kind = KINDS[i % 5]
        same = corpus[kind]
        data = same[int(rng.integers(len(same)))]
        how = i // 5 % 6
        if how == 0:
            data = rng.bytes(int(rng.integers(0, 64)))
        elif how == 1 and data:
            buf = bytearray(data)
            for pos in rng.integers(0, len(buf), size=int(rng.integers(1, 4))):
                buf[pos] ^= 1 << int(rng.integers(8))
            data = bytes(buf)
        elif how == 2:
            data = data[: int(rng.integers(0, len(data) + 1))]
        elif how == 3:
            pos = int(rng.integers(0, len(data) + 1))
            data = data[:pos] + rng.bytes(int(rng.integers(1, 8))) + data[pos:]
        elif how == 4:
            # Protobuf merges a message sent twice: repeated fields concatenate.
            data += same[int(rng.integers(len(same)))]
        else:
            data = _field_change(kind, data, rng)
        try:
            _decode(kind, data)
            outcomes[kind]["decoded"] += 1
        except ProtocolError as exc:
            outcomes[kind]["refused"] += 1
            words = str(exc)
            reached.update(c for c in BATCH_CHECKS if c in words)
        except Exception as exc:  # any other type is a crash
            crashes.append(f"{kind}: {type(exc).__name__}: {exc} on {data[:40]!r}")
    elapsed = time.perf_counter() - start
    assert not crashes, f"{len(crashes)} crashes, first: {crashes[:5]}"
    assert sum(sum(o.values()) for o in outcomes.values()) == total
    # Both outcomes occur for each kind, and every batch check is reached: the
    # mutations get past the parser.
    for kind, o in outcomes.items():
        assert o["decoded"] > 500 and o["refused"] > 1000, (kind, outcomes)
    assert reached == set(BATCH_CHECKS), set(BATCH_CHECKS) - reached
    print(f"fuzz: {outcomes} in {elapsed:.1f} s", file=sys.stderr)
