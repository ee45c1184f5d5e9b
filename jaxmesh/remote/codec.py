"""Arrays and leaves <-> ``jaxmesh.env.v1`` messages (docs/remote.md, "The
protocol"): pure functions over numpy and the generated classes; every way a
message can be wrong raises :class:`ProtocolError`. An array travels as a
``Tensor``: dtype name, shape, raw little-endian bytes in C order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError, Message

from jaxmesh.envs.gymnasium.batch import DTYPE_NAMES, ResultBatch
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES, PROTOCOL_VERSIONS

#: dtype names allowed on the wire -> their little-endian numpy dtype.
DTYPES = {name: np.dtype(name).newbyteorder("<") for name in DTYPE_NAMES}

# Bounds on what a peer may send (numpy's own limit is 64 dimensions).
MAX_NDIM = 32
MAX_DIM = 2**40
MAX_PROTOCOL_VERSIONS = 64
MAX_HANDSHAKE_BYTES = 1024 * 1024
#: The most observation (and info) keys a step request may name, and their length.
MAX_KEYS = 256
MAX_KEY_CHARS = 256
#: How many entries of a peer's list an error message names.
FEW = 8


def few(values: Iterable, count: int | None = None) -> str:
    """The first ``FEW`` of ``values`` for an error message (``count``: how many
    there are, when ``values`` is a prefix)."""
    head = [v if isinstance(v, int) else short(v) for v in list(values)[: FEW + 1]]
    more = len(head) > FEW or (count is not None and count > FEW)
    return "[" + ", ".join(str(v) for v in head[:FEW]) + (", ...]" if more else "]")


def short(text: object, limit: int = 64) -> str:
    """``repr(text)`` cut to about ``limit`` characters, for an error message."""
    text = str(text)
    more = f"... ({len(text)} characters)" if len(text) > limit else ""
    return repr(text[:limit]) + more


class ProtocolError(ValueError):
    """A message that breaks the protocol (a server answers INVALID_ARGUMENT)."""


class LeafSpec(NamedTuple):
    """One declared leaf: its key, numpy dtype name and shape."""

    key: str
    dtype: str
    shape: tuple[int, ...]


def _name(key: str | None) -> str:
    return "array" if key is None else f"leaf {short(key)}"


_WIRE_NAMES: dict[np.dtype, str] = {}  # cache of _wire_dtype (a hot path)


def _wire_dtype(dtype: np.dtype, key: str | None) -> str:
    name = _WIRE_NAMES.get(dtype)
    if name is None:
        name = dtype.newbyteorder("=").name if dtype.byteorder != "|" else dtype.name
        if name not in DTYPES or dtype.kind not in "biuf":
            raise ProtocolError(
                f"{_name(key)} has dtype {dtype.str!r}, which cannot be sent; "
                f"expected one of {sorted(DTYPES)}: cast it (e.g. with .astype) first"
            )
        _WIRE_NAMES[dtype] = name
    return name


def encode_array(x: npt.ArrayLike, key: str | None = None) -> pb.Tensor:
    """A numpy array as a ``Tensor`` (``key`` names the leaf in errors);
    ProtocolError: a dtype not in ``DTYPES``."""
    x = np.asarray(x)
    name = _wire_dtype(x.dtype, key)
    # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
    x = np.asarray(x, dtype=DTYPES[name], order="C")
    return pb.Tensor(dtype=name, shape=x.shape, data=x.tobytes())


def _shape(field: Any, what: str) -> tuple[int, ...]:
    """A message's shape, checked (``what``: the error's start)."""
    ndim = len(field)  # before a tuple is made of it: it may be huge
    shape = tuple(field) if ndim <= MAX_NDIM else ()
    if ndim > MAX_NDIM or (shape and (min(shape) < 0 or max(shape) > MAX_DIM)):
        raise ProtocolError(
            f"{what} shape {few(field[: FEW + 1], ndim)} ({ndim} dimensions), "
            f"expected at most {MAX_NDIM} dimensions, each in [0, {MAX_DIM}]; "
            "the peer sent a malformed shape"
        )
    return shape


def decode_array(
    tensor: pb.Tensor, expected: LeafSpec | None = None, *, key: str | None = None
) -> np.ndarray:
    """A ``Tensor`` as a read-only array viewing its bytes, checked (against
    ``expected``'s dtype and shape when given; ``key`` names the leaf);
    ProtocolError: a bad dtype, shape, byte count or bool byte, or a mismatch."""
    if key is None and expected is not None:
        key = expected.key
    # Each message field is read once (the hot path).
    if type(tensor) is not pb.Tensor and not isinstance(tensor, pb.Tensor):
        raise ProtocolError(
            f"{_name(key)}: expected a jaxmesh.env.v1.Tensor message, got "
            f"{type(tensor).__name__}"
        )
    name = tensor.dtype
    dtype = DTYPES.get(name)
    if dtype is None:
        raise ProtocolError(
            f"{_name(key)} has dtype {name[:64]!r}, expected one of "
            f"{sorted(DTYPES)}; the peer sent a dtype this protocol does not know "
            "(check both ends run the same jaxmesh protocol version)"
        )
    shape = _shape(tensor.shape, f"{_name(key)} has")
    # One read: under protobuf's upb runtime each access to a bytes field copies.
    data = tensor.data
    need = math.prod(shape) * dtype.itemsize
    if need != len(data):
        raise ProtocolError(
            f"{_name(key)} ({name}, shape {list(shape)}) needs {need} bytes, "
            f"but the message holds {len(data)}; the peer sent bytes that do not "
            "match the shape"
        )
    if expected is not None and (
        name != expected.dtype or shape != tuple(expected.shape)
    ):
        raise ProtocolError(
            f"{_name(key)} is {name}{list(shape)}, expected "
            f"{expected.dtype}{list(expected.shape)} as declared in the "
            "handshake; the peer broke its own declaration"
        )
    # With a zero dimension the bytes bound nothing: the other dims may be huge.
    if need == 0 and math.prod(max(d, 1) for d in shape) > 2**62:
        raise ProtocolError(
            f"{_name(key)} has shape {list(shape)}, too large for numpy; the peer sent "
            "a malformed shape"
        )
    if dtype.kind == "b" and data.count(b"\x00") + data.count(b"\x01") != len(data):
        raise ProtocolError(
            f"{_name(key)} is bool, but its bytes hold values other than 0 and 1"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def encode_leaves(leaves: Mapping[str, npt.ArrayLike]) -> dict[str, pb.Tensor]:
    """A dict of arrays as a dict of ``Tensor`` messages (see :func:`encode_array`)."""
    return {key: encode_array(x, key) for key, x in leaves.items()}


def decode_leaves(
    tensors: Mapping[str, pb.Tensor],
    expected: Mapping[str, LeafSpec] | None = None,
    *,
    lead: int | None = None,
) -> dict[str, np.ndarray]:
    """``Tensor`` messages as checked arrays: with ``expected``, exactly its
    keys, in its order, each of its dtype and shape (``(lead, *shape)`` with
    ``lead``); ProtocolError otherwise."""
    if expected is None:
        return {str(k): decode_array(t, key=str(k)) for k, t in tensors.items()}
    if len(tensors) != len(expected) or not all(k in tensors for k in expected):
        given, wanted = set(tensors.keys()), set(expected)
        raise ProtocolError(
            f"leaves {few(sorted(given))} were sent, expected exactly "
            f"{sorted(wanted)}; missing {sorted(wanted - given)}, unexpected "
            f"{few(sorted(given - wanted))}"
        )
    return {
        key: decode_array(
            tensors[key],
            spec if lead is None else spec._replace(shape=(lead, *spec.shape)),
        )
        for key, spec in expected.items()
    }


def leaf_spec_to_proto(spec: LeafSpec) -> pb.LeafSpec:
    name = _wire_dtype(np.dtype(spec.dtype), spec.key)
    return pb.LeafSpec(key=spec.key, dtype=name, shape=tuple(spec.shape))


def leaf_spec_from_proto(msg: pb.LeafSpec) -> LeafSpec:
    """A ``LeafSpec`` message, checked (ProtocolError)."""
    what = _name(msg.key)
    shape = _shape(msg.shape, f"{what} is declared with")
    if msg.dtype not in DTYPES:
        raise ProtocolError(
            f"{what} is declared with dtype {msg.dtype[:64]!r}, expected one of "
            f"{sorted(DTYPES)}"
        )
    return LeafSpec(msg.key, msg.dtype, shape)


class ActionBatch(NamedTuple):
    """A decoded ``ActionBatch``: ``lanes[i]`` (ascending) replays rows
    ``offsets[i] : offsets[i] + counts[i]`` of each ``actions`` leaf."""

    lanes: np.ndarray
    counts: np.ndarray
    actions: dict[str, np.ndarray]

    @property
    def offsets(self) -> np.ndarray:
        # Not concatenate([[0], cumsum[:-1]]): that gives [0] for no lanes.
        return (np.cumsum(self.counts) - self.counts).astype(np.int64)


def _vector(msg: Message, field: str, key: str, steps: int | None = None):
    """A per-lane uint32 vector (``steps`` None) or one float (``rewards``) or
    bool entry per executed step, checked."""
    kind = "u" if steps is None else "f" if field == "rewards" else "b"
    dtype = {"u": np.int64, "f": np.float64, "b": bool}[kind]
    if not steps and not msg.HasField(field):
        return np.zeros(0, dtype)
    tensor = getattr(msg, field)
    x = decode_array(tensor, key=key)
    if kind == "u" and (x.ndim != 1 or x.dtype != np.uint32):
        want = "a uint32 vector (one entry per lane of the batch)"
    elif kind != "u" and (x.shape != (steps,) or x.dtype.kind != kind):
        want = "a float dtype" if kind == "f" else "bool"
        want += f" of shape [{steps}] (one per executed step)"
    else:
        return x if kind == "b" else x.astype(dtype)
    raise ProtocolError(
        f"{_name(key)} is {tensor.dtype}{list(x.shape)}, expected {want}"
    )


def _check_lanes(lanes: np.ndarray, num_lanes: int | None, what: str) -> None:
    if lanes.size > 1 and (lanes[1:] <= lanes[:-1]).any():
        raise ProtocolError(
            f"{what} lanes {lanes[:16].tolist()} are not strictly ascending; each "
            "lane appears once, in ascending order"
        )
    if num_lanes is not None and lanes.size and int(lanes[-1]) >= num_lanes:
        raise ProtocolError(
            f"{what} names lane {int(lanes[-1])}, but the session has {num_lanes} "
            f"lanes (0..{num_lanes - 1})"
        )


def _rows_of(
    tensors: Mapping[str, pb.Tensor],
    specs: Mapping[str, LeafSpec] | None,
    total: int,
    what: str,
) -> dict[str, np.ndarray]:
    if specs is None:
        out = decode_leaves(tensors)
        for key, x in out.items():
            if x.ndim < 1 or x.shape[0] != total:
                raise ProtocolError(
                    f"{what} {_name(key)} has shape {list(x.shape)}, expected "
                    f"{total} rows on its first axis"
                )
        return out
    return decode_leaves(tensors, specs, lead=total)


def encode_action_batch(
    lanes: npt.ArrayLike, counts: npt.ArrayLike, actions: Mapping[str, npt.ArrayLike]
) -> pb.ActionBatch:
    return pb.ActionBatch(
        lanes=encode_array(np.asarray(lanes, np.uint32)),
        counts=encode_array(np.asarray(counts, np.uint32)),
        actions=encode_leaves(actions),
    )


def decode_action_batch(
    msg: pb.ActionBatch,
    specs: Mapping[str, LeafSpec],
    *,
    num_lanes: int | None = None,
    max_count: int = 1_000_000,
) -> ActionBatch:
    """An ``ActionBatch`` checked against the declared action leaves
    (ProtocolError)."""
    if num_lanes is not None:  # before anything is made of them
        for key, field in (("batch lanes", msg.lanes), ("batch counts", msg.counts)):
            shape = field.shape
            if len(shape) <= MAX_NDIM and (size := math.prod(shape)) > num_lanes:
                raise ProtocolError(
                    f"the action batch names {size} lanes ({key}), but the "
                    f"session has {num_lanes} lanes; each lane appears once"
                )
    lanes = _vector(msg, "lanes", "batch lanes")
    counts = _vector(msg, "counts", "batch counts")
    check_action_vectors(lanes, counts, num_lanes=num_lanes, max_count=max_count)
    actions = _rows_of(msg.actions, specs, int(counts.sum()), "the action batch")
    return ActionBatch(lanes, counts, actions)


def check_action_vectors(
    lanes: np.ndarray,
    counts: np.ndarray,
    *,
    num_lanes: int | None = None,
    max_count: int = 1_000_000,
) -> None:
    """Lanes and counts as ``decode_action_batch`` checks them (also for the
    same-host frames)."""
    if lanes.shape != counts.shape:
        raise ProtocolError(
            f"the action batch has {lanes.size} lanes and {counts.size} counts; "
            "expected one count per lane"
        )
    _check_lanes(lanes, num_lanes, "the action batch")
    if counts.size and (counts.min() < 1 or counts.max() > max_count):
        raise ProtocolError(
            f"the action batch has counts from {int(counts.min())} to "
            f"{int(counts.max())}, expected each in 1..{max_count} actions per lane"
        )


def encode_result_batch(
    lanes: npt.ArrayLike,
    steps: npt.ArrayLike,
    rows: npt.ArrayLike,
    rewards: npt.ArrayLike,
    terminated: npt.ArrayLike,
    truncated: npt.ArrayLike,
    observation: Mapping[str, npt.ArrayLike],
    info: Mapping[str, npt.ArrayLike] | None = None,
    info_present: Mapping[str, npt.ArrayLike] | None = None,
    info_rows: npt.ArrayLike | None = None,
) -> pb.ResultBatch:
    present = (info_present or {}).items()
    return pb.ResultBatch(
        lanes=encode_array(np.asarray(lanes, np.uint32)),
        steps=encode_array(np.asarray(steps, np.uint32)),
        rows=encode_array(np.asarray(rows, np.uint32)),
        rewards=encode_array(np.asarray(rewards, np.float64)),
        terminated=encode_array(np.asarray(terminated, bool)),
        truncated=encode_array(np.asarray(truncated, bool)),
        observation=encode_leaves(observation),
        info=encode_leaves(info or {}),
        info_present={k: encode_array(np.asarray(x, bool), k) for k, x in present},
        info_rows=None if info_rows is None else encode_array(np.uint32(info_rows)),
    )


def decode_result_batch(
    msg: pb.ResultBatch,
    observation: Mapping[str, LeafSpec] | None = None,
    info: Mapping[str, LeafSpec] | None = None,
    *,
    num_lanes: int | None = None,
) -> ResultBatch:
    """A ``ResultBatch`` checked against ``observation`` and ``info`` (their
    specs; None: as sent) and ``num_lanes`` (ProtocolError)."""
    lanes = _vector(msg, "lanes", "result lanes")
    steps = _vector(msg, "steps", "result steps")
    rows = _vector(msg, "rows", "result rows")
    has = msg.HasField("info_rows")
    info_rows = _vector(msg, "info_rows", "result info rows") if has else None
    check_result_vectors(lanes, steps, rows, info_rows, num_lanes=num_lanes)
    total = int(steps.sum())
    rewards, terminated, truncated = (
        _vector(msg, k, k, total) for k in ("rewards", "terminated", "truncated")
    )
    n_rows = int(rows.sum())
    n_info = n_rows if info_rows is None else int(info_rows.sum())
    obs = _rows_of(msg.observation, observation, n_rows, "the result batch")
    inf = _rows_of(msg.info, info, n_info, "the result batch")
    present = {}
    for key, tensor in msg.info_present.items():
        if key not in inf:
            raise ProtocolError(
                f"the result batch marks which rows have info {_name(key)}, but "
                "carries no such info leaf"
            )
        x = decode_array(tensor, key=key)
        if x.dtype != np.bool_ or x.shape != (n_info,):
            raise ProtocolError(
                f"the result batch's presence of info {_name(key)} is "
                f"{x.dtype}{list(x.shape)}, expected bool[{n_info}] (one per row)"
            )
        present[key] = x
    return ResultBatch(
        lanes, steps, rows, rewards, terminated, truncated, obs, inf, present, info_rows
    )


def check_result_vectors(
    lanes: np.ndarray,
    steps: np.ndarray,
    rows: np.ndarray,
    info_rows: np.ndarray | None = None,
    *,
    num_lanes: int | None = None,
) -> None:
    """Per-lane vectors as ``decode_result_batch`` checks them (also for the
    same-host frames)."""
    if not lanes.shape == steps.shape == rows.shape or (
        info_rows is not None and info_rows.shape != lanes.shape
    ):
        counts = "" if info_rows is None else f", {info_rows.size} info row counts"
        raise ProtocolError(
            f"the result batch has {lanes.size} lanes, {steps.size} step counts and "
            f"{rows.size} row counts{counts}; expected one of each per lane"
        )
    _check_lanes(lanes, num_lanes, "the result batch")
    low, high = np.minimum(steps, 1), np.maximum(steps, 1)
    for what, x in (("observation", rows), ("info", info_rows)):
        if x is not None and np.any((x < low) | (x > high)):
            i = int(np.argmax((x < low) | (x > high)))
            raise ProtocolError(
                f"result lane {int(lanes[i])} has {int(x[i])} {what} rows for "
                f"{int(steps[i])} steps; expected {int(low[i])} to {int(high[i])}"
            )


def check_size(nbytes: int, limit: int = MAX_MESSAGE_BYTES, what: str = "message"):
    if nbytes > limit:
        mib = 1024 * 1024
        raise ProtocolError(
            f"a {what} of {nbytes} bytes ({nbytes / mib:.1f} MiB) is over the "
            f"{limit} byte ({limit / mib:.1f} MiB) per-message limit; use fewer "
            "lanes per server, or a smaller declared observation (a spec that reads "
            "fewer or smaller leaves; explain() lists what crosses the wire)"
        )


M = TypeVar("M", bound=Message)


def _parse(cls: type[M], data: bytes, limit: int = MAX_MESSAGE_BYTES) -> M:
    check_size(len(data), limit, f"{cls.DESCRIPTOR.full_name} message")
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(
            f"{len(data)} bytes are not a valid {cls.DESCRIPTOR.full_name} message "
            f"({type(exc).__name__}: {exc}); check both ends speak the same "
            "jaxmesh protocol version"
        ) from exc
    return msg


# Serialized bytes -> a message (ProtocolError: not one, or over ``limit``).
parse_tensor = functools.partial(_parse, pb.Tensor)
parse_step_request = functools.partial(_parse, pb.StepRequest)
parse_step_reply = functools.partial(_parse, pb.StepReply)
parse_handshake_reply = functools.partial(_parse, pb.HandshakeReply)


def parse_handshake_request(
    data: bytes, limit: int = MAX_MESSAGE_BYTES
) -> pb.HandshakeRequest:
    """``_parse`` within ``MAX_HANDSHAKE_BYTES`` and ``MAX_PROTOCOL_VERSIONS``."""
    if len(data) > min(limit, MAX_HANDSHAKE_BYTES):
        raise ProtocolError(
            f"a handshake request of {len(data)} bytes is over the "
            f"{min(limit, MAX_HANDSHAKE_BYTES)} byte limit of a handshake (a few "
            "protocol versions, a version string and a token)"
        )
    msg = _parse(pb.HandshakeRequest, data, limit)
    count = len(msg.protocol_versions)
    if count > MAX_PROTOCOL_VERSIONS:
        raise ProtocolError(
            f"the handshake lists {count} protocol versions, more than the "
            f"{MAX_PROTOCOL_VERSIONS} a client may list (the first: "
            f"{few(msg.protocol_versions[: FEW + 1], count)}); list the versions "
            "the client speaks"
        )
    return msg


def choose_version(
    client_versions: Iterable[int], server_versions: Iterable[int] = PROTOCOL_VERSIONS
) -> int:
    """The newest protocol version both sides speak (ProtocolError: none)."""
    client, server = sorted(set(client_versions)), sorted(set(server_versions))
    common = set(client) & set(server)
    if not common:

        def say(v: list[int]) -> str:
            return str(v) if len(v) <= FEW else f"{len(v)} versions, {few(v)}"

        raise ProtocolError(
            f"no protocol version in common: the client speaks {say(client)}, "
            f"the server speaks {say(server)}; upgrade the older side of jaxmesh"
        )
    return max(common)
