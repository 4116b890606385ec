"""Samples whose user stack was copied (bpf/stackcopy.c) turned into frames once their process's tables are
known: the copies a drain's samples name are walked (stackcopy.py) with the mappings and rows the BPF
walker would have had, and the samples come back with the frames it would have given.

A process's tables (:meth:`StackCopies.add_tables`, from the unwind scheduler's workers) are the mapping list
it loads into the kernel, with the epoch it was read at: a copy of epoch E is walked with the first tables
read at an epoch >= E since the process's last exec (mappings are added as a process runs; an exec
replaces them all). A sample whose copy has no such tables yet waits, the process named in
:meth:`StackCopies.wanted` so that its tables are loaded.

When the copy store goes over its bound, the copies in it whose tables are there are walked at once, oldest
first (:meth:`StackCopies.add_copies`, on the copy watcher's thread), until it is back under: only what a walk
gives is kept for its sample (:class:`_Walk`), and only copies that wait for tables are dropped. Before, a busy
process all of whose samples are copied (cc1, whose 436k rows did not fit a full row array) put 14 MB a second
into the store between two drains, became its largest holder and lost its own copies, tables there or not
(issue 43: cc1 29.3 % and 34.4 % complete in 2 of 9 rounds, 1,155 copies dropped in one).

Bounds: copies wait at most WAIT_DRAINS drains for their tables, PENDING_DRAINS while they are being read
(or MAX_COPY_BYTES of them altogether, the largest holder's oldest first); a copy no sample names goes after
UNNAMED_DRAINS drains (an open off-CPU wait names its copy until it ends: :meth:`StackCopies.keep`);
tables are kept for at most MAX_TABLE_PIDS processes, each process's last MAX_TABLES_PER_PID, and dropped
one drain after the process exits; the rules they keep of the PCs looked up, at most MAX_RULES each and
MAX_CACHED_RULES in all (a process whose copies hold garbage return addresses, with new mappings to be
copied again, filled 65,536 a table: 588 MB for 16 such processes), and only PCs in a mapping; walks
made to make room, MAX_WALKED_FRAMES frames in all (the oldest go first, their samples given up). A sample that
gives up waiting keeps what the kernel took (its leaf, or the CFI walk up to where the copy would have gone
on) and, when the copy goes on from it, the copy's own PC as a raw address (where the walk would have
started: a CFI walk stopped at a JIT function's PC has no frame of its own), its stop "no_table".

What is known of a waiting sample before its walk (those frames, :meth:`StackCopies.take_arrived`) is
told at once: whether it ran JIT code must be learned while its process lives (its perf map and mapped
jitdumps are found through /proc/PID), and its tables may come only after the process exited.
"""
from __future__ import annotations

import dataclasses
import heapq
import threading
from bisect import bisect_right
from collections import Counter, OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from optrace.bpf.unwindmaps import ProcessMapping
from optrace.frontend.unwind.row import Rule
from optrace.frontend.unwind.stackcopy import (DEPTH, MAX_FRAMES, NATIVES_CUT, ROOT_REACHED, chain_of, unwind_copy,
                                               with_runtime_frames, without_call_ends)
from optrace.frontend.unwind.table import ROW, UnwindTable
from optrace.model import RawSample, StackCopy, UserFrame

WAIT_DRAINS = 4  # drains a sample waits for its process's tables
PENDING_DRAINS = 16  # and while they are being read
UNNAMED_DRAINS = 2  # drains a copy no sample named is kept
MAX_COPY_BYTES = 16 << 20  # of copies held
MAX_TABLE_PIDS = 4096
MAX_TABLES_PER_PID = 4
MAX_RULES = 1 << 16  # PCs whose rule a process's tables keep
MAX_CACHED_RULES = 1 << 17  # and all tables together (about 150 bytes each: 19 MiB)
MAX_FILE_TABLES = 1024  # files whose row lookups are kept (their rows, the unwind cache's or the kernel's)
MAX_FILE_TABLE_BYTES = 16 << 20  # and the rows they hold, at most
MAX_WALKED_FRAMES = 1 << 18  # frames of copies walked to make room, waiting for their samples (~50 B each)
# Rows of files the kernel does not hold that the process tables keep (each file's once, see _shared); past this,
# a mapping is kept without its rows and a walk through it asks ``rows_of`` (the table store's copy): serve
# held 76-127 MB of them on this machine's processes, beside a 16 MB unwind cache (issue 40)
MAX_HELD_ROW_BYTES = 16 << 20
NO_TABLE = "no_table"  # the stop of a sample whose copy was never walked


