"""JIT code is named even when its samples' stack walks come after the process exited.

A sample whose user stack the BPF walker cannot walk (its process has no unwind table yet, or a stale one:
a JIT's executable mappings are new) has its stack copied and waits for the process's tables
(frontend/unwind/copies.py). On a busy machine with a cold table cache those tables came only after a
short JIT process exited, and its samples were looked at for JIT code only then: its perf map and mapped
jitdumps, found through /proc/PID, were gone with it (tests/annotate's jitdump test: 46 % of the samples
`[unknown]`). Here the tables are withheld on purpose, so the case does not depend on load: the samples
must still be named from the process's JIT files, found while it lived from what is known of each sample
at once (its leaf, or the PC its copy starts from)."""
from __future__ import annotations

import os
import subprocess
import time
from collections import Counter

import pytest

from jithelpers import PROGRAMS, PYTHON
from optrace.frontend.session import RECORD, ProfilingSession, SessionOptions
from optrace.frontend.unwind import copies
from optrace.frontend.unwind.scheduler import UnwindScheduler
from optrace.model import RawSample

pytestmark = [pytest.mark.bpf, pytest.mark.usefixtures("bpf_ready")]
JIT_CPU_SECONDS = "1"  # of the JIT loop: about 1,000 samples at 999 Hz, whatever the load


@pytest.fixture
def withheld(monkeypatch) -> set[int]:
    """The processes whose unwind tables are never loaded: their reading lasts until the process is gone
    (as a cold table cache's did on a busy machine), so their samples wait for them past its exit."""
    pids: set[int] = set()
    load = UnwindScheduler.unwind

    def unwind(self, pid, capture=None):
        if pid not in pids:
            return load(self, pid, capture)
        deadline = time.monotonic() + 120
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)

    monkeypatch.setattr(UnwindScheduler, "unwind", unwind)
    monkeypatch.setattr(copies, "PENDING_DRAINS", 1 << 20)  # tables being read are waited for, however long
    return pids


def record(session: ProfilingSession, program: subprocess.Popen, first_table: bool, withheld: set[int]
           ) -> list[RawSample]:
    """The program's samples, no table loaded for it after the first one (``first_table``) or at all; it
    is told to go once the session samples it."""
    if first_table:  # as its first sample would have had it loaded: the JIT's mappings then make it stale
        session.unwinder.unwind(program.pid)
        assert session.unwinder.is_loaded(program.pid)
    withheld.add(program.pid)
    program.stdin.write("go\n")
    program.stdin.flush()
    raw: list[RawSample] = []
    while program.poll() is None:
        time.sleep(0.25)
        session.poll(time.monotonic())
        raw += session.drain().samples
    raw += session.drain().samples  # its exit
    raw += session.drain(final=True).samples
    session.finish(time.monotonic())
    return raw


@pytest.mark.parametrize("files, first_table", [(("--no-perf-map",), True), (("--no-jitdump",), True),
                                                (("--no-perf-map",), False)],
                         ids=["jitdump, stale table", "perf map, stale table", "jitdump, no table"])
def test_jit_samples_named_though_their_tables_never_come(tmp_path, spawn, withheld, files, first_table):
    program = spawn([PYTHON, str(PROGRAMS / "llvm_jit.py"), JIT_CPU_SECONDS, "--cpu", "--wait", "--dump-dir",
                     str(tmp_path), *files], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert program.stdout.readline() == "ready\n"
    with ProfilingSession(SessionOptions(RECORD, 999, pids=[program.pid])) as session:
        raw = record(session, program, first_table, withheld)
        frames, samples = session.symbolize(raw)
    name, _address, _size, dump = program.stdout.readline().split()
    ours = [s for s in raw if s.pid == program.pid]
    total = sum(s.count for s in ours)
    stops = Counter()
    for sample in ours:
        stops[sample.stop] += sample.count
    assert total >= 100 and stops["no_table"] >= total / 2, f"the case proves nothing: {total} samples, {stops}"
    named = Counter()
    for sample in samples:
        leaf = next((frames[i] for i in sample.frames if frames[i].symbol == name), None)
        if sample.pid == program.pid and leaf is not None:
            named[leaf.dso] += sample.count
    expected = f"[jit] {dump}" if "--no-perf-map" in files else f"[jit] /tmp/perf-{program.pid}.map"
    assert set(named) == {expected}, named
    assert named[expected] >= total / 2, (named, total)  # a CPU second in the JIT loop, less before it
