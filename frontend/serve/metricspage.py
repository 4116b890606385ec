"""The `/metrics` page: the exporter's totals in the Prometheus text format (0.0.4).

Units as Prometheus names them: CPU time in seconds (``optrace_cpu_seconds_total``: the samples of a
series divided by the sampling frequency, so ``rate()`` reads as CPUs busy, and hosts sampled at
different ``-F`` add up), counts as whole numbers (``optrace_drains_total 4``, not ``4.0``: what
prometheus-client's ``generate_latest`` prints for every value). The totals keep samples, exactly.

Self-metrics are prometheus-client metric families, written out here (:func:`family_text`). The two
large families (``optrace_cpu_seconds_total`` and ``optrace_uprobe_calls_total``, up to
``--max-series`` series each) are rendered from line prefixes computed once per series: measured
on this machine, ``generate_latest`` spends 37 ms (text) to 68 ms (OpenMetrics) on 10,000 series, and
its gzip another 18 ms, against under 10 ms here when every series changed. A series' labels never
change, so its prefix is valid for as long as the series lives, and its line until its value changes;
the caches hold only the series the page has (bounded by the guard, dropped when a series expires).
"""
from __future__ import annotations

import platform
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from optrace import __version__
from optrace.frontend.serve.cardinality import Labels
from optrace.frontend.serve.totals import (CALL_LABELS, CALLS_METRIC, CPU_LABELS, CPU_METRIC, OFFCPU_METRIC,
                                      ExporterTotals, TotalsSnapshot)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CPU_HELP = ("CPU time whose leaf frame (self time) is this symbol, JIT symbols included: samples divided by the "
            "sampling frequency, so rate() is in CPUs.")
CALLS_HELP = "Exact calls of a uprobe-probed function, counted in the kernel."
OFFCPU_HELP = ("Time threads waited off CPU (serve --off-cpu), by where they waited: the innermost user "
               "frame, or for kernel threads the caller of schedule().")
NS_PER_S = 1e9


@dataclass(frozen=True)
class ExporterInfo:
    frequency_hz: int
    event: str  # "cpu-clock" or "cycles"


def escape_label_value(value: str) -> str:
    """Text-format escaping; undecodable bytes (paths, symbols) become "?", never a broken page."""
    clean = value.encode("utf-8", "replace").decode("utf-8")
    return clean.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class CounterFamilyText:
    """Renders one large counter family, caching each series' `name{labels} ` prefix."""

    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...], divisor: float = 0.0) -> None:
        """``divisor``: values are shown divided by it (nanoseconds or samples as seconds); 0 shows them as
        they are (whole numbers)."""
        self._name = name
        self._divisor = divisor
        self._label_names = label_names
        self._header = f"# HELP {name} {help_text}\n# TYPE {name} counter\n"
        self._prefixes: dict[Labels, str] = {}
        self._lines: dict[Labels, tuple[int, str]] = {}  # the line last rendered, with its value

    def _prefix(self, labels: Labels) -> str:
        prefix = self._prefixes.get(labels)
        if prefix is None:
            pairs = ",".join(f'{n}="{escape_label_value(v)}"' for n, v in zip(self._label_names, labels))
            prefix = self._prefixes[labels] = f"{self._name}{{{pairs}}} "
        return prefix

    def render(self, values: dict[Labels, int]) -> str:
        """A drain changes few series (at most ~200 CPU series per second at 99 Hz on 2 CPUs): only
        their lines are formatted again."""
        lines = self._lines
        out = []
        for labels, value in values.items():
            cached = lines.get(labels)
            if cached is None or cached[0] != value:
                shown = value_text(value / self._divisor if self._divisor else value)
                cached = lines[labels] = (value, f"{self._prefix(labels)}{shown}\n")
            out.append(cached[1])
        if len(lines) > len(values):  # series expired since the last page
            self._forget_missing(values)
        return self._header + "".join(out)

    def _forget_missing(self, values: dict[Labels, int]) -> None:
        self._lines = {labels: line for labels, line in self._lines.items() if labels in values}
        self._prefixes = {labels: p for labels, p in self._prefixes.items() if labels in values}


def value_text(value: float) -> str:
    """A whole number as one (``4``), anything else as Prometheus' Go clients print it (``0.25``, ``+Inf``)."""
    return str(value) if isinstance(value, int) else floatToGoString(value)


def escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def family_text(family: Metric) -> str:
    """One metric family in the text format, as ``generate_latest`` writes it (a counter's name with its
    ``_total``, an info family as a gauge ``_info``), but whole numbers without ``.0``."""
    name, kind = family.name, family.type
    if kind == "counter":
        name += "_total"
    elif kind == "info":
        name, kind = name + "_info", "gauge"
    lines = [f"# HELP {name} {escape_help(family.documentation)}\n# TYPE {name} {kind}\n"]
    for sample in family.samples:
        pairs = ",".join(f'{key}="{escape_label_value(value)}"' for key, value in sorted(sample.labels.items()))
        lines.append(f"{sample.name}{{{pairs}}} {value_text(sample.value)}\n" if pairs
                     else f"{sample.name} {value_text(sample.value)}\n")
    return "".join(lines)


def counted_by(name: str, help_text: str, label: str, counts: Mapping[str, float]) -> CounterMetricFamily:
    """A counter family with one series per key of ``counts``, in key order."""
    family = CounterMetricFamily(name, help_text, labels=[label])
    for key, count in sorted(counts.items()):
        family.add_metric([key], count)
    return family


