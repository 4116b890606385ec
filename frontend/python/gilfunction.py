"""Where an interpreter file's ``take_gil`` is: the function a thread waits in for the GIL.

A wait whose stack runs through ``take_gil`` is a GIL wait (`report --gil`). It is a static function: named
in .symtab when the file has one (pyenv's builds), not in a stripped file (Debian's python3.11). There it is
found as the one function that the exported ``PyEval_RestoreThread`` and ``PyEval_AcquireThread`` both call
(3.8 to 3.13 call ``take_gil`` from both), its extent from the .eh_frame FDE that starts there. The range
found names frames the file's own symbols leave unnamed (the session gives it to the symbolizer).
"""
from __future__ import annotations

import capstone

from bisect import bisect_left

from optrace.frontend.python.symbolnames import code_at, find_symbols
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.fderanges import fde_ranges

TAKE_GIL = "take_gil"
CALLERS = ("PyEval_RestoreThread", "PyEval_AcquireThread")
MAX_CALLER_BYTES = 4096  # of each caller's code disassembled


def take_gil_range(elf: ElfFile) -> tuple[int, int] | None:
    """[start, end) link-time addresses of take_gil, None when it cannot be told."""
    named = find_symbols(elf, ".symtab", (TAKE_GIL,)).get(TAKE_GIL)
    if named is not None and named[1] > 0:
        return named[0], named[0] + named[1]
    callers = find_symbols(elf, ".dynsym", CALLERS)
    if len(callers) != len(CALLERS):
        return None
    targets = [set(_direct_calls(elf, address, size)) for address, size in callers.values()]
    common = set.intersection(*targets)
    if len(common) != 1:
        return None
    start = common.pop()
    end = _fde_end(elf, start)
    return (start, end) if end is not None else None


def _direct_calls(elf: ElfFile, address: int, size: int) -> list[int]:
    """The targets of the direct calls and jumps (tail calls) of the code at ``address``."""
    code = code_at(elf, address, min(size, MAX_CALLER_BYTES))
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    found = []
    for instruction in disassembler.disasm(code, address):
        if instruction.mnemonic in ("call", "jmp") and instruction.op_str.startswith("0x"):
            found.append(int(instruction.op_str, 16))
    return found


def _fde_end(elf: ElfFile, start: int) -> int | None:
    """The end of the FDE that starts at ``start`` (a function's first instruction)."""
    ranges = fde_ranges(elf)
    at = bisect_left(ranges.starts, start)
    return ranges.ends[at] if at < len(ranges) and ranges.starts[at] == start else None
