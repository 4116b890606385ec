"""What optrace needs to know about a live process to find and trust its JIT files."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

JITDUMP_NAME = re.compile(r"(?:^|/)jit-(\d+)\.dump$")


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    euid: int
    nspid: int  # the pid inside the process's own (innermost) pid namespace
    host_mounts: bool  # same mount namespace and same / as optrace: its paths are optrace's paths
    start_ticks: int  # start time (/proc/PID/stat field 22): tells a reused pid from the process before


def read_identity(pid: int) -> ProcessIdentity | None:
    """From /proc/PID/status (Uid: real effective ...; NSpid: outermost ... innermost). None if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode("ascii", "replace")
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_fields = f.read().rsplit(b")", 1)[1].split()
        root = os.stat(f"/proc/{pid}/root")
        mounts = os.stat(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        euid = int(fields["Uid"].split()[1])
        start_ticks = int(stat_fields[19])  # field 22; the list starts at field 3 (state)
    except (KeyError, IndexError, ValueError):
        return None
    nspids = fields.get("NSpid", "").split()
    nspid = int(nspids[-1]) if nspids and nspids[-1].isdigit() else pid
    return ProcessIdentity(pid, euid, nspid, _same(root, os.stat("/")) and _same(mounts, _own_mounts()),
                           start_ticks)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _own_mounts() -> os.stat_result:
    return os.stat("/proc/self/ns/mnt")


def mapped_jitdumps(pid: int, nspid: int) -> list[str]:
    """Paths (as the process sees them) of mapped files named jit-<pid>.dump, the way perf finds them."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    found: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        match = JITDUMP_NAME.search(path)
        if match and int(match.group(1)) in (pid, nspid) and path not in found:
            found.append(path)
    return found
