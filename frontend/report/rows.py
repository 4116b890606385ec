"""Aggregate a Record's samples into report rows, the way `perf report` builds its histogram.

This is the model every `optrace report` format prints (each format is a module of
:mod:`optrace.exporters`, registered in :mod:`optrace.exporters.formats`).

Self counts go to the leaf frame (``Sample.frames[0]``); with ``children`` every distinct row key in a
stack is also credited once with the whole sample (inclusive time). Percentages are of all samples in
the record (perf's default ``--percentage absolute``), so filtering never inflates them.
"""
from __future__ import annotations

import operator
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from optrace.errors import OptraceError
from optrace.model import EVENT_UNITS, UNKNOWN, Frame, Record, Sample

SORT_KEYS = ("comm", "pid", "tid", "dso", "symbol")
DEFAULT_SORT = ("comm", "dso", "symbol")
UNKNOWN_FRAME = Frame(symbol=UNKNOWN, dso=UNKNOWN, resolved=False)


@dataclass(frozen=True)
class ReportOptions:
    sort: tuple[str, ...] = DEFAULT_SORT
    pids: frozenset[int] = frozenset()
    tids: frozenset[int] = frozenset()
    comms: frozenset[str] = frozenset()
    dsos: frozenset[str] = frozenset()  # basenames or full paths
    percent_limit: float = 0.0
    children: bool = False
    call_graph: str = ""  # "caller" or "callee" with -G (frontend/report/callgraph.py), else no graph


@dataclass(frozen=True)
class Profile:
    """What a report prints: a record and its input's name as shown (escaped: it reaches terminals)."""

    record: Record  # its samples are the event's (see frontend/report/events.py)
    source: str
    event: str = "cpu"
    parts: dict[str, int] = field(default_factory=dict)  # wall: nanoseconds "on-cpu" and "off-cpu"
    # the samples (counts) whose interpreter frames were folded into their Python function (pythonview.py)
    python_folded: int = 0

    @property
    def unit(self) -> str:
        """What a sample's count counts: "samples" or "nanoseconds"."""
        return EVENT_UNITS[self.event]


class RowKey(NamedTuple):
    """The values of the sort keys; a key not in the sort order is None. (A tuple: millions are hashed.)"""

    comm: str | None = None
    pid: int | None = None
    dso: str | None = None
    symbol: str | None = None
    kernel: bool | None = None  # set with the symbol key: drives the [k]/[.] marker
    tid: int | None = None  # 0: the event did not record threads


@dataclass(slots=True)
class Row:
    key: RowKey
    samples: int  # self: samples whose leaf frame is this row
    percent: float
    children: int | None = None  # inclusive samples, with --children
    children_percent: float | None = None


def parse_sort_keys(text: str) -> tuple[str, ...]:
    """`comm,dso,symbol` -> a tuple of known keys, in order, without repeats."""
    keys = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [key for key in keys if key not in SORT_KEYS]
    if unknown or not keys:
        shown = ", ".join(repr(key) for key in unknown) or "(empty)"
        raise OptraceError(f"unknown sort key {shown}: valid keys are {', '.join(SORT_KEYS)}")
    return keys


def sample_total(record: Record) -> int:
    return sum(map(operator.attrgetter("count"), record.samples))


def percent(count: int, total: int) -> float:
    return round(100.0 * count / total, 4) if total else 0.0


@dataclass(frozen=True)
class RowTable:
    """The rows, and what the filters kept and --percent-limit hid (a report says both, so a limit that
    hides every row never reads as "nothing matched")."""

    rows: list[Row]
    matched: int  # self samples the --pid/--comm/--dso filters kept, before --percent-limit
    hidden_rows: int  # rows under --percent-limit
    hidden: int  # their self samples


def build_rows(record: Record, options: ReportOptions) -> list[Row]:
    """Rows sorted by their main count (children with --children, else self), largest first."""
    return build_table(record, options).rows


def build_table(record: Record, options: ReportOptions) -> RowTable:
    """:func:`build_rows` with what was matched and hidden."""
    self_counts, child_counts = _count(record, options)
    total = sample_total(record)
    keys = sorted(set(self_counts) | set(child_counts), key=_key_order(options.sort))
    keys.sort(key=(child_counts if options.children else self_counts).__getitem__, reverse=True)  # stable
    rows = [_make_row(key, self_counts[key], child_counts, total, options) for key in keys]
    shown = [row for row in rows if _main_percent(row) >= options.percent_limit]
    matched = sum(self_counts.values())
    return RowTable(shown, matched, len(rows) - len(shown), matched - sum(row.samples for row in shown))


