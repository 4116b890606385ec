"""The sampler's raw-IP stacks, translated in user space, against the kernel's own build-id stacks."""
from __future__ import annotations

import dataclasses
import subprocess
import time
from collections import Counter

import pytest

from optrace.frontend.session import TOP, ProfilingSession, SessionOptions

pytestmark = pytest.mark.usefixtures("bpf_ready")


def caller_chains(samples, pid: int) -> Counter:
    """Counts of each stack without its leaf: return addresses, the same in every run of a program."""
    chains: Counter = Counter()
    for sample in samples:
        if sample.pid == pid and len(sample.user) > 1:
            chains[sample.user[1:]] += sample.count
    return chains


def sampled_chains(session: ProfilingSession, pid: int, learn: bool) -> Counter:
    with session:
        session.add_pid(pid)
        if learn:
            session.learn(pid)
        time.sleep(1.0)
        return caller_chains(session.drain().samples, pid)


def session(hz: int, raw_stacks: bool = True) -> ProfilingSession:
    """Frame-pointer stacks: with CFI, the first stack copies of the process have its table loaded at once."""
    return ProfilingSession(SessionOptions(dataclasses.replace(TOP, raw_stacks=raw_stacks), hz, pids=[],
                                           call_graph="fp"))


def test_translated_raw_stacks_equal_the_kernels_build_id_stacks(workloads):
    """One process sampled for a second by build-id stacks only, then for a second by a sampler that read
    its maps (one after the other: with both at once, the kernel's build-id stacks came back as raw IPs
    for most stacks in CI): the call chains seen most must be the very same (build-id, file offset) frames."""
    demo = subprocess.Popen([str(workloads / "demo"), "30"])  # killed at the end: each compile takes seconds
    try:
        time.sleep(0.3)  # past the dynamic loader's mmaps
        kernel = sampled_chains(session(999, raw_stacks=False), demo.pid, learn=False)
        translated_by = session(999)
        translated = sampled_chains(translated_by, demo.pid, learn=True)
    finally:
        demo.kill()
        demo.wait()
    profiler = translated_by.profiler
    assert profiler.raw_stacks and profiler.stats["raw"] > 0.9 * sum(translated.values())
    # The kernel falls back to raw IPs itself now and then: only the chains it gave as build-ids count.
    named = Counter({chain: n for chain, n in kernel.items() if all(f.build_id for f in chain)})
    top = [chain for chain, _ in translated.most_common(4)]
    assert all(frame.build_id for chain in top for frame in chain)
    assert set(top) <= set(named), (top, named)
    assert named.most_common(1)[0][0] in top


def test_address_spaces_of_exited_processes_are_dropped(workloads):
    """Exits seen between drains count too: a long recording of short processes keeps nothing of them."""
    with session(99) as profiling:
        children = [subprocess.Popen(["sleep", "0.3"]) for _ in range(5)]
        for child in children:
            profiling.add_pid(child.pid)
            profiling.learn(child.pid)
        assert len(profiling.spaces) == 5
        for child in children:
            child.wait()
        time.sleep(0.1)
        profiling.poll(time.monotonic())  # the recorder's poll loop takes the exit events, not a drain
        profiling.drain()
        assert len(profiling.spaces) == 5  # raw stacks of theirs may still be in the set just drained
        profiling.drain()
        assert len(profiling.spaces) == 0
