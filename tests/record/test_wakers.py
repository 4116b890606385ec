"""record --off-cpu --wakers end to end (real BPF, needs root): each wait that slept joined to the stacks of the
thread that woke it, walked by the CFI walker (and its Python frames) at the wake-up (bpf/wakers.c).

Ground truths: workloads/wakeups.c (built without frame pointers) hands items over from publish_item and
bytes from write_byte; workloads/pywakeups.py hands items over from the Python function hand_over. Each
consumer measures its own blocked time; the tests compare the record's joined stacks with it."""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from optrace.bpf.offcpu import WaitOptions
from optrace.bpf.profiler import Profiler
from support import assert_one_line_error, run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")
NS = 1e9
PYTHON = "/usr/bin/python3.11"  # Debian's, without frame pointers


def record(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    out = tmp_path / "wakers.data"
    proc = run_optrace("record", "-o", str(out), *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, next(json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{"))


def joined(path: Path, *args: str) -> list[tuple[list[str], list[str], int]]:
    """report --wakers --format folded as (blocked frames from the root, waker frames from the wake-up, ns)."""
    text = run_optrace("report", "-i", str(path), "--event", "off-cpu", "--wakers", "--format", "folded", *args,
                       check=True).stdout
    stacks = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            cut = frames.index("--")
            stacks.append((frames[1:cut], frames[cut + 1:], int(count)))
    return stacks


def share_woken_by(stacks, blocked_in: str, woken_by: str) -> tuple[float, float]:
    """The seconds of the waits in ``blocked_in`` and the share of them whose waker's stack holds ``woken_by``."""
    waits = [(waker, ns) for blocked, waker, ns in stacks if blocked_in in blocked]
    total = sum(ns for _, ns in waits)
    by = sum(ns for waker, ns in waits if woken_by in waker)
    return total / NS, by / total if total else 0.0


@pytest.fixture(scope="module")
def c_run(bpf_ready, tmp_path_factory, workloads) -> tuple[Path, dict]:
    return record(tmp_path_factory.mktemp("wakers"), "--off-cpu", "--wakers", "--", str(workloads / "wakeups"),
                  "0.5", "80")


def test_consumers_are_joined_to_the_producer_functions_that_woke_them(c_run):
    """>= 90 % of each consumer's blocked time joined to its producer's handing-over function, whose stack
    (publish_item, producer, start_thread: no frame pointers) only a CFI walk of the waker finds; the time is
    the consumer's own measure of it."""
    data, timings = c_run
    stacks = joined(data)
    seconds, share = share_woken_by(stacks, "take_item", "publish_item")
    assert share >= 0.9, (seconds, share)
    assert seconds == pytest.approx(timings["consumer"]["blocked"], rel=0.1)
    seconds, share = share_woken_by(stacks, "read_byte", "write_byte")
    assert share >= 0.9, (seconds, share)
    assert seconds == pytest.approx(timings["pipe_consumer"]["blocked"], rel=0.1)
    whole = [waker for blocked, waker, _ in stacks if "take_item" in blocked and "publish_item" in waker]
    assert all(waker[-4:] == ["producer", "start_thread", "clone3", "producer"] for waker in whole), whole[:3]


def test_waker_stacks_in_every_format(c_run, tmp_path):
    """The joined stacks are the report's samples: the table names each waker's command, pprof and the flame
    graph hold the producer's function; without --wakers the off-CPU view is what it was."""
    data, _ = c_run
    table = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--wakers", check=True).stdout
    assert "# Wakers: " in table
    assert any(line.split()[-3:] == ["[waker]", "[.]", "producer"] for line in table.splitlines()), table
    pprof = tmp_path / "w.pb.gz"
    run_optrace("report", "-i", str(data), "--event", "off-cpu", "--wakers", "--format", "pprof", "-o", str(pprof),
                check=True)
    from optrace.exporters.pprofproto import profile_pb2
    import gzip

    profile = profile_pb2.Profile()
    profile.ParseFromString(gzip.decompress(pprof.read_bytes()))
    names = {profile.string_table[f.name] for f in profile.function}
    assert {"publish_item", "take_item", "--"} <= names
    graph = tmp_path / "w.html"
    run_optrace("report", "-i", str(data), "--event", "off-cpu", "--wakers", "--format", "flamegraph", "-o",
                str(graph), check=True)
    assert "publish_item" in graph.read_text()
    plain = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--format", "folded", check=True).stdout
    assert "--" not in plain.split(";") and "take_item" in plain


def test_a_python_waker_is_named_in_python(tmp_path, workloads):
    """Debian's python3.11 (no frame pointers): the consumer thread's waits for an item (in the queue's lock)
    are joined to the Python function hand_over for >= 90 % of their time (the waker's Python frames, walked at
    the wake-up); its waits for the GIL (in take_gil, which times out at the switch interval) are woken by
    the producer's Python code (burn releasing the GIL) or by that timer (most of their time: a wake-up may
    go unseen). Together they are the time its own clock measured in queue.get."""
    data, timings = record(tmp_path, "--off-cpu", "--wakers", "--", PYTHON, str(workloads.parent / "pywakeups.py"),
                           "150")
    stacks = joined(data, "--tid", str(timings["consumer"]["tid"]))
    waits = [(waker, ns) for blocked, waker, ns in stacks if "take_gil" not in blocked]
    gil = [(waker, ns) for blocked, waker, ns in stacks if "take_gil" in blocked]
    seconds = sum(ns for _, ns in waits) / NS
    by = sum(ns for waker, ns in waits if any(f.startswith("hand_over (") for f in waker)) / NS
    assert by >= 0.9 * seconds, (by, seconds, timings)
    producer = sum(ns for w, ns in gil if w[-1] == "[interrupt]" or any(f.startswith("produce (") for f in w))
    assert producer >= 0.75 * sum(ns for _, ns in gil), [(";".join(w[-8:]), ns) for w, ns in gil]
    total = seconds + sum(ns for _, ns in gil) / NS
    assert total == pytest.approx(timings["consumer"]["blocked"], rel=0.15)


def test_a_waker_storm_costs_counted_waits_not_memory(workloads):
    """Two threads passing a byte 20,000 times, with room for 16 distinct wakeups a drain: the rest are
    counted as lost (wakeup_counts_map_full), none is kept beyond the maps' bounds."""
    child = subprocess.Popen(["sh", "-c", f"read line; exec {workloads / 'pingpong'} 20000"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL)
    profiler = Profiler(99, pids=[child.pid], cfi_unwind=True, waits=WaitOptions(wakers=True, counts_size=16))
    try:
        profiler.load()
        profiler.attach()
        child.communicate(b"go\n", timeout=120)
        drained = profiler.drain()
    finally:
        profiler.close()
    assert drained.off_cpu_lost.get("wakeup_counts_map_full", 0) > 100, drained.off_cpu_lost
    assert 0 < len(drained.off_cpu) <= 16
    wakers = Counter(s.waker.comm for s in drained.off_cpu if s.waker is not None)
    assert wakers, drained.off_cpu


def test_bad_uses(tmp_path, c_run):
    data, _ = c_run
    assert_one_line_error(run_optrace("record", "-o", str(tmp_path / "x.data"), "--wakers", "-a"), "need --off-cpu")
    assert_one_line_error(run_optrace("report", "-i", str(data), "--event", "cpu", "--wakers"), "--event off-cpu")
    plain = tmp_path / "plain.data"
    run_optrace("record", "--off-cpu", "-o", str(plain), "--", "true", check=True)
    assert_one_line_error(run_optrace("report", "-i", str(plain), "--event", "off-cpu", "--wakers"),
                          "record with --off-cpu --wakers")
