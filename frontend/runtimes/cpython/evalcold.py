"""The split-off part of a stripped interpreter's eval function.

GCC moves the blocks it deems unlikely out of a function into a part of their own (``.cold``), with its
own FDE, named ``_PyEval_EvalFrameDefault.cold`` in .symtab only. A stripped interpreter (Debian's
builds) has no .symtab, and Debian sid's python3.14 and python3.15 (GCC 16) keep almost all of the eval
loop there: the exported function is 844-1,184 bytes of entry and exit, the loop 82-84 KiB of ``.cold``.
A sample in the loop is in no range the walker knows, and its eval call is left without Python frames.

The part is found from the exported function's own code: the conditional jumps that leave it (a jump
into a split-off part is a conditional branch; a tail call is an unconditional jump to a named
function) lead into one FDE that no exported symbol starts; that FDE is the part.
"""
from __future__ import annotations

from collections import Counter

import capstone

from optrace.frontend.runtimes.symbolnames import code_at, function_starts
from optrace.frontend.runtimes.cpython.functionbounds import FunctionBounds
from optrace.frontend.symbols.elffile import ElfFile

MAX_EVAL_BYTES = 1 << 18  # of the exported function disassembled (pyenv's 3.12 eval function is 97 KiB)


def cold_part(elf: ElfFile, start: int, size: int, bounds: FunctionBounds | None = None) -> tuple[int, int] | None:
    """[start, end) link-time addresses of the eval function's split-off part, None when it has none
    that can be told (no conditional jump out of it, or jumps into several unnamed functions alike)."""
    targets = _branches_out(code_at(elf, start, min(size, MAX_EVAL_BYTES)), start, start + size)
    if not targets:
        return None
    bounds = bounds or FunctionBounds(elf)
    named = function_starts(elf, ".dynsym")
    held: Counter[tuple[int, int]] = Counter()
    for target in targets:
        found = bounds.around(target)
        if found is not None and found[0] not in named and not found[0] <= start < found[1]:
            held[found] += 1
    if not held:
        return None
    (best, count), *rest = held.most_common(2) + [(None, 0)]
    return best if rest[0][1] < count else None


def _branches_out(code: bytes, start: int, end: int) -> list[int]:
    """Targets outside [start, end) of the direct conditional jumps of ``code`` (at ``start``)."""
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    found = []
    for _address, _size, mnemonic, operand in disassembler.disasm_lite(code, start):
        if mnemonic.startswith("j") and mnemonic != "jmp" and operand.startswith("0x"):
            target = int(operand, 16)
            if not start <= target < end:
                found.append(target)
    return found
