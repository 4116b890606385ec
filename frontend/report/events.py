"""The event a report shows: a record holds each event as its own sample type (CPU samples, off-CPU
nanoseconds); `report --event` picks one, and every format prints it through the same rows, in its unit.

``wall`` puts both on one scale: each CPU sample counts as one sampling period (1/F s) of time on CPU,
next to the off-CPU time of the same threads, so one flame graph shows where wall-clock time goes.
"""
from __future__ import annotations

import dataclasses

from optrace.errors import OptraceError
from optrace.model import EVENT_UNITS, Record, Sample

EVENTS = tuple(EVENT_UNITS)
NS_PER_S = 1_000_000_000


def event_record(record: Record, event: str) -> tuple[Record, dict[str, int]]:
    """A record whose ``samples`` are the event's, and for ``wall`` its parts: {"on-cpu": ns, "off-cpu": ns}."""
    if event not in EVENT_UNITS:
        raise OptraceError(f"unknown event {event!r}: valid events are {', '.join(EVENTS)}")
    if event == "cpu":
        return record, {}
    meta = record.meta.off_cpu
    if meta is None:
        raise OptraceError(f"the record holds no off-CPU time: record with --off-cpu or --wall for --event {event}")
    if event == "off-cpu":
        return dataclasses.replace(record, samples=record.off_cpu), {}
    if not meta.wall:
        raise OptraceError("the record has no wall-clock view: record with --wall for --event wall")
    period = NS_PER_S // max(record.meta.frequency_hz, 1)
    on_cpu = [dataclasses.replace(sample, count=sample.count * period) for sample in record.samples]
    parts = {"on-cpu": sum(s.count for s in on_cpu), "off-cpu": sum(s.count for s in record.off_cpu)}
    samples: list[Sample] = on_cpu + record.off_cpu
    return dataclasses.replace(record, samples=samples), parts


def human_time(ns: int) -> str:
    """1.23 s, 45.6 ms, 789 us, 12 ns: the table's time cells."""
    for unit, size in (("s", NS_PER_S), ("ms", 1_000_000), ("us", 1_000)):
        if ns >= size:
            return f"{ns / size:.{_digits(ns / size)}f} {unit}"
    return f"{ns} ns"


def _digits(value: float) -> int:
    return 2 if value < 10 else 1 if value < 100 else 0
