"""POSIX shared memory shared by the worker processes and the same-host served
transport: :class:`Segment` (a segment mapped without the resource tracker) and
:class:`Slots` (per-lane arrays at fixed offsets in one segment).

Cleanup rules: the process that creates a segment unlinks it when done; a
process that maps one by name unlinks it too when its peer dies (the creator
can no longer do it). Unlinking twice is harmless.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["Segment", "Slots"]


class Segment:
    """A POSIX shared-memory segment mapped into this process, created with
    ``size`` or mapped by name, without a resource-tracker process (which
    would outlive the run)."""

    def __init__(self, name: str, size: int | None = None):
        import _posixshmem

        self.name = name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if size is not None else 0)
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        except BaseException:
            if size is not None:
                self.unlink()
            raise
        finally:
            os.close(fd)
        self.buf = memoryview(self._map)

    def close(self) -> None:
        self.buf.release()
        self._map.close()

    def unlink(self) -> None:
        import _posixshmem

        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            pass


class Slots:
    """Per-lane arrays in one shared-memory segment (the same offsets on both
    sides). ``fields``: name -> (shape per lane, dtype)."""

    def __init__(self, shm: Segment, n: int, fields: dict):
        self.shm = shm
        self.arrays: dict[str, np.ndarray] = {}
        offset = 0
        for name, (shape, dtype) in fields.items():
            dtype = np.dtype(dtype)
            offset = -(-offset // 64) * 64  # each array on its own cache line
            arr = np.ndarray((n,) + tuple(shape), dtype, shm.buf, offset)
            self.arrays[name] = arr
            offset += arr.nbytes

    @staticmethod
    def size(n: int, fields: dict) -> int:
        offset = 0
        for shape, dtype in fields.values():
            offset = -(-offset // 64) * 64
            offset += n * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return max(offset, 1)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def release(self) -> None:
        self.arrays.clear()
        self.shm.close()
