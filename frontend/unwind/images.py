"""A process's mappings for the unwinder from its image (bpf/images.py: what the kernel recorded of its
executable mappings since its exec), without /proc: the tables of a process that lived 50 ms are built after it
is gone, and a process whose files are known costs no file read at all.

Files are known by identity (device, inode, size, mtime: the unwind cache's key), so a binary's table, load
segments and build-id are one object for every process that maps it. A file not converted yet is opened
through the process while it lives (/proc/PID/map_files: the very inode); once it is gone, by a path that
names the same identity: the exec'd path (the session's exec events), the libraries it needs (found as ld.so
finds them), only for a process whose root and mount namespace are optrace's own. A file found nowhere costs
its own frames (counted: ``stats["image_files_unknown"]``).

The executable and the dynamic linker are mapped by the kernel at exec, with no mmap call: the executable's
text is placed from the image's ``start_code`` (its first executable segment, relocated), the linker's from
``interp_base`` (its load bias: its segments are linked at 0); the linker's file is the one the executable's
PT_INTERP names (read once per executable).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from optrace.bpf.images import FileIdentity, ProcessImage
from optrace.bpf.unwindmaps import ProcessMapping
from optrace.fileaccess import BoundedFile, open_mapped, reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileRef, open_ref
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.linker import Linker
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.unwind.cache import RELEASED, UnwindTableCache, file_identity
from optrace.frontend.unwind.unwindfile import UnwindFile
from optrace.procfs import MapEntry

PAGE = 4096
PT_INTERP = 3
MAX_INTERP_BYTES = 4096
MAX_KNOWN = 8192  # paths known to name an identity, and executables' dynamic linkers


@dataclass(frozen=True)
class Root:
    """A process's root directory (st_dev, st_ino) and mount namespace: its paths are ours when both are."""

    directory: tuple[int, int]
    mnt_ns: int


def own_root() -> Root:
    info = os.stat("/")
    return Root((info.st_dev, info.st_ino), os.stat("/proc/self/ns/mnt").st_ino)


