"""The exporter's own totals: what each drain adds, what every scrape reads.

Sources turn one kernel drain into a :class:`Delta`; :meth:`ExporterTotals.apply` adds it under a
lock, so a scrape (any number of scrapers, any interval) only reads. Memory is bounded twice: the
cardinality guard caps the series a metric has at once, and a series that has not moved for
``series_idle_s`` seconds is dropped (a busy machine names new processes and JIT symbols all day).
A dropped counter series disappears from the page and starts again from 0 if its labels come back:
Prometheus' ``rate()``/``increase()`` take that as a counter reset, as after an exporter restart.
""" 
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from optrace.frontend.serve.cardinality import Labels, SeriesGuard, bound_labels
from optrace.model import UNKNOWN, Frame, Sample

CPU_LABELS = ("comm", "dso", "symbol")
CALL_LABELS = ("binary", "symbol", "comm")
CPU_METRIC = "optrace_cpu_seconds_total"  # kept in samples, shown in seconds (samples / -F)
OFFCPU_METRIC = "optrace_offcpu_seconds_total"  # serve --off-cpu; kept in nanoseconds, shown in seconds
CALLS_METRIC = "optrace_uprobe_calls_total"
DEFAULT_SERIES_IDLE_S = 600.0
MAX_EXPIRY_CHECK_S = 60.0  # idle series are looked for at most this long after they became idle


@dataclass
class Delta:
    """What one drain adds. Sources fill the parts they know."""

    cpu_samples: Counter[Labels] = field(default_factory=Counter)  # (comm, dso, symbol) -> samples
    uprobe_calls: Counter[Labels] = field(default_factory=Counter)  # (binary, symbol, comm) -> calls
    off_cpu_ns: Counter[Labels] = field(default_factory=Counter)  # (comm, dso, symbol) -> nanoseconds off CPU
    lost: Counter[str] = field(default_factory=Counter)  # reason -> lost samples or stacks
    idle_samples: int = 0  # samples of the idle task (pid 0), left out of the profile
    carried_samples: int = 0  # of cpu_samples: taken for threads that ended between ticks (RecordMeta's)
    execs: int = 0  # processes exec'd (what drives the symbolizer's work on a busy machine)
    exits: int = 0
    unresolved_frames: int = 0  # samples whose leaf frame has no symbol
    # samples with a user stack, by outcome: "complete" or why the walk stopped (frontend/unwind/quality.py)
    stack_quality: Counter[str] = field(default_factory=Counter)
    jit_refused_files: int = 0  # perf maps / jitdumps refused (untrusted owner, bad format...)
    read_errors: Counter[str] = field(default_factory=Counter)  # kind -> failures contained in a drain
    caches: dict[str, int] = field(default_factory=dict)  # symbol cache -> its size now (entries or *_bytes)
    symbolize_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)  # logged by the daemon, not kept
    # Whole stacks, asked for by the daemon while a /debug/pprof/profile collection is open (naming whole
    # stacks costs more than naming leaves): (frames, samples) as the symbolizer gave them.
    want_stacks: bool = False
    stacks: tuple[list[Frame], list[Sample]] | None = None
    # Whole off-CPU stacks (nanoseconds), asked for while OTLP push is on (frontend/serve/otlpexport.py)
    want_off_cpu_stacks: bool = False
    off_cpu_stacks: tuple[list[Frame], list[Sample]] | None = None


def guard_for(label_names: tuple[str, ...], coarse_label: str, max_series: int) -> SeriesGuard:
    return SeriesGuard(max_series, coarse_index=label_names.index(coarse_label), label_count=len(label_names))


class CounterTotals:
    """One counter metric: a total per series, at most ``guard.max_series`` series at once.

    Label values are bounded (length, control characters) before the guard sees them, so names
    that differ only past the cut share one series."""

    def __init__(self, label_names: tuple[str, ...], guard: SeriesGuard) -> None:
        self.label_names = label_names
        self._guard = guard
        self._values: dict[Labels, int] = {}
        self._touched: dict[Labels, float] = {}  # series -> when it last moved (monotonic s)
        self.overflow = 0  # samples or calls counted in an [other] series
        self.expired = 0  # series dropped after being idle

    def add(self, labels: Labels, amount: int, now: float) -> None:
        admission = self._guard.admit(bound_labels(labels), self._values)
        self._values[admission.labels] = self._values.get(admission.labels, 0) + amount
        self._touched[admission.labels] = now
        if admission.overflow:
            self.overflow += amount

    def expire(self, idle_since: float) -> int:
        """Drop the series that have not moved since ``idle_since``; how many were dropped."""
        stale = [labels for labels, touched in self._touched.items() if touched < idle_since]
        for labels in stale:
            del self._values[labels], self._touched[labels]
        self.expired += len(stale)
        return len(stale)

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
    off_cpu_ns: dict[Labels, int]
    overflow: dict[str, int]  # metric -> samples or calls sent to [other] series
    expired: dict[str, int]  # metric -> series dropped after being idle
    read_errors: dict[str, int]  # kind -> failures contained in a drain
    caches: dict[str, int]  # symbol cache -> its size after the last drain
    lost: dict[str, int]
    idle_samples: int
    carried_samples: int
    process_events: dict[str, int]  # "exec" / "exit" -> count
    unresolved_frames: int
    stack_quality: dict[str, int]  # outcome -> samples with a user stack
    jit_refused_files: int
    drains: int
    drain_seconds: float
    symbolize_seconds: float


