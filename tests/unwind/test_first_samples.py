"""Complete from the first sample (issue 34): a sample of a process whose unwind table is not loaded yet
keeps its user registers and a copy of its stack (bpf/stackcopy.c), walked in user space once the table
is there (frontend/unwind/copies.py). Each binary is compiled fresh (a build-id no stored table has) and
run while every CPU is busy, where its table comes late: before the copies, a fresh 0.8 s binary recorded
with ``-- CMD`` had 86 % complete stacks, and short-lived processes of an ``-a`` recording kept a frame or
two until their table came (most of them never had one)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from optrace.frontend.unwind.quality import THREAD_ROOTS
from optrace.recordfile import read_record
from support import OPTRACE, REPO, run_optrace, running, wait_perf_events

pytestmark = pytest.mark.usefixtures("bpf_ready")

# hot_leaf burns CPU five calls below main: every sample in it has a known, complete stack
FRESH = """#include <stdlib.h>
#include "burn.h"
BURN_FUNCTION(hot_leaf)
static volatile unsigned salt = SALT;
__attribute__((noinline)) void mid(int depth, double seconds)
{
    if (depth)
        mid(depth - 1, seconds);
    else
        hot_leaf(seconds);
    salt++;
}
int main(int argc, char **argv)
{
    mid(5, argc > 1 ? atof(argv[1]) : 0.8);
    return 0;
}
"""


@pytest.fixture
def hogs() -> Iterator[None]:
    """A CPU hog on every CPU for the test's duration."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def fresh_binary(tmp_path: Path, name: str) -> Path:
    """FRESH built -O2 without frame pointers, with a salt of its own: a build-id never seen before."""
    source, binary = tmp_path / f"{name}.c", tmp_path / name
    source.write_text(FRESH)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", f"-DSALT={random.getrandbits(31)}",
                    f"-I{REPO / 'workloads'}", "-o", str(binary), str(source)], check=True, capture_output=True)
    return binary


def hot_leaf_stacks(record_path: Path, comm: str) -> tuple[int, int]:
    """(complete, all) of ``comm``'s samples in hot_leaf: complete when the outermost user frame is a
    thread's root."""
    record = read_record(record_path)
    complete = total = 0
    for sample in record.samples:
        user = [record.frames[i] for i in sample.frames if not record.frames[i].kernel]
        if sample.comm != comm or not user or user[0].symbol != "hot_leaf":
            continue
        total += sample.count
        complete += sample.count if user[-1].symbol in THREAD_ROOTS else 0
    return complete, total


def test_a_fresh_command_is_complete_from_its_first_sample(tmp_path, hogs):
    binary = fresh_binary(tmp_path, "fresh")
    out = tmp_path / "fresh.data"
    run_optrace("record", "-F", "999", "-o", str(out), "--", str(binary), "0.8", check=True, timeout=180)
    meta = json.loads(run_optrace("report", "-i", str(out), "--format", "json", check=True).stdout)["meta"]
    quality = meta["stack_quality"]
    assert quality.get("complete", 0) >= 0.98 * sum(quality.values()), quality
    complete, total = hot_leaf_stacks(out, "fresh")
    assert total >= 300 and complete >= 0.98 * total, (complete, total)


def test_short_lived_processes_are_complete_in_a_whole_machine_recording(tmp_path, hogs):
    """30 processes of 30 ms CPU each, one after the other: each one's table is read only once its first
    samples are taken (their copies ask for it), and it may be gone before the table is built."""
    binary = fresh_binary(tmp_path, "shortfresh")
    out = tmp_path / "short.data"
    with running([str(OPTRACE), "record", "-a", "-F", "999", "-d", "60", "-o", str(out)]) as recorder:
        wait_perf_events(recorder.pid, os.cpu_count() or 1)
        for _ in range(30):
            subprocess.run([str(binary), "0.03"], check=True, timeout=60)
        recorder.send_signal(signal.SIGINT)
        assert recorder.wait(timeout=120) == 0
    complete, total = hot_leaf_stacks(out, "shortfresh")
    assert total >= 300 and complete >= 0.9 * total, (complete, total)
