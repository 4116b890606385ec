"""report --wakers on synthetic records: offwaketime's joined stacks in the formats, interrupts, the wall view,
the record's rows from the recorder's samples, and refusals (no BPF)."""
from __future__ import annotations

import dataclasses

import pytest

from optrace.errors import OptraceError
from optrace.frontend.report.events import event_record
from optrace.frontend.report.rows import ReportOptions
from optrace.frontend.report.wakers import merged_samples, wakeup_rows, with_wakers
from optrace.model import Frame, OffCpuMeta, Record, RecordMeta, Sample, Wakeup
from optrace.recordfile import read_record, write_record
from profiletext import render_report

MS = 1_000_000
K = "[kernel.kallsyms]"
FRAMES = [
    Frame("take_item", "/bin/w"),            # 0: the consumer blocks here
    Frame("consumer", "/bin/w"),             # 1
    Frame("schedule", K, "kernel"),              # 2
    Frame("bpf_trace_run1", K, "kernel"),        # 3: the tracepoint's machinery, at a waker's leaf
    Frame("try_to_wake_up", K, "kernel"),        # 4
    Frame("futex_wake", K, "kernel"),            # 5
    Frame("publish_item", "/bin/w"),         # 6: the producer wakes it from here
    Frame("producer", "/bin/w"),             # 7
    Frame("hrtimer_wakeup", K, "kernel"),        # 8
    Frame("asm_sysvec_apic_timer_interrupt", K, "kernel"),  # 9: an interrupt's entry
    Frame("do_syscall_64", K, "kernel"),         # 10: the interrupted thread's
    Frame("burn", "/bin/other"),             # 11
]


def make_record(wall: bool = False) -> Record:
    meta = RecordMeta(optrace_version="t", hostname="h", kernel="k", started=0.0, duration_s=1.0, frequency_hz=100,
                      event="cpu-clock", off_cpu=OffCpuMeta("raw tracepoint sched_switch", 1, [], 1000 * MS, wall=wall,
                                                            wakers=True))
    off = [Sample(1, "consumer", (2, 0, 1), 900 * MS, 2), Sample(1, "consumer", (2, 1), 100 * MS, 2)]
    wakeups = [Wakeup(1, "consumer", (2, 0, 1), 800 * MS, 2, 1, 3, "producer", (3, 4, 5, 6, 7)),
               Wakeup(1, "consumer", (2, 1), 100 * MS, 2, 9, 9, "other", (4, 8, 9, 10, 11)),
               Wakeup(1, "consumer", (2, 0, 1), 50 * MS, 2)]
    return Record(meta=meta, frames=list(FRAMES), samples=[Sample(1, "producer", (6, 7), 20, 3)], off_cpu=off,
                  wakeups=wakeups)


def folded(record: Record, event: str = "off-cpu") -> list[str]:
    view, _ = event_record(record, event)
    text = render_report(with_wakers(view, event), ReportOptions(), "folded", "f", event=event)
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_folded_lines_read_as_offwaketime_writes_them() -> None:
    """comm; blocked root..leaf; --; waker leaf..root; waker comm: the tracepoint's frames left out, an
    interrupt's waker cut at its entry and named [interrupt], an unseen one [unknown]."""
    assert sorted(folded(make_record())) == sorted([
        "consumer;consumer;take_item;schedule_[k];--;try_to_wake_up_[k];futex_wake_[k];publish_item;producer;producer"
        f" {800 * MS}",
        "consumer;consumer;schedule_[k];--;try_to_wake_up_[k];hrtimer_wakeup_[k];asm_sysvec_apic_timer_interrupt_[k];"
        f"[interrupt] {100 * MS}",
        f"consumer;consumer;take_item;schedule_[k];--;[unknown] {50 * MS}",
    ])


def test_children_credit_the_waker_function_and_the_table_says_what_it_shows() -> None:
    view, _ = event_record(make_record(), "off-cpu")
    joined = with_wakers(view, "off-cpu")
    text = render_report(joined, ReportOptions(sort=("symbol",), children=True), "table", "f", event="off-cpu")
    assert "# Wakers: the waits that slept (950 ms of 1.00 s off CPU" in text
    line = next(line for line in text.splitlines() if line.endswith("[.] publish_item"))
    assert line.split()[:2] == ["84.21%", "0.00%"]  # 800 of the 950 ms that slept
    assert sum(s.count for s in joined.samples) == 950 * MS


def test_wall_keeps_the_cpu_samples_as_time() -> None:
    lines = folded(make_record(wall=True), "wall")
    assert f"producer;producer;publish_item {200 * MS}" in lines and len(lines) == 4


def test_rows_from_the_recorders_samples() -> None:
    """Each wait's waker comes with it: the preempted one (None) is no wakeup; equal rows are summed, and the
    off-CPU samples merge once their wakers no longer tell them apart."""
    waits = [Sample(1, "c", (0,), 5, 2), Sample(1, "c", (0,), 7, 2), Sample(1, "c", (0,), 11, 2)]
    wakers = [Sample(9, "p", (6,), 0, 3), Sample(9, "p", (6,), 0, 3), None]
    assert wakeup_rows(waits, wakers) == [Wakeup(1, "c", (0,), 12, 2, 9, 3, "p", (6,))]
    assert merged_samples(waits) == [Sample(1, "c", (0,), 23, 2)]


def test_refusals_and_round_trip(tmp_path) -> None:
    view, _ = event_record(make_record(), "off-cpu")
    with pytest.raises(OptraceError, match="--event off-cpu or wall"):
        with_wakers(make_record(), "cpu")
    plain = dataclasses.replace(make_record(), meta=dataclasses.replace(
        make_record().meta, off_cpu=dataclasses.replace(make_record().meta.off_cpu, wakers=False)))
    with pytest.raises(OptraceError, match="record with --off-cpu --wakers"):
        with_wakers(plain, "off-cpu")
    path = tmp_path / "w.data"
    write_record(make_record(), path)
    assert read_record(path) == make_record()
    bad = make_record()
    bad.wakeups[1].waker_frames = (4, 99)
    write_record(bad, path)
    with pytest.raises(OptraceError, match=r"wakeups\[1\]\.waker_frames: frame index out of range"):
        read_record(path)
