"""JIT functions with their lifetimes, from a jitdump's records or a perf map's lines.

A function lives from its load until code loaded later overlaps it (address reuse) or it is moved
(jitdump MOVE). Used by ``optrace jit show`` and ``optrace jit convert``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sortedcontainers import SortedDict

from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.perfmap import PerfMapEntry


@dataclass(frozen=True)
class JitFunction:
    name: str
    start: int
    size: int
    born: float  # seconds since the jitdump's header (perf maps: the line number)
    died: float | None = None  # when later code replaced it; None: still there at the end of the file
    code: bytes | None = None
    moved_from: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.size


class _LiveSet:
    """Functions alive now, non-overlapping (so with distinct starts), by start: O(log n) per change, so
    a million loads at random addresses take seconds (a plain sorted list took minutes)."""

    def __init__(self) -> None:
        self._by_start: SortedDict = SortedDict()  # start -> (end, function id)

    def replace(self, start: int, end: int, new_id: int) -> list[int]:
        """Insert ``new_id`` at [start, end) and return the ids it pushes out."""
        live = self._by_start
        doomed = list(live.irange(minimum=start, maximum=end, inclusive=(True, False)))
        before = next(live.irange(maximum=start, inclusive=(True, False), reverse=True), None)
        if before is not None and live[before][0] > start:
            doomed.append(before)
        dead = [live.pop(key)[1] for key in doomed]
        live[start] = (end, new_id)
        return dead

    def remove(self, function_id: int, start: int) -> None:
        if self._by_start.get(start, (0, None))[1] == function_id:
            del self._by_start[start]


class Timeline:
    """Builds the functions in load order and ends the ones later code overlaps."""

    def __init__(self) -> None:
        self.functions: list[JitFunction] = []
        self._live = _LiveSet()

    def load(self, function: JitFunction) -> int:
        new_id = len(self.functions)
        self.functions.append(function)
        for dead in self._live.replace(function.start, function.end, new_id):
            self.functions[dead] = replace(self.functions[dead], died=function.born)
        return new_id

    def retire(self, function_id: int, when: float) -> None:
        self._live.remove(function_id, self.functions[function_id].start)
        self.functions[function_id] = replace(self.functions[function_id], died=when)


def from_jitdump(header: jd.JitDumpHeader, records: Iterable[jd.JitRecord]) -> list[JitFunction]:
    return jitdump_timeline(header, records)[0]


def seconds_since(header: jd.JitDumpHeader, timestamp: int) -> float:
    """A record's time after the header's; a record stamped before its header (another clock, a bad
    writer) counts as 0, never as a negative age."""
    return max(0.0, (timestamp - header.timestamp) / 1e9)


def jitdump_timeline(header: jd.JitDumpHeader,
                     records: Iterable[jd.JitRecord]) -> tuple[list[JitFunction], list[int | None]]:
    """The functions, and for each record the id of the function it created (None: it created none)."""
    timeline = Timeline()
    by_index: dict[int, int] = {}  # code_index -> function id of its current copy
    created: list[int | None] = []
    for record in records:
        when = seconds_since(header, record.timestamp)
        new_id = None
        if isinstance(record, jd.CodeLoad) and record.code_size:
            new_id = by_index[record.code_index] = timeline.load(
                JitFunction(record.name, record.code_addr, record.code_size, when, code=record.code))
        elif isinstance(record, jd.CodeMove) and record.code_index in by_index:
            old_id = by_index[record.code_index]
            old = timeline.functions[old_id]
            timeline.retire(old_id, when)
            code = old.code if old.code is not None and len(old.code) == record.code_size else None
            new_id = by_index[record.code_index] = timeline.load(JitFunction(
                old.name, record.new_code_addr, record.code_size, when, code=code, moved_from=old.start))
        created.append(new_id)
    return timeline.functions, created


def from_perf_map(entries: Sequence[PerfMapEntry]) -> list[JitFunction]:
    timeline = Timeline()
    for line, entry in enumerate(entries, 1):
        timeline.load(JitFunction(entry.name, entry.start, entry.size, float(line)))
    return timeline.functions


def symbol_name(function: JitFunction, times_are_lines: bool = False) -> str:
    """The plain name for code still there at the end; ``name@BORN..DIED`` for replaced code."""
    if function.died is None:
        return function.name
    if times_are_lines:
        return f"{function.name}@line{function.born:.0f}..line{function.died:.0f}"
    return f"{function.name}@{function.born:.6f}s..{function.died:.6f}s"