class ImageFiles:
    """Files of images by identity, with the paths known to name them; :meth:`mappings` is one image's
    ProcessMapping list. Thread-safe as the unwind cache is (the lookups of two threads may open a file twice)."""

    def __init__(self, tables: UnwindTableCache, linker: Linker) -> None:
        self.tables = tables
        self._linker = linker
        self._refs: LruCache[FileIdentity, FileRef] = LruCache(MAX_KNOWN)  # paths naming an identity
        self._interps: LruCache[FileIdentity, str | None] = LruCache(MAX_KNOWN)  # executable -> its PT_INTERP
        self._programs: LruCache[FileIdentity, None] = LruCache(MAX_KNOWN)  # executables whose libraries are known
        self._names: LruCache[FileIdentity, str] = LruCache(MAX_KNOWN)  # file names, as resolved
        self._linkers: dict[FileIdentity, FileIdentity] = {}  # executable -> its linker, found since the last take
        self._own = own_root()
        self.stats: Counter[str] = Counter()

    def ours(self, image: ProcessImage) -> bool:
        """Whether the image's process sees our file tree (its paths name our files)."""
        return Root(image.root, image.mnt_ns) == self._own

    def mappings(self, pid: int, image: ProcessImage, program: str | None, alive: bool,
                 need_rows: Callable[[Hashable], bool]) -> list[ProcessMapping]:
        """The image's executable mappings with their files' tables; ``program``: the path it exec'd (None:
        not known), ``alive``: whether its files can still be opened through it."""
        ours = self.ours(image)
        program = program or (image.path if image.path.startswith("/") else None)
        if ours and program and image.exe is not None:
            self._learn_program(image.exe, program)
        found: list[ProcessMapping] = []
        exe = self._file(pid, image.exe, _text_entry(image.start_code, image.end_code), alive, need_rows) \
            if image.exe is not None and image.start_code else None
        if exe is not None:
            found += self._placed(exe, image.start_code, first_executable=True)
            if image.interp_base and image.exe not in self._interps:
                text = _text_entry(image.start_code, image.end_code)
                self._interps.put(image.exe, self._read_interp(pid, text, alive, image.exe))
            interp = self._interp(image.exe, ours, need_rows) if image.interp_base else None
            if interp is not None:
                found += self._placed(interp, image.interp_base, first_executable=False)
                self._linkers[image.exe] = interp.identity
        for mapped in image.maps:
            entry = MapEntry(mapped.start, mapped.end, "r-xp", mapped.offset, "", 0, "")
            unwind = self._file(pid, mapped.file, entry, alive, need_rows)
            if unwind is not None:
                found.append(_mapping(unwind, entry))
        return found

    # -- files -------------------------------------------------------------------------------------------
    def _file(self, pid: int, identity: FileIdentity, entry: MapEntry, alive: bool,
              need_rows: Callable[[Hashable], bool]) -> UnwindFile | None:
        """The file with this identity: from the cache, else opened through the process (``entry``: where it
        maps it) or by a path known to name it."""
        known = self.tables.known(identity, need_rows)
        if known is not None:
            self.stats["image_files_known"] += 1
            return known
        unwind = self._through_process(pid, entry) if alive else None
        if unwind is None or unwind.identity != identity:
            ref = self._refs.get(identity)
            unwind = self.tables.file_of_ref(ref, need_rows) if ref is not None else None
            if ref is not None:
                self._names.put(identity, os.path.basename(ref.name))
        if unwind is None or unwind.identity != identity:
            self.stats["image_files_unknown"] += 1
            return None
        self.stats["image_files_opened"] += 1
        return unwind

    def take_linkers(self) -> dict[FileIdentity, FileIdentity]:
        """The executables whose dynamic linker was found since the last call, with it (for bpf/images.c)."""
        taken, self._linkers = self._linkers, {}
        return taken

    def names(self, image: ProcessImage) -> list[str] | None:
        """The names of the image's files (the executable's and its mappings'), None when one is not known."""
        names = []
        for identity in (image.exe, *(m.file for m in image.maps)):
            name = self._names.get(identity) if identity is not None else None
            if name is None:
                return None
            names.append(name)
        return names

    def _through_process(self, pid: int, entry: MapEntry) -> UnwindFile | None:
        try:
            fd = open_mapped(pid, entry.start, entry.end, ELF_POLICY)
        except Exception:  # noqa: BLE001 - refused or unreadable: found another way, or not at all
            return None
        if fd is None:
            return None
        try:
            try:
                name = os.readlink(f"/proc/{pid}/map_files/{entry.start:x}-{entry.end:x}")
            except OSError:
                name = f"[mapped by {pid}]"
            unwind = self.tables.file_of_open_file(fd, name)
            if unwind.identity is not None:
                self._names.put(unwind.identity, os.path.basename(name))
            return unwind
        finally:
            os.close(fd)

    def _learn_program(self, identity: FileIdentity, program: str) -> None:
        """The paths of an executable exec'd from our root, its libraries (as ld.so finds them) and its
        dynamic linker: each names its identity, for the files of processes gone before they were opened."""
        if identity in self._programs:
            return
        self._programs.put(identity, None)
        ref = FileRef(program, program, follow_symlinks=True)
        if _stat_identity(ref) != identity:
            return
        self._refs.put(identity, ref)
        self._names.put(identity, os.path.basename(program))
        libraries, _missing = self._linker.needed_libraries(program)
        for library in libraries:
            library_identity = _stat_identity(library)
            if library_identity is not None:
                self._refs.put(library_identity, library)
                self._names.put(library_identity, os.path.basename(library.name))

    def _interp(self, exe_identity: FileIdentity, ours: bool, need_rows: Callable[[Hashable], bool]
                ) -> UnwindFile | None:
        """The dynamic linker the executable names (PT_INTERP), for a process whose paths are ours."""
        if not ours:
            self.stats["image_interp_elsewhere"] += 1
            return None
        path = self._interps.get(exe_identity)
        if path is None:
            self.stats["image_interp_unknown"] += 1
            return None
        try:
            info = os.stat(path)  # the system's own linker, followed as ld.so does
        except OSError:
            return None
        known = self.tables.known((info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns), need_rows)
        unwind = known or self.tables.file_of_ref(FileRef(path, path, follow_symlinks=True), need_rows)
        return unwind if unwind.identity is not None else None

    def _read_interp(self, pid: int, text: MapEntry, alive: bool, identity: FileIdentity) -> str | None:
        """The executable's PT_INTERP, read through the process (``text``: its mapping) or a path naming it."""
        if alive:
            try:
                fd = open_mapped(pid, text.start, text.end, ELF_POLICY)
            except Exception:  # noqa: BLE001 - refused or unreadable: by its path, or not at all
                fd = None
            if fd is not None:
                with reader_for(fd, ELF_POLICY, f"[mapped by {pid}]") as reader:
                    return _interp_of(reader, identity)
        ref = self._refs.get(identity)
        if ref is None:
            return None
        try:
            with open_ref(ref, ELF_POLICY) as reader:
                return _interp_of(reader, identity)
        except Exception:  # noqa: BLE001 - a bad file: no linker found for it
            return None

    # -- placing -----------------------------------------------------------------------------------------
    def _placed(self, unwind: UnwindFile, at: int, first_executable: bool) -> list[ProcessMapping]:
        """The executable segments of a file the kernel mapped at exec: relocated so that its first executable
        segment starts at ``at`` (the executable's start_code), or by ``at`` (the linker's load bias)."""
        segments = [seg for seg in unwind.loads if seg.executable]
        if not segments:
            return []
        bias = at - segments[0].vaddr if first_executable else at
        return [_mapping(unwind, _segment_entry(seg.vaddr + bias, seg.filesz, seg.offset)) for seg in segments]


