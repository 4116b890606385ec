"""The maps of the BPF unwinder (unwind.c): files' unwind rows, per-process mapping tables, and the
CFI-unwound stacks a drain reads back.

Rows: one BPF array (``BPF_F_MMAPABLE``) holds every loaded file's rows, each file a contiguous range,
written through a shared mapping of just that range (one copy, no syscall per row: cc1's 436,539 rows;
the mapping is dropped at once, so the array's pages do not count in optrace's RSS). A file is loaded
once however many processes map it, keyed by what the caller says identifies it (build-id, else device,
inode, size and mtime).

Generations keep this bounded for a daemon that runs for months: ranges are handed out in order, and
when a process's new files do not fit (rows, or MAX_GENERATION_FILES files), a new generation starts:
every process's mapping table is dropped, the row array is filled again from 0 and the loaded files are
forgotten (the session loads the tables of processes still alive again when they are next sampled, see
:attr:`UnwindMaps.generation`). At most one generation starts per MIN_GENERATION_SECONDS (else a
working set larger than the array would start one at every load), unless what is in the way is files
no process sampled in the last ACTIVE_SECONDS uses (:meth:`UnwindMaps.touch`): then at most one per
MIN_STALE_GENERATION_SECONDS, when the files in use and the new ones fill at most STALE_SHARE of the
array (a build's compiler waited a minute behind the libraries of processes sampled once at the start).
Meanwhile a file that does not fit gets no rows (its code is walked by frame pointers, counted in
``stats["rows_full"]``). A file bigger than the whole array never gets rows.

Large files (more than LAZY_ROWS rows) get their rows once a sample shows they are used: a process maps
many it never runs (BCC's libz3, 386k rows, came in with every process that compiles a BPF program, and
filled the array before a compiler's 436k came). Until then their mappings are marked MAPPING_COPY: the
walker stops at a PC in one and copies the stack (stackcopy.c); the copy's walk in user space says which
file it was in (:meth:`UnwindMaps.want`), whose rows are loaded with the tables of the processes that map
it (and of any process in later generations).

Frames come back as (file id, file offset) for files with a build-id: a :class:`UserFrame` like the
kernel's build-id stacks give, valid after the process exited. The walker's stacks go to the stack store
(stackstore.c), under a hash salted with the generation (`unwind_generation`): equal frames of two
generations may name other files. A retired generation's ids still decode for RETIRED_READS more drains
(stacks sampled just before the reset are read then), and are not handed out again before; then they are
dropped, so what is kept is at most a few generations' files. Other frames come back as raw IPs.

A file refused rows because the array (or the generation's file list) is full is marked MAPPING_COPY too:
its code has CFI, so the walker copies the stack there and the copy is walked in user space with the rows
the session holds, rather than by frame pointers, which give false frames through code built without them
(``stats["rows_full"]``, ``stats["files_full"]``).
"""
from __future__ import annotations

import array
import ctypes
import mmap
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from optrace.bpf.abi import ProgType
from optrace.bpf.loader import load_function
from optrace.bpf.pidtables import forget_pid, has_pid
from optrace.bpf.pythonmaps import python_status_name
from optrace.bpf.rowspace import RowSpace
from optrace.bpf.stackstore import GRACE_SECONDS
from optrace.model import RUNTIME_FRAME, UserFrame
from optrace.runtimeword import is_runtime_word

