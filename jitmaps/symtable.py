"""Address -> JIT symbol over time, for one process.

JIT code is freed and its addresses reused, so every entry keeps the time it became known (``stamp``: the
jitdump record's CLOCK_MONOTONIC time, or for perf maps the drain at which its line was read) and its
arrival order. :meth:`SymbolHistory.lookup` answers "which code was at this address at this time": among the
entries covering the address, the newest one known at that time (later arrival wins on overlap and ties);
when none was known yet (a map written at exit, or a ``jcmd`` snapshot taken after the samples), the
earliest one known afterwards.

Memory: names are interned in a :class:`NameStore` (UTF-8 in anonymous memory blocks, not one object each:
see its module for why), or, for a table that keeps its perf maps open (``serve``), left in the map: a
:class:`MapLines` reference to the line, read back by :meth:`SymbolHistory.lookup`. Entries live in flat
arrays (32 bytes each), and an entry identical to the one already at the same start (same size and name)
is dropped when the index is rebuilt, so a map that repeats itself costs the distinct symbols, not its lines.

Bounds: a :class:`SymbolBudget` caps the entries and the bytes of distinct names one table may hold, and
(shared by the tables of one consumer) all of them together; entries over a cap are dropped and counted.
A table at its entry cap first drops its repeats, so a map rewritten again and again keeps working.
"""
from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate, chain, compress, islice
from operator import eq, sub
from dataclasses import dataclass

from optrace.jitmaps.maplines import MapLines
from optrace.jitmaps.namestore import NameStore

MAX_SPAN = 1 << 24  # entries larger than this (16 MiB) go to a short list scanned linearly
COMPACT_FROM = 1 << 21  # drop repeats once the table doubles past this many entries (64 MiB of arrays)
TABLE_FILES = 4  # perf maps one table keeps open (a map replaced over and over: the later ones are copied)
IN_FILE = 1 << 31  # a name id with this bit is a MapLines reference, not a NameStore id


@dataclass(frozen=True)
class JitSymbol:
    start: int
    size: int
    name: str
    source: str  # the perf map or jitdump path the entry came from
    stamp: float


@dataclass
class SymbolBudget:
    """Caps per table (one process) and over all tables sharing the budget; ``entries``/``name_bytes``
    are what those tables hold now, ``dropped`` what they refused. Names count their UTF-8 bytes.

    Measured here (Dec 1): an entry costs ~30 bytes, ~55 with the lookup index; a distinct 200-byte name
    ~330 bytes more (its bytes in the name store, three array slots, and a dict entry: its hash and id).
    At these caps one process costs at most ~140 MB of entries and ~55 MB of names, all of them together
    ~220 MB and ~210 MB; a 2,200,000-line V8 map (bench/bench_jit.py) fits one process's caps."""

    table_entries: int = 2_500_000
    table_name_bytes: int = 32 << 20
    total_entries: int = 4_000_000
    total_name_bytes: int = 128 << 20
    kept_files: int = 256  # perf-map descriptors kept open for their names, over all tables
    entries: int = 0
    name_bytes: int = 0
    dropped: int = 0
    files: int = 0  # descriptors kept now

    def describe(self) -> str:
        return (f"{self.table_entries} symbols or {self.table_name_bytes >> 20} MiB of names per process, "
                f"{self.total_entries} or {self.total_name_bytes >> 20} MiB in all")


