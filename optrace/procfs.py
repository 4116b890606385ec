"""Reading /proc about a process: the one module that reads ``/proc/PID/{maps,stat,status,comm,exe,cmdline,cgroup}``.

A :class:`MapEntry` is one line of ``/proc/PID/maps`` (perf's ``map``: an address range of one object).
These files are the kernel's own (not another user's), so they are read directly; a process that is
gone gives ``None``/``False``/``FileNotFoundError`` as each function says.
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from optrace.kernel import read_kernel_file

DELETED_SUFFIX = " (deleted)"
MAX_CMDLINE_BYTES = 4096  # of /proc/PID/cmdline: a process's own arguments may be megabytes
MAX_CGROUP_BYTES = 16384  # of /proc/PID/cgroup: one line per hierarchy, each a path
# A container's id at the end of a cgroup path, as container runtimes name them: 64 hex digits (Docker,
# containerd, CRI-O, podman: ".../docker-<id>.scope", "/kubepods/.../<id>") or an ECS task's
# "<32 hex>-<n>"; a last "/name" component after it is a cgroup the runtime made inside the container.
CONTAINER_ID = re.compile(r"([0-9a-f]{64}|[0-9a-f]{32}-[0-9]+)(?:\.scope)?(?:/[a-z]+)?$")
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


@dataclass(frozen=True)
class Maps:
    """One read of a process's /proc/PID/maps: its text (two reads are the same mappings when their texts
    are equal) and its entries, parsed once on first use."""

    text: str

    @functools.cached_property
    def entries(self) -> list[MapEntry]:
        return parse_maps(self.text)


def read_maps(pid: int | str, unreadable: Callable[[OSError], None] | None = None) -> Maps | None:
    """The process's mappings now: the one reader of /proc/PID/maps. None when they cannot be read: the
    process is gone (a kernel thread has none: empty, not None), or they are not ours to read, which
    ``unreadable`` is told first (a caller that names the process's frames warns)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            return Maps(handle.read())
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as err:
        if unreadable is not None:
            unreadable(err)
        return None


def device_number(dev: str) -> int:
    """The ``st_dev`` of a maps line's "major:minor" (hex)."""
    major, _, minor = dev.partition(":")
    return os.makedev(int(major, 16), int(minor, 16))


def processes_mapping(files: set[tuple[int, int]], skip: int | None = None) -> dict[tuple[int, int], int]:
    """How many processes map each of ``files`` ((st_dev, st_ino) pairs) now, ``skip`` left out; the
    processes whose maps cannot be read are not counted."""
    counts = dict.fromkeys(files, 0)
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == skip:
            continue
        maps = read_maps(name)
        mapped = {(device_number(e.dev), e.inode) for e in maps.entries if e.inode} if maps is not None else set()
        for key in mapped & files:
            counts[key] += 1
    return counts


JITDUMP_NAME = re.compile(r"(?:^|/)jit-(\d+)\.dump$")


def mapped_jitdumps(pid: int, nspid: int) -> list[str]:
    """Paths (as the process sees them) of mapped files named jit-<pid>.dump, the way perf finds them."""
    found: list[str] = []
    maps = read_maps(pid)
    for entry in maps.entries if maps is not None else ():
        match = JITDUMP_NAME.search(entry.path)
        if match and int(match.group(1)) in (pid, nspid) and entry.path not in found:
            found.append(entry.path)
    return found


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on (the comm in parentheses may hold spaces), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode("ascii", "replace").split()
    except (OSError, IndexError):
        return None


def cpu_ticks(fields: list[str]) -> int:
    """User + system time (fields 14 and 15) from :func:`stat_fields`, in clock ticks."""
    return int(fields[11]) + int(fields[12])


def process_cpu_ticks() -> dict[int, int]:
    """Every process's CPU time so far, in clock ticks (those that vanish meanwhile are left out)."""
    ticks = {}
    for name in os.listdir("/proc"):
        fields = stat_fields(int(name)) if name.isdigit() else None
        if fields and len(fields) > 12:
            ticks[int(name)] = cpu_ticks(fields)
    return ticks


def descendants(pids: Iterable[int]) -> set[int]:
    """The processes descending from ``pids`` now (children, their children...; not ``pids`` themselves),
    from each process's parent in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        fields = stat_fields(int(name)) if name.isdigit() else None
        if fields and len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    found: set[int] = set()
    waiting = list(pids)
    while waiting:
        for child in children.get(waiting.pop(), ()):
            if child not in found:
                found.add(child)
                waiting.append(child)
    return found - set(pids)


def is_alive(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped by its parent)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def start_ticks(fields: list[str]) -> int:
    """Start time (field 22) from :func:`stat_fields`: tells a reused pid from the process before."""
    return int(fields[19])


def status_fields(pid: int) -> dict[str, str] | None:
    """/proc/PID/status as a dict of its ``Key: value`` lines, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return dict(line.split(":", 1) for line in status.splitlines() if ":" in line)


def process_uid(pid: int) -> int | None:
    """The process's real user id, None when it is gone."""
    status = status_fields(pid)
    try:
        return int(status["Uid"].split()[0]) if status else None
    except (KeyError, IndexError, ValueError):
        return None


def comm(pid: int) -> str:
    """The process's command name, or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def executable(pid: int) -> str | None:
    """The path of the process's executable as the kernel links it (without " (deleted)"), or None (a
    kernel thread, a process gone or not ours to look at)."""
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return path.removesuffix(DELETED_SUFFIX)


def command_line(pid: int) -> list[str] | None:
    """The process's arguments (the first MAX_CMDLINE_BYTES bytes), None when it has none (a kernel
    thread) or is gone. The process writes this memory itself: it may say anything."""
    data = read_kernel_file(f"/proc/{pid}/cmdline", MAX_CMDLINE_BYTES)
    if not data:
        return None
    return data.rstrip(b"\0").decode("utf-8", "replace").split("\0")


def container_id(pid: int) -> str | None:
    """The id of the container the process runs in, from its cgroup paths (cgroup v1 and v2), or None."""
    data = read_kernel_file(f"/proc/{pid}/cgroup", MAX_CGROUP_BYTES)
    return cgroup_container_id(data.decode("utf-8", "replace")) if data else None


def cgroup_container_id(text: str) -> str | None:
    """The container id in the text of a /proc/PID/cgroup (``ID:CONTROLLERS:PATH`` lines), or None."""
    for line in text.splitlines():
        found = CONTAINER_ID.search(line.split(":", 2)[-1])
        if found:
            return found.group(1)
    return None


def exec_path(pid: int, filename: str) -> str | None:
    """The kernel reports an exec'd path as passed to execve; a relative one is made absolute through the
    process while it runs. Once it is gone, only a path that exists from here is trusted (None: skip)."""
    if os.path.isabs(filename):
        return filename
    for resolve in (lambda: os.readlink(f"/proc/{pid}/exe"),
                    lambda: os.path.join(os.readlink(f"/proc/{pid}/cwd"), filename)):
        try:
            return resolve()
        except OSError:
            continue
    path = os.path.abspath(filename)
    return path if os.path.exists(path) else None


def read_process_memory(pid: int, address: int, size: int) -> bytes | None:
    """``size`` bytes at ``address`` in ``pid`` (None when unmapped or the process is gone): the kernel's
    /proc/PID/mem, so only the bytes are the process's; callers compare or disassemble them, bounded by ``size``."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, size, address)
    except (OSError, OverflowError):
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None
