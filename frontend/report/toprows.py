"""`optrace top`'s model: live totals per row, refreshed once per interval, shown like `report`'s rows.

Totals are **decayed** by default, like `perf top`: at each refresh every total is multiplied by 7/8
before the interval's samples are added, so a function that stopped running fades out in about 20
refreshes (perf's ``hists__decay_entries``); with ``zero`` (perf top's ``-z``) each refresh shows that
interval's samples alone (a **window** of one interval). Percentages are of the shown totals of all rows.

Children totals grow only while the children column is on (the engine names whole stacks only then), and
only from samples whose stack is whole: one whose stack was never walked (its process's unwind tables came
too late, see frontend/unwind/copies.py) has its leaf but not its callers, and counting it would show every
caller short of its share (main at 88 % of a one-threaded program); it counts in the self column only.
Children percentages are of the samples they were counted from, decayed alike.
Totals are kept per (comm, pid, dso, symbol, kernel), the finest keys, and summed into the keys shown, so
the sort can change without losing history. Children (inclusive) totals sum exactly over comm and pid
(one sample has one process); with keys leaving out dso or symbol a stack with two frames of the shown
key would be credited twice, which is why ``symbol`` is always part of the keys.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from optrace.frontend.report.rows import ReportOptions, RowKey, build_rows
from optrace.model import Frame, RawSample, Record, RecordMeta, Sample

DECAY = 7 / 8
FORGET_BELOW = 0.05  # a decayed total under this is dropped (bounded memory on a busy machine)
FINE_KEYS = ("comm", "pid", "dso", "symbol")
SORT_PRESETS = (("dso", "symbol"), ("comm", "dso", "symbol"), ("pid", "comm", "symbol"), ("comm", "symbol"))


@dataclass(frozen=True)
class TopRow:
    key: RowKey
    samples: float  # self, decayed (or this interval's)
    percent: float
    children: float
    children_percent: float


@dataclass
class ViewState:
    """What the keys change."""

    sort: tuple[str, ...] = ("dso", "symbol")
    show_kernel: bool = True
    children: bool = False
    filter: str = ""
    paused: bool = False


@dataclass
class Header:
    samples_per_s: float = 0.0
    lost: int = 0
    cpus: int = 0
    event: str = ""
    frequency_hz: int = 0
    interval_s: float = 1.0
    zero: bool = False
    deep_stacks: float | None = None  # share of user stacks with more than one frame (stack quality)
    warnings: int = 0

    @property
    def totals(self) -> str:
        return "window: last interval" if self.zero else "decayed 7/8 per refresh"


@dataclass
class LiveTotals:
    zero: bool = False
    self_totals: dict[RowKey, float] = field(default_factory=dict)
    child_totals: dict[RowKey, float] = field(default_factory=dict)
    # the samples the children totals were counted from (decayed alike): children percentages are of it,
    # so they are right from the first refresh with stacks, not after the older totals decay
    child_samples: float = 0.0

    def add(self, frames: list[Frame], samples: list[Sample], stacks: bool = True,
            partial: Sequence[Sample] = ()) -> None:
        """One interval's symbolized samples: the old totals decay (or go), these are added. Children
        totals only from whole stacks (``stacks``; leaf-only samples count as self only); ``partial``: samples
        of the interval whose stacks are not whole, self only."""
        rows = build_rows(Record(meta=_META, frames=frames, samples=samples),
                          ReportOptions(sort=FINE_KEYS, children=stacks))
        if partial:
            rows += build_rows(Record(meta=_META, frames=frames, samples=list(partial)), ReportOptions(sort=FINE_KEYS))
        factor = 0.0 if self.zero else DECAY
        for totals in (self.self_totals, self.child_totals):
            for key in list(totals):
                totals[key] *= factor
                if totals[key] < FORGET_BELOW:
                    del totals[key]
        self.child_samples *= factor
        for row in rows:
            if row.samples:
                self.self_totals[row.key] = self.self_totals.get(row.key, 0.0) + row.samples
            if stacks and row.children:
                self.child_totals[row.key] = self.child_totals.get(row.key, 0.0) + row.children
        if stacks:
            self.child_samples += sum(sample.count for sample in samples)

    def rows(self, view: ViewState, limit: int | None = None) -> list[TopRow]:
        """Rows under the view's keys, filter and kernel setting, largest first."""
        wanted = set(view.sort)
        needle = view.filter.lower()
        self_sum: Counter[RowKey] = Counter()
        child_sum: Counter[RowKey] = Counter()
        total = sum(self.self_totals.values())
        for source, target in ((self.self_totals, self_sum), (self.child_totals, child_sum)):
            for key, value in source.items():
                if (not view.show_kernel and key.kernel) or (needle and needle not in (key.symbol or "").lower()):
                    continue
                target[_project(key, wanted)] += value
        keys = set(self_sum) | (set(child_sum) if view.children else set())
        rows = [TopRow(key, self_sum[key], _percent(self_sum[key], total), child_sum[key],
                       _percent(child_sum[key], self.child_samples)) for key in keys]
        rows.sort(key=lambda row: (-(row.children if view.children else row.samples), row.key.symbol or ""))
        return rows[:limit] if limit is not None else rows


def _project(key: RowKey, wanted: set[str]) -> RowKey:
    return RowKey(key.comm if "comm" in wanted else None, key.pid if "pid" in wanted else None,
                  key.dso if "dso" in wanted else None, key.symbol, key.kernel)


def _percent(value: float, total: float) -> float:
    return 100.0 * value / total if total else 0.0


_META = RecordMeta(optrace_version="", hostname="", kernel="", started=0.0, duration_s=0.0, frequency_hz=0, event="")


def deep_stack_share(samples: list[RawSample]) -> float | None:
    """Stack quality: the share of samples in user code whose user stack has more than one frame."""
    user = sum(sample.count for sample in samples if sample.user)
    deep = sum(sample.count for sample in samples if len(sample.user) > 1)
    return 100.0 * deep / user if user else None


@dataclass(frozen=True)
class TopSnapshot:
    """One refresh: what `top` prints, on a screen or as a plain table."""

    header: Header
    view: ViewState
    rows: list[TopRow]
    time: str  # wall-clock time of the refresh, HH:MM:SS
