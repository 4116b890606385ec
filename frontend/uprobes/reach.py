"""Which processes a uprobe slows down: every one that maps the probed file, whatever is counted.

A uprobe is set on a file (its inode and an offset): each call of the probed function traps into the
kernel in every process that maps the file, now and later (about 13 µs a trap in the test VM, 1-2 µs on
bare metal), and only then does the BPF program decide whether to count it (-p, --comm). A library probed
for one service (``c:malloc``) slows the whole machine's libc callers: say so, with how many there are.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from optrace.frontend.uprobes.resolve import ResolvedProbe, name_list
from optrace.procfs import processes_mapping


def slowed_processes(probes: Sequence[ResolvedProbe]) -> list[str]:
    """One warning per probed file that other processes map now (this one left out)."""
    by_file: dict[tuple[int, int], list[ResolvedProbe]] = {}
    for probe in probes:
        by_file.setdefault((probe.key.dev, probe.key.ino), []).append(probe)
    counts = processes_mapping(set(by_file), skip=os.getpid())
    warnings = []
    for key, group in by_file.items():
        if counts[key]:
            specs = ", ".join(dict.fromkeys(probe.spec for probe in group))
            names = name_list(sorted({probe.symbol for probe in group}))
            warnings.append(f"--uprobe {specs}: {counts[key]} other process{'es' if counts[key] > 1 else ''} map "
                            f"{group[0].binary} now: every call of {names} in them (and in those that map it "
                            "later) traps into the kernel, a few microseconds each, whatever -p and --comm count")
    return warnings
