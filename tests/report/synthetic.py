"""A Record with known counts, built in code: the ground truth for the report tests.

demo (pid 100, threads 100 and 101): main -> hot_a (400), main -> hot_b (200), main -> lib_burn in libburn.so (200),
                main -> write -> ksys_write [k] (100)
bash (pid 200): main -> hot_a in /usr/bin/bash (50), a lost stack (50)
Total 1000 samples.

A module of its own (not the conftest) so tests can import it by name: ``from conftest import`` picks
whichever conftest pytest imported first (tests/jit's when both folders are collected).
"""
from __future__ import annotations

from pathlib import Path

from optrace.model import KERNEL_DSO, CallCount, Frame, Record, RecordMeta, Sample
from optrace.recordfile import write_record

DEMO = "/work/main/workloads/build/demo"
LIBBURN = "/work/main/workloads/build/libburn.so"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
BASH = "/usr/bin/bash"

FRAMES = [
    Frame("main", DEMO, address=0x1100),  # 0
    Frame("hot_a", DEMO, address=0x1200),  # 1
    Frame("hot_b", DEMO, address=0x1300),  # 2
    Frame("lib_burn", LIBBURN, address=0x500),  # 3
    Frame("write", LIBC, address=0x9000),  # 4
    Frame("ksys_write", KERNEL_DSO, kind="kernel", address=0xFFFFFFFF81000000),  # 5
    Frame("main", BASH, address=0x2000),  # 6
    Frame("hot_a", BASH, address=0x2100),  # 7
]


def synthetic_record(with_calls: bool = False) -> Record:
    meta = RecordMeta(
        optrace_version="0.1.0", hostname="testhost", kernel="6.18.0", started=1_795_000_000.0,
        duration_s=2.5, frequency_hz=499, event="cpu-clock", command=[DEMO, "3"], exit_status=0,
        total_samples=1000, lost={"user_stack_missing": 3}, warnings=["one test warning"],
    )
    samples = [  # demo has two threads: 100 (hot_a, the write) and 101 (hot_b, lib_burn)
        Sample(100, "demo", (1, 0), 400, tid=100),
        Sample(100, "demo", (2, 0), 200, tid=101),
        Sample(100, "demo", (3, 0), 200, tid=101),
        Sample(100, "demo", (5, 4, 0), 100, tid=100),
        Sample(200, "bash", (7, 6), 50, tid=200),
        Sample(200, "bash", (), 50, tid=200),
    ]
    calls = [CallCount("c:write", LIBC, "write", 0x9000, 1234, {100: 1234})] if with_calls else []
    return Record(meta=meta, frames=list(FRAMES), samples=samples, calls=calls)


def records_whole_stack_formats_refuse(folder: Path) -> tuple[Path, Path]:
    """(a record without samples, one recorded with --no-stacks) written in ``folder``: what the formats of
    whole stacks (pprof, OTLP) refuse in one line."""
    empty, no_stacks = folder / "empty.data", folder / "leaf.data"
    write_record(Record(synthetic_record().meta), empty)
    leaf = synthetic_record()
    leaf.meta.stacks = False
    write_record(leaf, no_stacks)
    return empty, no_stacks
