"""The raw sched tracepoints (profile.c, bpf/btf.py): a target's forked children become targets (not its
threads), their execs name the file, and exits are seen. The fields are read at offsets from the running
kernel's BTF; with the headers' offsets (another kernel's, on this machine) the child pid would be wrong."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from optrace.bpf.profiler import Profiler

pytestmark = pytest.mark.usefixtures("bpf_ready")


def test_children_execs_and_exits_of_a_target(workloads):
    """sh (the target) forks a child that execs `stacks` with two threads, and waits for it."""
    parent = subprocess.Popen(["sh", "-c", f"read go; {workloads / 'stacks'} 0.2 2 0 >/dev/null & wait"],
                              stdin=subprocess.PIPE)
    execs, exits = [], []
    try:
        with Profiler(frequency_hz=49, pids=[parent.pid]) as profiler:
            parent.stdin.write(b"go\n")
            parent.stdin.flush()
            deadline = time.monotonic() + 20
            while parent.poll() is None and time.monotonic() < deadline:
                new_execs, new_exits = profiler.poll_events()
                execs += new_execs
                exits += new_exits
                time.sleep(0.01)
            time.sleep(0.05)
            new_execs, new_exits = profiler.poll_events()
            targets = profiler.target_pids()
    finally:
        parent.kill()
        parent.wait()
    execs += new_execs
    exits += new_exits
    children = [pid for pid, path in execs if os.path.basename(path) == "stacks"]
    assert len(children) == 1, execs
    child = children[0]
    assert targets == {parent.pid, child}, (targets, parent.pid, child)  # the child's threads are not processes
    assert {parent.pid, child} <= set(exits), exits
