"""One lane's observation as flat named leaves (JAX-free): one array is the leaf
``""``; a ``Dict``'s and ``Tuple``'s leaves are named by their keys and indices
joined with ``/`` (``{"cam": {"rgb": ...}}`` -> ``"cam/rgb"``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

#: A single-array observation's leaf name (the wire's ``OBS_KEY``).
WHOLE = ""


def leaf_name(path: tuple) -> str:
    return "/".join(str(p) for p in path)


class ObsLayout:
    """The named leaves of one lane's observation of a gymnasium space.

    ``leaf``: ``space -> (shape, dtype)`` of a one-array space; ``where`` names
    the env in messages. ``names`` are in the space's order; ``whole``: the
    observation is one array. TypeError: a leaf space ``leaf`` refuses, an
    empty Dict or Tuple, or a Dict key that is not a string or holds ``/``.
    """

    def __init__(self, space: Any, leaf: Callable[[Any], tuple], where: str):
        self.where = where
        self.paths: dict[str, tuple] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.skeleton = self._walk(space, (), leaf)
        self.names = tuple(self.paths)
        self.whole = self.names == (WHOLE,)

    def _walk(self, space: Any, path: tuple, leaf: Callable) -> Any:
        from gymnasium import spaces

        if isinstance(space, spaces.Dict | spaces.Tuple):
            kind = type(space).__name__
            if not len(space.spaces):
                raise TypeError(
                    f"{self.where}: observation_space has an empty {kind} at "
                    f"{leaf_name(path) or 'its top'}; give it at least one entry"
                )
            if isinstance(space, spaces.Tuple):
                return tuple(
                    self._walk(s, path + (i,), leaf) for i, s in enumerate(space)
                )
            out = {}
            for key, sub in space.spaces.items():
                if not isinstance(key, str) or "/" in key or not key:
                    raise TypeError(
                        f"{self.where}: observation Dict key {key!r} is not a "
                        "non-empty string without '/'; jaxmesh names leaves by "
                        "their keys joined with '/'. Rename the key with a "
                        "gymnasium ObservationWrapper"
                    )
                out[key] = self._walk(sub, path + (key,), leaf)
            return out
        name = leaf_name(path)
        shape, dtype = leaf(space)
        self.paths[name] = path
        self.shapes[name] = tuple(int(d) for d in shape)
        self.dtypes[name] = np.dtype(dtype)
        return name

    def select(self, keys: list[str]) -> ObsLayout:
        """This layout with only the top-level Dict entries ``keys`` (itself
        where it is not a Dict or lacks a key)."""
        if not isinstance(self.skeleton, dict) or any(
            k not in self.skeleton for k in keys
        ):
            return self
        out = copy.copy(self)
        out.skeleton = {k: self.skeleton[k] for k in keys}
        out.names = tuple(n for n in self.names if self.paths[n][0] in keys)
        for field in ("paths", "shapes", "dtypes"):
            setattr(out, field, {n: getattr(self, field)[n] for n in out.names})
        out.whole = False
        return out

    def _raw(self, value: Any, name: str, lane: int) -> Any:
        for p in self.paths[name]:
            try:
                value = value[p]
            except (KeyError, IndexError, TypeError) as exc:
                raise ValueError(
                    f"{self.where} lane {lane} returned an observation without "
                    f"{leaf_name(self.paths[name])!r} ({type(exc).__name__}: "
                    f"{exc}); its observation_space has leaves {list(self.names)}"
                ) from None
        return value

    def _check(self, arr: np.ndarray, name: str, lane: int, lead: int) -> None:
        if arr.shape[lead:] != self.shapes[name]:
            what = "an observation" if self.whole else f"observation leaf {name!r}"
            raise ValueError(
                f"{self.where} lane {lane} returned {what} of shape "
                f"{arr.shape[lead:]}; its observation_space has shape "
                f"{self.shapes[name]}. Make the env return observations of its "
                "declared shape"
            )

    def leaves(self, value: Any, lane: int) -> dict[str, np.ndarray]:
        """One observation as ``{name: array}`` (ValueError naming the lane)."""
        out = {}
        for name in self.names:
            arr = np.asarray(self._raw(value, name, lane), self.dtypes[name])
            self._check(arr, name, lane, 0)
            out[name] = arr
        return out

    def stack(self, values, lanes, out=None) -> dict[str, np.ndarray]:
        """Several lanes' observations as ``{name: array [m, ...]}``, into
        ``out[name]`` where given (a bad observation may leave it part written)."""
        got = {}
        for name in self.names:
            dtype = self.dtypes[name]
            if self.whole:
                rows = values
            else:
                rows = [
                    self._raw(v, name, j) for v, j in zip(values, lanes, strict=True)
                ]
            try:
                into = None if out is None else out.get(name)
                if into is None:
                    arr = np.asarray(rows, dtype)
                elif into.nbytes <= SMALL_STACK:  # no call per row
                    stacked, arr = np.asarray(rows), None
                    if stacked.shape == into.shape:
                        np.copyto(into, stacked, casting="unsafe")
                        arr = into
                else:
                    arr = np.stack(rows, out=into, casting="unsafe")
            except (TypeError, ValueError):  # ragged or not numbers: name the lane
                arr = None
            if arr is None or arr.shape[1:] != self.shapes[name]:
                for v, j in zip(values, lanes, strict=True):
                    self.leaves(v, j)
            got[name] = arr
        return got

    def take(self, batched, lanes, out=None) -> dict[str, np.ndarray]:
        """``lanes``' rows of a vector env's batched observation, into
        ``out[name]`` where given (ValueError naming the first lane)."""
        got = {}
        for name in self.names:
            arr = np.asarray(self._raw(batched, name, lanes[0]), self.dtypes[name])
            self._check(arr, name, lanes[0], 1)
            into = (out or {}).get(name)
            got[name] = arr[lanes] if into is None else arr.take(lanes, 0, into, "clip")
        return got

    def build(self, leaves: Mapping[str, Any]) -> Any:
        """The observation's own structure holding ``leaves[name]`` at each leaf."""
        return _fill(self.skeleton, leaves)

    def empty(self, lead=(), aligned=False) -> dict[str, np.ndarray]:
        """Zero leaves with leading axes ``lead`` (``aligned``: ``aligned_zeros``)."""
        zeros = aligned_zeros if aligned else np.zeros
        return {n: zeros(lead + self.shapes[n], self.dtypes[n]) for n in self.names}

    def nbytes(self) -> int:
        return sum(
            int(np.prod(self.shapes[n], dtype=np.int64)) * self.dtypes[n].itemsize
            for n in self.names
        )


#: Bytes up to which stacked leaves are gathered in one ``np.asarray`` and cast.
SMALL_STACK = 1 << 16

#: XLA's CPU client reads a jit argument so aligned in place (else copies it).
ALIGN = 64


def aligned_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.zeros(shape, dtype)`` starting on an ``ALIGN``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _fill(skeleton: Any, leaves: Mapping[str, Any]) -> Any:
    if isinstance(skeleton, str):
        return leaves[skeleton]
    if isinstance(skeleton, tuple):
        return tuple(_fill(s, leaves) for s in skeleton)
    return {k: _fill(s, leaves) for k, s in skeleton.items()}
