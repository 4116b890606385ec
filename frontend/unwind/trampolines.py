"""Unwind rows for CPython's perf trampolines (``python3.12 -X perf``), which live in anonymous memory
without CFI and, in builds without frame pointers (pyenv's), without a frame pointer either.

Each trampoline is a copy of ``_Py_trampoline_func_start`` (Python/asm_trampoline.S), laid one after the
other in an executable arena; the code is ``sub $8,%rsp; call *%rcx; add $8,%rsp; ret``, so its CFA is
rsp+8 at its first and last instruction and rsp+16 in between (where the return address of the call
points). 3.12 lays the copies end to end, 3.13 every 16 bytes (the code padded with zeros): the stride
is where the second copy starts. An arena is recognised by its first bytes, read from the process's
memory; its rows repeat that rule for every copy, so the unwinder walks from the interpreter through the
trampoline into its caller and the ``py::`` names of the perf map join the interpreter's frames. (With
3.12's stride on a 3.13 arena, the rules drifted off the copies after the first few: the walk read a
return address from the wrong slot, and 68 % of the stacks stopped in a trampoline.)
"""
from __future__ import annotations


from optrace.procfs import read_process_memory
from optrace.frontend.unwind.row import CFA_END, CFA_RSP, RBP_SAME, ROW

TRAMPOLINE = bytes.fromhex("4883ec08ffd14883c408c3")  # x86-64, CPython 3.12 built without frame pointers
STEPS = ((0, 8), (4, 16), (10, 8))  # (offset in a copy, CFA = rsp + this) from each instruction on
MAX_ARENA = 16 << 20
MAX_STRIDE = 64  # bytes from one copy's start to the next's


def trampoline_rows(pid: int, start: int, end: int) -> bytes | None:
    """Rows (ELF-like addresses relative to ``start``) for an anonymous executable mapping of ``pid`` that
    holds perf trampolines, else None."""
    if end - start > MAX_ARENA:
        return None
    head = read_process_memory(pid, start, min(end - start, MAX_STRIDE + len(TRAMPOLINE)))
    if head is None or head[:len(TRAMPOLINE)] != TRAMPOLINE:
        return None
    return arena_rows(end - start, stride(head))


def stride(head: bytes) -> int:
    """Where the arena's second copy starts (its first bytes ``head``); the code's length when there is none."""
    found = head.find(TRAMPOLINE, len(TRAMPOLINE))
    return found if found > 0 else len(TRAMPOLINE)


def arena_rows(size: int, step: int = len(TRAMPOLINE)) -> bytes:
    """The rows of an arena of ``size`` bytes holding a copy every ``step`` bytes (padding between copies:
    no rule, as for any address without CFI)."""
    copies = size // step
    padded = step > len(TRAMPOLINE)
    rows = bytearray(ROW.size * (copies * (len(STEPS) + padded) + 1))
    at = 0
    for copy in range(copies):
        base = copy * step
        for offset, cfa in STEPS:
            ROW.pack_into(rows, at, base + offset, cfa, 0, CFA_RSP, RBP_SAME)
            at += ROW.size
        if padded:
            ROW.pack_into(rows, at, base + len(TRAMPOLINE), 0, 0, CFA_END, RBP_SAME)
            at += ROW.size
    ROW.pack_into(rows, at, copies * step, 0, 0, CFA_END, RBP_SAME)
    return bytes(rows)
