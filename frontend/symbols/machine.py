"""What the recorder knows about the machine (perf's ``machine``): which file has which build-id, and
each process's executable mappings over time (perf's ``thread`` -> ``maps``)."""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from optrace.credentials import Credentials, process_credentials
from optrace.fileaccess import RefusedFile, open_file
from optrace.frontend.symbols.access import (ELF_POLICY, FileProblems, FileRef, in_other_namespace, open_mapped_file,
                                             open_ref)
from optrace.frontend.symbols.buildid import BuildIdCache, read_build_id
from optrace.frontend.symbols.elffile import ELF_MAGIC
from optrace.frontend.symbols.linker import Linker
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.symbols.mappings import Mappings
from optrace.procfs import MapEntry, read_maps

# Scanned once, only when a build-id is found nowhere else: the standard library dirs, and the program
# dirs for processes that ran before the recording and were never snapshotted.
SCAN_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib", "/usr/local/lib",
             "/usr/bin", "/usr/sbin", "/usr/local/bin")
MAX_KEPT_FDS = 256  # open files kept for objects only reachable through another mount namespace
MAX_OLDER_MAPPINGS = 4096  # per pid; a JIT that maps and unmaps code keeps adding some
# Most recently used files kept in the indexes (the library-dir scan alone adds a few thousand)
MAX_INDEXED_FILES = 32768
MAX_EXECUTABLES = 4096  # exec'd paths whose libraries were indexed
MAX_CAPTURED = 64  # processes whose captured mappings wait for :meth:`Machine.adopt_captured` (files held open)


