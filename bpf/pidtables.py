"""A BPF hash map keyed by process id, as the walkers' per-process tables are (unwind_procs, py_procs)."""
from __future__ import annotations


def forget_pid(table, pid: int) -> None:
    """The process's entry gone (nothing when it had none)."""
    try:
        del table[table.Key(pid)]
    except KeyError:
        pass


def has_pid(table, pid: int) -> bool:
    return table.Key(pid) in table