@dataclass(frozen=True)
class _Walk:
    """A copy walked to make room: what its sample needs of it (``pcs`` only where runtime frames go in)."""

    frames: tuple[UserFrame, ...]
    status: str
    continues: bool
    runtime_ranges: tuple[tuple[int, int], ...]
    pcs: tuple[int, ...]
    drain: int


@dataclass(frozen=True)
class ProcessTables:
    """One read of a process's executable mappings (sorted by start) and the epochs it was read at.
    ``rules``: each PC's mapping and rule, once looked up (copies of one process share most return
    addresses), at most MAX_RULES of them."""

    epoch: int
    exec_epoch: int
    mappings: tuple[ProcessMapping, ...]
    starts: tuple[int, ...] = field(default=(), compare=False)
    rules: dict[int, tuple[ProcessMapping | None, Rule | None]] = field(default_factory=dict, compare=False)
    frames: dict[int, UserFrame] = field(default_factory=dict, compare=False)  # pc -> its frame, as rules

    def frame(self, pc: int) -> UserFrame:
        """The frame of ``pc`` (:func:`frame_in` of its mapping), made once for a PC whose rule is kept (so
        frames are under the rules' bounds: MAX_RULES a table, MAX_CACHED_RULES in all)."""
        found = self.frames.get(pc)
        if found is None:
            found = frame_in(self.mapping_at(pc), pc)
            if pc in self.rules:
                self.frames[pc] = found
        return found

    def mapping_at(self, pc: int) -> ProcessMapping | None:
        index = bisect_right(self.starts, pc) - 1
        if index < 0:
            return None
        found = self.mappings[index]
        return found if pc < found.end else None


def frame_in(mapping: ProcessMapping | None, pc: int) -> UserFrame:
    """The frame of ``pc`` as the BPF walker names it: by build-id and file offset in a file with one."""
    if mapping is None or mapping.build_id is None:
        return UserFrame(None, pc)
    return UserFrame(mapping.build_id, pc - mapping.start + mapping.file_offset)


def process_tables(epoch: int, exec_epoch: int, mappings: Iterable[ProcessMapping]) -> ProcessTables:
    ordered = tuple(sorted(mappings, key=lambda m: m.start))
    return ProcessTables(epoch, exec_epoch, ordered, tuple(m.start for m in ordered))


