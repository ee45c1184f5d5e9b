"""Gymnasium spaces <-> ``LeafSpec`` messages of the ``jaxmesh.env.v1`` protocol.

Used by both ends: the server declares its env's spaces in the handshake with
:func:`space_leaf`, a client rebuilds them with :func:`leaf_space`. Only
single-array spaces travel for now, under the key ``""``:

- ``Box``: ``space="box"``, the space's own dtype and shape, ``low`` and
  ``high`` as Tensors of that dtype and shape, or as a scalar of that dtype
  when every entry is the same (so a large observation's handshake stays small).
- ``Discrete(n, start)``: ``space="discrete"``, dtype ``int64``, shape ``[]``,
  ``n`` and ``start``.

Values on the wire are the env's own: an observation is ``np.asarray(obs,
space.dtype)`` (``int64`` for a Discrete space), an action is what the env's
``step`` takes (a Discrete action includes ``start``). No JAX here.

Example:
    >>> import gymnasium
    >>> box = gymnasium.spaces.Box(-1.0, 1.0, (3,))
    >>> leaf_space(space_leaf(box)) == box
    True
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb

__all__ = ["BOX", "DISCRETE", "leaf_spec", "leaf_space", "space_leaf", "wire_value"]

BOX = "box"
DISCRETE = "discrete"


def _unsupported(space: Any, where: str) -> TypeError:
    return TypeError(
        f"{where} {space} is a {type(space).__name__}; jaxmesh serves gymnasium "
        "spaces that are Box or Discrete only (MultiDiscrete, MultiBinary, Dict "
        "and Tuple are not supported yet). Wrap the env in a gymnasium "
        "ObservationWrapper or ActionWrapper that maps it to a Box or Discrete "
        "(e.g. gymnasium.wrappers.FlattenObservation(env))"
    )


def space_leaf(space: Any, key: str = "", *, where: str = "space") -> pb.LeafSpec:
    """A gymnasium ``Box`` or ``Discrete`` space as a ``LeafSpec`` message.

    Args:
        space: the space (one lane's, no lane axis).
        key: the leaf's key (``""`` for a space that is a single array).
        where: what the space is, for errors (e.g. ``"observation_space"``).

    Returns:
        The ``jaxmesh.env.v1.LeafSpec``: a Box keeps its dtype, shape, low and
        high; a Discrete is an ``int64`` scalar with ``n`` and ``start``.

    Raises:
        TypeError: any other space, or a Box whose dtype cannot travel.
    """
    spaces = gymnasium.spaces
    if isinstance(space, spaces.Discrete):
        return pb.LeafSpec(
            key=key,
            dtype="int64",
            shape=(),
            space=DISCRETE,
            n=int(space.n),
            start=int(space.start),
        )
    if isinstance(space, spaces.Box):
        dtype = np.dtype(space.dtype)
        try:
            low = codec.encode_array(_bound(np.asarray(space.low, dtype)), key)
            high = codec.encode_array(_bound(np.asarray(space.high, dtype)), key)
        except codec.ProtocolError as exc:
            raise TypeError(f"{where} {space}: {exc}") from exc
        return pb.LeafSpec(
            key=key,
            dtype=low.dtype,
            shape=tuple(int(d) for d in space.shape),
            space=BOX,
            low=low,
            high=high,
        )
    raise _unsupported(space, where)


def _bound(x: np.ndarray) -> np.ndarray:
    """A Box bound as sent: one scalar when every entry is the same (an image's
    0..255), so that a large observation's handshake stays small."""
    if x.size > 1 and np.all(x == x.flat[0]):
        return x.reshape(-1)[:1].reshape(())
    return x


def leaf_spec(space: Any, key: str = "", *, where: str = "space") -> codec.LeafSpec:
    """The :class:`codec.LeafSpec` (key, wire dtype, shape) of one value of ``space``.

    Raises:
        TypeError: as :func:`space_leaf`.
    """
    msg = space_leaf(space, key, where=where)
    return codec.LeafSpec(key, msg.dtype, tuple(msg.shape))


def leaf_space(msg: pb.LeafSpec) -> gymnasium.Space:
    """The gymnasium space a ``LeafSpec`` message declares (inverse of space_leaf).

    Args:
        msg: a ``LeafSpec`` with ``space`` ``"box"`` or ``"discrete"``.

    Returns:
        A ``gymnasium.spaces.Box`` or ``Discrete`` equal to the one declared.

    Raises:
        codec.ProtocolError: an unknown ``space`` kind, a Discrete with ``n <
            1`` or not an ``int64`` scalar, a Box whose low or high do not
            match its dtype and shape.
    """
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
            codec.decode_array(t, scalar, key=msg.key)[()]
            if len(t.shape) == 0
            else codec.decode_array(t, spec, key=msg.key)
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


def wire_value(space: Any, value: Any) -> np.ndarray:
    """One env value (an observation) as the array that travels for ``space``.

    A Discrete value becomes an ``int64`` scalar; a Box value an array of the
    space's dtype.

    Raises:
        ValueError: the value's shape is not the space's.
    """
    if isinstance(space, gymnasium.spaces.Discrete):
        arr = np.asarray(value, np.int64)
    else:
        arr = np.asarray(value, space.dtype)
    if arr.shape != space.shape:
        raise ValueError(
            f"the env returned a value of shape {arr.shape} for {space}, whose "
            f"shape is {space.shape}; make the env return values of its declared "
            "shape"
        )
    return arr
