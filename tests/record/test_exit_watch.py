"""A recording that ends with its target notices the exit at once (pidfds), not at its next poll."""
from __future__ import annotations

import os
import subprocess
import time

from optrace.frontend.target import ExitWatch


def test_a_wait_ends_when_a_watched_process_exits():
    proc = subprocess.Popen(["sleep", "0.2"])
    watch = ExitWatch([proc.pid])
    try:
        t0 = time.monotonic()
        watch.wait(10.0)
        assert time.monotonic() - t0 < 5.0 and proc.poll() is not None
        assert watch.fds == []  # an exited process is not watched again (its pidfd would stay readable)
        t0 = time.monotonic()
        watch.wait(0.2)
        assert time.monotonic() - t0 >= 0.15
    finally:
        watch.close()
        proc.wait()


def test_a_process_already_gone_is_not_watched_and_fds_are_closed():
    proc = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    before = len(os.listdir("/proc/self/fd"))
    watch = ExitWatch([proc.pid, gone.pid])
    assert len(watch.fds) == 1
    watch.close()
    assert len(os.listdir("/proc/self/fd")) == before
    proc.kill()
    proc.wait()