class _CopyStore:
    """Copies by id, with the drain each came in, under MAX_COPY_BYTES. Full, it drops the copies of the process
    holding the most bytes, its oldest first: on a busy machine the store fills with copies waiting for tables,
    and dropping the oldest of all let those of a few processes (optrace's own, a long-running Python) evict
    everyone else's, a short-lived compiler's among them (issue 43: cc1 11.5 % complete, no_table 9902 of
    15,969). The largest holder is found with a heap of (bytes, pid) entries, an entry stale once its pid's
    bytes moved (skipped when it comes up, the heap rebuilt when stale ones outnumber the pids): O(log n) a copy.
    Thread-safe: the copy watcher (copywalks.py) adds while the drain walks."""

    def __init__(self, stats: Counter[str]) -> None:
        self._lock = threading.Lock()
        self._copies: dict[int, tuple[StackCopy, int]] = {}
        self._bytes = 0
        self._stats = stats
        self._queues: dict[int, OrderedDict[int, None]] = {}  # pid -> its copies' ids, oldest first
        self._pid_bytes: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (-bytes, pid), current while bytes == _pid_bytes[pid]

    def put(self, copies: dict[int, StackCopy], drain: int, bound: bool = True) -> None:
        """Add ``copies``; with ``bound`` False the caller makes room (:meth:`over`, :meth:`held`, :meth:`trim`)."""
        with self._lock:
            for copy_id, copy in copies.items():
                self._drop(copy_id)
                self._copies[copy_id] = (copy, drain)
                self._queues.setdefault(copy.pid, OrderedDict())[copy_id] = None
                self._count(copy.pid, len(copy.stack))
        if bound:
            self.trim()

    def over(self) -> bool:
        return self._bytes > MAX_COPY_BYTES

    def held(self) -> list[tuple[int, StackCopy]]:
        """The copies held, oldest first."""
        with self._lock:
            return [(copy_id, copy) for copy_id, (copy, _) in self._copies.items()]

    def trim(self) -> None:
        """Back under MAX_COPY_BYTES: the largest holder's oldest copies dropped."""
        with self._lock:
            while self._bytes > MAX_COPY_BYTES and self._copies:
                self._drop(next(iter(self._queues[self._largest()])))
                self._stats["dropped_bytes"] += 1

    def get(self, copy_id: int) -> StackCopy | None:
        with self._lock:
            found = self._copies.get(copy_id)
        return found[0] if found is not None else None

    def take(self, copy_id: int) -> StackCopy | None:
        with self._lock:
            found = self._drop(copy_id)
        return found[0] if found is not None else None

    def drop_unnamed(self, named: set[int], drain: int) -> None:
        """Copies no sample or open wait names that came UNNAMED_DRAINS drains ago or earlier."""
        with self._lock:
            old = [i for i, (_, since) in self._copies.items() if i not in named and drain - since >= UNNAMED_DRAINS]
            for copy_id in old:
                self._drop(copy_id)
        self._stats["dropped_unnamed"] += len(old)

    def _drop(self, copy_id: int) -> tuple[StackCopy, int] | None:
        found = self._copies.pop(copy_id, None)
        if found is not None:
            pid = found[0].pid
            queue = self._queues[pid]
            del queue[copy_id]
            if not queue:
                del self._queues[pid]
            self._count(pid, -len(found[0].stack))
        return found

    def _count(self, pid: int, size: int) -> None:
        """Add ``size`` bytes to ``pid``'s (the lock held)."""
        self._bytes += size
        held = self._pid_bytes.get(pid, 0) + size
        if pid in self._queues:
            self._pid_bytes[pid] = held
            heapq.heappush(self._heap, (-held, pid))
        else:
            self._pid_bytes.pop(pid, None)
        if len(self._heap) > 2 * len(self._pid_bytes) + 64:
            self._heap = [(-bytes_, pid_) for pid_, bytes_ in self._pid_bytes.items()]
            heapq.heapify(self._heap)

    def _largest(self) -> int:
        """The pid holding the most bytes (the lock held, some copy held)."""
        while -self._heap[0][0] != self._pid_bytes.get(self._heap[0][1]):
            heapq.heappop(self._heap)
        return self._heap[0][1]


class _WalkStore:
    """Walks by copy id until their samples take them, at most MAX_WALKED_FRAMES frames (oldest dropped first,
    counted ``dropped_walks``); thread-safe."""

    def __init__(self, stats: Counter[str]) -> None:
        self._lock = threading.Lock()
        self._walks: OrderedDict[int, _Walk] = OrderedDict()
        self._frames = 0
        self._stats = stats

    def put(self, copy_id: int, walk: _Walk) -> None:
        with self._lock:
            self._pop(copy_id)
            self._walks[copy_id] = walk
            self._frames += len(walk.frames)
            while self._frames > MAX_WALKED_FRAMES:
                self._pop(next(iter(self._walks)))
                self._stats["dropped_walks"] += 1

    def take(self, copy_id: int) -> _Walk | None:
        with self._lock:
            return self._pop(copy_id)

    def drop_unnamed(self, named: set[int], drain: int) -> None:
        """Walks no sample named that came UNNAMED_DRAINS drains ago or earlier."""
        with self._lock:
            old = [i for i, walk in self._walks.items() if i not in named and drain - walk.drain >= UNNAMED_DRAINS]
            for copy_id in old:
                self._pop(copy_id)
        self._stats["dropped_unnamed"] += len(old)

    def _pop(self, copy_id: int) -> _Walk | None:
        found = self._walks.pop(copy_id, None)
        if found is not None:
            self._frames -= len(found.frames)
        return found


@dataclass
class _Waiting:
    sample: RawSample
    since: int  # the drain it came in
    off_cpu: bool


