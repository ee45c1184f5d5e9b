"""openpi's wire format: msgpack, numpy arrays and scalars as the tagged maps
``openpi_client.msgpack_numpy`` writes (``__ndarray__``, ``__npgeneric__``),
never pickle. Decoding is bounded (docs/serving.md, "Security and limits").
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

#: dtype kinds that never cross the wire: object, void (records), complex.
REFUSED_KINDS = ("O", "V", "c")
#: The most entries of one list or map in a message.
MAX_CONTAINER = 4096
#: The most entries of every list and map of a message together.
MAX_ITEMS = 65536
#: The request bytes a server's connections may hold at once, by default.
MAX_INFLIGHT_BYTES = 1 << 30


class CodecError(ValueError):
    """Bytes that are not an openpi message, or a value that cannot be one."""


def _buffer(array: np.ndarray) -> Any:
    """``array``'s bytes, without a copy when it is contiguous."""
    array = np.ascontiguousarray(array)
    if array.size:
        try:
            return memoryview(array.reshape(-1)).cast("B")
        except (TypeError, ValueError):  # a dtype buffers do not carry
            pass
    return array.tobytes()


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in REFUSED_KINDS:
        raise CodecError(
            f"cannot send an array of dtype {obj.dtype}: openpi's format carries "
            "numbers, bools, strings, lists and dicts only"
        )
    if isinstance(obj, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": _buffer(obj),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise CodecError(
        f"cannot send a {type(obj).__name__} ({obj!r:.60}): openpi's format "
        "carries numpy arrays, numbers, strings, lists and dicts"
    )


#: dtype strings read so far -> their dtype (parsed once per process).
_DTYPES: dict[Any, np.dtype] = {}


def _dtype(raw: Any) -> np.dtype:
    if type(raw) is str or type(raw) is bytes:
        known = _DTYPES.get(raw)
        if known is not None:
            return known
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind in REFUSED_KINDS or dtype.hasobject:
        raise CodecError(
            f"an array of dtype {text!r}: expected a numpy dtype string of numbers "
            "or bools, e.g. '<f4' or '|u1'"
        )
    if len(_DTYPES) < 256:
        _DTYPES[raw] = dtype
    return dtype


def _unpack_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape = obj.get(b"shape")
        data = obj.get(b"data")
        if not (
            isinstance(shape, list | tuple)
            and all(isinstance(s, int) and s >= 0 for s in shape)
            and isinstance(data, bytes)
        ):
            raise CodecError(
                "an __ndarray__ map needs b'shape' (a list of ints >= 0) and "
                "b'data' (bytes)"
            )
        count = math.prod(shape)
        if count * dtype.itemsize != len(data):
            raise CodecError(
                f"an array of shape {list(shape)} and dtype {dtype.str} is "
                f"{count * dtype.itemsize} bytes, but its data holds {len(data)}"
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if b"__npgeneric__" in obj:
        return _dtype(obj.get(b"dtype")).type(obj.get(b"data"))
    return obj


def packb(obj: Any) -> bytes:
    """``obj`` (dicts, lists, strings, numbers, numpy arrays) as msgpack bytes.

    Raises:
      CodecError: a value of another type, or an array of a refused dtype.
    """
    return msgpack.packb(obj, default=_pack_default)


def unpackb(data: bytes, *, max_bytes: int | None = None) -> Any:
    """The value msgpack ``data`` holds, arrays as (read-only) numpy arrays.

    Raises:
      CodecError: not msgpack, a malformed array map or a refused dtype, over
        ``max_bytes``, ``MAX_CONTAINER`` or ``MAX_ITEMS``, or an extension type.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(
            f"expected a binary frame of msgpack, got a {type(data).__name__} frame"
        )
    if max_bytes is not None and len(data) > max_bytes:
        raise CodecError(f"a message of {len(data)} bytes is over {max_bytes}")
    if len(data) <= MAX_ITEMS // 2:
        # A byte at least per entry, counted twice at most: cannot pass MAX_ITEMS.
        return _unpack(data, _unpack_hook, None)
    items = 0

    def count(container: Any) -> Any:
        nonlocal items
        items += 1 + len(container)
        if items > MAX_ITEMS:
            raise CodecError(
                f"a message of {len(data)} bytes holds over {MAX_ITEMS} list and "
                "map entries; send arrays as numpy arrays (one __ndarray__ map "
                "each), not as lists of numbers or of containers"
            )
        return container

    return _unpack(data, lambda obj: _unpack_hook(count(obj)), count)


def _unpack(data: Any, on_map: Any, on_list: Any) -> Any:
    try:
        return msgpack.unpackb(
            data,
            object_hook=on_map,
            list_hook=on_list,
            raw=False,
            max_array_len=MAX_CONTAINER,
            max_map_len=MAX_CONTAINER,
            max_ext_len=0,
        )
    except CodecError:
        raise
    except (ValueError, TypeError, msgpack.exceptions.ExtraData) as e:
        why = str(e)
        if "max_ext_len" in why:
            why = "an extension type, which this protocol never sends"
        elif "exceeds max_" in why:
            why += (
                f" (a list or map holds at most {MAX_CONTAINER} entries; send "
                "arrays as numpy arrays)"
            )
        raise CodecError(f"not a msgpack message of this protocol: {why}") from None


__all__ = [
    "CodecError",
    "MAX_CONTAINER",
    "MAX_INFLIGHT_BYTES",
    "MAX_ITEMS",
    "REFUSED_KINDS",
    "packb",
    "unpackb",
]
