"""JIT functions with their lifetimes, from a jitdump's records or a perf map's lines.

A function lives from its load until code loaded later overlaps it (address reuse) or it is moved
(jitdump MOVE). Used by ``optrace jit show`` and ``optrace jit convert``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sortedcontainers import SortedDict

from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.perfmap import PerfMapEntry


@dataclass(frozen=True)
class JitFunction:
    name: str
    start: int
    size: int
    born: float  # age in the dump's clock units (JitClock: seconds, or TSC ticks); perf maps: the line number
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


def from_jitdump(header: jd.JitDumpHeader, records: Sequence[jd.JitRecord]) -> list[JitFunction]:
    return jitdump_timeline(header, records)[0]


SAME_CLOCK_SPAN = 86_400 * 10**9  # a header more than a day of ns before its first record is on another clock
WALL_CLOCK_SECONDS = (10**9, 4 * 10**9)  # 2001 .. 2096: a timestamp that reads as a date in these units


@dataclass(frozen=True)
class JitClock:
    """How a jitdump's timestamps become ages. The spec puts the header and the records on one clock
    (CLOCK_MONOTONIC ns, or the CPU's TSC with JITDUMP_FLAGS_ARCH_TIMESTAMP), and the JVM agent and LLVM
    do so. V8 does not: its header holds wall-clock microseconds, its records CLOCK_MONOTONIC ns. A header
    that cannot be on its records' clock (after the first record, or far before it) is not the origin:
    ages count from the first record then, and :attr:`origin_note` says why."""

    name: str  # "CLOCK_MONOTONIC" or "TSC"
    unit: str  # "s", or "ticks" for the TSC (its rate is not in the file)
    origin: int
    origin_note: str  # "" when the header is the origin

    def age(self, timestamp: int) -> float:
        """Never negative: a record stamped before the origin (a bad writer) is at age 0."""
        ticks = max(0, timestamp - self.origin)
        return ticks / 1e9 if self.unit == "s" else float(ticks)


def jitdump_clock(header: jd.JitDumpHeader, records: Sequence[jd.JitRecord]) -> JitClock:
    name, unit = ("CLOCK_MONOTONIC", "s") if header.monotonic else ("TSC", "ticks")
    first = min((record.timestamp for record in records), default=header.timestamp)
    if header.timestamp <= first <= header.timestamp + SAME_CLOCK_SPAN:
        return JitClock(name, unit, header.timestamp, "")
    return JitClock(name, unit, first, f"times from the first record: the header's timestamp "
                                       f"{header.timestamp} is {_other_clock(header.timestamp)}")


def _other_clock(timestamp: int) -> str:
    for divisor, units in ((10**6, "wall-clock µs (V8 writes its header so)"), (10**9, "wall-clock ns"),
                           (10**3, "wall-clock ms")):
        if WALL_CLOCK_SECONDS[0] <= timestamp / divisor <= WALL_CLOCK_SECONDS[1]:
            return units
    return "not on its records' clock"


def jitdump_timeline(header: jd.JitDumpHeader,
                     records: Sequence[jd.JitRecord]) -> tuple[list[JitFunction], list[int | None]]:
    """The functions, and for each record the id of the function it created (None: it created none)."""
    clock = jitdump_clock(header, records)
    timeline = Timeline()
    by_index: dict[int, int] = {}  # code_index -> function id of its current copy
    created: list[int | None] = []
    for record in records:
        when = clock.age(record.timestamp)
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


def symbol_name(function: JitFunction, unit: str = "s") -> str:
    """The plain name for code still there at the end; ``name@BORN..DIED`` for replaced code, in seconds
    (``name@0.1s..0.2s``), TSC ticks (``name@10ticks..20ticks``) or perf-map lines (``name@line3..line5``)."""
    if function.died is None:
        return function.name
    if unit == "line":
        return f"{function.name}@line{function.born:.0f}..line{function.died:.0f}"
    if unit == "s":
        return f"{function.name}@{function.born:.6f}s..{function.died:.6f}s"
    return f"{function.name}@{function.born:.0f}{unit}..{function.died:.0f}{unit}"
