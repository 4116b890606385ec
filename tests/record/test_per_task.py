"""`record -p` samples through events bound to the target's threads and inherited by what it starts
(bpf/perfevents.py): real BPF, in-process so the test acts at the moment the sampler is attached."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from optrace.bpf.profiler import Profiler
from optrace.frontend.recorder import Recorder, RecordOptions
from optrace.model import Record
from support import bpf_prog_ids, leaf_samples, perf_event_fds

pytestmark = pytest.mark.usefixtures("bpf_ready")


def record_pid(monkeypatch, pid: int, after_attach: Callable[[], None], **options) -> Record:
    """``record -p pid`` in this process; ``after_attach`` runs in a thread as soon as sampling starts."""
    attach = Profiler.attach

    def attach_then_act(self: Profiler) -> None:
        attach(self)
        threading.Thread(target=after_attach, daemon=True).start()

    monkeypatch.setattr(Profiler, "attach", attach_then_act)
    return Recorder(RecordOptions(pids=[pid], **options)).run()


def record_killed_soon(monkeypatch, argv: list[str]) -> tuple[Record, int]:
    """``record -p`` of a command killed 0.1 s after the sampler starts; the record and its exit status."""
    target = subprocess.Popen(argv)
    return record_until_killed(monkeypatch, target), target.returncode


def record_until_killed(monkeypatch, target: subprocess.Popen) -> Record:
    """``record -p`` of a running target, killed 0.1 s after the sampler starts."""
    try:
        return record_pid(monkeypatch, target.pid, lambda: threading.Timer(0.1, target.kill).start(),
                          frequency_hz=4999, duration_s=30)
    finally:
        target.kill()
        target.wait()


def test_everything_is_released_before_the_recording_returns(monkeypatch):
    """The detach runs on a thread while the samples are named (closing tracepoint events waits for RCU);
    run() waits for it: no program, link or perf event of the recording is left in this process."""
    before = (bpf_prog_ids(os.getpid()), perf_event_fds(os.getpid()))
    record, _ = record_killed_soon(monkeypatch, ["sleep", "60"])
    assert record.meta.pids
    assert (bpf_prog_ids(os.getpid()), perf_event_fds(os.getpid())) == before


def test_target_exiting_soon_after_attach_is_named(monkeypatch, workloads):
    """The target's mappings are read before the compile, so samples of a process killed 0.1 s after the
    sampler starts are named (they used to be all [unknown] when it exited within ~0.3 s)."""
    record, status = record_killed_soon(monkeypatch, [str(workloads / "demo"), "60"])
    assert status == -signal.SIGKILL
    leaves = leaf_samples(record, "demo")
    assert sum(leaves.values()) > 0, "no sample in the 0.1 s between attach and exit"
    named = sum(n for name, n in leaves.items() if name in ("hot_a", "hot_b", "lib_burn", "demo::Hasher::mix(double)"))
    assert named >= 0.9 * sum(leaves.values()), leaves
    assert record.meta.duration_s < 5  # the recording ends with its target


def test_library_mapped_after_the_first_look_is_named_when_its_process_is_gone(monkeypatch, workloads):
    """The target maps a library between the look before the program's load and the one after it (the
    load waits for it: a stored program loads in a few milliseconds), then is killed 0.1 s after the
    sampler starts: the library's samples are named from the second look's mappings (the symbolizer used
    to know only the first, so they were [unknown], as in a CI run of the test above)."""
    library = workloads / "libburn.so"
    target = subprocess.Popen([str(workloads / "dlopen-late"), str(library), "0.05", "60"])
    load = Profiler.load

    def load_then_wait_for_the_library(self: Profiler) -> None:
        load(self)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and str(library) not in Path(f"/proc/{target.pid}/maps").read_text():
            time.sleep(0.005)

    monkeypatch.setattr(Profiler, "load", load_then_wait_for_the_library)
    record = record_until_killed(monkeypatch, target)
    leaves = leaf_samples(record, "dlopen-late")
    assert sum(leaves.values()) > 0, "no sample in the 0.1 s between attach and exit"
    assert leaves["lib_burn"] >= 0.9 * sum(leaves.values()), leaves


def test_threads_and_children_started_after_attach_are_sampled(monkeypatch, workloads):
    """The target is idle when the sampler attaches; then it forks a child that starts two threads: the
    events are inherited by both, so the burn is in the profile (and nothing of other processes)."""
    target = subprocess.Popen(["sh", "-c", f"read go; exec {workloads / 'stacks'} 1 2 0 >/dev/null & wait"],
                              stdin=subprocess.PIPE)

    def go() -> None:
        target.stdin.write(b"go\n")
        target.stdin.flush()

    try:
        record = record_pid(monkeypatch, target.pid, go, frequency_hz=499, duration_s=60)
    finally:
        target.kill()
        target.wait()
    leaves = leaf_samples(record, "stacks")
    assert leaves["leaf_burn"] > 0.8 * sum(leaves.values()), leaves  # its main thread only waits
    assert {sample.comm for sample in record.samples} <= {"sh", "stacks"}