def selected_samples(record: Record, options: ReportOptions) -> list[Sample]:
    """Samples passing --pid, --tid and --comm (the filters that apply to a whole stack)."""
    if not (options.pids or options.tids or options.comms):
        return record.samples
    return [
        sample
        for sample in record.samples
        if (not options.pids or sample.pid in options.pids)
        and (not options.tids or sample.tid in options.tids)
        and (not options.comms or sample.comm in options.comms)
    ]


def dso_selected(frame: Frame, dsos: frozenset[str]) -> bool:
    return not dsos or frame.dso in dsos or os.path.basename(frame.dso) in dsos


FramePart = tuple[str | None, str | None, bool | None]  # (dso, symbol, kernel) as the sort keys need them


def _count(record: Record, options: ReportOptions) -> tuple[Counter[RowKey], Counter[RowKey]]:
    """Self and children counts (children empty without --children)."""
    samples = selected_samples(record, options)
    if options.children:
        return _count_stacks(record, samples, options)
    return _count_leaves(record, samples, options), Counter()


def _count_leaves(record: Record, samples: list[Sample], options: ReportOptions) -> Counter[RowKey]:
    """Self counts without walking stacks: each distinct leaf frame's part of the key is computed once
    (and numbered: frames of one function share it), samples are summed per (comm, pid, tid, part
    number) as the sort keys need them, and each sum becomes a row key once."""
    sort = options.sort
    with_comm, with_pid, with_tid = "comm" in sort, "pid" in sort, "tid" in sort
    numbers: dict[FramePart | None, int] = {_frame_part(UNKNOWN_FRAME, options): -1}
    leaves = {sample.frames[0] for sample in samples if sample.frames}
    number = {leaf: numbers.setdefault(_frame_part(record.frames[leaf], options), len(numbers)) for leaf in leaves}
    sums: dict[tuple[str | None, int | None, int | None, int], int] = {}
    for sample in samples:
        key = (sample.comm if with_comm else None, sample.pid if with_pid else None,
               sample.tid if with_tid else None, number[sample.frames[0]] if sample.frames else -1)
        sums[key] = sums.get(key, 0) + sample.count
    parts = {n: part for part, n in numbers.items()}
    return Counter({RowKey(comm, pid, *part, tid): count  # type: ignore[misc]
                    for (comm, pid, tid, n), count in sums.items() if (part := parts[n]) is not None})


def _count_stacks(record: Record, samples: list[Sample],
                  options: ReportOptions) -> tuple[Counter[RowKey], Counter[RowKey]]:
    """Self and children counts from whole stacks; each frame's part of the key is computed once, not once
    per sample."""
    parts = [_frame_part(frame, options) for frame in record.frames]
    unknown = _frame_part(UNKNOWN_FRAME, options)
    self_counts: Counter[RowKey] = Counter()
    child_counts: Counter[RowKey] = Counter()
    for sample in samples:
        comm = sample.comm if "comm" in options.sort else None
        pid = sample.pid if "pid" in options.sort else None
        tid = sample.tid if "tid" in options.sort else None
        leaf = parts[sample.frames[0]] if sample.frames else unknown
        if leaf is not None:
            self_counts[RowKey(comm, pid, *leaf, tid)] += sample.count
        for part in {parts[i] for i in sample.frames} if sample.frames else {unknown}:
            if part is not None:
                child_counts[RowKey(comm, pid, *part, tid)] += sample.count
    return self_counts, child_counts


def _frame_part(frame: Frame, options: ReportOptions) -> FramePart | None:
    """None when --dso filters the frame out."""
    if not dso_selected(frame, options.dsos):
        return None
    with_symbol = "symbol" in options.sort
    return (
        frame.dso if "dso" in options.sort else None,
        frame.symbol if with_symbol else None,
        frame.kernel if with_symbol else None,
    )


def _make_row(key: RowKey, count: int, child_counts: Counter[RowKey], total: int, options: ReportOptions) -> Row:
    row = Row(key=key, samples=count, percent=percent(count, total))
    if options.children:
        row.children = child_counts[key]
        row.children_percent = percent(row.children, total)
    return row


def _main_percent(row: Row) -> float:
    return row.children_percent if row.children_percent is not None else row.percent


def _key_order(sort: tuple[str, ...]) -> Callable[[RowKey], Any]:
    """The order of rows of equal counts: by comm, pid, tid, dso, symbol, then [k] after [.], whatever the
    process's hash seed. The parts of the key that are set are the same in every key of a table (the sort
    keys), and the others are None in all of them: only the set ones are compared."""
    parts = [part for part, key in (("comm", "comm"), ("pid", "pid"), ("tid", "tid"), ("dso", "dso"),
                                    ("symbol", "symbol"), ("kernel", "symbol")) if key in sort]
    return operator.attrgetter(*parts)
