"""The maps of the BPF unwinder (unwind.c): files' unwind rows, per-process mapping tables, and the
CFI-unwound stacks a drain reads back.

Rows: one BPF array (``BPF_F_MMAPABLE``) holds every loaded file's rows, each file a contiguous range,
written through a shared mapping of the map (one copy, no syscall per row: cc1's 436,539 rows). A file
is loaded once however many processes map it, keyed by what the caller says identifies it (build-id,
else device, inode, size and mtime). Ranges are handed out in order; when the array is full, a new
file gets no rows (its code is walked by frame pointers, counted in ``stats["rows_full"]``) until
:meth:`UnwindMaps.reset_rows` starts over.

Frames come back as (file id, file offset) for files with a build-id: a :class:`UserFrame` like the
kernel's build-id stacks give, valid after the process exited; other frames as raw IPs.
"""
from __future__ import annotations

import ctypes
import mmap
import struct
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from optrace.model import UserFrame

ROW_SIZE = 16  # struct unwind_row
MAX_MAPPINGS = 256  # UNWIND_MAX_MAPPINGS
FILE_FRAME = 1 << 63
FILE_OFFSET_BITS = 40
MAX_FILE_IDS = (1 << 23) - 1
# enum unwind_status in unwind.c, by value
UNWIND_STATUSES = ("outermost", "chain_end", "no_cfi", "expression", "read_fault", "depth_limit")
UNWIND_COUNTERS = ("stacks_full", "no_user_registers")  # enum unwind_counter
_MAPPING = struct.Struct("<QQQQIIII")


@dataclass(frozen=True)
class ProcessMapping:
    """One executable file mapping of a process, as the unwinder needs it. ``rows`` (the file's unwind
    table rows, ``ROW_SIZE`` bytes each, sorted by PC) may be empty: its code is walked by frame pointers."""

    start: int
    end: int
    file_offset: int  # of ``start``
    bias: int  # ELF virtual address = address - bias
    file_key: Hashable  # identifies the file across processes (its rows are loaded once)
    rows: bytes
    build_id: bytes | None  # None: its frames stay raw IPs


@dataclass(frozen=True)
class UnwoundStack:
    frames: tuple[UserFrame, ...]
    status: str  # one of UNWIND_STATUSES


@dataclass
class _LoadedFile:
    file_id: int
    row_start: int
    row_count: int
    build_id: bytes | None


