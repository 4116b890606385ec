"""The CPython interpreters running on this machine and whether the walker knows their layout (`doctor`:
informational, never part of the checks a recording runs first)."""
from __future__ import annotations

import os
from collections import defaultdict

from optrace.frontend.preflight import CheckResult
from optrace.frontend.runtimes.cpython.interpreter import find_interpreter, python_mappings
from optrace.procfs import read_maps

MAX_PROCESSES = 4096  # processes looked at (a machine with more is surveyed in part)


def running_interpreters(own_pid: int | None = None) -> dict[str, list[int]]:
    """"<version> <file>" (known layouts) or "refused: <reason>" -> the pids of the processes that run it."""
    found: dict[str, list[int]] = defaultdict(list)
    own = os.getpid() if own_pid is None else own_pid
    pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())[:MAX_PROCESSES]
    for pid in pids:
        maps = read_maps(pid) if pid != own else None
        executable = [entry for entry in (maps.entries if maps is not None else ()) if entry.executable and entry.is_file]
        if not python_mappings(executable):
            continue
        outcome = find_interpreter(pid, executable)
        found[f"refused: {outcome}" if isinstance(outcome, str) else f"{outcome.version} {outcome.path}"].append(pid)
    return dict(found)


def check_python() -> CheckResult:
    """The CPythons running now, and whether their layout is known (Python frames: bpf/python.c)."""
    from optrace.bpf.btf import kernel_offsets

    offsets = kernel_offsets()
    if offsets is None or not offsets.task_fsbase:
        return CheckResult("python", False, "no thread fs base offset in the kernel's BTF: Python frames cannot "
                           "find their threads", "a kernel with CONFIG_DEBUG_INFO_BTF=y", required=False)
    if os.geteuid() != 0:
        return CheckResult("python", True, "run as root to look at the interpreters running now", required=False)
    found = running_interpreters()
    if not found:
        return CheckResult("python", True, "no CPython process running now (3.8 to 3.14 are known)", required=False)
    known = sorted(f"{name} ({len(pids)})" for name, pids in found.items() if not name.startswith("refused"))
    refused = sorted(f"{name} ({len(pids)}: pid {pids[0]})" for name, pids in found.items() if name.startswith("refused"))
    detail = "; ".join((["layout known: " + ", ".join(known)] if known else []) + refused)
    return CheckResult("python", not refused, detail, "those processes keep native stacks only" if refused else "",
                       required=False)
