"""Real uprobes while processes come and go: the kernel's per-process rows stay few, no call is lost."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from optrace.bpf import uprobes
from optrace.bpf.uprobes import BpfUprobeAttacher, exit_has_group_dead
from optrace.frontend.serve.sources import CallSource
from optrace.frontend.serve.totals import Delta
from optrace.frontend.uprobes.manager import ProbeManager
from optrace.frontend.uprobes.counter import CallCounter

pytestmark = pytest.mark.bpf
RUNS, CALLS_EACH, DRAIN_EVERY = 200, 3, 20
EXIT_MODES = [True, False] if exit_has_group_dead() else [False]


@pytest.mark.parametrize("group_dead", EXIT_MODES, ids=lambda mode: "group_dead" if mode else "leader_exit")
def test_short_processes_are_folded_out_of_the_kernel_and_counted_once(bpf_ready, workloads, tmp_path,
                                                                       monkeypatch, group_dead):
    """What a long `optrace serve --uprobe` sees: 200 processes with 3 calls each, drained every 20.
    Kernels before 6.16 have no group_dead in sched_process_exit: the leader's exit stands for it."""
    monkeypatch.setattr(uprobes, "exit_has_group_dead", lambda: group_dead)
    binary = tmp_path / "calls"  # a private inode: no other process on the machine hits it
    shutil.copy(workloads / "calls", binary)
    attacher = BpfUprobeAttacher()
    source = CallSource([f"{binary}:target"], comms=[], targets=None)
    source.counter = CallCounter(source._specs, manager=ProbeManager(lambda: attacher))
    increments: Counter = Counter()
    largest: dict[str, int] = Counter()
    with source.counter:
        for run in range(1, RUNS + 1):
            subprocess.run([str(binary), str(CALLS_EACH)], check=True, stdout=subprocess.DEVNULL)
            if run % DRAIN_EVERY == 0:
                largest |= Counter(attacher.map_sizes())
                delta = Delta()
                source.collect(delta)
                increments.update(delta.uprobe_calls)
        for _ in range(2):  # the last exits are listed once, then retired
            delta = Delta()
            source.collect(delta)
            increments.update(delta.uprobe_calls)
        final = source.counter.calls()[0]
        sizes = attacher.map_sizes()
    assert final.calls == RUNS * CALLS_EACH
    assert final.per_pid == {}  # nothing kept per exited process
    assert increments == Counter({(str(binary), "target", "calls"): RUNS * CALLS_EACH})
    assert sizes == {"per_pid": 0, "procs": 0, "exited": 0}
    assert largest["per_pid"] <= DRAIN_EVERY and largest["exited"] <= DRAIN_EVERY  # never all 200
    assert source._seen == {(str(binary), final.offset, None): 0}


def test_live_process_keeps_its_row_and_an_exited_one_is_listed_once(bpf_ready, workloads, tmp_path):
    """This test's own process stays alive with calls; a child with calls exits."""
    library = tmp_path / "libburn.so"  # a private inode: no other process on the machine hits it
    shutil.copy(workloads / "libburn.so", library)
    attacher = BpfUprobeAttacher()
    with CallCounter([f"{library}:lib_burn"], manager=ProbeManager(lambda: attacher)) as counter:
        child = subprocess.run([sys.executable, "-c", CALL_LIB_BURN.format(library=str(library), times=7)],
                               check=True, capture_output=True, text=True)
        child_pid = int(child.stdout)
        first = counter.calls()[0]
        assert (first.calls, first.per_pid) == (7, {child_pid: 7})
        assert attacher.map_sizes() == {"per_pid": 0, "procs": 0, "exited": 0}
        burn = ctypes.CDLL(str(library)).lib_burn
        burn.argtypes = [ctypes.c_double]
        for _ in range(5):
            burn(0.0)
        second = counter.calls()[0]
        me = os.getpid()
        assert (second.calls, second.per_pid) == (12, {me: 5})  # the child is listed no more
        assert second.comms == {me: Path("/proc/self/comm").read_text().strip()}
        assert attacher.map_sizes() == {"per_pid": 1, "procs": 1, "exited": 0}
        thread = threading.Thread(target=lambda: [burn(0.0) for _ in range(3)])
        thread.start()
        thread.join()  # a thread's exit is not the process's: its calls stay in the live row
        assert counter.calls()[0].per_pid == {me: 8}
        assert attacher.map_sizes() == {"per_pid": 1, "procs": 1, "exited": 0}


def test_calls_without_room_for_their_process_are_counted_apart(bpf_ready, workloads, tmp_path, monkeypatch):
    """Kernel maps with room for 4 processes and 10 processes calling 3 times each, nothing read in
    between: 4 get rows, the calls of the other 6 land in the probe's own unattributed counter. serve
    shows those as comm="[unknown]"; every call is counted once."""
    monkeypatch.setattr(uprobes, "MAX_ROWS", 4)
    binary = tmp_path / "calls"
    shutil.copy(workloads / "calls", binary)
    attacher = BpfUprobeAttacher()
    source = CallSource([f"{binary}:target"], comms=[], targets=None)
    source.counter = CallCounter(source._specs, manager=ProbeManager(lambda: attacher))
    increments: Counter = Counter()
    with source.counter:
        for _ in range(10):
            subprocess.run([str(binary), "3"], check=True, stdout=subprocess.DEVNULL)
        for _ in range(2):
            delta = Delta()
            source.collect(delta)
            increments.update(delta.uprobe_calls)
        count = source.counter.calls()[0]
    assert (count.calls, count.unattributed, count.per_pid) == (30, 18, {})
    assert increments == Counter({(str(binary), "target", "calls"): 12, (str(binary), "target", "[unknown]"): 18})


CALL_LIB_BURN = """
import ctypes, os
burn = ctypes.CDLL({library!r}).lib_burn
burn.argtypes = [ctypes.c_double]
for _ in range({times}):
    burn(0.0)
print(os.getpid())
"""