class UnwindMaps:
    """Fills unwind.c's maps of a loaded BCC program and reads its stacks."""

    def __init__(self, bpf, rows_capacity: int) -> None:
        """The maps only: the walking program comes with :meth:`load_step`."""
        self._bpf = bpf
        self._capacity = rows_capacity
        self._rows = mmap.mmap(bpf[b"unwind_rows"].map_fd, _page_rounded(rows_capacity * ROW_SIZE),
                               mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._procs = bpf[b"unwind_procs"]
        self._files: dict[Hashable, _LoadedFile] = {}
        self._by_id: dict[int, _LoadedFile] = {}
        self._next_row = 0
        self._last_id = 0  # file ids are never reused: a stack read later still names its file
        self.stats: Counter[str] = Counter()

    def load_step(self) -> None:
        """Load the walking program (unwind_step) and put it where on_sample tail-calls it. The kernel takes
        about a second to verify it, so this runs off the start-up path: until it is in place the tail
        call fails and samples take frame-pointer stacks (unwind.c). Safe to call twice."""
        from bcc import BPF  # bpf/ is the one folder that imports BCC

        step = self._bpf.load_func(b"unwind_step", BPF.PERF_EVENT)
        progs = self._bpf[b"unwind_progs"]
        progs[progs.Key(0)] = progs.Leaf(step.fd)

    def load_process(self, pid: int, epoch: int, mappings: Sequence[ProcessMapping]) -> None:
        """Give the sampler this process's mapping table (replacing any before), read from /proc/PID/maps
        after the process had ``epoch`` (profile.c): its samples are unwound from CFI while it keeps
        that epoch (no exec, no new executable mapping since)."""
        ordered = sorted(mappings, key=lambda m: m.start)[:MAX_MAPPINGS]
        if len(mappings) > MAX_MAPPINGS:
            self.stats["mappings_dropped"] += len(mappings) - MAX_MAPPINGS
        value = self._procs.Leaf()
        packed = struct.pack("<IIQ", len(ordered), 0, epoch) + b"".join(self._packed(m) for m in ordered)
        ctypes.memmove(ctypes.addressof(value), packed, len(packed))
        self._procs[self._procs.Key(pid)] = value
        self.stats["processes_loaded"] += 1

    def forget_process(self, pid: int) -> None:
        try:
            del self._procs[self._procs.Key(pid)]
        except KeyError:
            pass

    def has_process(self, pid: int) -> bool:
        return self._procs.Key(pid) in self._procs

    def read_stacks(self, index: int) -> dict[int, UnwoundStack]:
        """The stacks of map set ``index`` by hash, decoded; the map is cleared."""
        table = self._bpf[f"cfistacks{index}".encode()]
        stacks = {}
        for key, value in table.items():
            frames = tuple(self._decoded(ip) for ip in value.frames[:min(value.len, len(value.frames))])
            status = UNWIND_STATUSES[value.status] if value.status < len(UNWIND_STATUSES) else "read_fault"
            stacks[key.value] = UnwoundStack(frames, status)
        for key in list(stacks):
            try:
                del table[table.Key(key)]
            except KeyError:
                pass
        return stacks

    def counters(self) -> dict[str, int]:
        """unwind.c's counters (totals since the start)."""
        table = self._bpf[b"unwind_counters"]
        return {name: sum(table[table.Key(i)]) for i, name in enumerate(UNWIND_COUNTERS)}

    def reset_rows(self) -> None:
        """Forget every loaded file (the processes' tables must be loaded again after this)."""
        self._files.clear()
        self._next_row = 0
        for key in list(self._procs.keys()):
            self.forget_process(key.value)

    def close(self) -> None:
        self._rows.close()

    def _packed(self, mapping: ProcessMapping) -> bytes:
        loaded = self._file(mapping)
        offset_adj = (mapping.file_offset - mapping.start) & ((1 << 64) - 1)
        return _MAPPING.pack(mapping.start, mapping.end, mapping.bias & ((1 << 64) - 1), offset_adj,
                             loaded.row_start, loaded.row_count,
                             loaded.file_id if loaded.build_id is not None else 0, 0)

    def _file(self, mapping: ProcessMapping) -> _LoadedFile:
        loaded = self._files.get(mapping.file_key)
        if loaded is not None:
            return loaded
        count = len(mapping.rows) // ROW_SIZE
        if self._next_row + count > self._capacity or self._last_id >= MAX_FILE_IDS:
            self.stats["rows_full"] += 1
            count = 0
        start = self._next_row
        if count:
            self._rows[start * ROW_SIZE:(start + count) * ROW_SIZE] = mapping.rows[:count * ROW_SIZE]
            self._next_row += count
            self.stats["rows_loaded"] += count
        self._last_id += 1
        loaded = _LoadedFile(self._last_id, start, count, mapping.build_id)
        self._files[mapping.file_key] = loaded
        self._by_id[loaded.file_id] = loaded
        return loaded

    def _decoded(self, frame: int) -> UserFrame:
        if not frame & FILE_FRAME:
            return UserFrame(None, frame)
        loaded = self._by_id.get((frame & ~FILE_FRAME) >> FILE_OFFSET_BITS)
        if loaded is None or loaded.build_id is None:  # cannot happen: ids are never reused
            return UserFrame(None, 0)
        return UserFrame(loaded.build_id, frame & ((1 << FILE_OFFSET_BITS) - 1))


def _page_rounded(size: int) -> int:
    return -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