class ExporterTotals:
    """All of the exporter's totals, behind one lock. ``series_idle_s`` = 0 keeps series forever."""

    def __init__(self, max_series: int, series_idle_s: float = DEFAULT_SERIES_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.Lock()
        self.cpu_samples = CounterTotals(CPU_LABELS, guard_for(CPU_LABELS, "symbol", max_series))
        self.uprobe_calls = CounterTotals(CALL_LABELS, guard_for(CALL_LABELS, "comm", max_series))
        self.off_cpu_ns = CounterTotals(CPU_LABELS, guard_for(CPU_LABELS, "symbol", max_series))
        self.series_idle_s = series_idle_s
        self._clock = clock
        self._next_expiry = clock() + self._expiry_period()
        self.lost: Counter[str] = Counter()
        self.idle_samples = 0
        self.carried_samples = 0
        self.process_events: Counter[str] = Counter()
        self.unresolved_frames = 0
        self.stack_quality: Counter[str] = Counter()
        self.jit_refused_files = 0
        self.read_errors: Counter[str] = Counter()
        self.caches: dict[str, int] = {}
        self.drains = 0
        self.drain_seconds = 0.0
        self.symbolize_seconds = 0.0
        self.generation = 0  # bumped by every apply(): lets a scrape reuse a page rendered since

    def set_series_idle(self, seconds: float) -> None:
        """A new idle time (a reload), in force from the next drain on."""
        with self.lock:
            self.series_idle_s = seconds
            self._next_expiry = min(self._next_expiry, self._clock() + self._expiry_period())

    def _expiry_period(self) -> float:
        return min(self.series_idle_s / 10, MAX_EXPIRY_CHECK_S)

    def apply(self, delta: Delta, drain_seconds: float) -> None:
        now = self._clock()
        with self.lock:
            for labels, count in delta.cpu_samples.items():
                self.cpu_samples.add(labels, count, now)
            for labels, calls in delta.uprobe_calls.items():
                self.uprobe_calls.add(labels, calls, now)
            for labels, nanoseconds in delta.off_cpu_ns.items():
                self.off_cpu_ns.add(labels, nanoseconds, now)
            self.lost.update(delta.lost)
            self.idle_samples += delta.idle_samples
            self.carried_samples += delta.carried_samples
            self.process_events.update(exec=delta.execs, exit=delta.exits)
            self.unresolved_frames += delta.unresolved_frames
            self.stack_quality.update(delta.stack_quality)
            self.jit_refused_files += delta.jit_refused_files
            self.read_errors.update(delta.read_errors)
            self.caches.update(delta.caches)
            self.symbolize_seconds += delta.symbolize_seconds
            self.drain_seconds += drain_seconds
            self.drains += 1
            self._expire(now)
            self.generation += 1

    def _expire(self, now: float) -> None:
        """Every tenth of the idle time (at most every minute): drop the series idle that long."""
        if self.series_idle_s <= 0 or now < self._next_expiry:
            return
        for metric in (self.cpu_samples, self.uprobe_calls, self.off_cpu_ns):
            metric.expire(now - self.series_idle_s)
        self._next_expiry = now + self._expiry_period()

    def snapshot(self) -> TotalsSnapshot:
        with self.lock:
            return TotalsSnapshot(
                generation=self.generation,
                cpu_samples=self.cpu_samples.values(),
                uprobe_calls=self.uprobe_calls.values(),
                off_cpu_ns=self.off_cpu_ns.values(),
                overflow={CPU_METRIC: self.cpu_samples.overflow, CALLS_METRIC: self.uprobe_calls.overflow,
                          OFFCPU_METRIC: self.off_cpu_ns.overflow},
                expired={CPU_METRIC: self.cpu_samples.expired, CALLS_METRIC: self.uprobe_calls.expired,
                         OFFCPU_METRIC: self.off_cpu_ns.expired},
                read_errors=dict(self.read_errors),
                caches=dict(self.caches),
                lost=dict(self.lost),
                idle_samples=self.idle_samples,
                carried_samples=self.carried_samples,
                process_events=dict(self.process_events),
                unresolved_frames=self.unresolved_frames,
                stack_quality=dict(self.stack_quality),
                jit_refused_files=self.jit_refused_files,
                drains=self.drains,
                drain_seconds=self.drain_seconds,
                symbolize_seconds=self.symbolize_seconds,
            )


JIT_DSO = "[jit]"


def dso_label(dso: str) -> str:
    """JIT dsos name a per-process file (`[jit] /tmp/perf-PID.map`): one label for all of them, or
    every process would add series."""
    return JIT_DSO if dso.startswith(JIT_DSO) else dso


def leaf_labels(comm: str, frame: Frame | None) -> tuple[str, str, str]:
    """(comm, dso, symbol) of a sample's leaf frame. An unnamed address becomes symbol="[unknown]"
    (keeping its dso): `dso+0xOFFSET` labels would add a series per address."""
    if frame is None:
        return (comm, UNKNOWN, UNKNOWN)
    return (comm, dso_label(frame.dso), frame.symbol if frame.resolved else UNKNOWN)


def add_off_cpu_rows(delta: Delta, frames: list[Frame], samples: Iterable[Sample]) -> None:
    """Off-CPU nanoseconds by the frame each wait is named after (see sources.py's off_cpu_leaves)."""
    for sample in samples:
        delta.off_cpu_ns[leaf_labels(sample.comm, frames[sample.frames[0]] if sample.frames else None)] += sample.count


def add_leaf_rows(delta: Delta, frames: list[Frame], samples: Iterable[Sample]) -> None:
    for sample in samples:
        leaf = frames[sample.frames[0]] if sample.frames else None
        if leaf is None or not leaf.resolved:
            delta.unresolved_frames += sample.count
        delta.cpu_samples[leaf_labels(sample.comm, leaf)] += sample.count
