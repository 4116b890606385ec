"""A process's executable mappings with their files' unwind tables: what the BPF unwinder needs to walk
its stacks (handed to :class:`optrace.bpf.unwindmaps.UnwindMaps`).

Files come from the session's :class:`~optrace.frontend.unwind.cache.UnwindTableCache` (opened through
``/proc/PID/map_files``, one conversion per file however many processes map it, with its build-id and
load segments). A file that cannot be read or has no CFI costs its own rows only: its code is walked by
frame pointers. Anonymous code has rows only for CPython's perf trampolines (trampolines.py).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from optrace.bpf.images import ProcessImage
from optrace.bpf.unwindmaps import ProcessMapping
from optrace.frontend.symbols.access import FileRef, open_ref
from optrace.frontend.symbols.buildid import FileIdentity
from optrace.frontend.symbols.elffile import ELF_MAGIC
from optrace.frontend.symbols.linker import Linker
from optrace.frontend.unwind.cache import RELEASED, UnwindTableCache, rows_always_needed
from optrace.frontend.unwind.images import ImageFiles
from optrace.frontend.unwind.trampolines import trampoline_rows
from optrace.procfs import MapEntry, read_maps


@dataclass
class CapturedMaps:
    """A process's executable mappings as read at one moment, each file mapping's file held open (``fds``,
    None where it could not be opened): their tables can be built after the process is gone (a compiler's
    assembler lives for milliseconds; its copied stacks are walked once the tables are built). Closed
    by :meth:`ProcessUnwinding.mappings_of`, or :meth:`close`."""

    pid: int
    entries: list[MapEntry]
    fds: list[int | None] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            if fd is not None:
                os.close(fd)
        self.fds = [None] * len(self.fds)


class ProcessUnwinding:
    """Builds :class:`ProcessMapping` lists for processes."""

    def __init__(self, tables: UnwindTableCache | None = None) -> None:
        self.tables = tables if tables is not None else UnwindTableCache()  # an empty cache is falsy
        self._linker = Linker()  # caches each library's dynamic section
        self.images = ImageFiles(self.tables, self._linker)
        self.stats: Counter[str] = Counter()

    def cancel(self) -> None:
        """The session is ending: no more tables are built (one in progress stops at its next check)."""
        self.tables.cancelled.set()

    def mappings(self, pid: int, loaded: Callable[[Hashable], bool] | None = None) -> list[ProcessMapping] | None:
        """The process's executable mappings now; None when it is gone or the session is ending. With
        ``loaded`` (whether the kernel holds a file's rows), a file whose rows were released (see
        :meth:`release`) comes without them when it is loaded, and is converted again when it is not."""
        captured = self.capture(pid)
        return None if captured is None else self.mappings_of(captured, loaded)

    def capture(self, pid: int) -> CapturedMaps | None:
        """The process's executable mappings now, their files opened (a fraction of a millisecond: no table
        is built); None when it is gone."""
        maps = read_maps(pid)
        if maps is None:
            return None
        entries = [entry for entry in maps.entries if entry.executable and (entry.is_file or not entry.path)]
        return CapturedMaps(pid, entries, [self.tables.open_mapping(pid, entry) if entry.is_file else None
                                           for entry in entries])

    def mappings_of(self, captured: CapturedMaps, loaded: Callable[[Hashable], bool] | None = None
                    ) -> list[ProcessMapping] | None:
        """:meth:`mappings` of a capture (closed here); None when the session is ending."""
        need_rows = rows_always_needed if loaded is None else (lambda identity: not loaded(identity))
        found = []
        try:
            for entry, fd in zip(captured.entries, captured.fds):
                if self.tables.cancelled.is_set():
                    return None
                if entry.is_file:
                    mapping = self._mapping(entry, fd, need_rows) if fd is not None else None
                else:
                    mapping = self._anonymous(captured.pid, entry)
                if mapping is not None:
                    found.append(mapping)
        finally:
            captured.close()
        return found

    def mappings_of_image(self, pid: int, image: ProcessImage, program: str | None, alive: bool,
                          loaded: Callable[[Hashable], bool] | None = None) -> list[ProcessMapping] | None:
        """:meth:`mappings` from the kernel's image of the process (frontend/unwind/images.py); None when the
        session is ending."""
        if self.tables.cancelled.is_set():
            return None
        need_rows = rows_always_needed if loaded is None else (lambda identity: not loaded(identity))
        return self.images.mappings(pid, image, program, alive, need_rows)

    def frame_pointer_mappings(self, pid: int) -> list[ProcessMapping] | None:
        """The process's executable file mappings without rows: the BPF walker follows frame pointers in
        them, as the kernel's walk would, and names its frames by file and offset (folded in a recording
        like any CFI stack, where raw addresses are decoded at every drain). For optrace's own process,
        whose BCC libraries alone hold more rows than the kernel's array (see ProfilingSession). The
        files get keys of their own, so a process with rows for the same file is not walked without them."""
        maps = read_maps(pid)
        if maps is None:
            return None
        found = []
        for entry in maps.entries:
            if not (entry.is_file and entry.executable):
                continue
            unwind = self.tables.file_without_rows(pid, entry)
            if unwind.identity is not None:
                found.append(ProcessMapping(entry.start, entry.end, entry.offset, unwind.bias(entry),
                                            ("frame pointers", unwind.identity), b"", unwind.build_id))
        return found

    def warm(self, executable: str) -> None:
        """Build the tables of ``executable`` (a path as passed to execve) and the libraries it needs
        before it runs, so its first samples are unwound too (the build takes a fraction of a second per
        large file: samples taken meanwhile are walked by frame pointers)."""
        program = FileRef(executable, executable, follow_symlinks=True)
        if not _is_elf(program):  # a script: its interpreter's tables come with its process
            return
        libraries, _missing = self._linker.needed_libraries(executable)
        for ref in [program, *libraries]:
            if self.tables.cancelled.is_set():
                return
            self.tables.file_of_ref(ref)

    def release(self, mappings: Sequence[ProcessMapping], held: Callable[[Hashable], bool]) -> int:
        """Drop the user-space rows of these mappings' files that the kernel holds (``held``); the bytes dropped.
        The rest stay in the cache: the walks of stack copies keep them for each process, and a file released
        there would be read again, one copy per process (a python3.11's 7.3 MB for each of 30 processes: serve's
        RSS 270 -> 530 MB beside the issue-40 attack)."""
        return self.tables.release_rows(m.file_key for m in mappings if m.rows and held(m.file_key))

    def _mapping(self, entry: MapEntry, fd: int, need_rows: Callable[[FileIdentity], bool]) -> ProcessMapping | None:
        unwind = self.tables.file_of_open_file(fd, entry.file_path, need_rows)
        if unwind.identity is None:  # the file was refused (counted)
            return None
        rows = None if unwind.table is RELEASED else unwind.table.rows
        return ProcessMapping(entry.start, entry.end, entry.offset, unwind.bias(entry), unwind.identity, rows,
                              unwind.build_id, unwind.executable_segment())

    def _anonymous(self, pid: int, entry: MapEntry) -> ProcessMapping | None:
        """Code without a file: only CPython's perf trampolines have rows (see trampolines.py); the rest
        (other JITs) is walked by frame pointers without an entry."""
        rows = trampoline_rows(pid, entry.start, entry.end)
        if rows is None:
            return None
        self.stats["trampoline_arenas"] += 1
        return ProcessMapping(entry.start, entry.end, 0, entry.start, ("trampolines", entry.end - entry.start),
                              rows, None)


def _is_elf(ref: FileRef) -> bool:
    try:
        with open_ref(ref) as stream:
            return stream.read(len(ELF_MAGIC)) == ELF_MAGIC
    except OSError:
        return False
