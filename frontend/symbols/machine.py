"""What the recorder knows about the machine (perf's ``machine``): which file has which build-id, and
each process's executable mappings over time (perf's ``thread`` -> ``maps``)."""
from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from optrace.frontend.symbols.buildid import is_elf_file, read_build_id_file
from optrace.frontend.symbols.linker import Linker
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.symbols.maps import MapEntry, parse_maps, read_maps_text

# Scanned once, only when a build-id is found nowhere else: the standard library dirs, and the program
# dirs for processes that ran before the recording and were never snapshotted.
SCAN_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib", "/usr/local/lib",
             "/usr/bin", "/usr/sbin", "/usr/local/bin")
MAX_KEPT_FDS = 256  # open files kept for objects only reachable through another mount namespace
MAX_OLDER_MAPPINGS = 4096  # per pid; a JIT that maps and unmaps code keeps adding some
# Most recently used files kept in the indexes (the library-dir scan alone adds a few thousand)
MAX_INDEXED_FILES = 32768
MAX_EXECUTABLES = 4096  # exec'd paths whose libraries were indexed


@dataclass(frozen=True)
class FileRef:
    """An ELF file: ``name`` is its path as the process sees it, ``read_path`` opens it from here."""

    name: str
    read_path: str
    from_maps: bool = False  # seen in /proc/PID/maps (its name is what the process mapped)


