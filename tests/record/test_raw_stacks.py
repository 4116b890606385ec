"""The sampler's raw-IP stacks, translated in user space, against the kernel's own build-id stacks."""
from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest

from optrace.bpf.profiler import Profiler

pytestmark = pytest.mark.usefixtures("bpf_ready")


def caller_chains(samples, pid: int) -> Counter:
    """Counts of each stack without its leaf: return addresses, the same in every run of a program."""
    chains: Counter = Counter()
    for sample in samples:
        if sample.pid == pid and len(sample.user) > 1:
            chains[sample.user[1:]] += sample.count
    return chains


def test_translated_raw_stacks_equal_the_kernels_build_id_stacks(workloads):
    """Two samplers on one process, one with build-id stacks only, one that read the process's maps:
    the call chains they see most must be the very same (build-id, file offset) frames."""
    with Profiler(999, pids=[], raw_stacks=False) as kernel, Profiler(999, pids=[]) as translated:
        assert translated.raw_stacks
        demo = subprocess.Popen([str(workloads / "demo"), "2.5"])
        for profiler in (kernel, translated):
            profiler.add_pid(demo.pid)
        time.sleep(0.3)  # past the dynamic loader's mmaps
        translated.learn(demo.pid)
        demo.wait()
        time.sleep(0.1)
        results = {name: caller_chains(profiler.drain().samples, demo.pid)
                   for name, profiler in (("kernel", kernel), ("translated", translated))}
        assert translated.stats["raw"] > 0.8 * sum(results["translated"].values())
        assert kernel.stats["raw"] == 0
    # The kernel itself falls back to raw IPs now and then (mm lock contended, its per-CPU irq_work
    # busy: two samplers tick together here), so only the chains it gave wholly as build-ids count.
    named = Counter({chain: n for chain, n in results["kernel"].items() if all(f.build_id for f in chain)})
    top = [chain for chain, _ in results["translated"].most_common(4)]
    assert all(frame.build_id for chain in top for frame in chain)
    assert set(top) <= set(named), (top, named)
    assert named.most_common(1)[0][0] in top


def test_address_spaces_of_exited_processes_are_dropped(workloads):
    """Exits seen between drains count too: a long recording of short processes keeps nothing of them."""
    with Profiler(99, pids=[]) as profiler:
        children = [subprocess.Popen(["sleep", "0.3"]) for _ in range(5)]
        for child in children:
            profiler.add_pid(child.pid)
            profiler.learn(child.pid)
        assert len(profiler._spaces) == 5
        for child in children:
            child.wait()
        time.sleep(0.1)
        profiler.poll_events()  # the recorder's poll loop takes the exit events, not a drain
        profiler.drain()
        assert len(profiler._spaces) == 5  # raw stacks of theirs may still be in the set just drained
        profiler.drain()
        assert len(profiler._spaces) == 0
