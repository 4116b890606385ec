"""What `optrace count` prints: each probe with its calls, and the run around them (made by
:meth:`~optrace.frontend.uprobes.counter.CallCounter.probe_calls`). The formats that print it are
:mod:`optrace.exporters.counttable` and :mod:`optrace.exporters.countjson`."""
from __future__ import annotations

from dataclasses import dataclass

from optrace.model import CallCount


@dataclass(frozen=True)
class ProbeCalls:
    """One attached probe and its calls."""

    spec: str  # the SPEC as the user gave it
    binary: str
    symbol: str
    offset: int  # file offset
    aliases: tuple[str, ...]
    glob: bool  # matched by a glob SPEC: the table leaves it out while it has no calls (JSON keeps it)
    count: CallCount


@dataclass(frozen=True)
class CountReport:
    probes: list[ProbeCalls]
    elapsed_s: float
    lost_pid_rows: int = 0
    exit_status: int | None = None


@dataclass(frozen=True)
class CountOptions:
    per_pid: bool = False  # also each process's calls
    interval_mark: bool = False  # an -i print: the table is headed by the time and the seconds counted
