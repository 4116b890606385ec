"""A process's executable mappings at one moment, sorted by address (perf's ``maps``: thread -> maps
-> map -> dso): the one model both of the symbolizer's per-process snapshots
(:mod:`~optrace.frontend.symbols.machine`) and of the raw-IP translation
(:mod:`~optrace.frontend.symbols.addrspace`)."""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from operator import attrgetter

from optrace.procfs import MapEntry, Maps


class Mappings:
    """Executable mappings sorted by start; :meth:`index_at` is a bisect."""

    __slots__ = ("entries", "_starts")

    def __init__(self, entries: Iterable[MapEntry] = ()) -> None:
        self.entries: list[MapEntry] = sorted(entries, key=attrgetter("start"))
        self._starts = [entry.start for entry in self.entries]

    @classmethod
    def of(cls, maps: Maps) -> Mappings:
        """The executable mappings of one read of ``/proc/PID/maps``."""
        return cls(entry for entry in maps.entries if entry.executable)

    def index_at(self, address: int) -> int | None:
        """Index in :attr:`entries` of the mapping that holds ``address``, or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        return index if index >= 0 and address < self.entries[index].end else None

    def find(self, address: int) -> MapEntry | None:
        index = self.index_at(address)
        return None if index is None else self.entries[index]

    def __iter__(self) -> Iterator[MapEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
