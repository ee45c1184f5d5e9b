"""Gymnasium spaces <-> ``LeafSpec`` messages: the server declares them with
``space_leaf`` / ``space_leaves``, a client rebuilds them with ``leaf_space`` /
``observation_space``. A Box bound whose entries are all equal travels as one
scalar, so a large observation's handshake stays small.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import gymnasium
import numpy as np

from jaxmesh.envs.gymnasium.leaves import ObsLayout
from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb

BOX = "box"
DISCRETE = "discrete"
#: ``LeafSpec.nest`` letters: the part of a leaf's key is a Dict key, a Tuple index.
DICT = "d"
TUPLE = "t"


def space_leaf(space: Any, key: str = "", *, where: str = "space") -> pb.LeafSpec:
    """A ``Box`` or ``Discrete`` space (one lane's) as a ``LeafSpec`` under
    ``key`` (``where`` names it in errors); TypeError: any other space, or a
    Box whose dtype cannot travel."""
    spaces = gymnasium.spaces
    if isinstance(space, spaces.Discrete):
        n, start = int(space.n), int(space.start)
        return pb.LeafSpec(key=key, dtype="int64", space=DISCRETE, n=n, start=start)
    if isinstance(space, spaces.Box):
        dtype = np.dtype(space.dtype)
        try:
            low = codec.encode_array(_bound(np.asarray(space.low, dtype)), key)
            high = codec.encode_array(_bound(np.asarray(space.high, dtype)), key)
        except codec.ProtocolError as exc:
            raise TypeError(f"{where} {space}: {exc}") from exc
        shape = tuple(int(d) for d in space.shape)
        return pb.LeafSpec(
            key=key, dtype=low.dtype, shape=shape, space=BOX, low=low, high=high
        )
    raise TypeError(
        f"{where} {space} is a {type(space).__name__}; jaxmesh serves gymnasium "
        "spaces that are Box or Discrete, and observation spaces that nest them "
        "in Dict and Tuple spaces (MultiDiscrete, MultiBinary, and Dict or Tuple "
        "actions, are not supported yet). Wrap the env in a gymnasium "
        "ObservationWrapper or ActionWrapper that maps it to a Box or Discrete "
        "(e.g. gymnasium.wrappers.FlattenObservation(env))"
    )


def _bound(x: np.ndarray) -> np.ndarray:
    if x.size > 1 and np.all(x == x.flat[0]):
        return x.reshape(-1)[:1].reshape(())
    return x


def leaf_space(msg: pb.LeafSpec) -> gymnasium.Space:
    """The space a ``LeafSpec`` declares (inverse of ``space_leaf``;
    ProtocolError: an unknown or malformed one)."""
    spec = codec.leaf_spec_from_proto(msg)
    what = f"leaf {msg.key!r}"
    if msg.space == DISCRETE:
        if spec.dtype != "int64" or spec.shape != () or msg.n < 1:
            raise codec.ProtocolError(
                f"{what} is declared as Discrete with dtype {spec.dtype}, shape "
                f"{list(spec.shape)}, n={msg.n}; expected an int64 scalar with "
                "n >= 1"
            )
        return gymnasium.spaces.Discrete(int(msg.n), start=int(msg.start))
    if msg.space == BOX:
        if not (msg.HasField("low") and msg.HasField("high")):
            raise codec.ProtocolError(
                f"{what} is declared as Box without low and high; the peer must "
                "send both"
            )
        scalar = spec._replace(shape=())
        # A scalar bound (every entry the same) as a numpy scalar: Box takes it.
        low, high = (
            codec.decode_array(t, spec if len(t.shape) else scalar)[()]
            for t in (msg.low, msg.high)
        )
        try:
            return gymnasium.spaces.Box(
                low=low, high=high, shape=spec.shape, dtype=np.dtype(spec.dtype)
            )
        except (ValueError, TypeError, AssertionError) as exc:
            raise codec.ProtocolError(
                f"{what} is declared as a Box gymnasium refuses: {exc}"
            ) from exc
    raise codec.ProtocolError(
        f"{what} is declared with space {msg.space[:64]!r}; expected 'box' or "
        "'discrete' (a server of a newer jaxmesh may declare more: upgrade this "
        "side)"
    )


def space_leaves(space: Any, *, where: str = "observation_space") -> list[pb.LeafSpec]:
    """An observation space as one ``LeafSpec`` per leaf, in its order (a
    single array: the leaf ``""``); TypeError: one that cannot travel."""
    out = []
    # ObsLayout refuses an empty Dict or Tuple and a Dict key that names no leaf.
    for name, path in ObsLayout(space, lambda s: ((), None), where).paths.items():
        sub = functools.reduce(operator.getitem, path, space)
        msg = space_leaf(sub, name, where=f"{where} leaf {name!r}" if path else where)
        msg.nest = "".join(DICT if isinstance(p, str) else TUPLE for p in path)
        out.append(msg)
    return out


def observation_space(msgs: Any) -> gymnasium.Space:
    """The observation space the handshake's leaves declare (inverse of
    ``space_leaves``; ProtocolError: leaves that build no space)."""
    msgs = list(msgs)
    if not msgs:
        raise codec.ProtocolError(
            "the handshake declares no observation leaf; expected at least one"
        )
    if len(msgs) == 1 and not msgs[0].nest:
        if msgs[0].key != "":
            raise codec.ProtocolError(
                f"the observation's one leaf is declared under key "
                f"{codec.short(msgs[0].key)} without a nest; a single-array "
                "observation is the leaf ''"
            )
        return leaf_space(msgs[0])
    root: dict = {}  # part -> subtree or leaf space; kinds kept apart
    kinds: dict[tuple, str] = {}
    for msg in msgs:
        key, nest = msg.key, msg.nest
        parts = key.split("/")
        what = f"observation leaf {codec.short(key)}"
        if (
            not nest
            or len(parts) != len(nest)
            or any(c not in (DICT, TUPLE) for c in nest)
            or not all(parts)
        ):
            raise codec.ProtocolError(
                f"{what} is declared with nest {codec.short(nest)}; expected one "
                f"letter per part of the key, {DICT!r} (a Dict key) or {TUPLE!r} "
                "(a Tuple index), for every leaf of an observation with several"
            )
        node = root
        for i, (part, kind) in enumerate(zip(parts, nest, strict=True)):
            path = tuple(parts[:i])
            if kinds.setdefault(path, kind) != kind:
                raise codec.ProtocolError(
                    f"{what} makes {'/'.join(path) or 'the top'} both a Dict and "
                    "a Tuple; the server broke its own declaration"
                )
            if kind == TUPLE and not (
                part.isascii() and part.isdecimal() and str(int(part)) == part
            ):
                raise codec.ProtocolError(
                    f"{what} has Tuple index {codec.short(part)}; expected a "
                    "number without leading zeros"
                )
            last = i == len(parts) - 1
            sub = node.get(part)
            if sub is not None and (last or not isinstance(sub, dict)):
                raise codec.ProtocolError(
                    f"{what} is declared twice, or as a leaf and as a nest; the "
                    "server broke its own declaration"
                )
            if last:
                node[part] = leaf_space(msg)
            else:
                node = node.setdefault(part, {})

    def make(node: Any, path: tuple) -> gymnasium.Space:
        if not isinstance(node, dict):  # a leaf's space
            return node
        if kinds[path] == DICT:
            return gymnasium.spaces.Dict(
                [(k, make(v, path + (k,))) for k, v in node.items()]
            )
        if sorted(int(k) for k in node) != list(range(len(node))):
            raise codec.ProtocolError(
                f"the Tuple at {'/'.join(path) or 'the top'} of the observation "
                f"declares entries {codec.few(sorted(int(k) for k in node))}; "
                "expected 0 .. n - 1"
            )
        return gymnasium.spaces.Tuple(
            [make(node[str(i)], path + (str(i),)) for i in range(len(node))]
        )

    return make(root, ())
