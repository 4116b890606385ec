"""What optrace needs to know about a live process to find and trust its JIT files."""
from __future__ import annotations

import os
from dataclasses import dataclass

from optrace.procfs import start_ticks, stat_fields, status_fields


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    euid: int
    nspid: int  # the pid inside the process's own (innermost) pid namespace
    host_mounts: bool  # same mount namespace and same / as optrace: its paths are optrace's paths
    start_ticks: int  # start time (/proc/PID/stat field 22): tells a reused pid from the process before


def read_identity(pid: int) -> ProcessIdentity | None:
    """From /proc/PID/status (Uid: real effective ...; NSpid: outermost ... innermost). None if gone."""
    fields, stat = status_fields(pid), stat_fields(pid)
    try:
        root = os.stat(f"/proc/{pid}/root")
        mounts = os.stat(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
    if fields is None or stat is None:
        return None
    try:
        euid = int(fields["Uid"].split()[1])
        started = start_ticks(stat)
    except (KeyError, IndexError, ValueError):
        return None
    nspids = fields.get("NSpid", "").split()
    nspid = int(nspids[-1]) if nspids and nspids[-1].isdigit() else pid
    return ProcessIdentity(pid, euid, nspid, _same(root, os.stat("/")) and _same(mounts, _own_mounts()),
                           started)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _own_mounts() -> os.stat_result:
    return os.stat("/proc/self/ns/mnt")
