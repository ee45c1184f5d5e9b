"""The wire codec (jaxmesh/remote/codec.py) and the generated protocol code.

References are numpy itself (``np.frombuffer`` / ``tobytes`` / ``==``) and
hand-built messages; the fuzz test feeds 100,000+ random and mutated serialized
messages and accepts only a decoded value or ProtocolError.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from jaxmesh.remote import codec
from jaxmesh.remote.codec import LeafSpec, ProtocolError
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
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
    assert {m.name for m in service.methods} == {"Handshake", "Step"}
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


# -- lane results -------------------------------------------------------------


def _lane_result(steps: int, lane: int = 1, k: int | None = None) -> pb.LaneResult:
    k = steps if k is None else k
    r = pb.LaneResult(lane=lane, steps=steps)
    r.rewards.CopyFrom(codec.encode_array(np.arange(steps, dtype=np.float32)))
    r.terminated.CopyFrom(codec.encode_array(np.arange(steps) == steps - 1))
    r.truncated.CopyFrom(codec.encode_array(np.zeros(steps, bool)))
    r.observation["pos"].CopyFrom(
        codec.encode_array(
            np.ones((k, 4), np.float32) * np.arange(k, dtype=np.float32)[:, None]
        )
    )
    r.info["x"].CopyFrom(codec.encode_array(np.zeros((k,), np.int64)))
    return r


OBS = {"pos": LeafSpec("pos", "float32", (4,))}
INFO = {"x": LeafSpec("x", "int64", ())}


def test_lane_result_decodes():
    out = codec.decode_lane_result(_lane_result(3), OBS, INFO, num_lanes=2)
    assert out.lane == 1 and out.steps == 3
    assert out.rewards.dtype == np.float64 and out.rewards.tolist() == [0, 1, 2]
    assert out.terminated.tolist() == [False, False, True]
    assert out.truncated.tolist() == [False] * 3
    assert out.observation["pos"][:, 0].tolist() == [0, 1, 2]
    assert out.info["x"].shape == (3,)
    # Only the last observation: k = 1.
    assert codec.decode_lane_result(_lane_result(3, k=1), OBS, INFO).steps == 3
    # A reset alone: no step, one observation, no per-step vectors at all.
    reset = pb.LaneResult(lane=0, steps=0)
    reset.observation["pos"].CopyFrom(codec.encode_array(np.zeros((1, 4), "f4")))
    out = codec.decode_lane_result(reset, OBS, {})
    assert out.rewards.shape == out.terminated.shape == (0,)


def test_lane_result_malformed_refused():
    with pytest.raises(ProtocolError, match="lane 5, but the session has 2 lanes"):
        codec.decode_lane_result(_lane_result(2, lane=5), OBS, INFO, num_lanes=2)
    with pytest.raises(ProtocolError, match=r"lane 1: leaf 'pos' .*1 <= k <= 2"):
        codec.decode_lane_result(_lane_result(2, k=3), OBS, INFO)
    bad = _lane_result(2)
    bad.steps = 3
    with pytest.raises(ProtocolError, match=r"leaf 'rewards'.*shape \[3\]"):
        codec.decode_lane_result(bad, OBS, INFO)
    bad = _lane_result(2)
    bad.terminated.CopyFrom(codec.encode_array(np.zeros(2, np.uint8)))
    with pytest.raises(ProtocolError, match=r"leaf 'terminated'.*expected bool"):
        codec.decode_lane_result(bad, OBS, INFO)
    with pytest.raises(ProtocolError, match=r"missing \['y'\]"):
        codec.decode_lane_result(_lane_result(2), OBS, {**INFO, "y": INFO["x"]})


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


def _corpus(rng) -> list[tuple[str, bytes]]:
    """Valid serialized Tensor and StepReply messages to mutate."""
    found = []
    for dtype in ALLOWED:
        for shape in SHAPES:
            t = codec.encode_array(_sample(dtype, shape, rng))
            found.append(("tensor", t.SerializeToString()))
    for lanes in (1, 3):
        reply = pb.StepReply(server_step_seconds=0.001, call_id=7)
        for lane in range(lanes):
            reply.lanes.append(_lane_result(int(rng.integers(0, 4)) or 1, lane))
        found.append(("reply", reply.SerializeToString()))
    return found


def _decode(kind: str, data: bytes) -> None:
    if kind == "tensor":
        codec.decode_array(codec.parse_tensor(data), key="fuzz")
        return
    reply = codec.parse_step_reply(data)
    for lane in reply.lanes:
        codec.decode_lane_result(lane, OBS, INFO, num_lanes=3)
        codec.decode_lane_result(lane)


def _field_change(kind: str, data: bytes, rng) -> bytes:
    """A valid message with one field set to a random, often wrong, value."""
    msg = pb.Tensor.FromString(data) if kind == "tensor" else pb.StepReply()
    if kind == "reply":
        msg.ParseFromString(data)
        lane = msg.lanes[int(rng.integers(len(msg.lanes)))]
        field = [lane.rewards, lane.terminated, lane.observation["pos"]]
        t = field[int(rng.integers(3))]
        lane.steps = int(rng.integers(0, 6))
    else:
        t = msg
    choice = int(rng.integers(4))
    if choice == 0:
        t.dtype = str(rng.choice([*ALLOWED, "complex64", "f4", "", "object"]))
    elif choice == 1:
        t.shape[:] = rng.integers(-3, 2**40, size=int(rng.integers(0, 4))).tolist()
    elif choice == 2:
        t.shape[:] = rng.integers(-1, 5, size=int(rng.integers(0, 4))).tolist()
    else:
        t.data = t.data[: int(rng.integers(0, len(t.data) + 1))] + b"\x02"
    return msg.SerializeToString()


def test_fuzz_decoder_only_decodes_or_raises_protocol_error():
    # 100,000+ messages: random bytes, bit flips, truncations, insertions and
    # field changes of valid Tensor / StepReply messages. Anything but a decoded
    # value or ProtocolError is a crash.
    rng = np.random.default_rng(20261130)
    corpus = _corpus(rng)
    counts = {"decoded": 0, "refused": 0}
    crashes = []
    start = time.perf_counter()
    total = 100_000
    for i in range(total):
        kind, data = corpus[int(rng.integers(len(corpus)))]
        how = i % 5
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
        else:
            data = _field_change(kind, data, rng)
        try:
            _decode(kind, data)
            counts["decoded"] += 1
        except ProtocolError:
            counts["refused"] += 1
        except Exception as exc:  # any other type is a crash
            crashes.append(f"{type(exc).__name__}: {exc} on {data[:40]!r}")
    elapsed = time.perf_counter() - start
    assert not crashes, f"{len(crashes)} crashes, first: {crashes[:5]}"
    assert counts["decoded"] + counts["refused"] == total
    # Both outcomes occur: the mutations reach past the parser.
    assert counts["decoded"] > 1000 and counts["refused"] > 1000, counts
    print(f"fuzz: {counts} in {elapsed:.1f} s", file=sys.stderr)
