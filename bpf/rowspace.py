"""Where the unwind rows of each file go in the BPF walker's one row array (bpf/unwindmaps.py): free ranges,
handed out first fit and merged again when a file's rows are given back, so the rows of files no process uses
any more make room for a new one without dropping every table (a new generation)."""
from __future__ import annotations

from bisect import insort
from collections.abc import Iterable


class RowSpace:
    """Free ranges of an array of ``capacity`` rows, as (start, count), sorted and never adjacent."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity else []

    @property
    def used(self) -> int:
        return self.capacity - sum(count for _, count in self._free)

    def allocate(self, count: int) -> int | None:
        """The start of ``count`` rows now taken (the first range that holds them), None when none does."""
        for i, (start, free) in enumerate(self._free):
            if free >= count:
                if free == count:
                    del self._free[i]
                else:
                    self._free[i] = (start + count, free - count)
                return start
        return None

    def release(self, start: int, count: int) -> None:
        """Rows given back, merged with the free ranges they touch."""
        if not count:
            return
        insort(self._free, (start, count))
        merged: list[tuple[int, int]] = []
        for begin, size in self._free:
            if merged and merged[-1][0] + merged[-1][1] == begin:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((begin, size))
        self._free = merged

    def fits(self, counts: Iterable[int]) -> bool:
        """Whether every one of ``counts`` would get its rows, taken in this order."""
        free = [size for _, size in self._free]
        for count in counts:
            if not count:
                continue
            slot = next((i for i, size in enumerate(free) if size >= count), None)
            if slot is None:
                return False
            free[slot] -= count
        return True

    def reset(self) -> None:
        self._free = [(0, self.capacity)] if self.capacity else []
