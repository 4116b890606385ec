"""HotSpot frames named from the outside on live JVMs (JDK 17 and 25), no agent and no flag: the VM's tables
read once, then the workload's main thread stopped (ptrace) at random moments and its Java frames walked
(frontend/runtimes/hotspot/walker.py, the rules the BPF walker will follow) and named. The stops are a
sample, not a profile: shares are checked in recordings once the BPF walker exists (docs/runtimes.md)."""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from jvms import PHASES, main_lines, phase_of, running
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.frontend.runtimes.hotspot import process as hotspot_process
from optrace.frontend.runtimes.hotspot.process import attach
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.runtimes.hotspot.walker import ENTRY, NOT_JAVA, Registers, java_stack
from optrace.procfs import read_maps
from threadstop import busiest_thread, stopped

pytestmark = pytest.mark.root  # ptrace of the JVM
JDK_VERSIONS = ["17", "25"]


class CountingMemory(ProcessMemory):
    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.ranges = 0

    def read_ranges(self, ranges):
        self.ranges += len(ranges)
        return super().read_ranges(ranges)


def stacks(pid: int, process, count: int, wait: tuple[float, float] = (0.005, 0.06)) -> list:
    tid = busiest_thread(pid, "java")
    found = []
    for _ in range(count):
        time.sleep(random.uniform(*wait))
        with stopped(tid) as regs:
            found.append(java_stack(process, Registers(regs.ip, regs.sp, regs.bp, regs.r13), tid))
    return found


@pytest.mark.parametrize("jdk", JDK_VERSIONS)
def test_tables_are_read_once_per_libjvm(jdk, phases_classes, monkeypatch):
    monkeypatch.setattr(hotspot_process, "_tables", LruCache(8))  # whatever attached before in this session
    with running(jdk, phases_classes, 20) as first, running(jdk, phases_classes, 20) as second:
        memory = CountingMemory(first.pid)
        process = attach(first.pid, read_maps(first.pid).entries, memory)
        assert not isinstance(process, str), process
        assert process.major == int(jdk) and process.release.startswith(jdk)
        again = CountingMemory(second.pid)
        assert not isinstance(attach(second.pid, read_maps(second.pid).entries, again), str)
        assert memory.ranges > 1000 and again.ranges < 10, (memory.ranges, again.ranges)


@pytest.mark.parametrize("jdk", JDK_VERSIONS)
def test_interpreted_frames_are_named_with_lines(jdk, phases_classes):
    with running(jdk, phases_classes, 30, "-Xint") as proc:
        process = attach(proc.pid, read_maps(proc.pid).entries, ProcessMemory(proc.pid))
        found = stacks(proc.pid, process, 20)
    walked = [s for s in found if s.status != NOT_JAVA]
    assert len(walked) >= 18, Counter(s.status for s in found)
    for stack in walked:
        assert stack.status == ENTRY and stack.frames[-1].name == "Phases.main", stack
        assert {f.kind for f in stack.frames} == {"interpreted"}, stack
        for frame in stack.frames:
            if frame.name.startswith("Phases."):
                assert frame.file == "Phases.java" and frame.line > 0 and frame.bci >= 0, frame
        main = stack.frames[-1]
        assert main.line in main_lines(), main
    assert {phase_of([f.name for f in s.frames]) for s in walked} >= {"Phases.hashPhase"}


@pytest.mark.parametrize("jdk", JDK_VERSIONS)
def test_compiled_frames_are_named_inlined_expanded(jdk, phases_classes):
    """After warm-up: >= 95 % of the stops in Java code reach main through the call stub; inlined methods and
    the lambda comparator under Arrays.sort are named; no frame is left unnamed."""
    with running(jdk, phases_classes, 60) as proc:
        time.sleep(3)
        process = attach(proc.pid, read_maps(proc.pid).entries, ProcessMemory(proc.pid))
        found = stacks(proc.pid, process, 150)
    walked = [s for s in found if s.status != NOT_JAVA]
    statuses = Counter(s.status for s in found)
    reached = [s for s in walked if s.status == ENTRY and s.frames[-1].name == "Phases.main"]
    assert len(reached) >= 0.95 * len(walked) and len(walked) >= 0.9 * len(found), statuses
    frames = [f for s in walked for f in s.frames]
    assert not [f for f in frames if f.name.startswith("[unknown")], process.outcomes
    assert any(f.kind == "inlined" for f in frames) and any(f.kind == "compiled" for f in frames)
    lambdas = [s for s in reached if "Phases.lambda$sortPhase$0" in [f.name for f in s.frames]]
    assert lambdas, "no stop named the lambda comparator"
    for stack in lambdas:
        names = [f.name for f in stack.frames]
        assert names.index("Phases.lambda$sortPhase$0") < names.index("java.util.Arrays.sort") \
            < names.index("Phases.sortPhase"), names
    seen = Counter(phase_of([f.name for f in s.frames]) for s in reached)
    assert set(PHASES) <= set(seen), seen
