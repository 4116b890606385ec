"""The CPython interpreters running on this machine and whether the walker knows their layout (`doctor`)."""
from __future__ import annotations

import os
from collections import defaultdict

from optrace.frontend.python.interpreter import find_interpreter, python_mappings
from optrace.procfs import maps_entries

MAX_PROCESSES = 4096  # processes looked at (a machine with more is surveyed in part)


def running_interpreters(own_pid: int | None = None) -> dict[str, list[int]]:
    """"<version> <file>" (known layouts) or "refused: <reason>" -> the pids of the processes that run it."""
    found: dict[str, list[int]] = defaultdict(list)
    own = os.getpid() if own_pid is None else own_pid
    pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())[:MAX_PROCESSES]
    for pid in pids:
        maps = maps_entries(pid) if pid != own else None
        executable = [entry for entry in maps or () if entry.executable and entry.is_file]
        if not python_mappings(executable):
            continue
        outcome = find_interpreter(pid, executable)
        found[f"refused: {outcome}" if isinstance(outcome, str) else f"{outcome.version} {outcome.path}"].append(pid)
    return dict(found)