def _mapping(unwind: UnwindFile, entry: MapEntry) -> ProcessMapping:
    rows = None if unwind.table is RELEASED else unwind.table.rows
    return ProcessMapping(entry.start, entry.end, entry.offset, unwind.bias(entry), unwind.identity, rows,
                          unwind.build_id, unwind.executable_segment())


def _segment_entry(address: int, size: int, offset: int) -> MapEntry:
    """The mapping the kernel makes of a segment: whole pages around it, its file offset moved as its start."""
    start = address - address % PAGE
    end = -(-(address + size) // PAGE) * PAGE
    return MapEntry(start, end, "r-xp", offset - (address - start), "", 0, "")


def _text_entry(start_code: int, end_code: int) -> MapEntry:
    """The executable's text mapping as /proc names it (for map_files): its file offset is not needed there."""
    start = start_code - start_code % PAGE
    return MapEntry(start, -(-end_code // PAGE) * PAGE, "r-xp", 0, "", 0, "")


def _stat_identity(ref: FileRef) -> FileIdentity | None:
    try:
        with open_ref(ref, ELF_POLICY) as reader:
            return file_identity(reader.fd)
    except Exception:  # noqa: BLE001 - a path that does not name a readable ELF file names nothing here
        return None


def _interp_of(reader: BoundedFile, identity: FileIdentity) -> str | None:
    """The PT_INTERP path of the ELF file ``reader`` reads, if it is the one with ``identity`` (None: static,
    another file, or malformed)."""
    try:
        if file_identity(reader.fd) != identity:
            return None
        for seg in ElfFile(reader).segments():
            if seg.type == PT_INTERP and 0 < seg.filesz <= MAX_INTERP_BYTES:
                reader.seek(seg.offset)
                path = reader.read(seg.filesz).split(b"\0", 1)[0]
                return os.fsdecode(path) if path.startswith(b"/") else None
    except Exception:  # noqa: BLE001 - a bad file: no linker found for it
        return None
    return None
