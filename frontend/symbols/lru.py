"""A mapping that keeps its most recently used entries, for the caches of a symbolizer that may run for
months (`optrace serve`): without a bound they would grow with every program that ever ran."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """``get`` and ``put`` mark an entry as used. Eviction happens in :meth:`trim` only (``put`` calls
    it when ``trim_on_put``), so an owner can keep everything it uses during one piece of work and
    trim after it."""

    def __init__(self, max_entries: int, trim_on_put: bool = True) -> None:
        if max_entries < 1:
            raise ValueError("an LRU cache needs room for at least one entry")
        self.max_entries = max_entries
        self._trim_on_put = trim_on_put
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def __getitem__(self, key: K) -> V:
        """The value without marking it used; KeyError when absent."""
        return self._entries[key]

    def get(self, key: K, default: V | None = None) -> V | None:
        try:
            value = self._entries[key]
        except KeyError:
            return default
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        if self._trim_on_put:
            self.trim()

    def touch(self, key: K) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)

    def keys(self) -> list[K]:
        """Least recently used first."""
        return list(self._entries)

    def values(self) -> list[V]:
        """Least recently used first."""
        return list(self._entries.values())

    def evict_oldest(self) -> V:
        """Drop the least recently used entry and return its value; KeyError when empty."""
        if not self._entries:
            raise KeyError("evict_oldest from an empty cache")
        return self._entries.popitem(last=False)[1]

    def trim(self, keep: Container[K] = frozenset()) -> int:
        """Drop the least recently used entries beyond ``max_entries``, except those in ``keep`` (so
        the cache may stay above its limit); how many were dropped."""
        excess = len(self._entries) - self.max_entries
        if excess <= 0:
            return 0
        victims = []
        for key in self._entries:
            if len(victims) == excess:
                break
            if key not in keep:
                victims.append(key)
        for key in victims:
            del self._entries[key]
        return len(victims)
