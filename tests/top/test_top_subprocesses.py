"""`optrace top -p PID --subprocesses`: the descendants a process has when top starts are shown too (a
pre-fork server's workers); without the flag, only children started after top attached are."""
from __future__ import annotations

import time

import pytest

from optrace.procfs import descendants
from support import cpu_seconds, run_optrace, running

pytestmark = pytest.mark.usefixtures("bpf_ready")
MIN_CPU_S = 0.2  # the child used less while top ran: the case proves nothing (the machine starved it)
DEMO = ("hot_a", "hot_b", "lib_burn", "demo::Hasher::mix")  # workloads/demo.c's functions


def test_a_parents_running_child_is_shown_only_with_subprocesses(workloads):
    with running(["sh", "-c", f"{workloads / 'demo'} 120 & wait"]) as parent:
        deadline = time.monotonic() + 10
        while not descendants([parent.pid]) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = descendants([parent.pid])  # the demo runs before top starts
        tables, used = {}, 0.0
        for flags in ((), ("--subprocesses",)):
            before = cpu_seconds(child)
            proc = run_optrace("top", "-p", str(parent.pid), *flags, "--stdio", "-n", "5", "-d", "1", timeout=180)
            used = cpu_seconds(child) - before
            assert proc.returncode == 0, proc.stderr
            tables[flags] = proc.stdout  # every refresh's table
    assert not any(name in tables[()] for name in DEMO), tables[()]  # the parent shell only waits
    assert used >= MIN_CPU_S, f"the child used {used:.2f} s of CPU while top ran: too little to tell (machine load)"
    assert any(f"[.] {name}" in tables[("--subprocesses",)] for name in DEMO), tables[("--subprocesses",)]
