"""The one cache of unwind tables of a session: each executable file is converted once, however many
processes map it, and the tables held stay under a byte budget.

Keys are the file's identity as the symbol layer keys files (:class:`~optrace.frontend.symbols.buildid.
BuildIdCache`): (st_dev, st_ino, st_size, st_mtime_ns), so a rebuilt or replaced file is converted
again; a build-id, when the caller knows it, is a second key (the same library in two containers is one
table).

Bound: the rows of the tables held total at most ``max_bytes`` (default DEFAULT_MAX_BYTES = 256 MiB,
about 16 M rows: cc1's table is 7.7 MB); the least recently used tables go first. A table over the
whole budget is returned but not kept. The cache is thread-safe (serve's reload thread and its drain
loop may both ask), and two threads asking for the same file wait for one conversion.

Files are opened only through the symbol layer's hostile-file rules
(:func:`~optrace.frontend.symbols.access.open_mapped_file`, :func:`~optrace.frontend.symbols.access.open_ref`:
no symlink followed, non-blocking, size and time budgets). Whatever a file does wrong (refused,
unreadable, not ELF, malformed or over-budget CFI) costs that file's table: an empty or partial table
and one counted problem through :class:`~optrace.frontend.symbols.access.FileProblems`, never the caller.
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from typing import BinaryIO

from optrace.fileaccess import reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileProblems, FileRef, open_mapped_file, open_ref
from optrace.frontend.symbols.buildid import FileIdentity
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.unwind.cfi import CfiError
from optrace.frontend.unwind.table import EMPTY, UnwindTable, build_table
from optrace.procfs import MapEntry

DEFAULT_MAX_BYTES = 256 << 20
CONSEQUENCE = "its frames are walked with frame pointers only"


class UnwindTableCache:
    """Unwind tables by file. ``stats`` counts ``conversions``, ``hits``, ``evictions`` and the problems
    (``bad_files``, ``bad_files_<kind>``, as the symbolizer's); ``warn`` gets one line per bad file."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, warn: Callable[[str], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.stats: Counter[str] = Counter()
        self._problems = FileProblems(warn or (lambda _line: None), self.stats)
        self._tables: LruCache[FileIdentity, UnwindTable] = LruCache(1 << 30, trim_on_put=False)
        self._by_build_id: dict[bytes, FileIdentity] = {}
        self._build_ids: dict[FileIdentity, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._building: dict[FileIdentity, threading.Event] = {}

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._tables)

    # -- lookups ----------------------------------------------------------------------------------------
    def of_mapping(self, pid: int, entry: MapEntry, build_id: bytes | None = None) -> UnwindTable:
        """The table of the file ``pid`` maps at ``entry`` (through /proc/PID/map_files: the very inode
        mapped). EMPTY when the process or mapping is gone or the file is bad (counted)."""
        try:
            fd = open_mapped_file(pid, entry, ELF_POLICY)
        except Exception as err:  # noqa: BLE001 - the per-file boundary
            self._problems.report(entry.file_path, err, CONSEQUENCE)
            return EMPTY
        if fd is None:
            return EMPTY
        try:
            return self.of_open_file(fd, entry.file_path, build_id)
        finally:
            os.close(fd)

    def of_ref(self, ref: FileRef, build_id: bytes | None = None) -> UnwindTable:
        """The table of a file the symbol layer names (a debug file, a library by path)."""
        try:
            reader = open_ref(ref, ELF_POLICY)
        except Exception as err:  # noqa: BLE001 - the per-file boundary
            self._problems.report(ref.name, err, CONSEQUENCE)
            return EMPTY
        with reader:
            return self._lookup(_identity(reader.fd), ref.name, build_id, reader)

    def of_open_file(self, fd: int, name: str, build_id: bytes | None = None) -> UnwindTable:
        """The table of the file open at ``fd`` (left open; ``name`` for messages), already checked
        against ELF_POLICY (open_mapped_file, open_file)."""
        return self._lookup(_identity(fd), name, build_id, None, fd)

    def cached(self, build_id: bytes) -> UnwindTable | None:
        """The table already built for a file with this build-id (e.g. of a process that has exited)."""
        with self._lock:
            identity = self._by_build_id.get(build_id)
            return None if identity is None else self._tables.get(identity)

    # -- the one conversion per file ------------------------------------------------------------------
    def _lookup(self, identity: FileIdentity, name: str, build_id: bytes | None, reader: BinaryIO | None,
                fd: int | None = None) -> UnwindTable:
        while True:
            with self._lock:
                found = self._find(identity, build_id)
                if found is not None:
                    self.stats["hits"] += 1
                    return found
                pending = self._building.get(identity)
                if pending is None:
                    pending = self._building[identity] = threading.Event()
                    break
            pending.wait()  # another thread converts this file: use its table
        try:
            table = self._convert(name, reader, fd)
            with self._lock:
                self._store(identity, build_id, table)
            return table
        finally:
            with self._lock:
                del self._building[identity]
            pending.set()

    def _find(self, identity: FileIdentity, build_id: bytes | None) -> UnwindTable | None:
        table = self._tables.get(identity)
        if table is None and build_id is not None and build_id in self._by_build_id:
            table = self._tables.get(self._by_build_id[build_id])
        return table

    def _convert(self, name: str, reader: BinaryIO | None, fd: int | None) -> UnwindTable:
        self.stats["conversions"] += 1
        if reader is None:
            with reader_for(os.dup(fd), ELF_POLICY, name) as owned:
                table = self._problems.contained(name, CONSEQUENCE, lambda: build_table(owned))
        else:
            table = self._problems.contained(name, CONSEQUENCE, lambda: build_table(reader))
        if table is None:
            return EMPTY
        if table.problems:
            self._problems.report(name, CfiError(f"{table.problems} problems in its CFI, first: {table.problem}"),
                                  "its unwind table is partial")
        return table

    def _store(self, identity: FileIdentity, build_id: bytes | None, table: UnwindTable) -> None:
        if table.nbytes > self.max_bytes:
            self.stats["too_large"] += 1
            return
        self._tables.put(identity, table)
        self._bytes += table.nbytes
        if build_id is not None:
            self._by_build_id[build_id] = identity
            self._build_ids[identity] = build_id
        while self._bytes > self.max_bytes:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        identity = self._tables.keys()[0]
        self._bytes -= self._tables[identity].nbytes
        self._tables.evict_oldest()
        build_id = self._build_ids.pop(identity, None)
        if build_id is not None and self._by_build_id.get(build_id) == identity:
            del self._by_build_id[build_id]
        self.stats["evictions"] += 1


def _identity(fd: int) -> FileIdentity:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns
