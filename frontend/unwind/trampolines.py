"""Unwind rows for CPython's perf trampolines (``python3.12 -X perf``), which live in anonymous memory
without CFI and, in builds without frame pointers (pyenv's), without a frame pointer either.

Each trampoline is a copy of ``_Py_trampoline_func_start`` (Python/asm_trampoline.S), laid end to end in
an executable arena; the code is ``sub $8,%rsp; call *%rcx; add $8,%rsp; ret``, so its CFA is rsp+8 at
its first and last instruction and rsp+16 in between (where the return address of the call points). An
arena is recognised by its first bytes, read from the process's memory; its rows repeat that rule for
every copy, so the unwinder walks from the interpreter through the trampoline into its caller and the
``py::`` names of the perf map join the interpreter's frames.
"""
from __future__ import annotations


from optrace.procfs import read_process_memory
from optrace.frontend.unwind.row import CFA_END, CFA_RSP, RBP_SAME, ROW

TRAMPOLINE = bytes.fromhex("4883ec08ffd14883c408c3")  # x86-64, CPython 3.12 built without frame pointers
STEPS = ((0, 8), (4, 16), (10, 8))  # (offset in a copy, CFA = rsp + this) from each instruction on
MAX_ARENA = 16 << 20


def trampoline_rows(pid: int, start: int, end: int) -> bytes | None:
    """Rows (ELF-like addresses relative to ``start``) for an anonymous executable mapping of ``pid`` that
    holds perf trampolines, else None."""
    if end - start > MAX_ARENA or read_process_memory(pid, start, len(TRAMPOLINE)) != TRAMPOLINE:
        return None
    return arena_rows(end - start)


def arena_rows(size: int) -> bytes:
    copies = size // len(TRAMPOLINE)
    rows = bytearray(ROW.size * (copies * len(STEPS) + 1))
    at = 0
    for copy in range(copies):
        base = copy * len(TRAMPOLINE)
        for offset, cfa in STEPS:
            ROW.pack_into(rows, at, base + offset, cfa, 0, CFA_RSP, RBP_SAME)
            at += ROW.size
    ROW.pack_into(rows, at, copies * len(TRAMPOLINE), 0, 0, CFA_END, RBP_SAME)
    return bytes(rows)
