"""POSIX shared memory of the worker processes and the same-host transport.

The process that creates a segment unlinks it when done; one that maps it by
name unlinks it too when its peer dies. Unlinking twice is harmless.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np


class Segment:
    """A shared-memory segment created with ``size`` or mapped by name, without
    a resource-tracker process (which would outlive the run), or the file ``fd``
    (sized to ``size`` if given) mapped and closed."""

    def __init__(self, name: str = "", size: int | None = None, fd: int = -1):
        import _posixshmem

        self.name = name
        created = fd < 0 and size is not None  # unlinked on failure: ours, named
        if fd < 0:
            flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if size is not None else 0)
            fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        except BaseException:
            if created:
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

        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + self.name)


class Slots:
    """Per-lane arrays in one shared-memory segment (the same offsets on both
    sides). ``fields``: name -> (shape per lane, dtype)."""

    def __init__(self, shm: Segment, n: int, fields: dict):
        self.shm = shm
        offsets, _ = Slots._offsets(n, fields)
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray((n, *shape), dtype, shm.buf, offsets[name])
            for name, (shape, dtype) in fields.items()
        }

    @staticmethod
    def _offsets(n: int, fields: dict) -> tuple[dict[str, int], int]:
        """Each field's offset (on its own cache line) and the end of the last."""
        offsets, end = {}, 0
        for name, (shape, dtype) in fields.items():
            offsets[name] = -(-end // 64) * 64
            nbytes = n * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            end = offsets[name] + nbytes
        return offsets, end

    @staticmethod
    def size(n: int, fields: dict) -> int:
        return max(Slots._offsets(n, fields)[1], 1)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def release(self) -> None:
        self.arrays.clear()
        self.shm.close()