def self_metric_families(snap: TotalsSnapshot, info: ExporterInfo) -> Iterator[Metric]:
    """What the exporter says about itself."""
    yield counted_by("optrace_lost_samples", "Samples or stacks the kernel side could not keep, by reason.",
                     "reason", snap.lost)
    yield CounterMetricFamily("optrace_idle_samples", "Samples of the idle task (pid 0), not in "
                              "optrace_cpu_seconds_total.", value=snap.idle_samples)
    yield CounterMetricFamily("optrace_carried_samples", "Samples of the process filter's threads that ended "
                              "between two ticks, taken at their process's next tick (in optrace_cpu_seconds_total, "
                              "with another thread's stack).", value=snap.carried_samples)
    yield counted_by("optrace_process_events", "Processes exec'd and exited, as the profiler saw them (the "
                     "symbolizer works for those that get sampled).", "event",
                     {event: snap.process_events.get(event, 0) for event in ("exec", "exit")})
    yield CounterMetricFamily("optrace_unresolved_frames", "Samples whose leaf frame could not be named "
                              "(counted as symbol=\"[unknown]\").", value=snap.unresolved_frames)
    yield counted_by("optrace_stacks", "CPU samples with a user stack, by quality: complete (its outermost "
                     "frame is a thread's first) or why the walk stopped.", "quality", snap.stack_quality)
    yield CounterMetricFamily("optrace_jit_refused_files", "JIT symbol files (perf maps, jitdumps) refused "
                              "as untrusted or malformed.", value=snap.jit_refused_files)
    yield from series_families(snap)
    yield counted_by("optrace_read_errors", "Failures contained within one drain (one process's symbols, one "
                     "source's drain), by kind: the daemon went on.", "kind", snap.read_errors)
    yield from cache_families(snap)
    yield CounterMetricFamily("optrace_drains", "Kernel map drains done.", value=snap.drains)
    yield CounterMetricFamily("optrace_drain_seconds", "Wall time spent draining the kernel maps and "
                              "turning them into series, symbolizing included.", value=snap.drain_seconds)
    yield CounterMetricFamily("optrace_symbolize_seconds", "Wall time spent symbolizing.",
                              value=snap.symbolize_seconds)
    frequency = GaugeMetricFamily("optrace_sampling_frequency_hertz", "Sampling frequency per CPU.",
                                  labels=["event"])
    frequency.add_metric([info.event], info.frequency_hz)
    yield frequency
    yield InfoMetricFamily("optrace_build", "optrace build information.",
                           value={"version": __version__, "python": platform.python_version()})


def series_families(snap: TotalsSnapshot) -> Iterator[Metric]:
    """The cardinality guard's own numbers: series folded into [other], expired, and held now."""
    yield counted_by("optrace_cardinality_overflow", "Samples or calls counted in an [other] series because the "
                     "metric reached --max-series.", "metric", snap.overflow)
    yield counted_by("optrace_series_expired", "Series dropped after --series-idle-expiry seconds without a new "
                     "sample or call (a series seen again restarts from 0).", "metric", snap.expired)
    series = GaugeMetricFamily("optrace_series", "Series a metric has (at most --max-series).", labels=["metric"])
    series.add_metric([CPU_METRIC], len(snap.cpu_samples))
    series.add_metric([CALLS_METRIC], len(snap.uprobe_calls))
    series.add_metric([OFFCPU_METRIC], len(snap.off_cpu_ns))
    yield series


def cache_families(snap: TotalsSnapshot) -> Iterator[Metric]:
    entries = GaugeMetricFamily("optrace_symbol_cache_entries", "What the symbolizer and the JIT symbol "
                                "reader keep now, by cache (each is capped; for explaining serve's memory).",
                                labels=["cache"])
    sizes = GaugeMetricFamily("optrace_symbol_cache_bytes", "Bytes the symbolizer's symbol tables and the "
                              "JIT symbols' names take now, by cache.", labels=["cache"])
    for cache, size in sorted(snap.caches.items()):
        if cache.endswith("_bytes"):
            sizes.add_metric([cache.removesuffix("_bytes")], size)
        else:
            entries.add_metric([cache], size)
    yield entries
    yield sizes


class MetricsPage:
    """Renders `/metrics`; a page is rendered at most once per drain, whoever scrapes it."""

    def __init__(self, totals: ExporterTotals, info: ExporterInfo) -> None:
        self._totals = totals
        self._info = info
        self._cpu = CounterFamilyText(CPU_METRIC, CPU_HELP, CPU_LABELS, divisor=info.frequency_hz)
        self._calls = CounterFamilyText(CALLS_METRIC, CALLS_HELP, CALL_LABELS)
        self._off_cpu = CounterFamilyText(OFFCPU_METRIC, OFFCPU_HELP, CPU_LABELS, divisor=NS_PER_S)
        self._lock = threading.Lock()
        self._page: tuple[int, bytes] | None = None  # (generation, page)
        self._collectors: list[Collector] = []

    def add_collector(self, collector: Collector) -> None:
        """More self-metrics on the page (OTLP push's: frontend/serve/otlpexport.py), read at each render."""
        with self._lock:
            self._collectors.append(collector)

    def current(self) -> bytes | None:
        """The page of the last drain if it was rendered already, else None (never waits: the server's
        event loop asks, and answers at once when it can)."""
        page = self._page
        return page[1] if page is not None and page[0] == self._totals.generation else None

    def render(self) -> bytes:
        with self._lock:
            if self._page is not None and self._page[0] == self._totals.generation:
                return self._page[1]
            snap = self._totals.snapshot()
            text = self._cpu.render(snap.cpu_samples) + self._calls.render(snap.uprobe_calls)
            if snap.off_cpu_ns:
                text += self._off_cpu.render(snap.off_cpu_ns)
            text += "".join(family_text(family) for family in self_metric_families(snap, self._info))
            text += "".join(family_text(family) for collector in self._collectors for family in collector.collect())
            page = text.encode("utf-8")
            self._page = (snap.generation, page)
            return page
