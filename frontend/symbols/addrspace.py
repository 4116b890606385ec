"""A process's executable file mappings with their build-ids: raw user IPs turned into the
(build-id, file offset) frames the kernel's build-id stack maps give.

Asking the kernel for build-id stacks costs about 6 µs more per sample than raw IPs (it looks up the
VMA and reads the file's build-id note for every frame, and releases the mmap lock through an
irq_work), which at 999 Hz slowed a target by about 2 points more than perf. So the sampler takes raw
IPs for processes whose mappings user space has read, and build-id stacks for the others (new and
short-lived processes); this module does the kernel's translation for the former, with the same
rules: file-backed executable memory with a build-id gives (build-id, pgoff + ip - start), anything
else (anonymous or JIT code, [vdso], a file without build-id) the raw IP.
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

from optrace.fileaccess import reader_for
from optrace.model import UserFrame
from optrace.frontend.symbols.access import ELF_POLICY, open_mapped_file
from optrace.frontend.symbols.buildid import read_build_id
from optrace.frontend.symbols.lru import LruCache
from optrace.procfs import MapEntry, parse_maps, read_maps_text

FileIdentity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


class BuildIds:
    """Build-ids of mapped files, read through /proc/PID/map_files: the very file the process maps,
    even deleted or in another mount namespace, never a path taken from user data (without
    CAP_SYS_ADMIN, the path inside the process's root, only if it is still the mapped inode; see
    :func:`~optrace.frontend.symbols.access.open_mapped_file`). Cached by the file's identity, size
    and mtime, so a rebuilt binary that got the old one's inode is read again. A file that cannot be
    read (refused, malformed) counts in ``failures`` and has no build-id: its frames stay raw IPs."""

    def __init__(self, capacity: int = 4096) -> None:
        self._cache: LruCache[FileIdentity, bytes | None] = LruCache(capacity)
        self.failures = 0

    def of(self, pid: int, entry: MapEntry) -> bytes | None:
        try:
            fd = open_mapped_file(pid, entry, ELF_POLICY)
            if fd is None:
                return None
            with reader_for(fd, ELF_POLICY, entry.file_path) as stream:
                info = os.fstat(fd)
                identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
                if identity in self._cache:
                    return self._cache.get(identity)
                found = read_build_id(stream)
        except Exception:  # noqa: BLE001 - the per-file boundary: a bad file only loses its build-id
            self.failures += 1
            return None
        self._cache.put(identity, found)
        return found


@dataclass(frozen=True)
class _Range:
    start: int
    end: int
    file_offset: int  # of start
    build_id: bytes


class AddressSpace:
    """The executable file mappings of one process at one moment, sorted by address."""

    def __init__(self, ranges: list[_Range]) -> None:
        self._ranges = sorted(ranges, key=lambda r: r.start)
        self._starts = [r.start for r in self._ranges]

    @classmethod
    def read(cls, pid: int, build_ids: BuildIds) -> AddressSpace | None:
        """The process's address space now; None when it is gone."""
        try:
            entries = parse_maps(read_maps_text(pid))
        except OSError:
            return None
        ranges = []
        for entry in entries:
            if entry.executable and entry.is_file:
                build_id = build_ids.of(pid, entry)
                if build_id:
                    ranges.append(_Range(entry.start, entry.end, entry.offset, build_id))
        return cls(ranges)

    def frame(self, ip: int) -> UserFrame:
        index = bisect.bisect_right(self._starts, ip) - 1
        if index >= 0:
            found = self._ranges[index]
            if ip < found.end:
                return UserFrame(found.build_id, found.file_offset + ip - found.start)
        return UserFrame(None, ip)

    def __len__(self) -> int:
        return len(self._ranges)


class AddressSpaces:
    """Address spaces by (pid, epoch), as the sampler's raw stacks name them.

    A snapshot replaced by a newer one, or of a process that exited, may still be named by raw stacks
    in the map set the sampler writes now, which the next drain reads: it is dropped at the end of
    the drain after the one that retired it."""

    def __init__(self, build_ids: BuildIds | None = None) -> None:
        self._build_ids = build_ids or BuildIds()
        self._spaces: dict[tuple[int, int], AddressSpace] = {}
        self._current: dict[int, int] = {}  # pid -> epoch of its newest snapshot
        self._retired: dict[tuple[int, int], int] = {}  # (pid, epoch) -> drain that retired it
        self._drains = 0

    def get(self, pid: int, epoch: int) -> AddressSpace | None:
        return self._spaces.get((pid, epoch))

    def has(self, pid: int, epoch: int) -> bool:
        return self._current.get(pid) == epoch

    def learn(self, pid: int, epoch: int) -> bool:
        """Read the process's mappings as of ``epoch`` (read before calling); False when it is gone."""
        space = AddressSpace.read(pid, self._build_ids)
        if space is None:
            return False
        previous = self._current.get(pid)
        if previous is not None:
            self._retired[(pid, previous)] = self._drains
        self._spaces[(pid, epoch)] = space
        self._current[pid] = epoch
        return True

    def end_drain(self, exited: list[int]) -> None:
        for pid in exited:
            epoch = self._current.pop(pid, None)
            if epoch is not None:
                self._retired[(pid, epoch)] = self._drains
        for key, drain in list(self._retired.items()):
            if drain < self._drains:
                del self._retired[key]
                self._spaces.pop(key, None)
        self._drains += 1

    def __len__(self) -> int:
        return len(self._spaces)
