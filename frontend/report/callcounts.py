"""What `optrace count` prints: each probe with its calls, and the run around them (made by
:meth:`~optrace.frontend.uprobes.counter.CallCounter.probe_calls`). The formats that print it are
:mod:`optrace.exporters.counttable` and :mod:`optrace.exporters.countjson`."""
from __future__ import annotations

from dataclasses import dataclass, replace

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
    interval: bool = False  # the calls of the last interval only (count -i); elapsed_s is its length


def interval_report(current: CountReport, previous: CountReport | None) -> CountReport:
    """The calls made since ``previous`` (``count -i``, funccount's way). The kernel's counters only
    grow and are never reset by a read, so an interval is the difference of two reads: the intervals
    always add up to the total, and no call is lost between them."""
    if previous is None:
        return replace(current, interval=True)
    before = {(p.binary, p.offset, p.spec): p.count for p in previous.probes}
    probes = [replace(p, count=_calls_since(p.count, before.get((p.binary, p.offset, p.spec))))
              for p in current.probes]
    return replace(current, probes=probes, elapsed_s=current.elapsed_s - previous.elapsed_s,
                   lost_pid_rows=current.lost_pid_rows - previous.lost_pid_rows, interval=True)


def _calls_since(now: CallCount, then: CallCount | None) -> CallCount:
    if then is None:
        return now
    per_pid = {pid: n - then.per_pid.get(pid, 0) for pid, n in now.per_pid.items()}
    return replace(now, calls=now.calls - then.calls, unattributed=now.unattributed - then.unattributed,
                   per_pid={pid: n for pid, n in per_pid.items() if n})


@dataclass(frozen=True)
class CountOptions:
    per_pid: bool = False  # also each process's calls
    interval_mark: bool = False  # an -i print: the table is headed by the time and what it counts
