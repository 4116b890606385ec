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
    host_root: bool  # the process sees the same / as optrace
    start_ticks: int  # start time (/proc/PID/stat field 22): tells a reused pid from the process before


def read_identity(pid: int) -> ProcessIdentity | None:
    """From /proc/PID/status (Uid: real effective ...; NSpid: outermost ... innermost). None if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode("ascii", "replace")
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_fields = f.read().rsplit(b")", 1)[1].split()
        root = os.stat(f"/proc/{pid}/root")
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
    here = os.stat("/")
    same_root = (root.st_dev, root.st_ino) == (here.st_dev, here.st_ino)
    return ProcessIdentity(pid, euid, nspid, same_root, start_ticks)


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
