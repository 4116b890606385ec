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
from support import bpf_prog_ids, cpu_seconds, leaf_samples, perf_event_fds, running

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


BPF_ENABLE_STATS, BPF_OBJ_GET_INFO_BY_FD, SYS_BPF = 32, 15, 321


def program_runs(prog_fd: int) -> int:
    """How many times a BPF program ran (struct bpf_prog_info's run_cnt, counted while stats are on)."""
    import ctypes

    info = ctypes.create_string_buffer(232)
    attr = ctypes.create_string_buffer(16)
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(prog_fd, len(info)), 8)
    ctypes.memmove(ctypes.addressof(attr) + 8, ctypes.byref(ctypes.c_uint64(ctypes.addressof(info))), 8)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_BPF, BPF_OBJ_GET_INFO_BY_FD, attr, len(attr)) != 0:
        raise OSError(ctypes.get_errno(), "BPF_OBJ_GET_INFO_BY_FD")
    return int.from_bytes(info.raw[200:208], "little")


def sampler_runs(monkeypatch, target: subprocess.Popen, hz: int, seconds: float) -> tuple[int, float, Record]:
    """Runs of the sampler program while `record -p` samples ``target`` (BPF run statistics on meanwhile:
    BPF_ENABLE_STATS, for as long as its fd is open), and the target's CPU time meanwhile."""
    import ctypes

    from optrace.bpf.abi import ProgType
    from optrace.bpf.loader import load_function

    libc = ctypes.CDLL(None, use_errno=True)
    stats_fd = libc.syscall(SYS_BPF, BPF_ENABLE_STATS, ctypes.create_string_buffer(4), 4)
    assert stats_fd >= 0, os.strerror(ctypes.get_errno())
    runs: list[int] = []
    cpu: list[float] = []
    attach, stop = Profiler.attach, Profiler.stop_sampling

    def attach_then_note(self: Profiler) -> None:
        attach(self)
        cpu.append(cpu_seconds(target.pid))

    def count_then_stop(self: Profiler) -> None:
        if not runs:
            runs.append(program_runs(load_function(self._bpf, b"on_sample", ProgType.PERF_EVENT).fd))
            cpu.append(cpu_seconds(target.pid))
        stop(self)

    try:
        with monkeypatch.context() as patched:
            patched.setattr(Profiler, "attach", attach_then_note)
            patched.setattr(Profiler, "stop_sampling", count_then_stop)
            record = Recorder(RecordOptions(pids=[target.pid], frequency_hz=hz, duration_s=seconds)).run()
    finally:
        os.close(stats_fd)
    return runs[0], cpu[1] - cpu[0], record


def test_the_sampler_runs_only_while_its_target_runs(monkeypatch, workloads):
    """What per-task events give (the bystander's side): the CPUs a target does not use get no timer
    interrupt from the sampler. A sleeping target: the program ran a handful of times in 2 s at 999 Hz
    (per-CPU events run it on every CPU 999 times a second). A busy target: about once per tick of its CPU
    time (bpf/profiler.py's TICK_NS), however many CPUs the machine has, and a sample per 1/F of it."""
    from optrace.bpf.profiler import TICK_NS

    with running(["sleep", "60"]) as sleeper:
        runs, _, _ = sampler_runs(monkeypatch, sleeper, 999, 2.0)
    assert runs <= 10, f"the sampler ran {runs} times while its target slept"
    busy = subprocess.Popen([str(workloads / "demo"), "60"])
    try:
        runs, used, record = sampler_runs(monkeypatch, busy, 99, 3.0)
    finally:
        busy.kill()
        busy.wait()
    assert used >= 0.2, f"the target used {used:.2f} s of CPU: too little to tell (machine load)"
    ticks = used * 1e9 / TICK_NS
    assert runs <= 1.2 * ticks + 20, f"{runs} runs for {used:.2f} s of the target's CPU ({ticks:.0f} ticks)"
    taken = sum(s.count for s in record.samples)
    assert 0.8 * used * 99 <= taken <= 1.2 * used * 99 + 3, (taken, used)
