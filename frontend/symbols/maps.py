"""/proc/PID/maps as :class:`MapEntry` records (perf's ``map``: an address range of one object)."""
from __future__ import annotations

from dataclasses import dataclass

DELETED_SUFFIX = " (deleted)"
# Shared anonymous memory shows a path but holds no ELF object (perf's is_anon_memory, plus memfd,
# which JITs such as .NET use to double-map code).
ANONYMOUS_PREFIXES = ("/dev/zero", "/anon_hugepage", "/SYSV", "/memfd:")


@dataclass(frozen=True)
class MapEntry:
    start: int
    end: int
    perms: str
    offset: int  # file offset of ``start``
    dev: str  # "major:minor" in hex, as the kernel prints it
    inode: int
    path: str  # as the process sees it; "" for anonymous memory, "[vdso]", "[heap]", ...

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path.startswith("/") and not self.path.startswith(ANONYMOUS_PREFIXES)

    @property
    def executable(self) -> bool:
        return "x" in self.perms

    @property
    def file_key(self) -> tuple[str, int]:
        """Identifies the mapped file across processes (same device and inode)."""
        return (self.dev, self.inode)

    @property
    def file_path(self) -> str:
        """The path without the kernel's " (deleted)" marker."""
        if self.path.endswith(DELETED_SUFFIX):
            return self.path[: -len(DELETED_SUFFIX)]
        return self.path

    def contains(self, address: int) -> bool:
        return self.start <= address < self.end

    def file_offset(self, address: int) -> int:
        return address - self.start + self.offset


def parse_maps(text: str) -> list[MapEntry]:
    """Parse the text of /proc/PID/maps (paths may contain spaces)."""
    entries = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        low, _, high = fields[0].partition("-")
        entries.append(MapEntry(
            start=int(low, 16), end=int(high, 16), perms=fields[1], offset=int(fields[2], 16),
            dev=fields[3], inode=int(fields[4]), path=fields[5] if len(fields) > 5 else "",
        ))
    return entries


def read_maps_text(pid: int | str) -> str:
    """The current text of /proc/PID/maps. Raises OSError (FileNotFoundError once the process is gone)."""
    with open(f"/proc/{pid}/maps") as handle:
        return handle.read()