@dataclass
class ProcessMaps:
    """The executable mappings of one pid: the latest snapshot, and older ones since unmapped."""

    text: str = ""
    current: list[MapEntry] = field(default_factory=list)
    older: list[MapEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._starts = [entry.start for entry in self.current]

    def find(self, address: int) -> MapEntry | None:
        """The current mapping at ``address``; else an older one if all older candidates agree."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and self.current[index].contains(address):
            return self.current[index]
        matches = [entry for entry in self.older if entry.contains(address)]
        if matches and len({(e.file_key, e.path, e.file_offset(address)) for e in matches}) == 1:
            return matches[0]
        return None


class Machine:
    """Fed by the recorder while it runs (maps snapshots of sampled pids, exec'd files); read by the
    :class:`Symbolizer`. Frames carry build-ids, so what matters is that every build-id seen has a
    file we can still open when symbolizing, possibly after its process is gone.

    The file indexes keep the most recently used ``max_files`` entries (a file mapped by a process
    being snapshotted counts as used) and always the files of the processes still known, trimmed by
    :meth:`trim` between symbolize calls; processes are dropped by their owner
    (``Symbolizer.forget_process``), which lets their files go."""

    def __init__(self, warn: Callable[[str], None], stats: dict[str, int], max_files: int = MAX_INDEXED_FILES) -> None:
        self.by_build_id: LruCache[bytes, FileRef] = LruCache(max_files, trim_on_put=False)
        # (dev, inode) -> file, build-id
        self.files: LruCache[tuple[str, int], tuple[FileRef, bytes | None]] = LruCache(max_files, trim_on_put=False)
        self.processes: dict[int, ProcessMaps] = {}
        self.generation = 0  # grows whenever a build-id is newly indexed
        self._warn = warn
        self._stats = stats
        self._executables: LruCache[str, tuple[int, int, int]] = LruCache(MAX_EXECUTABLES)
        self._kept_fds: list[int] = []
        self._scanned = False
        self._linker = Linker()

    def trim(self) -> None:
        if len(self.files) <= self.files.max_entries and len(self.by_build_id) <= self.by_build_id.max_entries:
            return
        live = {entry.file_key for maps in self.processes.values() for entry in maps.current if entry.is_file}
        live_ids = {self.files[key][1] for key in live if key in self.files}
        self.files.trim(keep=live)
        self.by_build_id.trim(keep=live_ids)

    def cache_sizes(self) -> dict[str, int]:
        return {"indexed_build_ids": len(self.by_build_id), "indexed_files": len(self.files),
                "executables": len(self._executables), "processes": len(self.processes)}

    def close(self) -> None:
        for fd in self._kept_fds:
            os.close(fd)
        self._kept_fds.clear()

    def snapshot_process(self, pid: int) -> None:
        try:
            text = read_maps_text(pid)
        except (FileNotFoundError, ProcessLookupError):
            return
        except OSError as err:
            self._warn(f"cannot read /proc/{pid}/maps: {err.strerror}; frames without build-id in it stay unresolved")
            return
        known = self.processes.get(pid)
        if known is not None and known.text == text:
            return
        entries = sorted((e for e in parse_maps(text) if e.executable), key=lambda e: e.start)
        older = []
        if known is not None:
            keep = set(entries) | set(known.older)
            older = (known.older + [e for e in known.current if e not in keep])[-MAX_OLDER_MAPPINGS:]
        self.processes[pid] = ProcessMaps(text, entries, older)
        self._stats["maps_snapshots"] = self._stats.get("maps_snapshots", 0) + 1
        for entry in entries:
            if not entry.is_file:
                continue
            known_file = self.files.get(entry.file_key)
            if known_file is None:
                self._index_mapped_file(pid, entry)
            elif known_file[1] is not None:
                self.by_build_id.touch(known_file[1])

    def mapping_at(self, pid: int, address: int) -> MapEntry | None:
        maps = self.processes.get(pid)
        return maps.find(address) if maps is not None else None

    def add_executable(self, path: str) -> None:
        path = os.path.abspath(path)
        try:
            info = os.stat(path)
            identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
            if self._executables.get(path) == identity:
                return
            self._executables.put(path, identity)
            if not is_elf_file(path):
                return  # a script (#!): its interpreter shows up in the maps snapshots
        except OSError as err:
            self._warn_unreadable(path, err)
            return
        if not self._index_path(path):
            return
        libraries, problems = self._linker.needed_libraries(path)
        for library in libraries:
            self._index_path(library)
        for problem in problems:
            self._warn(problem)

    def scan_standard_dirs(self, dirs: Iterable[str] = SCAN_DIRS) -> None:
        """Index every ELF file directly in ``dirs`` by build-id (once; reads only the ELF notes)."""
        if self._scanned:
            return
        self._scanned = True
        seen: set[str] = set()
        for directory in dirs:
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in names:
                real = os.path.realpath(os.path.join(directory, name))
                if real not in seen and os.path.isfile(real):
                    seen.add(real)
                    self._index_path(real, quiet=True)
        self._stats["scanned_files"] = len(seen)

    def _warn_unreadable(self, path: str, err: OSError) -> None:
        self._warn(f"cannot read {path}: {err.strerror}; its frames show as {os.path.basename(path)}+0xOFFSET")

    def _index(self, build_id: bytes, ref: FileRef) -> None:
        known = self.by_build_id.get(build_id)
        if known is None or (ref.from_maps and not known.from_maps):
            self.by_build_id.put(build_id, ref)
            self.generation += 1

    def _index_path(self, path: str, quiet: bool = False) -> bool:
        try:
            build_id = read_build_id_file(path)
        except OSError as err:
            if not quiet:
                self._warn_unreadable(path, err)
            return False
        if build_id:
            self._index(build_id, FileRef(path, path))
        return True

    def _index_mapped_file(self, pid: int, entry: MapEntry) -> None:
        """Read the build-id of a mapped file through /proc (works across mount namespaces and for
        deleted files) and remember how to open it after the process is gone."""
        name = entry.file_path
        sources = [f"/proc/{pid}/map_files/{entry.start:x}-{entry.end:x}", f"/proc/{pid}/root{name}", name]
        try:
            ref = self._file_ref(name, sources)
            build_id = read_build_id_file(ref.read_path)
        except FileNotFoundError:
            return  # the process or mapping went away meanwhile
        except OSError as err:
            self._warn_unreadable(name, err)
            ref, build_id = FileRef(name, name, from_maps=True), None
        self.files.put(entry.file_key, (ref, build_id))
        if build_id:
            self._index(build_id, ref)

    def _file_ref(self, name: str, sources: list[str]) -> FileRef:
        """Use the plain path when it is the same file here (stable after exit); else keep it open."""
        errors: list[OSError] = []
        for source in sources:
            try:
                mapped = os.stat(source)
                break
            except OSError as err:
                errors.append(err)
        else:  # report "Permission denied" rather than "No such file" when both happened
            raise next((e for e in errors if isinstance(e, PermissionError)), errors[-1])
        try:
            here = os.stat(name)
            if (here.st_dev, here.st_ino) == (mapped.st_dev, mapped.st_ino):
                return FileRef(name, name, from_maps=True)
        except OSError:
            pass
        if len(self._kept_fds) >= MAX_KEPT_FDS:
            return FileRef(name, source, from_maps=True)
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        self._kept_fds.append(fd)
        return FileRef(name, f"/proc/self/fd/{fd}", from_maps=True)