ROW_SIZE = 16  # struct unwind_row
MAX_MAPPINGS = 256  # UNWIND_MAX_MAPPINGS
FILE_FRAME = 1 << 63
FILE_FRAME_TOP = FILE_FRAME >> 56  # in a frame word's most significant byte
FILE_OFFSET_BITS = 40
MAX_FILE_IDS = (1 << 23) - 1
MAX_GENERATION_FILES = 8192  # files one generation keeps, with or without rows (a _LoadedFile each)
MIN_GENERATION_SECONDS = 60.0
MIN_STALE_GENERATION_SECONDS = 2.0
ACTIVE_SECONDS = 5.0  # a file is in use while a process that maps it was sampled this recently
STALE_SHARE = 0.75
# a file with more rows gets them once a sample is in it (cc1: 479k, BCC's libz3: 386k). Not an interpreter
# (CPython's: 45k-78k, libc 28k): a copy's walk in user space has no Python frames
LAZY_ROWS = 131072
MAX_FILE_SHARE = 0.5  # of the array: a larger file never gets rows (frame pointers), never waits for them
MAPPING_COPY = 1  # unwind_mapping.flags (unwind.c)
RETIRED_READS = 2  # drains a retired generation's file ids still decode for (see drain_ids)
# enum unwind_status in unwind.c, by value
UNWIND_STATUSES = ("outermost", "chain_end", "no_cfi", "expression", "read_fault", "depth_limit", "copied")
UNWIND_COUNTERS = ("stacks_full", "no_user_registers", "copies", "copies_full")  # enum unwind_counter
PROG_UNWIND_STEP = 0  # indices into unwind_progs (unwind.c)
PYTHON_PROGRAMS = ((1, b"python_step"), (2, b"python_thread"), (3, b"python_capture"))
PROG_COPY_PYTHON = 4  # copypython.c: a copied sample's Python frames
CHAIN_MAPS = {b"unwind_progs": b"chain_progs"}  # python_thread's copy for copy_python (copypython.c)
_MAPPING = struct.Struct("<QQQQIIII")


@dataclass(frozen=True)
class ProcessMapping:
    """One executable file mapping of a process, as the unwinder needs it. ``rows`` (the file's unwind
    table rows, ``ROW_SIZE`` bytes each, sorted by PC) may be empty: its code is walked by frame pointers.
    None: the caller dropped them because this generation holds the file (see :meth:`UnwindMaps.is_loaded`);
    if it no longer does, the file is walked by frame pointers and not kept, so it is asked for again."""

    start: int
    end: int
    file_offset: int  # of ``start``
    bias: int  # ELF virtual address = address - bias
    file_key: Hashable  # identifies the file across processes (its rows are loaded once)
    rows: bytes | None
    build_id: bytes | None  # None: its frames stay raw IPs
    # (vaddr, size, vaddr - file offset) of its file's executable segment, for a file_key that is a file's
    # identity (st_dev, st_ino, st_size, st_mtime_ns): the walk of images (images.c) finds its rows by it
    segment: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class UnwoundStack:
    frames: tuple[UserFrame, ...]
    status: str  # one of UNWIND_STATUSES
    python: str = ""  # why its Python frames stopped short (pythonmaps.PYTHON_STATUSES), "" when they did not


class FileIds:
    """The file ids a drain's stacks decode with: the retired generations still kept, then this one's.
    An id is in one of them when it is handed out; this generation's may later get an id of a retired
    one that has since been forgotten, but no stack of this drain names it then: searched last, it never
    shadows the retired file. So the tables are kept as they are, not copied, and drains that saw the
    same generations share one FileIds (and one cache of decoded frames)."""

    def __init__(self, current: dict[int, "_LoadedFile"], retired: Sequence[dict[int, "_LoadedFile"]]) -> None:
        self.key = (id(current), *map(id, retired))
        self.tables = (*retired, current)
        self._frames: _FrameCache | None = None

    def frames(self) -> "_FrameCache":
        if self._frames is None:
            self._frames = _FrameCache(self.tables)
        return self._frames


def decode_cfi(words: bytes, status: int, ids: FileIds | None, python: int = 0) -> UnwoundStack:
    """A CFI stack as the walker stored it (frame words) with the file ids of the drain that read it."""
    frames = array.array("Q", words)
    python_status = python_status_name(python)
    if ids is None:  # cannot happen: a CFI record always comes with its drain's ids
        return UnwoundStack(tuple(_decoded(f, ()) for f in frames), _status(status), python_status)
    return UnwoundStack(tuple(map(ids.frames().__getitem__, frames)), _status(status), python_status)


@dataclass
class _LoadedFile:
    file_id: int
    row_start: int
    row_count: int
    build_id: bytes | None
    lazy: bool = False  # its rows are not loaded until a sample shows they are used (MAPPING_COPY)
    refused: bool = False  # it has rows, but the array had no room for them: walked from copies (MAPPING_COPY)