@dataclass
class ProcessMaps:
    """The executable mappings of one pid: the latest snapshot, and older ones since unmapped."""

    text: str = ""
    current: Mappings = field(default_factory=Mappings)
    older: list[MapEntry] = field(default_factory=list)
    by_build_id: dict[bytes, MapEntry] = field(default_factory=dict)  # its own files, current ones last
    elsewhere: bool = False  # in another mount namespace or root (access.in_other_namespace) when snapshotted
    credentials: Credentials | None = None  # its user's at this snapshot: what it may read (codecapture)

    def find(self, address: int) -> MapEntry | None:
        """The current mapping at ``address``; else an older one if all older candidates agree."""
        found = self.current.find(address)
        if found is not None:
            return found
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

    def __init__(self, warn: Callable[[str], None], stats: dict[str, int], max_files: int = MAX_INDEXED_FILES,
                 build_ids: BuildIdCache | None = None) -> None:
        self.build_ids = build_ids or BuildIdCache()  # shared with the sampler's AddressSpaces when given
        self.by_build_id: LruCache[bytes, FileRef] = LruCache(max_files, trim_on_put=False)
        # (dev, inode) -> file, build-id
        self.files: LruCache[tuple[str, int], tuple[FileRef, bytes | None]] = LruCache(max_files, trim_on_put=False)
        self.processes: dict[int, ProcessMaps] = {}
        self.generation = 0  # grows whenever a build-id is newly indexed
        self._stats = stats
        self._problems = FileProblems(warn, stats)
        self._warn = self._problems.warn  # one printable line: names in them come from other users' files
        self._executables: LruCache[str, tuple[int, int, int]] = LruCache(MAX_EXECUTABLES)
        self._kept_fds: list[int] = []
        self._scanned = False
        self._scan: Iterator[None] | None = None  # the standard dirs' scan, once started
        self._linker = Linker(self._problems)
        # (pid, mappings, their files' descriptors, elsewhere) captured on other threads (:meth:`captured`)
        self._captured: deque[tuple[int, Sequence[MapEntry], list[int | None], bool]] = deque()
        self._captured_lock = threading.Lock()

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
        with self._captured_lock:
            waiting, self._captured = list(self._captured), deque()
        for _, _, fds, _ in waiting:
            _close_all(fds)

    def captured(self, pid: int, entries: Sequence[MapEntry], fds: list[int | None]) -> None:
        """A process's executable mappings captured with their files open (``fds[i]`` of ``entries[i]``, None
        where it could not be opened), on any thread: the unwinder's capture at the process's first copied
        sample (frontend/unwind/captures.py), which comes at once, while the exec event may be read after a
        short-lived process is gone. Named from as from a snapshot (:meth:`adopt_captured`) unless the process
        was snapshotted. Takes the descriptors; at most MAX_CAPTURED wait (the others are closed)."""
        elsewhere = bool(in_other_namespace(pid))
        with self._captured_lock:
            if len(self._captured) < MAX_CAPTURED:
                self._captured.append((pid, entries, fds, elsewhere))
                return
        _close_all(fds)

    def adopt_captured(self) -> None:
        """The captures waiting (:meth:`captured`), each a snapshot of its process (the descriptors of files
        indexed already, or reachable here by their path, are closed; the others kept, as a snapshot's)."""
        while True:
            with self._captured_lock:
                if not self._captured:
                    return
                pid, entries, fds, elsewhere = self._captured.popleft()
            opened = dict(zip(entries, fds))
            text = "\n".join(map(repr, entries))  # one capture's identity (a read of the maps has its text)
            self._snapshot(pid, text, Mappings(e for e in entries if e.executable), elsewhere,
                           lambda entry: self._index_open_file(entry, opened.pop(entry)) if opened.get(entry) else None)
            _close_all(opened.values())

    def snapshot_process(self, pid: int) -> None:
        self.adopt_captured()
        maps = read_maps(pid, lambda err: self._warn(f"cannot read /proc/{pid}/maps: {err.strerror}; frames "
                                                     "without build-id in it stay unresolved"))
        if maps is not None:
            self._snapshot(pid, maps.text, Mappings.of(maps), bool(in_other_namespace(pid)),
                           lambda entry: self._index_mapped_file(pid, entry))

    def _snapshot(self, pid: int, text: str, entries: Mappings, elsewhere: bool,
                  index: Callable[[MapEntry], None]) -> bool:
        """The process's mappings now ``entries`` (read as ``text``), the files not indexed yet by ``index``;
        False when they are the ones known."""
        known = self.processes.get(pid)
        if known is not None and known.text == text:
            return False
        older = []
        if known is not None:
            keep = set(entries) | set(known.older)
            older = (known.older + [e for e in known.current if e not in keep])[-MAX_OLDER_MAPPINGS:]
        self.processes[pid] = ProcessMaps(text, entries, older, elsewhere=elsewhere,
                                          credentials=process_credentials(pid))
        self._stats["maps_snapshots"] = self._stats.get("maps_snapshots", 0) + 1
        for entry in entries:
            if not entry.is_file:
                continue
            known_file = self.files.get(entry.file_key)
            if known_file is None:
                index(entry)
            elif known_file[1] is not None:
                self.by_build_id.touch(known_file[1])
        self._own_build_ids(self.processes[pid])
        return True

    def _own_build_ids(self, maps: ProcessMaps) -> None:
        for entry in (*maps.older, *maps.current):
            known = self.files.get(entry.file_key)
            if known is not None and known[1] is not None:
                maps.by_build_id[known[1]] = entry

    def mapping_of(self, pid: int, build_id: bytes) -> MapEntry | None:
        """The process's own mapped file with ``build_id``, current or older. A build-id is a claim a file
        makes about itself and anyone can copy one: a frame is named from the file its own process mapped,
        and only from another file with that id when the process was never snapshotted."""
        maps = self.processes.get(pid)
        return None if maps is None else maps.by_build_id.get(build_id)

    def credentials_of(self, pid: int) -> Credentials | None:
        """The process's user at its last snapshot (None if never snapshotted)."""
        maps = self.processes.get(pid)
        return None if maps is None else maps.credentials

    def mapping_at(self, pid: int, address: int) -> MapEntry | None:
        maps = self.processes.get(pid)
        return maps.find(address) if maps is not None else None

    def add_executable(self, path: str, pid: int | None = None) -> None:
        """Index an exec'd file and the libraries it names. ``path`` is as passed to execve: its
        symlinks are followed (see :class:`FileRef`), those of its RPATH dirs are not (see linker). A path
        that ``pid`` exec'd in another mount namespace or root is not looked for here (a container's binary:
        "cannot read" would be false): its files are read through the process, from its maps snapshot
        (:meth:`snapshot_process`, while it runs), also after it exits."""
        path = os.path.abspath(path)
        self.adopt_captured()
        if pid is not None and (pid in self.processes and self.processes[pid].elsewhere or in_other_namespace(pid)):
            self._stats["executables_elsewhere"] = self._stats.get("executables_elsewhere", 0) + 1
            return
        try:
            info = os.stat(path)  # no open: a FIFO or a device costs nothing here
        except OSError as err:
            self._warn(f"cannot read {path}: {err.strerror}; its frames show as {os.path.basename(path)}+0xOFFSET")
            return
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
        if self._executables.get(path) == identity:
            return
        self._executables.put(path, identity)
        if not self._index_ref(FileRef(path, path, follow_symlinks=True)):
            return  # a script (#!): its interpreter shows up in the maps snapshots; or unreadable (warned)
        libraries, missing = self._linker.needed_libraries(path)
        for library in libraries:
            self._index_ref(library)
        for problem in missing:
            self._warn(problem)

    def scan_standard_dirs(self, dirs: Iterable[str] = SCAN_DIRS, budget_s: float | None = None) -> bool:
        """Index every ELF file directly in ``dirs`` by build-id (once; reads only the ELF notes). The
        dirs are the system's own, so their symlinks are followed; bad files are skipped silently. With
        ``budget_s``, stop after about that long and go on from there at the next call (some 2,500 files:
        seconds on a slow machine, which a daemon's drain must not wait for). True once it is complete."""
        if self._scan is None:
            self._scan = self._scan_files(tuple(dirs))
        deadline = None if budget_s is None else time.monotonic() + budget_s
        for _ in self._scan:
            if deadline is not None and time.monotonic() >= deadline:
                return False
        self._scanned = True
        return True

    @property
    def scan_complete(self) -> bool:
        return self._scanned

    def _scan_files(self, dirs: tuple[str, ...]) -> Iterator[None]:
        """The scan, one file per step."""
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
                    try:
                        self._index_file(FileRef(real, real, follow_symlinks=True))
                    except Exception:  # noqa: BLE001 - the scan's per-file boundary: a bad file is skipped
                        pass
                    self._stats["scanned_files"] = len(seen)
                    yield

    def _index(self, build_id: bytes, ref: FileRef) -> None:
        """The file to name frames of ``build_id`` for processes gone before their maps were read: the first
        seen, but a file from the maps beats one found otherwise (the mapped one is what ran)."""
        known = self.by_build_id.get(build_id)
        if known is None or (ref.from_maps and not known.from_maps):
            self.by_build_id.put(build_id, ref)
            self.generation += 1

    def _index_ref(self, ref: FileRef) -> bool:
        """Index one file by build-id; False when it is not ELF or could not be read (warned)."""
        consequence = f"its frames show as {os.path.basename(ref.name)}+0xOFFSET"
        return bool(self._problems.contained(ref.name, consequence, lambda: self._index_file(ref)))

    def _index_file(self, ref: FileRef) -> bool:
        with open_ref(ref) as stream:
            if stream.read(4) != ELF_MAGIC:
                return False
            build_id = read_build_id(stream)
        if build_id:
            self._index(build_id, ref)
        return True

    def _index_mapped_file(self, pid: int, entry: MapEntry) -> None:
        """Read the build-id of a mapped file through /proc/PID/map_files (works across mount
        namespaces and for deleted files) and remember how to open it after the process is gone."""
        self._index_entry(entry, lambda: self._read_mapped_file(pid, entry))

    def _index_open_file(self, entry: MapEntry, fd: int) -> None:
        """:meth:`_index_mapped_file` of a file opened already (takes ``fd``)."""
        self._index_entry(entry, lambda: self._read_open_file(entry, fd))

    def _index_entry(self, entry: MapEntry, read: Callable[[], tuple[FileRef, bytes | None] | tuple[()]]) -> None:
        name = entry.file_path
        consequence = f"its frames show as {os.path.basename(name)}+0xOFFSET"
        found = self._problems.contained(name, consequence, read)
        if found is None:  # unreadable (warned): nothing to open later either
            found = (FileRef(name, None, from_maps=True), None)
        elif not found:
            return  # the process or mapping went away meanwhile
        self.files.put(entry.file_key, found)
        if found[1]:
            self._index(found[1], found[0])

    def _read_mapped_file(self, pid: int, entry: MapEntry) -> tuple[FileRef, bytes | None] | tuple[()]:
        fd = open_mapped_file(pid, entry, ELF_POLICY)
        return () if fd is None else self._read_open_file(entry, fd)

    def _read_open_file(self, entry: MapEntry, fd: int) -> tuple[FileRef, bytes | None]:
        """(how to open it later, its build-id) of a mapped file open as ``fd`` (taken)."""
        try:
            build_id = self.build_ids.of_open_file(fd, entry.file_path)
            same_here = self._same_file_here(entry.file_path, fd)
        except BaseException:
            os.close(fd)
            raise
        return self._file_ref(entry.file_path, fd, same_here), build_id

    def _file_ref(self, name: str, fd: int, same_here: bool) -> FileRef:
        """Use the plain path (no symlinks followed) when it is the same file here (stable after exit);
        else keep ``fd`` open (another mount namespace, a deleted file). Takes ownership of ``fd``."""
        if same_here:
            os.close(fd)
            return FileRef(name, name, from_maps=True)
        if len(self._kept_fds) >= MAX_KEPT_FDS:
            os.close(fd)
            self._warn(f"{name}: over {MAX_KEPT_FDS} files of other mount namespaces kept open; "
                       f"its frames show as {os.path.basename(name)}+0xOFFSET after its process exits")
            return FileRef(name, None, from_maps=True)
        self._kept_fds.append(fd)
        return FileRef(name, None, from_maps=True, fd=fd)

    @staticmethod
    def _same_file_here(name: str, fd: int) -> bool:
        try:
            here = open_file(name, ELF_POLICY)
        except RefusedFile:
            return False
        if here is None:
            return False
        try:
            a, b = os.fstat(here), os.fstat(fd)
        finally:
            os.close(here)
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _close_all(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)
