"""The built objects ``jaxmesh.evaluate`` keeps between calls, so that a second
call with the same policy object, env and settings compiles nothing."""

from __future__ import annotations

import collections
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


__all__ = ["Kept", "SIZE"]