class UnwindMaps:
    """Fills unwind.c's maps of a loaded BCC program and reads its stacks. :meth:`load_process` runs on
    the session's unwind worker while the drain loop reads stacks: the generation's bookkeeping is
    shared under a lock."""

    def __init__(self, bpf, rows_capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        """The maps only: the walking program comes with :meth:`load_step`."""
        self._bpf = bpf
        self._capacity = rows_capacity
        self._rows_fd = bpf[b"unwind_rows"].map_fd
        self._procs = bpf[b"unwind_procs"]
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[Hashable, _LoadedFile] = {}
        self._by_id: dict[int, _LoadedFile] = {}  # this generation's files with an id
        self._process_files: dict[int, tuple[Hashable, ...]] = {}  # pid -> its table's files (this generation)
        self._used: dict[Hashable, float] = {}  # file -> when a process that maps it was last sampled
        self._wanted: dict[Hashable, None] = {}  # large files samples were in: their rows are loaded (ordered set)
        self._retired: list[tuple[int, dict[int, _LoadedFile]]] = []  # (reads when retired, its ids)
        self._evicted: dict[int, _LoadedFile] = {}  # files evicted since the last drain, by id (decoded still)
        self._dropped: set[int] = set()  # processes whose tables an eviction dropped (see take_dropped)
        self._rows = RowSpace(rows_capacity)
        self._last_id = 0
        self._reads = 0
        self._generation_started = clock()
        self.generation = 0  # bumped when every process's table was dropped (see the module docstring)
        self.stats: Counter[str] = Counter()
        self._ids: FileIds | None = None  # the last drain's file ids
        self._by_identity = FileEntries(bpf)  # the files' rows by identity, for walks of images (images.c)
        self._segments: dict[Hashable, tuple[int, int, int]] = {}  # this generation's files' segments

    def load_step(self, python: bool = False) -> None:
        """Load the walking program (unwind_step) and put it where on_sample tail-calls it; with ``python``,
        python.c's programs too (the program was compiled with them). This runs off the start-up path (the
        kernel's verification took 0.11 s here before forget() in unwind.c, 0.015 s now): until it is in
        place the tail call fails and samples take frame-pointer stacks (unwind.c). Safe to call twice."""
        programs = [(PROG_UNWIND_STEP, b"unwind_step")] + (list(PYTHON_PROGRAMS) if python else [])
        if python and b"chain_progs" in self._bpf:  # first (copies come until the walker is in place): copypython.c's
            copy_python = load_function(self._bpf, b"copy_python", ProgType.PERF_EVENT).fd  # copy_python, and
            thread = self._bpf.load_func_copy(b"chain_python_thread", b"python_thread", ProgType.PERF_EVENT,
                                              CHAIN_MAPS).fd  # python_thread's copy that comes back to it
            self._put(b"chain_progs", [(PYTHON_PROGRAMS[0][0], copy_python), (PYTHON_PROGRAMS[1][0], thread)])
            capture = PYTHON_PROGRAMS[2]
            self._put(b"unwind_progs", [(capture[0], load_function(self._bpf, capture[1], ProgType.PERF_EVENT).fd),
                                        (PROG_COPY_PYTHON, copy_python)])
        self._put(b"unwind_progs", [(index, load_function(self._bpf, name, ProgType.PERF_EVENT).fd)
                                    for index, name in programs])

    def _put(self, table: bytes, programs: list[tuple[int, int]]) -> None:
        progs = self._bpf[table]
        for index, fd in programs:
            progs[progs.Key(index)] = progs.Leaf(fd)

    def load_process(self, pid: int, epoch: int, mappings: Sequence[ProcessMapping]) -> None:
        """Give the sampler this process's mapping table (replacing any before), read from /proc/PID/maps
        after the process had ``epoch`` (profile.c): its samples are unwound from CFI while it keeps
        that epoch (no exec, no new executable mapping since). May start a new generation first."""
        ordered = sorted(mappings, key=lambda m: m.start)[:MAX_MAPPINGS]
        if len(mappings) > MAX_MAPPINGS:
            self.stats["mappings_dropped"] += len(mappings) - MAX_MAPPINGS
        with self._lock:
            packed = self._loaded(ordered)
            self._process_files[pid] = tuple(m.file_key for m in ordered)
        value = self._procs.Leaf()
        packed = struct.pack("<IIQ", len(ordered), 0, epoch) + packed
        ctypes.memmove(ctypes.addressof(value), packed, len(packed))
        self._procs[self._procs.Key(pid)] = value
        self.stats["processes_loaded"] += 1

    def load_files(self, mappings: Sequence[ProcessMapping]) -> None:
        """Load these mappings' files (rows and identities) with no process table: a process gone before its
        table was loaded leaves its files to the walks of the images of those that run them next (images.c)."""
        with self._lock:
            self._loaded(sorted(mappings, key=lambda m: m.start)[:MAX_MAPPINGS])

    def _loaded(self, ordered: Sequence[ProcessMapping]) -> bytes:
        """The mappings' files loaded (making room first, see the module docstring), packed as a table's."""
        if not self._fits(ordered):
            self._evict_stale(ordered)
        if not self._fits(ordered) and self._may_start_over(ordered):
            self._new_generation()
        packed = b"".join(self._packed(m) for m in ordered)
        now = self._clock()
        self._used.update((m.file_key, now) for m in ordered)
        return packed

    def touch(self, pids: Iterable[int]) -> None:
        """These processes were sampled now: the files of their tables are in use."""
        now = self._clock()
        with self._lock:
            for pid in pids:
                self._used.update((key, now) for key in self._process_files.get(pid, ()))

    def _may_start_over(self, mappings: Sequence[ProcessMapping]) -> bool:
        """Whether a new generation may start for files that do not fit (see the module docstring)."""
        age = self._clock() - self._generation_started
        if age >= MIN_GENERATION_SECONDS:
            return True
        if age < MIN_STALE_GENERATION_SECONDS:
            return False
        recent = self._clock() - ACTIVE_SECONDS
        in_use = {key for key, at in self._used.items() if at >= recent} | {m.file_key for m in mappings}
        rows = sum(f.row_count for key, f in self._files.items() if key in in_use)
        rows += sum(self._rows_needed(mappings).values())
        return rows <= STALE_SHARE * self._capacity

    def _evict_stale(self, mappings: Sequence[ProcessMapping]) -> None:
        """Give back the rows of files no process sampled in the last ACTIVE_SECONDS maps (the least recently
        used first) until ``mappings``' new files fit, if they can: the tables of the processes that map an
        evicted file are dropped (loaded again once sampled), its id still decodes for RETIRED_READS drains."""
        recent = self._clock() - ACTIVE_SECONDS
        keep = {m.file_key for m in mappings}
        stale = sorted((self._used.get(key, 0.0), i, key) for i, (key, f) in enumerate(self._files.items())
                       if f.row_count and key not in keep and self._used.get(key, 0.0) < recent
                       and self._by_identity.walked_at(key) < recent)
        free = [(f.row_start, f.row_count) for *_, key in stale for f in (self._files[key],)]
        trial = RowSpace(self._capacity)
        trial._free = list(self._rows._free)
        needed = list(self._rows_needed(mappings).values())
        evict = []
        for (_, _, key), (start, count) in zip(stale, free):
            if trial.fits(needed):
                break
            trial.release(start, count)
            evict.append(key)
        if not evict or not trial.fits(needed):
            return
        evicted = set(evict)
        for pid, keys in list(self._process_files.items()):
            if evicted.intersection(keys):
                forget_pid(self._procs, pid)
                del self._process_files[pid]
                self._dropped.add(pid)
        for key in evict:
            self._by_identity.forget(key)
        time.sleep(GRACE_SECONDS)  # walks in flight, which looked their table up before, end on the old rows
        for key in evict:
            self._segments.pop(key, None)
            loaded = self._files.pop(key)
            self._rows.release(loaded.row_start, loaded.row_count)
            self._by_id.pop(loaded.file_id, None)
            self._evicted[loaded.file_id] = loaded
            self._used.pop(key, None)
        self.stats["files_evicted"] += len(evict)

    def set_interp(self, executable: Hashable, linker: Hashable) -> None:
        """The dynamic linker (its identity) the executable with this identity names, for walks of images."""
        self._by_identity.set_interp(executable, linker)

    def take_dropped(self) -> set[int]:
        """The processes whose tables an eviction dropped since the last call (loaded again once sampled)."""
        with self._lock:
            dropped, self._dropped = self._dropped, set()
        return dropped

    def want(self, file_keys: Iterable[Hashable]) -> set[int]:
        """Samples were in these files (copies walked in user space): a large one's rows are to be loaded.
        Returns the processes whose tables must be loaded again for that (they map a file whose rows are
        not loaded yet)."""
        with self._lock:
            new = [key for key in file_keys if key not in self._wanted]
            self._wanted.update(dict.fromkeys(new))
            while len(self._wanted) > MAX_GENERATION_FILES:
                del self._wanted[next(iter(self._wanted))]
            lazy = {key for key in new if key in self._files and self._files[key].lazy}
            return {pid for pid, keys in self._process_files.items() if lazy.intersection(keys)} if lazy else set()

    def is_loaded(self, file_key: Hashable) -> bool:
        """Whether this generation holds the file (its rows, its place among those walked by frame pointers,
        or among those whose rows wait until used): a mapping of it needs no rows."""
        with self._lock:
            return file_key in self._files and not (self._files[file_key].lazy and file_key in self._wanted)

    def rows(self, file_key: Hashable) -> bytes | None:
        """The rows this generation holds for the file (read back from the kernel's array), None when it
        holds none: for walks in user space of files whose user-space rows were released."""
        with self._lock:
            loaded = self._files.get(file_key)
            if loaded is None or not loaded.row_count:
                return None
            offset, size = loaded.row_start * ROW_SIZE, loaded.row_count * ROW_SIZE
            first_page = offset - offset % mmap.PAGESIZE
            with mmap.mmap(self._rows_fd, offset + size - first_page, mmap.MAP_SHARED, mmap.PROT_READ,
                           offset=first_page) as window:
                return window[offset - first_page:offset - first_page + size]

    def forget_process(self, pid: int) -> None:
        forget_pid(self._procs, pid)
        with self._lock:
            self._process_files.pop(pid, None)

    def has_process(self, pid: int) -> bool:
        return has_pid(self._procs, pid)

    def drain_ids(self) -> FileIds:
        """The file ids the stacks a drain read decode with: call it after reading them (every id a stack
        names was handed out before). Each call is a drain: a generation retired RETIRED_READS drains ago
        is forgotten after it (a stack sampled just before the reset is read by the next drain, or, when
        the reset came between that drain's flip and its read, by the one after)."""
        ids = self._file_ids()
        with self._lock:
            if self._evicted:  # retired as a generation's files are: read again by the next drains
                self._retired.append((self._reads, self._evicted))
                self._evicted = {}
            self._reads += 1
            self._retired = [(at, ids) for at, ids in self._retired if self._reads - at < RETIRED_READS]
        return ids

    def _file_ids(self) -> FileIds:
        """The ids as of now, the previous drain's object when they are the same."""
        with self._lock:
            current, retired = self._by_id, [ids for _, ids in self._retired] + ([self._evicted] if self._evicted else [])
            if self._ids is None or self._ids.key != (id(current), *map(id, retired)):
                self._ids = FileIds(current, retired)
            return self._ids

    def counters(self) -> dict[str, int]:
        """unwind.c's counters (totals since the start)."""
        table = self._bpf[b"unwind_counters"]
        return {name: sum(table[table.Key(i)]) for i, name in enumerate(UNWIND_COUNTERS)}

    def sizes(self) -> dict[str, int]:
        """What the generation holds now: rows, files, and file ids kept for decoding (retired too)."""
        with self._lock:
            return {"unwind_rows": self._rows.used, "unwind_files": len(self._files),
                    "unwind_file_ids": len(self._by_id) + sum(len(ids) for _, ids in self._retired)}

    def new_generation(self) -> None:
        """Start over now (see the module docstring); the processes' tables must be loaded again."""
        with self._lock:
            self._new_generation()

    def _new_generation(self) -> None:
        for key in list(self._procs.keys()):
            forget_pid(self._procs, key.value)
        self._by_identity.clear()
        self._segments = {}
        self._process_files, self._used = {}, {}
        time.sleep(GRACE_SECONDS)  # walks in flight, which looked their table up before, end on the old rows
        self._retired.append((self._reads, self._by_id))
        self._by_id, self._files = {}, {}
        self._rows.reset()
        self._generation_started = self._clock()
        self.generation += 1
        salt = self._bpf[b"unwind_generation"]  # before any new table: walks from now on hash with it
        salt[salt.Key(0)] = salt.Leaf(self.generation)
        self.stats["generations"] += 1

    def _fits(self, mappings: Sequence[ProcessMapping]) -> bool:
        """Whether the files of ``mappings`` not loaded yet fit in this generation (a file larger than the
        whole array never gets rows, so it does not count)."""
        new = {m.file_key for m in mappings if m.file_key not in self._files}
        return self._rows.fits(self._rows_needed(mappings).values()) and len(self._files) + len(new) <= MAX_GENERATION_FILES

    def _rows_needed(self, mappings: Sequence[ProcessMapping]) -> dict[Hashable, int]:
        """The rows loading these mappings would write, by file: a new file's unless it waits until it is
        wanted (LAZY_ROWS), a waiting file's once it is; none for a file larger than the whole array."""
        needed = {}
        for m in mappings:
            count = len(m.rows or b"") // ROW_SIZE
            loaded = self._files.get(m.file_key)
            if loaded is None and not self._stays_lazy(m.file_key, count) or loaded is not None and loaded.lazy \
                    and m.file_key in self._wanted:
                needed[m.file_key] = count if count <= self._capacity * MAX_FILE_SHARE else 0
        return needed

    def _stays_lazy(self, file_key: Hashable, rows: int) -> bool:
        return LAZY_ROWS < rows <= self._capacity * MAX_FILE_SHARE and file_key not in self._wanted

    def _packed(self, mapping: ProcessMapping) -> bytes:
        loaded = self._file(mapping)
        offset_adj = (mapping.file_offset - mapping.start) & ((1 << 64) - 1)
        return _MAPPING.pack(mapping.start, mapping.end, mapping.bias & ((1 << 64) - 1), offset_adj,
                             loaded.row_start, loaded.row_count,
                             loaded.file_id if loaded.build_id is not None else 0,
                             MAPPING_COPY if loaded.lazy or loaded.refused else 0)

    def _file(self, mapping: ProcessMapping) -> _LoadedFile:
        loaded = self._files.get(mapping.file_key)
        if loaded is not None:
            if loaded.lazy and mapping.file_key in self._wanted and mapping.rows is not None:
                if self._fill(loaded, mapping.rows) and mapping.file_key in self._segments:
                    self._by_identity.put(mapping.file_key, loaded, self._segments[mapping.file_key])
                self.stats["files_loaded_when_used"] += 1
            return loaded
        if len(self._files) >= MAX_GENERATION_FILES:  # walked from copies (its frames raw IPs otherwise)
            self.stats["files_full"] += 1
            return _LoadedFile(0, 0, 0, None, refused=bool(mapping.rows))
        if mapping.rows is None:  # dropped by a caller that found it loaded before a new generation
            self.stats["rows_missing"] += 1
            return _LoadedFile(0, 0, 0, None)
        loaded = _LoadedFile(self._new_id(), 0, 0, mapping.build_id)
        if self._stays_lazy(mapping.file_key, len(mapping.rows) // ROW_SIZE):
            loaded.lazy = True
            self.stats["files_waiting"] += 1
        elif not self._fill(loaded, mapping.rows) and len(mapping.rows) // ROW_SIZE <= self._capacity * MAX_FILE_SHARE:
            loaded.lazy = True  # no room now: its stacks are copied until there is (as a large file's)
            self._wanted[mapping.file_key] = None
        self._files[mapping.file_key] = loaded
        self._by_id[loaded.file_id] = loaded
        if mapping.segment is not None:
            self._segments[mapping.file_key] = mapping.segment
            self._by_identity.put(mapping.file_key, loaded, mapping.segment)
        return loaded

    def _fill(self, loaded: _LoadedFile, rows: bytes) -> bool:
        """The file's rows written where there is room; False when there is none (it stays or becomes a file
        whose stacks are copied, MAPPING_COPY, and is asked for again at the next load that maps it)."""
        count = len(rows) // ROW_SIZE
        start = self._rows.allocate(count) if count else 0
        if start is None:
            self.stats["rows_full_waiting" if loaded.lazy else "rows_full"] += 1
            loaded.refused = True
            return False
        loaded.lazy = loaded.refused = False
        if count:
            self._write_rows(start, rows[:count * ROW_SIZE])
            loaded.row_start, loaded.row_count = start, count
            self.stats["rows_loaded"] += count
        return True

    def _write_rows(self, start: int, rows: bytes) -> None:
        """Through a shared mapping of the pages that hold them, dropped after the copy."""
        offset = start * ROW_SIZE
        first_page = offset - offset % mmap.PAGESIZE
        with mmap.mmap(self._rows_fd, offset + len(rows) - first_page, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE, offset=first_page) as window:
            window[offset - first_page:offset - first_page + len(rows)] = rows

    def _new_id(self) -> int:
        """The next id no stack may still name: ids of this generation and the retired ones kept are
        skipped (they are far fewer than MAX_FILE_IDS, so this ends)."""
        while True:
            self._last_id = self._last_id % MAX_FILE_IDS + 1
            if self._last_id not in self._by_id and self._last_id not in self._evicted and not any(
                    self._last_id in ids for _, ids in self._retired):
                return self._last_id


class _FrameCache(dict):
    """Frame word -> UserFrame, each decoded once (a dict subclass: hits stay in C)."""

    def __init__(self, tables: Sequence[dict[int, _LoadedFile]]) -> None:
        super().__init__()
        self._tables = tables

    def __missing__(self, frame: int) -> UserFrame:
        decoded = self[frame] = _decoded(frame, self._tables)
        return decoded


def _status(value: int) -> str:
    return UNWIND_STATUSES[value] if value < len(UNWIND_STATUSES) else "read_fault"


def _decoded(frame: int, tables: Sequence[dict[int, _LoadedFile]]) -> UserFrame:
    if is_runtime_word(frame):
        return UserFrame(RUNTIME_FRAME, frame)
    if not frame & FILE_FRAME:
        return UserFrame(None, frame)
    file_id = (frame & ~FILE_FRAME) >> FILE_OFFSET_BITS
    loaded = next((ids[file_id] for ids in tables if file_id in ids), None)
    if loaded is None or loaded.build_id is None:  # cannot happen while the ids are kept long enough
        return UserFrame(None, 0)
    return UserFrame(loaded.build_id, frame & ((1 << FILE_OFFSET_BITS) - 1))


class FileEntries:
    """images.c's tables of files by identity: each file of this generation with rows or waiting for them
    (unwind_files), and each executable's dynamic linker (unwind_interps). An identity is the unwind cache's
    key (st_dev, st_ino, st_size, st_mtime_ns); other file keys have no entry."""

    def __init__(self, bpf) -> None:
        try:
            self._files, self._interps = bpf[b"unwind_files"], bpf[b"unwind_interps"]
        except KeyError:  # a program without images.c (tests' stand-ins): nothing to keep
            self._files = self._interps = None

    def put(self, identity: Hashable, loaded: _LoadedFile, segment: tuple[int, int, int]) -> None:
        key = self._key(identity)
        if key is None:
            return
        vaddr, size, vaddr_adj = segment
        value = self._files.Leaf(loaded.row_start, loaded.row_count,
                                 loaded.file_id if loaded.build_id is not None else 0,
                                 MAPPING_COPY if loaded.lazy else 0, vaddr_adj, vaddr, size, 0)
        self._files[key] = value

    def forget(self, identity: Hashable) -> None:
        key = self._key(identity)
        if key is not None:
            try:
                del self._files[key]
            except KeyError:
                pass

    def walked_at(self, identity: Hashable) -> float:
        """When a walk of an image last went through the file (monotonic seconds; 0.0: never, or no entry)."""
        key = self._key(identity)
        try:
            return self._files[key].used / 1e9 if key is not None else 0.0
        except KeyError:
            return 0.0

    def set_interp(self, executable: Hashable, linker: Hashable) -> None:
        exe_key, linker_key = self._key(executable, self._interps.Key), self._key(linker, self._interps.Leaf)
        if exe_key is not None and linker_key is not None:
            self._interps[exe_key] = linker_key

    def clear(self) -> None:
        for table in (self._files, self._interps) if self._files is not None else ():
            for key in list(table.keys()):
                try:
                    del table[key]
                except KeyError:
                    pass

    def _key(self, identity: Hashable, kind=None):
        if self._files is None or not (isinstance(identity, tuple) and len(identity) == 4 and all(isinstance(v, int) for v in identity)):
            return None
        st_dev, ino, size, mtime_ns = identity
        kernel_dev = os.major(st_dev) << 20 | os.minor(st_dev)
        return (kind or self._files.Key)(ino, size, mtime_ns, kernel_dev, 0)
