"""The event a report shows: a record holds each event as its own sample type (CPU samples, off-CPU
nanoseconds); `report --event` picks one, and every format prints it through the same rows, in its unit.

``wall`` puts both on one scale: each CPU sample counts as one sampling period (1/F s) of time on CPU,
next to the off-CPU time of the same threads, so one flame graph shows where wall-clock time goes.

A record's main event (:func:`main_event`) is what it was recorded for: ``wall`` for ``record --wall``,
``off-cpu`` for ``record --off-cpu``, else ``cpu``; it is what `report` shows unless told otherwise.

Records made before off-CPU stacks moved to the context-switch perf event (bpf/offcpu.c) took them inside
the sched_switch tracepoint, so the frames of the tracepoint's own machinery could sit above ``__schedule``:
they are where the stack was taken, not where the thread waits, and are left out (:data:`TRACEPOINT_FRAMES`).
The one seen was ``__traceiter_sched_switch``: while another tracer was attached to the tracepoint too
(``perf record -e sched:sched_switch``, another optrace), the kernel called its probes from that function's
loop, and the frame was the leaf of every off-CPU stack of a context-switching program (17 % of its
wall-clock view, 27 % of an http.server's). Stacks taken today start at ``schedule()``.
"""
from __future__ import annotations

import dataclasses

from optrace.errors import OptraceError
from optrace.model import EVENT_UNITS, Frame, Record, RecordMeta, Sample

EVENTS = tuple(EVENT_UNITS)
NS_PER_S = 1_000_000_000
# Kernel functions of a tracepoint's call into a BPF program, by name prefix: the tracepoint's iterator
# (__traceiter_sched_switch), its BPF glue (__bpf_trace_sched_switch, bpf_trace_run4), its stub
# (__probestub_sched_switch), BPF programs and trampolines (bpf_prog_<tag>_<name>, bpf_trampoline_<id>).
TRACEPOINT_FRAMES = ("__traceiter_", "__bpf_trace_", "bpf_trace_run", "__probestub_", "bpf_prog_", "bpf_trampoline_")
# What each event's counts are called, with a time in front for the events counted in nanoseconds
EVENT_NOUNS = {"cpu": "samples", "off-cpu": "off-CPU", "wall": "wall-clock"}


def main_event(meta: RecordMeta) -> str:
    """The event the record was made for: wall with --wall, off-cpu with --off-cpu, else cpu."""
    if meta.off_cpu is None:
        return "cpu"
    return "wall" if meta.off_cpu.wall else "off-cpu"


def is_timed(event: str) -> bool:
    """Whether the event's counts are nanoseconds (off-cpu, wall), not CPU samples."""
    return EVENT_UNITS[event] == "nanoseconds"


def amount(count: int, event: str) -> str:
    """A count in the event's words: "1234 samples", "25.4 s off-CPU", "1.97 s wall-clock"."""
    if is_timed(event):
        return f"{human_time(count)} {EVENT_NOUNS[event]}"
    return f"{count} {EVENT_NOUNS[event]}"


def event_record(record: Record, event: str | None = None) -> tuple[Record, dict[str, int]]:
    """A record whose ``samples`` are the event's (None: the record's main event), and for ``wall`` its
    parts: {"on-cpu": ns, "off-cpu": ns}."""
    event = event or main_event(record.meta)
    if event not in EVENT_UNITS:
        raise OptraceError(f"unknown event {event!r}: valid events are {', '.join(EVENTS)}")
    if event == "cpu":
        return record, {}
    meta = record.meta.off_cpu
    if meta is None:
        raise OptraceError(f"the record holds no off-CPU time: record with --off-cpu or --wall for --event {event}")
    off_cpu = without_tracepoint_frames(record.frames, record.off_cpu)
    if event == "off-cpu":
        return dataclasses.replace(record, samples=off_cpu), {}
    if not meta.wall:
        raise OptraceError("the record has no wall-clock view: record with --wall for --event wall")
    period = NS_PER_S // max(record.meta.frequency_hz, 1)
    on_cpu = [dataclasses.replace(sample, count=sample.count * period) for sample in record.samples]
    parts = {"on-cpu": sum(s.count for s in on_cpu), "off-cpu": sum(s.count for s in off_cpu)}
    samples: list[Sample] = on_cpu + off_cpu
    return dataclasses.replace(record, samples=samples), parts


def without_tracepoint_frames(frames: list[Frame], samples: list[Sample]) -> list[Sample]:
    """The off-CPU samples without the tracepoint's frames at their leaf end (see TRACEPOINT_FRAMES)."""
    machinery = [frame.kernel and frame.symbol.startswith(TRACEPOINT_FRAMES) for frame in frames]
    kept = []
    for sample in samples:
        cut = 0
        while cut < len(sample.frames) - 1 and machinery[sample.frames[cut]]:
            cut += 1
        kept.append(dataclasses.replace(sample, frames=sample.frames[cut:]) if cut else sample)
    return kept


def nothing_line(record: Record, event: str, filters: str = "") -> str:
    """What a report says when no row is left: which filters matched nothing, or, when the event holds
    nothing at all, where the record's time is instead."""
    what = "no samples match" if not is_timed(event) else f"no {EVENT_NOUNS[event]} time matches"
    if filters:
        return f"({what} {filters})"
    off_cpu = record.meta.off_cpu
    if event == "cpu" and off_cpu is not None:
        events = "off-cpu or wall" if off_cpu.wall else "off-cpu"
        return (f"(no CPU samples: the record's threads did not run on a CPU while sampled; their off-CPU time"
                f" is in --event {events})")
    if event == "cpu":
        return ("(no CPU samples: the targets did not run on a CPU while sampled; record --off-cpu or --wall"
                " shows where they waited)")
    return (f"(no {EVENT_NOUNS[event]} time: no thread of the targets waited {off_cpu.min_block_us} us or more"
            " while recorded)" if off_cpu is not None else f"({what})")


def human_time(ns: int) -> str:
    """1.23 s, 45.6 ms, 789 us, 12 ns: the table's time cells."""
    for unit, size in (("s", NS_PER_S), ("ms", 1_000_000), ("us", 1_000)):
        if ns >= size:
            return f"{ns / size:.{_digits(ns / size)}f} {unit}"
    return f"{ns} ns"


def _digits(value: float) -> int:
    return 2 if value < 10 else 1 if value < 100 else 0