class StackCopies:
    """The copies and process tables of one session. ``rows_of(file_key)``: a file's rows where a mapping
    came without them (the kernel holds them: bpf/unwindmaps.py; or its rows were over MAX_HELD_ROW_BYTES,
    counted in ``stats["rows_not_held"]``: the table store has them), None when it has none either."""

    def __init__(self, rows_of: Callable[[Hashable], bytes | None] = lambda _key: None) -> None:
        self._rows_of = rows_of
        self._lock = threading.Lock()  # add_tables runs on the unwind worker
        self._tables: OrderedDict[int, list[ProcessTables]] = OrderedDict()
        self.stats: Counter[str] = Counter()
        self._copies = _CopyStore(self.stats)
        self._walks = _WalkStore(self.stats)
        self._walk_lock = threading.Lock()  # walks run on the copy watcher's thread and the drain's
        self._kept: set[int] = set()  # ids open waits name
        self._waiting: list[_Waiting] = []
        self._arrived: list[RawSample] = []  # samples that began waiting since the last take_arrived
        self._files: OrderedDict[Hashable, UnwindTable] = OrderedDict()
        self._file_bytes = 0  # of rows in _files
        self._exited: dict[int, int] = {}  # pid -> the drain its exit was seen at
        self._drain = 0
        self._files_used: set[Hashable] = set()  # files the walks went through since the last take
        self._rules_held = 0  # in all tables' ``rules``
        self._rows: dict[Hashable, tuple[bytes, int]] = {}  # file -> the rows its tables share, how many tables
        self._held_row_bytes = 0  # of the rows in _rows

    # -- what comes in ------------------------------------------------------------------------------------
    def add_tables(self, pid: int, epoch: int, exec_epoch: int, mappings: Iterable[ProcessMapping]) -> None:
        with self._lock:
            tables = process_tables(epoch, exec_epoch, [self._shared(m) for m in mappings])
            before = self._tables.pop(pid, [])
            kept = sorted([t for t in before if t.exec_epoch == exec_epoch] + [tables], key=lambda t: t.epoch)
            self._tables[pid] = kept[-MAX_TABLES_PER_PID:]
            self._release([t for t in before if t not in self._tables[pid]])
            while len(self._tables) > MAX_TABLE_PIDS:
                self._release(self._tables.popitem(last=False)[1])

    def add_copies(self, copies: dict[int, StackCopy], alive: Callable[[int], bool] = lambda _pid: True) -> set[int]:
        """Copies read from the ring (from any thread); returns the processes among them whose tables are
        wanted: those without tables here, and those still ``alive`` the kernel holds no table for (a copy that
        does not go on from a CFI walk: a process whose table a new generation dropped is walked here meanwhile).
        A process's stack at its exit (``shared``) is walked only if a sample names it (:meth:`wanted`).
        Over the store's bound, the copies whose tables are here are walked now (see the module docstring)."""
        self._copies.put(copies, self._drain, bound=False)
        if self._copies.over():
            self._walk_held()
        self._copies.trim()
        return {copy.pid for copy in copies.values() if not copy.shared and (
            self._tables_for(copy) is None or not copy.continues and alive(copy.pid))}

    def _walk_held(self) -> None:
        """Walk the held copies whose tables are here, oldest first, until the store is under its bound."""
        for copy_id, copy in self._copies.held():
            if not self._copies.over():
                return
            walk = None if copy.shared else self._walk(copy)
            if walk is not None:
                self._walks.put(copy_id, walk)
                self._copies.take(copy_id)
                self.stats["walked_to_make_room"] += 1

    def keep(self, ids: set[int]) -> None:
        """The copies open off-CPU waits name: kept until a sample names them."""
        self._kept = ids

    # -- samples ------------------------------------------------------------------------------------------
    def resolve(self, samples: Sequence[RawSample], off_cpu: bool = False, leaves: bool = False
                ) -> list[RawSample]:
        """``samples`` with their copies walked, but those whose process's tables are not known yet: they
        wait (:meth:`end_drain` hands them back) or, with ``leaves`` (a caller that names leaves only), come
        back at once with the frames known before their walk, their leaf among them."""
        out = []
        for sample in samples:
            if not sample.copy:
                out.append(sample)
                continue
            walked = self._walked(sample)
            if walked is None and leaves:
                walked = self._unwalked(sample, "unwalked_for_leaves")
            if walked is None:
                self._waiting.append(_Waiting(sample, self._drain, off_cpu))
                self._arrived.append(dataclasses.replace(sample, user=self._known_frames(sample)))
            else:
                out.append(walked)
        return out

    def take_files_used(self) -> set[Hashable]:
        """The files (ProcessMapping.file_key) the walks since the last call went through: a file whose
        rows the kernel does not load until they are used needs them (bpf/unwindmaps.py's LAZY_ROWS)."""
        with self._walk_lock:
            used, self._files_used = self._files_used, set()
        return used

    def take_arrived(self) -> list[RawSample]:
        """The samples that began waiting for tables since the last call, with the frames known before their
        walk (their copy still named: they are not samples to count, only what can be learned of them now)."""
        arrived, self._arrived = self._arrived, []
        return arrived

    def wanted(self) -> set[int]:
        """The processes whose waiting samples need tables."""
        return {w.sample.pid for w in self._waiting}

    def end_drain(self, exited: Iterable[int], final: bool = False, pending: Container[int] = frozenset()
                  ) -> tuple[list[RawSample], list[RawSample]]:
        """Samples that waited and can be walked now or gave up (CPU samples, off-CPU samples); ``exited``:
        processes whose exit this drain saw; ``pending``: processes whose tables are being read (their
        mappings captured before they exited, maybe): their samples wait up to PENDING_DRAINS.
        With ``final``, every waiting sample comes back."""
        for pid in exited:
            self._exited.setdefault(pid, self._drain)
        cpu: list[RawSample] = []
        off: list[RawSample] = []
        still = []
        for waiting in self._waiting:
            walked = self._walked(waiting.sample)
            pid = waiting.sample.pid
            waited = self._drain - waiting.since
            if walked is None and (final or waited >= (PENDING_DRAINS if pid in pending else WAIT_DRAINS)
                                   or self._exited.get(pid, self._drain) < self._drain and pid not in pending):
                walked = self._given_up(waiting.sample)
            if walked is None:
                still.append(waiting)
            else:
                (off if waiting.off_cpu else cpu).append(walked)
        self._waiting = still
        self._forget_old()
        self._drain += 1
        return cpu, off

    def _forget_old(self) -> None:
        named = {w.sample.copy for w in self._waiting} | self._kept
        self._copies.drop_unnamed(named, self._drain)
        self._walks.drop_unnamed(named, self._drain)
        waiting = {w.sample.pid for w in self._waiting}
        gone = [pid for pid, at in self._exited.items() if at < self._drain and pid not in waiting]
        with self._lock:
            for pid in gone:
                self._release(self._tables.pop(pid, []))
        for pid in gone:
            del self._exited[pid]

    # -- walking ------------------------------------------------------------------------------------------
    def _walked(self, sample: RawSample) -> RawSample | None:
        """The sample with its copy's walk, made as the copy came or now; None while its tables are not here."""
        walk = self._walks.take(sample.copy)
        if walk is None:
            copy = self._copies.get(sample.copy)
            if copy is None:  # dropped (MAX_COPY_BYTES): the kernel's part stays
                return self._given_up(sample)
            walk = self._walk(copy)
            if walk is None:
                return None
            if not copy.shared:  # a shared one goes when no sample names it any more (UNNAMED_DRAINS)
                self._copies.take(sample.copy)
        walked, chain = chain_of(sample.user)  # (the thread's Python frames read with the copy: copypython.c)
        prefix = walked if walk.continues else ()
        frames, status = walk.frames, walk.status
        room = MAX_FRAMES - len(prefix)
        if len(frames) > room:
            frames, status = frames[:room], DEPTH
        runtime = sample.runtime
        if chain and walk.runtime_ranges:
            cut = status not in ROOT_REACHED
            frames, rest = with_runtime_frames(walk.pcs[:room], frames, chain, walk.runtime_ranges, cut)
            runtime = runtime or (NATIVES_CUT if rest else "")
        return dataclasses.replace(sample, user=(prefix + frames)[:MAX_FRAMES], stop=status, runtime=runtime,
                                   epoch=0, copy=0)

    def _walk(self, copy: StackCopy) -> _Walk | None:
        """The copy walked with its process's tables, None when they are not here."""
        tables = self._tables_for(copy)
        if tables is None:
            return None
        rules = tables.rules
        with self._walk_lock:
            walk = unwind_copy(copy, lambda pc: (rules.get(pc) or self._rule_at(tables, pc))[1])
            self.stats["walked"] += 1
            self.stats["walk_" + walk.status] += 1
            frames = tuple(map(tables.frame, walk.pcs))
            self._files_used.update(m.file_key for m in map(tables.mapping_at, walk.pcs) if m is not None)
        return _Walk(frames, walk.status, copy.continues, copy.runtime_ranges,
                     walk.pcs if copy.runtime_ranges else (), self._drain)

    def _given_up(self, sample: RawSample) -> RawSample:
        self.stats["gave_up"] += 1
        with self._lock:
            known = self._tables.get(sample.pid)
        return self._unwalked(sample, "gave_up_" + ("tables_of_other_epochs" if known else "no_tables"))

    def _unwalked(self, sample: RawSample, why: str) -> RawSample:
        """The sample with the frames known before its walk, its copy dropped unwalked."""
        self.stats[why] += 1
        user = self._known_frames(sample)
        self._copies.take(sample.copy)
        return dataclasses.replace(sample, user=user, stop=NO_TABLE, copy=0)

    def _known_frames(self, sample: RawSample) -> tuple[UserFrame, ...]:
        """A copied sample's frames before its walk, as they are named when the copy is not walked: those the
        kernel took and, when the copy goes on from them or they are none (a first sample whose thread's
        Python frames were read: copypython.c stores no leaf), the copy's PC (a raw address, as
        :func:`frame_in` names a PC in no file with a build-id) before the Python frames read with the copy."""
        copy = self._copies.get(sample.copy)
        walked, chain = chain_of(sample.user)
        if copy is not None and (copy.continues or not walked):
            walked += (UserFrame(None, copy.ip),)
        return without_call_ends(walked + chain)[:MAX_FRAMES]

    def _tables_for(self, copy: StackCopy) -> ProcessTables | None:
        with self._lock:
            for tables in self._tables.get(copy.pid, ()):
                if tables.exec_epoch == copy.exec_epoch and tables.epoch >= copy.epoch:
                    return tables
        return None

    def _rule_at(self, tables: ProcessTables, pc: int) -> tuple[ProcessMapping | None, Rule | None]:
        mapping = tables.mapping_at(pc)
        table = self._table(mapping) if mapping is not None else None
        found = mapping, table.find(pc - mapping.bias) if table is not None else None
        if mapping is not None and len(tables.rules) < MAX_RULES:
            with self._lock:
                if self._rules_held < MAX_CACHED_RULES:
                    tables.rules[pc] = found
                    self._rules_held += 1
        return found

    def _shared(self, mapping: ProcessMapping) -> ProcessMapping:
        """``mapping`` with the rows object the tables already hold for its file, when they hold the same rows
        (the lock held). A file the kernel does not hold comes with its rows, read again from the table store
        for each process: without this, each process's tables kept a copy of them (python3.11's 7.3 MB for
        each of 14-30 processes beside the issue-40 attack on root's serve). A file new to the tables whose
        rows would take them over MAX_HELD_ROW_BYTES comes without them (its walks ask ``rows_of``)."""
        if not mapping.rows:
            return mapping
        held = self._rows.get(mapping.file_key)
        if held is not None and held[0] == mapping.rows:
            self._rows[mapping.file_key] = (held[0], held[1] + 1)
            return dataclasses.replace(mapping, rows=held[0]) if held[0] is not mapping.rows else mapping
        if held is None:
            if self._held_row_bytes + len(mapping.rows) > MAX_HELD_ROW_BYTES:
                self.stats["rows_not_held"] += 1
                return dataclasses.replace(mapping, rows=None)
            self._rows[mapping.file_key] = (mapping.rows, 1)
            self._held_row_bytes += len(mapping.rows)
        return mapping

    def _release(self, dropped: Iterable[ProcessTables]) -> None:
        """Count out the rules and shared rows of tables dropped (the lock held)."""
        for tables in dropped:
            self._rules_held -= len(tables.rules)
            for mapping in tables.mappings:
                held = self._rows.get(mapping.file_key)
                if held is not None and held[0] is mapping.rows:
                    self._rows[mapping.file_key] = (held[0], held[1] - 1)
                    if held[1] == 1:
                        del self._rows[mapping.file_key]
                        self._held_row_bytes -= len(held[0])

    def _table(self, mapping: ProcessMapping) -> UnwindTable | None:
        table = self._files.get(mapping.file_key)
        if table is not None:
            self._files.move_to_end(mapping.file_key)
            return table
        rows = mapping.rows if mapping.rows is not None else self._rows_of(mapping.file_key)
        if not rows:
            return None
        table = self._files[mapping.file_key] = UnwindTable(rows, len(rows) // ROW.size, "", 0)
        self._file_bytes += len(rows)
        while len(self._files) > 1 and (len(self._files) > MAX_FILE_TABLES or self._file_bytes > MAX_FILE_TABLE_BYTES):
            self._file_bytes -= self._files.popitem(last=False)[1].nbytes
        return table
