"""A process's executable file mappings with their files' unwind tables: what the BPF unwinder needs to
walk its stacks (handed to :class:`optrace.bpf.unwindmaps.UnwindMaps`).

Each mapped file is opened through ``/proc/PID/map_files`` (the very inode mapped; see
:mod:`optrace.frontend.symbols.access`); its unwind table comes from the session's
:class:`~optrace.frontend.unwind.cache.UnwindTableCache` (one conversion per file), its build-id and load
segments from a small cache keyed the same way, so a library mapped by a thousand processes is read once.
A file that cannot be read or has no CFI costs its own rows only: its code is walked by frame pointers.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from optrace.bpf.unwindmaps import ProcessMapping
from optrace.fileaccess import reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileRef, open_mapped_file, open_ref
from optrace.frontend.symbols.buildid import FileIdentity, read_build_id
from optrace.frontend.symbols.elffile import PT_LOAD, ElfFile
from optrace.frontend.symbols.linker import Linker
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.cache import _identity as file_identity  # the cache's own key of a file
from optrace.frontend.unwind.trampolines import trampoline_rows
from optrace.procfs import MapEntry, parse_maps, read_maps_text


@dataclass(frozen=True)
class FileLayout:
    """How a file's offsets map to its virtual addresses, and its build-id."""

    build_id: bytes | None
    loads: tuple[tuple[int, int, int], ...]  # PT_LOAD (offset, filesz, vaddr - offset)

    def bias(self, entry: MapEntry) -> int:
        """Load bias of ``entry``: the file's virtual address of a mapped address is ``address - bias``."""
        for offset, size, delta in self.loads:
            if offset <= entry.offset < offset + max(size, 1):
                return entry.start - entry.offset - delta
        return entry.start - entry.offset


NO_LAYOUT = FileLayout(None, ())


class ProcessUnwinding:
    """Builds :class:`ProcessMapping` lists for processes."""

    def __init__(self, tables: UnwindTableCache | None = None, max_files: int = 4096) -> None:
        self.tables = tables or UnwindTableCache()
        self._layouts: LruCache[FileIdentity, FileLayout] = LruCache(max_files)
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
            elif entry.executable and not entry.path:
                mapping = self._anonymous(pid, entry)
            else:
                continue
            if mapping is not None:
                found.append(mapping)
        return found

    def warm(self, executable: str) -> None:
        """Build the tables of ``executable`` (a path as passed to execve) and the libraries it needs
        before it runs, so its first samples are unwound too (the build takes a fraction of a second per
        large file: samples taken meanwhile are walked by frame pointers)."""
        libraries, _missing = Linker().needed_libraries(executable)
        for ref in [FileRef(executable, executable, follow_symlinks=True), *libraries]:
            try:
                with open_ref(ref) as stream:
                    layout = self._layout(stream.fd, ref.name)
                    self.tables.of_open_file(stream.fd, ref.name, layout.build_id)
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
            layout = self._layout(fd, entry.file_path)
            table = self.tables.of_open_file(fd, entry.file_path, layout.build_id)
            identity = file_identity(fd)
        finally:
            os.close(fd)
        return ProcessMapping(entry.start, entry.end, entry.offset, layout.bias(entry), identity, table.rows,
                              layout.build_id)

    def _anonymous(self, pid: int, entry: MapEntry) -> ProcessMapping | None:
        """Code without a file: only CPython's perf trampolines have rows (see trampolines.py); the rest
        (other JITs) is walked by frame pointers without an entry."""
        rows = trampoline_rows(pid, entry.start, entry.end)
        if rows is None:
            return None
        self.stats["trampoline_arenas"] += 1
        return ProcessMapping(entry.start, entry.end, 0, entry.start, ("trampolines", entry.end - entry.start),
                              rows, None)

    def _layout(self, fd: int, name: str) -> FileLayout:
        identity = file_identity(fd)
        layout = self._layouts.get(identity)
        if layout is None:
            layout = self._read_layout(fd, name)
            self._layouts.put(identity, layout)
        return layout

    def _read_layout(self, fd: int, name: str) -> FileLayout:
        """A file that cannot be read has no layout (counted): its frames stay raw IPs."""
        try:
            with reader_for(os.dup(fd), ELF_POLICY, name) as stream:
                elf = ElfFile(stream)
                loads = tuple((s.offset, s.filesz, s.vaddr - s.offset) for s in elf.segments() if s.type == PT_LOAD)
                return FileLayout(read_build_id(stream), loads)
        except Exception:  # noqa: BLE001 - the per-file boundary: a bad file only loses its own frames
            self.stats["files_unreadable"] += 1
            return NO_LAYOUT
