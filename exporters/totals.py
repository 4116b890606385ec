"""The exporter's own monotonic totals: what each drain adds, what every scrape reads.

Sources turn one kernel drain into a :class:`Delta`; :meth:`ExporterTotals.apply` adds it under a
lock. Nothing here is ever reset or removed, so a scrape (any number of scrapers, any interval)
only reads: counters stay monotonic, and memory is bounded by the cardinality guard.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from optrace.exporters.cardinality import Labels, SeriesGuard

CPU_LABELS = ("comm", "dso", "symbol")
CALL_LABELS = ("binary", "symbol", "comm")


@dataclass
class Delta:
    """What one drain adds. Sources fill the parts they know."""

    cpu_samples: Counter[Labels] = field(default_factory=Counter)  # (comm, dso, symbol) -> samples
    uprobe_calls: Counter[Labels] = field(default_factory=Counter)  # (binary, symbol, comm) -> calls
    lost: Counter[str] = field(default_factory=Counter)  # reason -> lost samples or stacks
    idle_samples: int = 0  # samples of the idle task (pid 0), left out of the profile
    execs: int = 0  # processes exec'd (what drives the symbolizer's work on a busy machine)
    exits: int = 0
    unresolved_frames: int = 0  # samples whose leaf frame has no symbol
    jit_refused_files: int = 0  # perf maps / jitdumps refused (untrusted owner, bad format...)
    symbolize_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)  # logged by the daemon, not kept


def guard_for(label_names: tuple[str, ...], coarse_label: str, max_series: int) -> SeriesGuard:
    return SeriesGuard(max_series, coarse_index=label_names.index(coarse_label), label_count=len(label_names))


class CounterTotals:
    """One counter metric: a monotonic total per series, at most ``guard.max_series`` series."""

    def __init__(self, label_names: tuple[str, ...], guard: SeriesGuard) -> None:
        self.label_names = label_names
        self._guard = guard
        self._values: dict[Labels, int] = {}
        self.overflow = 0  # samples or calls counted in an [other] series

    def add(self, labels: Labels, amount: int) -> None:
        admission = self._guard.admit(labels, self._values)
        self._values[admission.labels] = self._values.get(admission.labels, 0) + amount
        if admission.overflow:
            self.overflow += amount

    def values(self) -> dict[Labels, int]:
        return dict(self._values)

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True)
class TotalsSnapshot:
    """A consistent copy of everything, taken under the lock, read without it."""

    generation: int
    cpu_samples: dict[Labels, int]
    uprobe_calls: dict[Labels, int]
    overflow: dict[str, int]  # metric -> samples or calls sent to [other] series
    lost: dict[str, int]
    idle_samples: int
    process_events: dict[str, int]  # "exec" / "exit" -> count
    unresolved_frames: int
    jit_refused_files: int
    drains: int
    drain_seconds: float
    symbolize_seconds: float


class ExporterTotals:
    """All of the exporter's totals, behind one lock."""

    def __init__(self, max_series: int) -> None:
        self.lock = threading.Lock()
        self.cpu_samples = CounterTotals(CPU_LABELS, guard_for(CPU_LABELS, "symbol", max_series))
        self.uprobe_calls = CounterTotals(CALL_LABELS, guard_for(CALL_LABELS, "comm", max_series))
        self.lost: Counter[str] = Counter()
        self.idle_samples = 0
        self.process_events: Counter[str] = Counter()
        self.unresolved_frames = 0
        self.jit_refused_files = 0
        self.drains = 0
        self.drain_seconds = 0.0
        self.symbolize_seconds = 0.0
        self.generation = 0  # bumped by every apply(): lets a scrape reuse a page rendered since

    def apply(self, delta: Delta, drain_seconds: float) -> None:
        with self.lock:
            for labels, count in delta.cpu_samples.items():
                self.cpu_samples.add(labels, count)
            for labels, calls in delta.uprobe_calls.items():
                self.uprobe_calls.add(labels, calls)
            self.lost.update(delta.lost)
            self.idle_samples += delta.idle_samples
            self.process_events.update(exec=delta.execs, exit=delta.exits)
            self.unresolved_frames += delta.unresolved_frames
            self.jit_refused_files += delta.jit_refused_files
            self.symbolize_seconds += delta.symbolize_seconds
            self.drain_seconds += drain_seconds
            self.drains += 1
            self.generation += 1

    def snapshot(self) -> TotalsSnapshot:
        with self.lock:
            return TotalsSnapshot(
                generation=self.generation,
                cpu_samples=self.cpu_samples.values(),
                uprobe_calls=self.uprobe_calls.values(),
                overflow={"optrace_cpu_samples_total": self.cpu_samples.overflow,
                          "optrace_uprobe_calls_total": self.uprobe_calls.overflow},
                lost=dict(self.lost),
                idle_samples=self.idle_samples,
                process_events=dict(self.process_events),
                unresolved_frames=self.unresolved_frames,
                jit_refused_files=self.jit_refused_files,
                drains=self.drains,
                drain_seconds=self.drain_seconds,
                symbolize_seconds=self.symbolize_seconds,
            )
