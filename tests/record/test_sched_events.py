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


def _readiness_cleared(profiler: Profiler) -> int:
    """Poll the event buffers' fds as the kernel's perf_poll sees them: that clears their readiness."""
    import select

    from optrace.bpf.bcclib import lib

    poller = select.poll()
    for reader in profiler._bpf.perf_buffers.values():
        poller.register(lib.perf_reader_fd(reader), select.POLLIN)
    return len(poller.poll(0))


def test_a_drain_reads_events_whose_readiness_was_taken(workloads):
    """poll_events reads a buffer only when poll(2) says it is ready, and polling clears that readiness:
    a drain must read the buffers whatever they say, or events polled but not read would wait forever."""
    with Profiler(frequency_hz=49, pids=[os.getpid()]) as profiler:
        assert profiler.poll_events() == ([], [])
        child = subprocess.run([str(workloads / "stacks"), "0.05", "1", "0"], stdout=subprocess.DEVNULL)
        assert child.returncode == 0
        time.sleep(0.05)
        assert _readiness_cleared(profiler) >= 1, "the exec and exit events should have made a buffer ready"
        assert profiler.poll_events() == ([], []), "nothing is read once readiness is gone"
        result = profiler.drain()
    assert [os.path.basename(path) for _, path in result.execs] == ["stacks"], result.execs
    assert len(result.exits) == 1, result.exits


def test_buffers_a_callers_poll_found_ready_are_read_by_their_fds(workloads):
    """The recording loop polls the buffers' fds itself (frontend/loopwait.py), spending their readiness:
    poll_events reads the buffers whose fds it is given, and no others."""
    import select

    with Profiler(frequency_hz=49, pids=[os.getpid()]) as profiler:
        child = subprocess.run([str(workloads / "stacks"), "0.05", "1", "0"], stdout=subprocess.DEVNULL)
        assert child.returncode == 0
        time.sleep(0.05)
        poller = select.poll()
        for fd in profiler.event_fds:
            poller.register(fd, select.POLLIN)
        ready = [fd for fd, _ in poller.poll(0)]
        assert ready, "the exec and exit events should have made a buffer ready"
        others = [fd for fd in profiler.event_fds if fd not in ready]
        assert profiler.poll_events(others) == ([], [])
        execs, exits = profiler.poll_events(ready)
    assert [os.path.basename(path) for _, path in execs] == ["stacks"], execs
    assert len(exits) == 1, exits
