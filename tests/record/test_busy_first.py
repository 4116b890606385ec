"""record -a (SessionOptions.unwind_busy_first): the walker and the tables of the processes that used CPU
while BCC compiled are loaded before the sampler attaches, so the recording's first seconds are not
spent verifying and converting while the machine is sampled (real BPF)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from optrace.frontend.session import ProfilingSession, SessionOptions
from optrace.procfs import process_cpu_ticks
from support import WORKLOADS

pytestmark = pytest.mark.usefixtures("bpf_ready")


@pytest.mark.parametrize("busy_first", [True, False])
def test_busy_processes_have_their_tables_when_sampling_starts(busy_first):
    busy = subprocess.Popen([str(WORKLOADS / "stacks"), "30", "1"], stdout=subprocess.DEVNULL)
    try:
        with ProfilingSession(SessionOptions(unwind_busy_first=busy_first, fold=True)) as session:
            loaded = session.profiler.unwind.has_process(busy.pid), session.profiler.unwind.has_process(os.getpid())
            step = session._unwind_step.done()
    finally:
        busy.kill()
        busy.wait()
    assert loaded == (busy_first, busy_first)
    if busy_first:
        assert step  # the walker was waited for


def test_process_cpu_ticks_sees_a_busy_process():
    """The busy process's ticks grow by 10 (0.1 s at 100 Hz): within 0.3 s on a quiet machine, later on a
    loaded one (at load 12 on 2 CPUs it gets a sixth of one), never when its ticks are not read."""
    busy = subprocess.Popen(["python3", "-c", "while True: pass"])
    try:
        before = process_cpu_ticks()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.1)
            after = process_cpu_ticks()
            if after.get(busy.pid, 0) - before.get(busy.pid, 0) >= 10:
                break
    finally:
        busy.kill()
        busy.wait()
    assert after[busy.pid] - before.get(busy.pid, 0) >= 10
    assert 1 in after
