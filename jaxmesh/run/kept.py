"""The built objects ``jaxmesh.evaluate`` keeps between calls, so that a second
call with the same policy object, env and settings compiles nothing; and,
inside ``kept_processes``, the worker processes and Ray actors of its runs."""

from __future__ import annotations

import collections
import contextlib
import pickle
from collections.abc import Callable, Hashable, Iterator
from typing import Any

#: How many of each kind are kept (the least recently used goes first).
SIZE = 16


class Kept:
    """The last ``size`` objects built, by key (least recently used dropped)."""

    def __init__(self, size: int = SIZE):
        self.size = size
        self._items: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The object kept under ``key``, else ``build()``, kept."""
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = build()
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        self._items.move_to_end(key)
        return item

    def clear(self) -> None:
        self._items.clear()

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items.values()))


#: ``kept_processes``'s started objects while it runs: pickled key ->
#: ``(object, stop)``. None outside it.
_processes: dict[bytes, tuple[Any, Callable[[Any], None]]] | None = None


@contextlib.contextmanager
def kept_processes() -> Iterator[None]:
    """Within it, a run with an earlier run's env source (pickled), lanes and
    workers takes its worker processes or Ray actors (``started``), stopped at
    the exit; every episode resets with its own seed, so results are unchanged."""
    global _processes
    if _processes is not None:  # an outer one keeps them
        yield
        return
    _processes = {}
    try:
        yield
    finally:
        kept, _processes = _processes, None
        with contextlib.ExitStack() as stops:  # every one, whatever one raises
            for obj, stop in kept.values():
                stops.callback(stop, obj)


def started(key: tuple, start: Callable[[], Any], stop: Callable[[Any], None]):
    """``(start(), False)``; inside ``kept_processes``, ``(object, True)``: the
    object kept under ``key`` (a key that does not pickle is never kept)."""
    if _processes is None:
        return start(), False
    try:
        k = pickle.dumps(key)
    except Exception:  # the workers pickle the env and say what fails
        return start(), False
    if k not in _processes:
        _processes[k] = (start(), stop)
    return _processes[k][0], True


def forget(obj: Any) -> None:
    """Stops ``obj`` and drops it from ``kept_processes`` (it can no longer serve)."""
    for k, (kept, stop) in list((_processes or {}).items()):
        if kept is obj:
            del _processes[k]
            stop(kept)