class SymbolHistory:
    def __init__(self, budget: SymbolBudget | None = None) -> None:
        self.budget = budget or SymbolBudget()
        self.name_bytes = 0
        self.dropped = 0
        self.names = NameStore()
        self.lines = MapLines()
        self.sources: list[str] = []
        self._starts = array("Q")
        self._ends = array("Q")
        self._stamps = array("d")
        self._name_idx = array("I")
        self._source_idx = array("H")
        self._index: _Index | None = None
        self._compacted_at = 0

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: int, size: int, name: str, source: str, stamp: float) -> None:
        self.add_many(((start, size, name),), source, stamp)

    def keep_file(self, fd: int) -> int | None:
        """Keep (a duplicate of) a perf map's descriptor so that its entries' names stay in it; the id to
        pass to :meth:`add_many`, or None when the budget's descriptors are all in use."""
        if self.budget.files >= self.budget.kept_files or len(self.lines.fds) >= TABLE_FILES:
            return None
        self.budget.files += 1
        return self.lines.keep(fd)

    def add_many(self, entries: Iterable[tuple], source: str, stamp: float, in_file: int | None = None) -> None:
        """Append entries ``(start, size, name)`` (in arrival order) that share a source and a stamp; those
        over the budget are dropped and counted (the iterable is always consumed). With ``in_file`` (from
        :meth:`keep_file`), an entry ``(start, size, name, line_offset)`` keeps its name in that file
        (a line_offset of None: copied)."""
        if source not in self.sources:
            self.sources.append(source)
        source_id = self.sources.index(source)
        items = iter(entries)
        pending = self._append(items, source_id, stamp, in_file)
        if pending is not None and len(self._starts) - self._compacted_at >= self.budget.table_entries // 4:
            self.compact()
            pending = self._append(chain((pending,), items), source_id, stamp, in_file)
        if pending is not None:
            self._drop(1 + sum(1 for _ in items))
        self._index = None
        if len(self._starts) >= 2 * max(self._compacted_at, COMPACT_FROM):
            self.compact()

    def _append(self, items: Iterator[tuple], source_id: int, stamp: float,
                in_file: int | None) -> tuple | None:
        """Append until the entry cap; the entry in hand when it stopped there (None: all appended)."""
        budget = self.budget
        room = min(budget.table_entries - len(self._starts), budget.total_entries - budget.entries)
        name_room = min(budget.table_name_bytes - self.name_bytes, budget.total_name_bytes - budget.name_bytes)
        intern, refer = self.names.intern, self.lines.add
        starts, ends, name_idx = self._starts, self._ends, self._name_idx
        before, name_bytes, dropped, pending = len(starts), 0, 0, None
        for item in items:
            if len(starts) - before >= room:
                pending = item
                break
            start, size, name = item[:3]
            if in_file is not None and item[3] is not None:
                name_id = IN_FILE | refer(in_file, item[3], name)
            else:
                name_id, added = intern(name, name_room - name_bytes)
                if name_id is None:
                    dropped += 1
                    continue
                name_bytes += added
            starts.append(start)
            ends.append(start + size)
            name_idx.append(name_id)
        added = len(starts) - before
        self._stamps.extend([stamp] * added)
        self._source_idx.extend([source_id] * added)
        self.name_bytes += name_bytes
        budget.name_bytes += name_bytes
        budget.entries += added
        self._drop(dropped)
        return pending

    def _drop(self, count: int) -> None:
        self.dropped += count
        self.budget.dropped += count

    def release(self) -> None:
        """Give this table's share of the budget back and close its kept files (it is being discarded)."""
        self.budget.entries -= len(self._starts)
        self.budget.name_bytes -= self.name_bytes
        self.budget.files -= len(self.lines.fds)
        self.name_bytes = 0
        self.lines.close()

    def _name(self, name_id: int) -> str | None:
        if name_id & IN_FILE:
            return self.lines.get(name_id ^ IN_FILE)
        return self.names.get(name_id)

    def _name_key(self, name_id: int) -> tuple[bool, int]:
        """Equal for two entries with the same name: the NameStore id, or the hash of a name in a file."""
        if name_id & IN_FILE:
            return True, self.lines.key(name_id ^ IN_FILE)
        return False, name_id

    def compact(self) -> None:
        """Drop entries that repeat the entry already at their start (keeps the first, older stamp)."""
        keep = sorted(self._sorted_order()[0])  # back to arrival order, the tie-breaker on overlap
        self.budget.entries -= len(self._starts) - len(keep)
        self._starts = array("Q", map(self._starts.__getitem__, keep))
        self._ends = array("Q", map(self._ends.__getitem__, keep))
        self._stamps = array("d", map(self._stamps.__getitem__, keep))
        self._name_idx = array("I", map(self._name_idx.__getitem__, keep))
        self._source_idx = array("H", map(self._source_idx.__getitem__, keep))
        if len(self.lines):
            self._compact_lines()
        self._compacted_at = len(self._starts)
        self._index = None

    def _compact_lines(self) -> None:
        """Keep the line references the entries still use (a map rewritten again and again would grow them
        without bound: unlike copied names, they are not interned)."""
        renumbered = self.lines.keep_only([n ^ IN_FILE for n in self._name_idx if n & IN_FILE])
        self._name_idx = array("I", (IN_FILE | renumbered[n ^ IN_FILE] if n & IN_FILE else n
                                     for n in self._name_idx))

    def _sorted_order(self) -> tuple[list[int], array]:
        """Entry indices by start (then arrival), and their starts, without an entry that repeats the one
        before it at the same start (same end and name): the code there did not change. Only C-level loops
        (sorted, map, compress) touch every entry: this runs once per million-line map."""
        starts, ends, names = self._starts, self._ends, self._name_idx
        order = sorted(range(len(starts)), key=starts.__getitem__)
        by_start = array("Q", map(starts.__getitem__, order))
        same_start = compress(range(1, len(order)), map(eq, islice(by_start, 1, None), by_start))
        key = self._name_key
        repeats = [k for k in same_start if ends[order[k]] == ends[order[k - 1]]
                   and key(names[order[k]]) == key(names[order[k - 1]])]
        if not repeats:
            return order, by_start
        keep = bytearray(b"\x01") * len(order)
        for k in repeats:
            keep[k] = 0
        return list(compress(order, keep)), array("Q", compress(by_start, keep))

    def lookup(self, address: int, time: float) -> JitSymbol | None:
        if self._index is None:
            self._index = _Index(self)
        best = self._index.best(address, time)
        name = None if best is None else self._name(self._name_idx[best])
        if name is None:  # none, or its name is no longer in its file
            return None
        start = self._starts[best]
        return JitSymbol(start, self._ends[best] - start, name, self.sources[self._source_idx[best]],
                         self._stamps[best])

    def entries(self) -> list[JitSymbol]:
        """Every entry whose name is known, in arrival order (for `jit show` and ELF conversion)."""
        named = ((s, e, self._name(n), src, t) for s, e, n, src, t in
                 zip(self._starts, self._ends, self._name_idx, self._source_idx, self._stamps))
        return [JitSymbol(s, e - s, name, self.sources[src], t) for s, e, name, src, t in named
                if name is not None]


