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

from collections.abc import Iterable

from optrace.model import UserFrame
from optrace.frontend.symbols.buildid import BuildIdCache
from optrace.frontend.symbols.mappings import Mappings
from optrace.procfs import MapEntry, read_maps


class AddressSpace:
    """The executable file mappings of one process at one moment that have a build-id."""

    def __init__(self, mapped: Iterable[tuple[MapEntry, bytes]] = ()) -> None:
        ordered = sorted(mapped, key=lambda pair: pair[0].start)
        self._mappings = Mappings(entry for entry, _build_id in ordered)
        self._build_ids = [build_id for _entry, build_id in ordered]

    @classmethod
    def read(cls, pid: int, build_ids: BuildIdCache) -> AddressSpace | None:
        """The process's address space now; None when it is gone."""
        maps = read_maps(pid)
        if maps is None:
            return None
        mappings = Mappings.of(maps)
        found = ((entry, build_ids.of_mapping(pid, entry)) for entry in mappings if entry.is_file)
        return cls((entry, build_id) for entry, build_id in found if build_id)

    def frame(self, ip: int) -> UserFrame:
        index = self._mappings.index_at(ip)
        if index is None:
            return UserFrame(None, ip)
        entry = self._mappings.entries[index]
        return UserFrame(self._build_ids[index], entry.offset + ip - entry.start)  # hot: no file_offset() call

    def __len__(self) -> int:
        return len(self._mappings)


class AddressSpaces:
    """Address spaces by (pid, epoch), as the sampler's raw stacks name them.

    A snapshot replaced by a newer one, or of a process that exited, may still be named by raw stacks
    in the map set the sampler writes now, which the next drain reads: it is dropped at the end of
    the drain after the one that retired it."""

    def __init__(self, build_ids: BuildIdCache | None = None) -> None:
        self._build_ids = build_ids or BuildIdCache()
        self._spaces: dict[tuple[int, int], AddressSpace] = {}
        self._current: dict[int, int] = {}  # pid -> epoch of its newest snapshot
        self._retired: dict[tuple[int, int], int] = {}  # (pid, epoch) -> drain that retired it
        self._drains = 0

    def get(self, pid: int, epoch: int) -> AddressSpace | None:
        return self._spaces.get((pid, epoch))

    def newest(self, pid: int) -> AddressSpace | None:
        """The process's latest snapshot, also after its exit while it is kept (off-CPU stacks, which
        carry no epoch, are named with it)."""
        epoch = self._current.get(pid)
        if epoch is None:
            epoch = max((e for p, e in self._spaces if p == pid), default=None)
        return None if epoch is None else self._spaces.get((pid, epoch))

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
