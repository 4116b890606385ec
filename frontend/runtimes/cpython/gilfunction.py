"""Where an interpreter file's ``take_gil`` is: the function a thread waits in for the GIL.

A wait whose stack runs through ``take_gil`` is a GIL wait (`report --gil`). It is a static function: named
in .symtab when the file has one (pyenv's builds), not in a stripped file (Debian's). There it is found from
the exported ``PyEval_RestoreThread`` and ``PyEval_AcquireThread``: of the functions no symbol names that both
reach through at most CALL_DEPTH direct calls or jumps (each to an FDE's start) and that wait on a condition
with a timeout (``pthread_cond_timedwait``, as take_gil does in every version), the nearest to both. 3.8 to 3.13 call ``take_gil`` from both (Debian's python3.11: the one function both call);
Debian sid's 3.14 and 3.15 (GCC 16, LTO) call it from PyEval_RestoreThread and through an unnamed
``_PyThreadState_Attach`` from PyEval_AcquireThread, beside a 59-72-byte helper reached as near. Its extent
is the .eh_frame FDE that starts there. The range found names frames the file's own symbols leave unnamed
(the session gives it to the symbolizer).
"""
from __future__ import annotations

import capstone

from optrace.frontend.runtimes.symbolnames import code_at, find_symbols, function_starts, imported_functions
from optrace.frontend.runtimes.cpython.functionbounds import FunctionBounds
from optrace.frontend.symbols.elffile import ElfFile

TAKE_GIL = "take_gil"
CALLERS = ("PyEval_RestoreThread", "PyEval_AcquireThread")
MAX_CALLER_BYTES = 4096  # of each caller's code disassembled
CALL_DEPTH = 3  # calls followed from each caller (3.13: PyEval_RestoreThread, _PyThreadState_Attach, _PyEval_AcquireLock)
WAITS = {"pthread_cond_timedwait", "pthread_cond_clockwait"}  # take_gil waits for the GIL in one


def take_gil_range(elf: ElfFile, bounds: FunctionBounds | None = None) -> tuple[int, int] | None:
    """[start, end) link-time addresses of take_gil, None when it cannot be told."""
    named = find_symbols(elf, ".symtab", (TAKE_GIL,)).get(TAKE_GIL)
    if named is not None and named[1] > 0:
        return named[0], named[0] + named[1]
    return unnamed_take_gil(elf, bounds)


def unnamed_take_gil(elf: ElfFile, bounds: FunctionBounds | None = None) -> tuple[int, int] | None:
    """take_gil found from its callers, as in a stripped file (whatever .symtab says)."""
    callers = find_symbols(elf, ".dynsym", CALLERS)
    if len(callers) != len(CALLERS):
        return None
    bounds = bounds or FunctionBounds(elf)
    exported, imported = function_starts(elf, ".dynsym"), imported_functions(elf)
    reached = [_reached(elf, bounds, exported, address, size) for address, size in callers.values()]
    common = {start: max(reached[0][start], reached[1][start]) for start in reached[0].keys() & reached[1].keys()
              if WAITS & {imported.get(target) for target in _direct_calls(elf, start, _size(bounds, start))}}
    if not common:
        return None
    nearest = min(common.values())
    start = max((start for start, depth in common.items() if depth == nearest), key=lambda s: _size(bounds, s))
    return start, start + _size(bounds, start)


def _size(bounds: FunctionBounds, start: int) -> int:
    end = bounds.starting_at(start)
    return 0 if end is None else end - start


def _reached(elf: ElfFile, bounds: FunctionBounds, exported: set[int], address: int, size: int) -> dict[int, int]:
    """The unnamed functions (FDE starts) reached from the function at ``address`` by direct calls and jumps
    (through named ones too), with the least number of calls it takes (0: called from it)."""
    found: dict[int, int] = {}
    followed: set[int] = set()
    frontier = [(address, size)]
    for depth in range(CALL_DEPTH):
        following = []
        for start, length in frontier:
            for target in _direct_calls(elf, start, length):
                end = bounds.starting_at(target)
                if end is not None and target not in followed:
                    followed.add(target)
                    following.append((target, end - target))
                    if target not in exported:
                        found[target] = depth
        frontier = following
    return found


def _direct_calls(elf: ElfFile, address: int, size: int) -> list[int]:
    """The targets of the direct calls and jumps (tail calls) of the code at ``address``, and the GOT slots
    of its calls through the GOT."""
    code = code_at(elf, address, min(size, MAX_CALLER_BYTES))
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    found = []
    for at, length, mnemonic, operand in disassembler.disasm_lite(code, address):
        if mnemonic in ("call", "jmp") and operand.startswith("0x"):
            found.append(int(operand, 16))
        elif mnemonic == "call" and operand.startswith("qword ptr [rip + "):
            found.append(at + length + int(operand[len("qword ptr [rip + "):-1], 0))
    return found