class _Index:
    """Entries sorted by start with a running maximum of their ends, so a lookup scans back from the
    address only as far as some entry can still reach it. Entries over MAX_SPAN are kept apart."""

    def __init__(self, table: SymbolHistory) -> None:
        # The table's arrays, not the table: a table that pointed at its index and back would be freed only
        # by the cycle collector, which counts objects, not bytes (a serve soak held ~200 MB of dropped JIT
        # tables that way). Appending to the table or compacting it drops its index.
        self._starts, self._ends, self._stamps = table._starts, table._ends, table._stamps
        self.large: list[int] = []
        starts, ends = table._starts, table._ends
        order, by_start = table._sorted_order()
        if max(map(sub, ends, starts), default=0) > MAX_SPAN:
            self.large = [i for i in order if ends[i] - starts[i] > MAX_SPAN]
            order = [i for i in order if ends[i] - starts[i] <= MAX_SPAN]
            by_start = array("Q", map(starts.__getitem__, order))
        self.order = array("I", order)  # not a list: one int object per entry would stay in the arenas
        self.starts = by_start
        self.reach = array("Q", accumulate(map(ends.__getitem__, order), max))

    def covering(self, address: int) -> list[int]:
        ends = self._ends
        found = [i for i in self.large if self._starts[i] <= address < ends[i]]
        pos = bisect_right(self.starts, address) - 1
        while pos >= 0 and self.reach[pos] > address and self.starts[pos] + MAX_SPAN > address:
            i = self.order[pos]
            if ends[i] > address:
                found.append(i)
            pos -= 1
        return found

    def best(self, address: int, time: float) -> int | None:
        """The newest entry known at ``time``, else the earliest known after it (ties: later arrival)."""
        stamps = self._stamps
        candidates = self.covering(address)
        if not candidates:
            return None
        known = [i for i in candidates if stamps[i] <= time]
        if known:
            return max(known, key=lambda i: (stamps[i], i))
        return min(candidates, key=lambda i: (stamps[i], -i))
