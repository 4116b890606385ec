"""What the uprobe manager (frontend/uprobes/manager.py) and the kernel side that attaches and counts
(bpf/uprobes.py, or a fake in tests) hand each other."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from optrace.errors import OptraceError


class UnprobeableError(OptraceError):
    """The kernel refuses a uprobe at this offset (an instruction it cannot single-step)."""


@dataclass(frozen=True)
class ExitedRow:
    """The final calls of one exited process on one probe, taken out of the kernel by a read."""

    probe_id: int
    pid: int
    calls: int
    comm: str


@dataclass
class KernelCounts:
    """One read of the kernel maps."""

    totals: dict[int, int] = field(default_factory=dict)  # probe id -> calls, exact
    per_pid: dict[tuple[int, int], int] = field(default_factory=dict)  # (probe id, pid) -> calls, live processes
    exited: list[ExitedRow] = field(default_factory=list)  # handed out once, oldest process first
    comms: dict[int, str] = field(default_factory=dict)  # pid -> command name at its first hit
    lost_rows: dict[int, int] = field(default_factory=dict)  # probe id -> hits no per-pid row took (in totals)
    followed: dict[int, int] = field(default_factory=dict)  # pid -> the followed root it descends from


class UprobeTarget(NamedTuple):
    """Where to attach: ``offset`` in the file at ``path``, which must still be the file (device,
    inode) the offset was checked on (``count BIN:0xADDR`` checks instruction boundaries in it)."""

    path: str
    offset: int
    dev: int
    ino: int
