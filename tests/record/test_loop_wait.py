"""The recording loop sleeps until something happens (frontend/loopwait.py): a target's exit (pidfds), a stop
signal (the signal wakeup fd), a process event; not on a 50 ms timer."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from support import OPTRACE, wait_perf_events
from optrace.frontend.loopwait import LoopWait
from optrace.frontend.stopsignals import StopSignals
from optrace.frontend.target import ExitWatch


def waits(exits: ExitWatch, stop: StopSignals | None = None, event_fds=()) -> LoopWait:
    return LoopWait(stop or StopSignals(), exits, event_fds)


def test_a_wait_ends_when_a_watched_process_exits():
    proc = subprocess.Popen(["sleep", "0.2"])
    watch = ExitWatch([proc.pid])
    try:
        t0 = time.monotonic()
        waits(watch).wait(10.0, events=True)
        assert time.monotonic() - t0 < 5.0 and proc.poll() is not None
        assert watch.fds == []  # an exited process is not watched again (its pidfd would stay readable)
        t0 = time.monotonic()
        waits(watch).wait(0.2, events=True)
        assert time.monotonic() - t0 >= 0.15
    finally:
        watch.close()
        proc.wait()


def test_targets_that_exit_together_are_all_forgotten_in_one_wait():
    procs = [subprocess.Popen(["sleep", "0.1"]) for _ in range(3)]
    watch = ExitWatch([proc.pid for proc in procs])
    try:
        for proc in procs:
            proc.wait()
        waits(watch).wait(10.0, events=True)
        assert watch.fds == []
    finally:
        watch.close()


def test_a_process_already_gone_is_not_watched_and_fds_are_closed():
    proc = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    before = len(os.listdir("/proc/self/fd"))
    watch = ExitWatch([proc.pid, gone.pid])
    assert len(watch.fds) == 1 and not watch.blind
    watch.close()
    assert len(os.listdir("/proc/self/fd")) == before
    proc.kill()
    proc.wait()


def test_a_stop_signal_ends_a_long_wait_at_once():
    """A Python signal handler alone would not end poll(2): it is retried after the handler (PEP 475)."""
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as stop:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        waits(ExitWatch([]), stop).wait(10.0, events=True)
        took = time.monotonic() - t0
        timer.join()
    assert stop.stopped.is_set() and took < 3.0
    assert signal.getsignal(signal.SIGINT) == before  # restored
    assert signal.set_wakeup_fd(-1) == -1  # and the wakeup fd too


def test_event_fds_end_a_wait_only_when_asked_and_are_returned():
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        t0 = time.monotonic()
        assert waits(ExitWatch([]), event_fds=[read_end]).wait(0.3, events=False) == ()
        assert time.monotonic() - t0 >= 0.25
        assert waits(ExitWatch([]), event_fds=[read_end]).wait(10.0, events=True) == (read_end,)
    finally:
        os.close(read_end)
        os.close(write_end)


def voluntary_switches(pid: int) -> int:
    with open(f"/proc/{pid}/task/{pid}/status") as status:  # the main thread's: the loop's
        return int(next(line for line in status if line.startswith("voluntary_ctxt_switches")).split()[1])


def settled_switches(pid: int, most_per_second: int, within_s: float) -> int:
    """The main thread's voluntary switches once a whole second has had at most ``most_per_second``; fails
    when none has within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        before = voluntary_switches(pid)
        time.sleep(1.0)
        now = voluntary_switches(pid)
        if now - before <= most_per_second:
            return now
    raise AssertionError(f"the loop never woke at most {most_per_second} times in a second in {within_s:.0f} s")


@pytest.mark.usefixtures("bpf_ready")
def test_recording_an_idle_process_wakes_about_once_per_drain(tmp_path):
    """20 wakeups a second with the 50 ms timer loop; a drain a second, and little else, now. The loop polls
    on the timer while the target's unwind table is on its way and for a second after it came (the
    scheduler's wants_polls): under load (30 on 2 CPUs) that took past the 1.5 s this test once waited, so
    it waits for a quiet second first (a loop on a timer never has one), then counts 4 s."""
    idle = subprocess.Popen(["sleep", "120"])
    recording = subprocess.Popen([str(OPTRACE), "record", "-p", str(idle.pid), "-F", "99", "-o", str(tmp_path / "idle.data")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_perf_events(recording.pid, 1)
        before = settled_switches(recording.pid, 4, 60.0)
        time.sleep(4.0)
        woke = voluntary_switches(recording.pid) - before
    finally:
        recording.send_signal(signal.SIGINT)
        _, err = recording.communicate(timeout=60)
        idle.kill()
        idle.wait()
    assert recording.returncode == 0, err
    assert woke <= 16, f"the loop woke {woke} times in 4 s"
