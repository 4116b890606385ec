"""A process's executable file mappings with their files' unwind tables: what the BPF unwinder needs to
walk its stacks (handed to :class:`optrace.bpf.unwindmaps.UnwindMaps`).

Each mapped file is opened through ``/proc/PID/map_files`` (the very inode mapped; see
:mod:`optrace.frontend.symbols.access`), once per (device, inode, size, mtime): its build-id, unwind
table and load segments are cached, so a library mapped by a thousand processes is read once. A file that
cannot be read or has no CFI costs its own rows only: its code is walked by frame pointers.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from optrace.bpf.unwindmaps import ProcessMapping
from optrace.fileaccess import reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileRef, open_mapped_file, open_ref
from optrace.frontend.symbols.buildid import read_build_id
from optrace.frontend.symbols.elffile import PT_LOAD, ElfFile
from optrace.frontend.symbols.linker import Linker
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.unwind.table import EMPTY, UnwindTable, build_table
from optrace.procfs import MapEntry, parse_maps, read_maps_text

FileIdentity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
MAX_TABLE_BYTES = 256 << 20  # rows kept in memory for files not mapped right now (cc1: 7 MB)


@dataclass(frozen=True)
class UnwindFile:
    """What the unwinder needs of one file: its rows, how its file offsets map to its addresses."""

    table: UnwindTable
    build_id: bytes | None
    loads: tuple[tuple[int, int, int], ...]  # PT_LOAD (offset, filesz, vaddr - offset)

    def bias(self, entry: MapEntry) -> int:
        """Load bias of ``entry``: the file's virtual address of a mapped address is ``address - bias``."""
        for offset, size, delta in self.loads:
            if offset <= entry.offset < offset + max(size, 1):
                return entry.start - entry.offset - delta
        return entry.start - entry.offset


class ProcessUnwinding:
    """Builds :class:`ProcessMapping` lists for processes, with a bounded cache of files' tables."""

    def __init__(self, max_table_bytes: int = MAX_TABLE_BYTES, max_files: int = 4096) -> None:
        self._files: LruCache[FileIdentity, UnwindFile] = LruCache(max_files, trim_on_put=False)
        self._max_bytes = max_table_bytes
        self.stats: Counter[str] = Counter()

    def mappings(self, pid: int) -> list[ProcessMapping] | None:
        """The process's executable file mappings now; None when it is gone."""
        try:
            entries = parse_maps(read_maps_text(pid))
        except OSError:
            return None
        found = []
        for entry in entries:
            if entry.is_file and entry.executable:
                mapping = self._mapping(pid, entry)
                if mapping is not None:
                    found.append(mapping)
        self._trim()
        return found

    def warm(self, executable: str) -> None:
        """Build the tables of ``executable`` (a path as passed to execve) and the libraries it needs
        before it runs, so its first samples are unwound too (the build takes a fraction of a second per
        large file: samples taken meanwhile are walked by frame pointers)."""
        libraries, _missing = Linker().needed_libraries(executable)
        for ref in [FileRef(executable, executable, follow_symlinks=True), *libraries]:
            try:
                with open_ref(ref) as stream:
                    info = os.fstat(stream.fd)
                    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
                    if identity not in self._files:
                        self._files.put(identity, self._read(stream.fd, ref.name))
            except OSError:
                self.stats["files_refused"] += 1

    def _mapping(self, pid: int, entry: MapEntry) -> ProcessMapping | None:
        try:
            fd = open_mapped_file(pid, entry, ELF_POLICY)
        except OSError:
            self.stats["files_refused"] += 1
            return None
        if fd is None:
            return None
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            unwind = self._files.get(identity)
            if unwind is None:
                unwind = self._read(fd, entry.file_path)
                self._files.put(identity, unwind)
        finally:
            os.close(fd)
        return ProcessMapping(entry.start, entry.end, entry.offset, unwind.bias(entry), identity,
                              unwind.table.rows, unwind.build_id)

    def _read(self, fd: int, name: str) -> UnwindFile:
        """The file's table, build-id and load segments; a file that cannot be read has none of them
        (counted): its code is walked by frame pointers."""
        try:
            with reader_for(os.dup(fd), ELF_POLICY, name) as stream:
                elf = ElfFile(stream)
                loads = tuple((s.offset, s.filesz, s.vaddr - s.offset) for s in elf.segments() if s.type == PT_LOAD)
                build_id = read_build_id(stream)  # reads first: the reader's time budget runs during the build
                table = build_table(elf)
        except Exception:  # noqa: BLE001 - the per-file boundary: a bad file only loses its own rows
            self.stats["files_unreadable"] += 1
            return UnwindFile(EMPTY, None, ())
        self.stats["tables_built"] += 1
        if table.problems:
            self.stats["tables_with_problems"] += 1
        return UnwindFile(table, build_id, loads)

    def _trim(self) -> None:
        self._files.trim()
        total = self.cache_bytes()
        while total > self._max_bytes and len(self._files) > 1:
            total -= self._files.evict_oldest().table.nbytes

    def cache_bytes(self) -> int:
        return sum(f.table.nbytes for f in self._files.values())
