"""record --off-cpu / --wall end to end on workloads/offcpu.c, whose threads sleep, block on a pipe, wait on
a mutex, wait for the disk in fsync and burn CPU, and print their own blocked, CPU and wall times (real BPF,
needs root).

The machine is shared, so the designed shares are computed from the workload's own timings of this run
(a thread's off-CPU time is its lifetime minus its CPU time): a burner preempted by other work waits in
the run queue, and the mutex waiter waits as long as the lock holder takes to burn its CPU time."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from optrace.bpf.offcpu import WaitOptions
from optrace.bpf.profiler import Profiler
from support import OPTRACE, assert_no_programs_of, assert_one_line_error, run_optrace, wait_perf_events

pytestmark = pytest.mark.usefixtures("bpf_ready")
ROLES = ("sleeper", "pipe_reader", "pipe_writer", "mutex_waiter", "syncer")  # the blocking functions
WAITS_IN = {"syncer": "sync_file"}  # a role whose own clock times only the calls of this function
NS = 1e9


def record(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    """Record the workload; returns the record and the workload's own timings (its last stderr line)."""
    out = tmp_path / "off.data"
    proc = run_optrace("record", "-o", str(out), *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    timings = next(json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{"))
    return out, timings


def report(path: Path, *args: str) -> dict:
    proc = run_optrace("report", "-i", str(path), "--format", "json", *args, check=True)
    return json.loads(proc.stdout)


def designed_off_cpu(timings: dict) -> float:
    """Seconds the workload's threads spent off CPU, by their own clocks."""
    return sum(t["lifetime"] - t["cpu"] for t in timings.values())


def missed_waits(doc: dict) -> int:
    """Waits the record counts as lost because their end was not traced (bpf/offcpu.c: this machine's
    kernel emits no sched_switch when its VM agent's threads leave a CPU)."""
    return doc["meta"]["lost"].get("off_cpu_missed_switch_ins", 0)


def assert_seconds(measured: float, expected: float, doc: dict, scale: float, rel: float, abs_: float) -> None:
    """``measured`` is ``expected`` within the tolerance, or short of it by at most the waits the record
    says it lost, each no longer than the workload's longest (the mutex wait: 1.2 s x scale)."""
    tolerance = max(rel * expected, abs_)
    allowance = missed_waits(doc) * 1.2 * scale
    assert expected - tolerance - allowance <= measured <= expected + tolerance, (measured, expected, allowance)


def seconds_per_thread(doc: dict) -> dict[str, float]:
    """Off-CPU seconds per comm (each of the workload's threads has its own) of a ``--sort comm`` report."""
    assert len({row["comm"] for row in doc["rows"]}) == len(doc["rows"]), "one row per comm"
    return {row["comm"]: row["nanoseconds"] / NS for row in doc["rows"]}


@pytest.fixture(scope="module")
def off_cpu_run(bpf_ready, tmp_path_factory, workloads) -> tuple[Path, dict]:
    """One `record --off-cpu -- offcpu 0.5` and the workload's own timings, for the tests that only read it."""
    return record(tmp_path_factory.mktemp("off-cpu"), "--off-cpu", "--", str(workloads / "offcpu"), "0.5")


def test_blocking_functions_share_of_off_cpu_time(off_cpu_run):
    data, timings = off_cpu_run
    doc = report(data, "--event", "off-cpu", "--children", "--sort", "symbol")
    assert (doc["report"]["event"], doc["report"]["unit"]) == ("off-cpu", "nanoseconds")
    total = doc["report"]["total"]
    assert_seconds(total / NS, designed_off_cpu(timings), doc, 0.5, rel=0.1, abs_=0)
    by_symbol = {row["symbol"]: row for row in doc["rows"]}
    missed_points = 100 * missed_waits(doc) * 1.2 * 0.5 / designed_off_cpu(timings)
    for role in ROLES:
        designed = 100 * timings[role]["blocked"] / designed_off_cpu(timings)
        row = by_symbol[WAITS_IN.get(role, role)]
        assert row["children_percent"] == pytest.approx(designed, abs=5 + missed_points), role
        assert_seconds(row["children"] / NS, timings[role]["blocked"], doc, 0.5, rel=0.05, abs_=0.02)
    threads = {row["comm"]: row for row in report(data, "--event", "off-cpu", "--sort", "comm,tid")["rows"]}
    for role in ("sleeper", "pipe_reader", "pipe_writer", "mutex_waiter", "lock_holder", "syncer", "burner"):
        own = timings[role]["lifetime"] - timings[role]["cpu"]
        assert_seconds(threads[role]["nanoseconds"] / NS, own, doc, 0.5, rel=0.05, abs_=0.03)
        assert threads[role]["tid"] > 0


def test_state_filter_keeps_only_that_state(tmp_path, workloads):
    """Sleeping keeps the blocked roles and drops the burner's run-queue waits; running the reverse."""
    data, timings = record(tmp_path, "--off-cpu", "--state", "sleeping", "--", str(workloads / "offcpu"), "0.3")
    doc = report(data, "--event", "off-cpu", "--sort", "comm")
    threads = seconds_per_thread(doc)
    assert_seconds(threads["mutex_waiter"], timings["mutex_waiter"]["blocked"], doc, 0.3, rel=0.05, abs_=0.02)
    assert threads.get("burner", 0) < 0.02
    data, timings = record(tmp_path, "--off-cpu", "--state", "running", "--", str(workloads / "offcpu"), "0.3")
    doc = report(data, "--event", "off-cpu", "--sort", "comm")
    threads = seconds_per_thread(doc)
    assert threads.get("mutex_waiter", 0) < 0.02
    assert threads.get("sleeper", 0) < 0.02
    burner_waits = timings["burner"]["lifetime"] - timings["burner"]["cpu"]
    assert_seconds(threads.get("burner", 0), burner_waits, doc, 0.3, rel=0.1, abs_=0.03)


def test_disk_state_keeps_the_fsync_waits(tmp_path, workloads):
    """--state disk: the syncer's waits in fsync (state D, for the disk) are kept, under its own sync_file and
    the kernel's fsync; the sleeping roles' waits are not."""
    data, timings = record(tmp_path, "--off-cpu", "--state", "disk", "--", str(workloads / "offcpu"), "0.3")
    doc = report(data, "--event", "off-cpu", "--children", "--sort", "comm,symbol")
    rows = {(row["comm"], row["symbol"]): row["children"] / NS for row in doc["rows"]}
    assert timings["syncer"]["blocked"] > 0.01, timings["syncer"]  # else the disk did not wait: proves nothing
    assert_seconds(rows[("syncer", "sync_file")], timings["syncer"]["blocked"], doc, 0.3, rel=0.2, abs_=0.02)
    assert rows.get(("syncer", "__x64_sys_fsync"), 0) >= 0.8 * rows[("syncer", "sync_file")]
    assert not [key for key in rows if key[0] in ("mutex_waiter", "sleeper", "pipe_reader")], rows


def test_min_block_drops_shorter_waits(tmp_path, workloads):
    """At scale 0.3 the sleeper's waits are 15 ms each, the mutex wait far longer: --min-block 50000 (50 ms).
    A wait lasts until the thread runs again: on a loaded machine (load 60 on 2 CPUs here) a 15 ms sleep
    can last 50 ms, and a runnable thread can wait a second for a CPU, so what the sleeper keeps is bounded
    by its own off-CPU time, and the dropped waits are counted."""
    data, timings = record(tmp_path, "--off-cpu", "--min-block", "50000", "--", str(workloads / "offcpu"), "0.3")
    doc = report(data, "--event", "off-cpu", "--sort", "comm")
    threads = seconds_per_thread(doc)
    sleeper = timings["sleeper"]
    assert threads.get("sleeper", 0) <= sleeper["lifetime"] - sleeper["cpu"] + 0.01
    assert_seconds(threads["mutex_waiter"], timings["mutex_waiter"]["blocked"], doc, 0.3, rel=0.05, abs_=0.02)
    assert doc["meta"]["off_cpu"]["min_block_us"] == 50000
    assert doc["meta"]["off_cpu"]["short_waits"] >= 5


def test_user_stacks_only(tmp_path, workloads):
    """--off-cpu-user-stacks: no kernel frame in any off-CPU stack, the same time per thread."""
    data, timings = record(tmp_path, "--off-cpu", "--off-cpu-user-stacks", "--", str(workloads / "offcpu"), "0.3")
    folded = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--format", "folded", check=True).stdout
    assert folded.count("\n") > 3 and "_[k]" not in folded
    doc = report(data, "--event", "off-cpu", "--sort", "comm")
    threads = seconds_per_thread(doc)
    assert_seconds(threads["mutex_waiter"], timings["mutex_waiter"]["blocked"], doc, 0.3, rel=0.05, abs_=0.02)
    assert doc["meta"]["off_cpu"]["kernel_stacks"] is False


SLEEPS = """
import json, sys, threading, time
total, count = 0.0, int(sys.argv[1])
for _ in range(count):
    start = time.perf_counter()
    time.sleep(0.0005)
    total += time.perf_counter() - start
print(json.dumps({"tid": threading.get_native_id(), "slept": total}), file=sys.stderr)
"""


def test_one_wait_in_n_estimates_the_time(tmp_path):
    """--off-cpu-every 8 on Debian's python3 sleeping 2000 x 0.5 ms: about 250 waits recorded, each counted 8
    times (so every sum is a multiple of 8 ns), its time in the kernel's do_nanosleep estimated within 25 % of
    the sleeps' own clock (4 standard deviations of the estimate for 2000 equal waits sampled at 1/8; the
    thread's other waits, few and long, are left out of the comparison: one such wait, picked, counts 8x)."""
    script = tmp_path / "sleeps.py"
    script.write_text(SLEEPS)
    data, timings = record(tmp_path, "--off-cpu", "--off-cpu-every", "8", "--", "python3", str(script), "2000")
    doc = report(data, "--event", "off-cpu", "--children", "--sort", "symbol", "--tid", str(timings["tid"]))
    assert doc["meta"]["off_cpu"]["every"] == 8
    sleeps = next(row for row in doc["rows"] if row["symbol"] == "do_nanosleep")
    assert sleeps["children"] / NS == pytest.approx(timings["slept"], rel=0.25)
    folded = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--format", "folded", check=True).stdout
    counts = [int(line.rsplit(" ", 1)[1]) for line in folded.splitlines() if line and not line.startswith("#")]
    assert len(counts) >= 3 and all(count % 8 == 0 for count in counts), counts
    table = run_optrace("report", "-i", str(data), "--event", "off-cpu", check=True).stdout
    assert "One wait in 8 recorded" in table


def test_wall_splits_on_and_off_cpu_as_designed(tmp_path, workloads):
    data, timings = record(tmp_path, "--wall", "-F", "999", "--", str(workloads / "offcpu"), "0.5")
    doc = report(data, "--event", "wall", "--children", "--sort", "symbol")
    parts = doc["report"]["parts"]
    on_share = 100 * parts["on-cpu"] / (parts["on-cpu"] + parts["off-cpu"])
    designed = 100 * sum(t["cpu"] for t in timings.values()) / sum(t["lifetime"] for t in timings.values())
    assert on_share == pytest.approx(designed, abs=5)
    by_symbol = {row["symbol"]: row for row in doc["rows"]}
    burner_life = timings["burner"]["lifetime"]  # on CPU and waiting for it: the thread's whole life
    assert_seconds(by_symbol["burner"]["children"] / NS, burner_life, doc, 0.5, rel=0.1, abs_=0)


def test_text_report_prints_human_times(tmp_path, off_cpu_run):
    data, _ = off_cpu_run
    text = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--sort", "comm", check=True).stdout
    assert "# Time: " in text and "of event 'off-cpu'" in text
    line = next(line for line in text.splitlines() if line.rstrip().endswith("mutex_waiter"))
    percent, value, unit = line.split()[:3]
    assert percent.endswith("%") and unit in ("ms", "s"), line
    folded = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--format", "folded", check=True).stdout
    assert folded.splitlines()[0] == "# optrace folded stacks: event off-cpu, unit nanoseconds"
    assert any(line.startswith("mutex_waiter;") and ";mutex_waiter;" in line for line in folded.splitlines())
    pprof = tmp_path / "off.pb.gz"
    run_optrace("report", "-i", str(data), "--event", "off-cpu", "--format", "pprof", "-o", str(pprof), check=True)
    if shutil.which("go"):  # as people read it: go tool pprof
        raw = subprocess.run(["go", "tool", "pprof", "-raw", str(pprof)], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        assert "PeriodType: off_cpu nanoseconds" in raw and "off_cpu/nanoseconds[dflt]" in raw


def test_pid_and_system_wide(tmp_path):
    """-p measures a running process (cat, blocked on its stdin between our writes); -a sees it among the rest."""
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.1):
            child.stdin.write(b"x\n")
            child.stdin.flush()

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        out = tmp_path / "p.data"
        run_optrace("record", "--off-cpu", "-d", "2", "-o", str(out), "-p", str(child.pid), check=True)
        doc = report(out, "--event", "off-cpu", "--children", "--sort", "pid,comm,symbol")
        assert {row["pid"] for row in doc["rows"]} == {child.pid}
        reads = [row for row in doc["rows"] if row["symbol"] == "anon_pipe_read"]
        assert reads and reads[0]["children_percent"] > 90
        out = tmp_path / "a.data"
        run_optrace("record", "--off-cpu", "-d", "2", "-o", str(out), "-a", check=True)
        pids = {row["pid"] for row in report(out, "--event", "off-cpu", "--sort", "pid")["rows"]}
        assert child.pid in pids and len(pids) > 3
    finally:
        stop.set()
        feeder.join()
        child.stdin.close()
        child.wait()


def test_signal_mid_record_detaches(tmp_path, workloads):
    out = tmp_path / "sig.data"
    proc = subprocess.Popen([str(OPTRACE), "record", "--off-cpu", "-o", str(out), "--", str(workloads / "offcpu"),
                             "20"], stderr=subprocess.PIPE, text=True)
    wait_perf_events(proc.pid, 1, timeout=120)  # attached: mid-record (a fixed 5 s before, whatever the compile took)
    time.sleep(1)  # a drain or so of waits recorded
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert report(out, "--event", "off-cpu")["report"]["total"] > 0
    assert_no_programs_of(proc.pid, "on_switch_in")
    assert_no_programs_of(proc.pid, "on_switch_out")
    assert_no_programs_of(proc.pid, "on_sample")


def test_bad_flags(tmp_path):
    out = str(tmp_path / "x.data")
    assert_one_line_error(run_optrace("record", "-o", out, "--off-cpu", "--no-stacks", "-a"), "needs stacks")
    assert_one_line_error(run_optrace("record", "-o", out, "--off-cpu", "--min-block", "-1", "-a"), "--min-block")
    assert_one_line_error(run_optrace("record", "-o", out, "--min-block", "5", "-a"), "need --off-cpu")
    assert_one_line_error(run_optrace("record", "-o", out, "--off-cpu-user-stacks", "-a"), "need --off-cpu")
    assert_one_line_error(run_optrace("record", "-o", out, "--off-cpu", "--state", "zombie", "-a"), "--state")
    assert_one_line_error(run_optrace("record", "-o", out, "--off-cpu", "--off-cpu-every", "0", "-a"), "--off-cpu-every")
    assert_one_line_error(run_optrace("record", "-o", out, "--off-cpu-every", "4", "-a"), "need --off-cpu")
    assert not Path(out).exists()


def test_report_of_a_cpu_only_record_refuses_off_cpu(tmp_path, workloads):
    out = tmp_path / "cpu.data"
    run_optrace("record", "-o", str(out), "--", "true", check=True)
    assert_one_line_error(run_optrace("report", "-i", str(out), "--event", "off-cpu"), "--off-cpu")
    assert_one_line_error(run_optrace("report", "-i", str(out), "--event", "cycles"), "--event")


def test_a_target_and_its_children_waits_are_counted_nobody_elses():
    """The context-switch events bound to a target's threads are inherited: a target's waits and its
    children's are counted, nobody else's."""
    target = subprocess.Popen(["sh", "-c", "read line; sleep 0.3; sleep 0.3"], stdin=subprocess.PIPE)
    profiler = Profiler(99, pids=[target.pid], cfi_unwind=True, waits=WaitOptions())
    try:
        profiler.load()
        profiler.attach()
        target.communicate(b"go\n", timeout=60)
        samples = profiler.drain().off_cpu
    finally:
        profiler.close()
    waited: Counter[int] = Counter()
    for sample in samples:
        waited[sample.pid] += sample.count
    children = {pid: ns / NS for pid, ns in waited.items() if pid != target.pid}
    assert len(children) == 2 and all(0.29 <= seconds <= 3 for seconds in children.values()), children
    assert waited[target.pid] / NS >= 0.59  # the shell waits for each sleep
    assert all(sample.comm in ("sh", "sleep") for sample in samples)


def test_a_wait_longer_than_the_stack_stores_epochs_keeps_its_stacks(tmp_path, workloads):
    """A 4 s sleep while workloads/stacks makes the store turn over at every drain (256 stacks): the wait's
    records are kept while it is open (bpf/offcpu.py open_stacks), so its time comes with its stacks."""
    out = tmp_path / "long.data"
    run_optrace("record", "--off-cpu", "-F", "999", "--stack-storage-size", "256", "-o", str(out), "--", "sh", "-c",
                f"{workloads / 'stacks'} 5 & sleep 4; wait", check=True, timeout=120)
    doc = report(out, "--event", "off-cpu", "--children", "--sort", "comm,symbol")
    sleeps = {row["symbol"]: row["children"] / NS for row in doc["rows"] if row["comm"] == "sleep"}
    assert sleeps.get("do_nanosleep", 0) >= 3.5 and sleeps.get("clock_nanosleep", 0) >= 3.5, sleeps
