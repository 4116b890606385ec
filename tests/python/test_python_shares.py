"""Issue 33's ground truth: workloads/pyground.py (timed phases, a C builtin calling back into Python, two
threads) recorded with ``optrace record -p`` while py-spy samples the same process over the same window, on
Debian's python3.11, each pyenv CPython 3.8-3.13 and Debian sid's 3.14 and 3.15 (in a container root), started
without a flag.

Each function's inclusive share (the samples whose stack holds it, over the process's samples) is within
3 points of the design, the workload's own account of its threads' CPU time between two marks around
py-spy's window (tokenize, encode_all, decode_all, checksum), and of py-spy's figure (those and ``rank``,
which only py-spy gives); >= 98 % of the samples have complete stacks, from the thread's root through
the Python frames.

py-spy samples by the wall clock and counts a thread as active when the kernel says it is runnable
(3.11+), or unless its Python frame is a known wait (3.8-3.10 with ``--nonblocking``, which cannot tell
the OS thread there): a thread's time waiting for a CPU is in py-spy's profile and not in a CPU
profiler's. Measured here under other work (load 3, Dec 4): the checksum thread waited for a CPU 0.8 s per
second of its CPU time and py-spy gave it 30 % where it had 24 % of the CPU (optrace 23.5 %); the main
thread was preempted mostly at the system call of ``time.thread_time()`` (a return to user space), so
py-spy moved 5 points of ``rank`` to the line of ``encode_all`` that calls it, where perf with 3.12's
``-X perf`` trampolines gave rank 20.4 % as optrace did (py-spy: 15.8 %). So the workload and both
profilers run ahead of the machine's other work (nice -20 autogroups: without, py-spy, whose samples waited
for a CPU that a busy checksum thread left free, had checksum at 16.5 % where it had 23.9 % on 3.11), and
optrace's shares are compared with py-spy's as py-spy counts: each thread's samples weighed by the time it
was runnable per second on a CPU over the window (/proc/PID/task/TID/schedstat). The weighing assumes that a
thread's waits fall on its functions evenly, so a window where a thread waited more than MAX_CPU_WAIT per
second of CPU fails as too busy. Even first in line, the checksum thread waited 0.13-0.26 s per second of
CPU here (load 2-5): raw, py-spy's checksum was 2.3-3.2 points above optrace's; weighed, within 0.6. py-spy
samples at SPY_HZ for WINDOW_S: at 99 Hz a share of 25 % moves by 1.7 points (two standard deviations) from
one window to the next, too close to 3 points to tell a fault from chance.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from groundtruth import (DESIGNED, NAMED, PYGROUND, Stacks, design_between, has_pyground_frame, inclusive,
                         parse_folded)
from pythons import SID, SUPPORTED, command
from support import OPTRACE, first_in_line, python_walker_pids, run_optrace, wait_perf_events

pytestmark = [pytest.mark.usefixtures("bpf_ready"), pytest.mark.slow]

PY_SPY = Path(sys.executable).parent / "py-spy"
OPTRACE_HZ = 999
SPY_HZ = 333
WINDOW_S = 20
POINTS = 3.0  # the tolerance, in percentage points
MAX_CPU_WAIT = 0.5  # seconds a thread may wait for a CPU per second of CPU for py-spy's figures to count
COMPLETE = 0.98
ROOTS = ("_start", "clone3", "clone")  # a thread's outermost frame
# sid's interpreters run in a container root whose libc is not at the path the host sees: its clone3 is named
# by file offset (issue 43's container names), the stack still complete
SID_ROOTS = r"_start|clone3|clone|libc\.so\.6\+0x[0-9a-f]+"


@dataclass(frozen=True)
class Window:
    """One run of the workload, sampled by both tools."""

    version: str
    optrace: dict[str, float]  # inclusive share, percent of the process's samples
    py_spy: dict[str, float]
    design: dict[str, float]  # percent of the workload's CPU time between the marks
    samples: int
    spy_samples: int
    meta: dict
    stacks: Stacks  # optrace's folded stacks, comm first
    cpu_wait: dict[int, float]  # thread -> seconds waiting for a CPU per second on one, over the window
    main_thread: int
    spy_output: str

    def as_py_spy_counts(self) -> dict[str, float]:
        """optrace's shares with each thread's samples weighed by the seconds it was runnable (on a CPU or
        waiting for one) per second on a CPU: what py-spy's figures estimate. checksum is the other thread's."""
        main = 1 + self.cpu_wait.get(self.main_thread, 0.0)
        worker = 1 + max((wait for tid, wait in self.cpu_wait.items() if tid != self.main_thread), default=0.0)
        weight = {name: worker if name == "checksum" else main for name in NAMED}
        total = (100 - self.optrace["checksum"]) * main + self.optrace["checksum"] * worker
        return {name: 100 * self.optrace[name] * weight[name] / total for name in NAMED}

    def describe(self) -> str:
        counted = self.as_py_spy_counts()
        rows = [f"{name:10s} optrace {self.optrace[name]:5.1f} (as py-spy counts {counted[name]:5.1f})  "
                f"py-spy {self.py_spy[name]:5.1f}  design {self.design.get(name, float('nan')):5.1f}"
                for name in NAMED]
        waits = ", ".join(f"{tid}: {wait:.2f}" for tid, wait in self.cpu_wait.items())
        return (f"python {self.version}: {self.samples} samples, py-spy {self.spy_samples}; waits for a CPU per "
                f"second of CPU {{{waits}}}\n" + "\n".join(rows) + f"\npy-spy said: {self.spy_output[-800:]}")



def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """thread -> (ns on a CPU, ns waiting on a run queue for one)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            on_cpu, waiting, _ = map(int, (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        found[int(task.name)] = (on_cpu, waiting)
    return found


def cpu_waits(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> dict[int, float]:
    return {tid: (after[tid][1] - before[tid][1]) / max(1, after[tid][0] - before[tid][0])
            for tid in before if tid in after}


def wait_walker(recorder: subprocess.Popen, pid: int, timeout: float = 120) -> None:
    """Until the recorder samples (its perf events are open) and its Python walker expands ``pid``."""
    wait_perf_events(recorder.pid, 1, timeout)
    deadline = time.monotonic() + timeout
    while pid not in python_walker_pids(recorder.pid):
        assert recorder.poll() is None, recorder.stderr.read()
        assert time.monotonic() < deadline, f"optrace's Python walker never took pid {pid}"
        time.sleep(0.1)


def wait_threads(pid: int, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(list(Path(f"/proc/{pid}/task").iterdir())) < count:
        assert time.monotonic() < deadline, f"pid {pid} never ran {count} threads"
        time.sleep(0.05)


def measure(version: str, tmp: Path) -> Window:
    """The workload, then optrace on it, then a mark, py-spy for WINDOW_S, a mark; then both stopped."""
    python = command(version)
    if not PY_SPY.exists():
        pytest.skip("py-spy is not installed (it is in the [test] extras)")
    report, data, spied = tmp / "shares.json", tmp / "py.data", tmp / "py-spy.txt"
    work = subprocess.Popen([*python, str(PYGROUND), "--seconds", "600", "--report", str(report)],
                            preexec_fn=first_in_line)
    recorder = None
    try:
        wait_threads(work.pid, 2)
        recorder = subprocess.Popen([str(OPTRACE), "record", "-F", str(OPTRACE_HZ), "-p", str(work.pid),
                                     "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=first_in_line)
        wait_walker(recorder, work.pid)
        before = schedstat(work.pid)
        work.send_signal(signal.SIGUSR1)
        spy = subprocess.run([str(PY_SPY), "record", "-p", str(work.pid), "--nonblocking", "--format", "raw",
                              "-r", str(SPY_HZ), "-d", str(WINDOW_S), "-o", str(spied)],
                             capture_output=True, text=True, timeout=WINDOW_S + 60, preexec_fn=first_in_line)
        work.send_signal(signal.SIGUSR1)
        after = schedstat(work.pid)
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=120)
        assert recorder.returncode == 0, err
        assert spy.returncode == 0, spy.stdout + spy.stderr
        work.send_signal(signal.SIGTERM)
        assert work.wait(timeout=60) == 0
    finally:
        for proc in (work, recorder):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    stacks = parse_folded(run_optrace("report", "-i", str(data), "--format", "folded", check=True).stdout)
    meta = json.loads(run_optrace("report", "-i", str(data), "--format", "json", check=True).stdout)["meta"]
    mine, samples = inclusive(stacks)
    theirs, spy_samples = inclusive(parse_folded(spied.read_text()))
    return Window(version, mine, theirs, design_between(report), samples, spy_samples, meta, stacks,
                  cpu_waits(before, after), work.pid, spy.stdout + spy.stderr)


@pytest.fixture(scope="module")
def windows() -> dict[str, Window]:
    return {}


@pytest.fixture(params=SUPPORTED)
def window(request, windows, tmp_path_factory) -> Window:
    """One measured run per interpreter, shared by the tests below."""
    version = request.param
    if version not in windows:
        windows[version] = measure(version, tmp_path_factory.mktemp(f"shares-{version}"))
        print(f"\nFIGURES {windows[version].describe()}")
    return windows[version]


def test_shares_match_the_design(window: Window) -> None:
    off = {name: window.optrace[name] - window.design[name] for name in DESIGNED}
    assert all(abs(points) <= POINTS for points in off.values()), window.describe()


def test_shares_match_py_spy_on_the_same_run(window: Window) -> None:
    busy = {tid: round(wait, 2) for tid, wait in window.cpu_wait.items() if wait > MAX_CPU_WAIT}
    assert not busy, (f"the machine was too busy to compare with py-spy: threads waited for a CPU {busy} s per "
                      f"second of CPU (py-spy counts that time, a CPU profiler does not)\n{window.describe()}")
    assert window.spy_samples >= SPY_HZ * WINDOW_S, window.describe()
    counted = window.as_py_spy_counts()
    off = {name: counted[name] - window.py_spy[name] for name in NAMED}
    assert all(abs(points) <= POINTS for points in off.values()), window.describe()


def test_stacks_complete_through_the_python_frames(window: Window) -> None:
    """stack_quality says complete for >= 98 % of the samples, and as many reach a thread's root with
    pyground's Python frames in them."""
    quality = window.meta["stack_quality"]
    assert quality.get("complete", 0) >= COMPLETE * sum(quality.values()), quality
    roots = re.compile(SID_ROOTS if window.version in SID else "|".join(ROOTS))
    through = sum(count for frames, count in window.stacks
                  if roots.fullmatch(frames[1]) and has_pyground_frame(frames))
    assert through >= COMPLETE * window.samples, (through, window.samples, window.meta["runtimes"]["cpython"]["samples"])
