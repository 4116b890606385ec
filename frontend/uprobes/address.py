"""Which ``BINARY:0xADDRESS`` probes are safe: a function start, or an instruction boundary inside a function.

A uprobe replaces the first byte of an instruction with ``int3``. Set in the middle of an instruction it
corrupts that instruction in every process that maps the file (the target dies with SIGSEGV or computes
garbage); set outside any function (padding after ``ret``) it never fires and counts 0 silently. So an
address must lie inside a function of the ELF symbol tables, and, if it is not the function's start, on
an instruction boundary found by decoding from that start (capstone; x86-64 only: on other machines only
function starts are accepted). Anything else is a one-line error naming the nearest valid addresses.
"""
from __future__ import annotations

from collections.abc import Callable

import capstone

from optrace.fileaccess import printable
from optrace.errors import OptraceError
from optrace.frontend.symbols.symbol import Symbol, preferred_alias
from optrace.frontend.uprobes.elf import ElfFunctions

MAX_DECODE_BYTES = 1 << 20  # from the function start to the address
MAX_INSTRUCTION = 15  # bytes, on x86-64
ReadCode = Callable[[int, int], bytes]  # (file offset, length) -> exactly those bytes


def check_address(address: int, elf: ElfFunctions, read_code: ReadCode, shown: str) -> str:
    """The probe's label (``main`` or ``main+0x45``) if a uprobe at ``address`` is safe; else OptraceError.

    ``shown`` is the binary's path for messages."""
    starting = [f for f in elf.functions if f.start == address]
    if starting:
        return preferred_alias(starting).name
    inside = [f for f in elf.functions if f.start < address < f.end]
    if not inside:
        raise OptraceError(_outside_message(address, elf, shown))
    start = max(f.start for f in inside)  # the innermost function, if symbols nest
    function = preferred_alias([f for f in inside if f.start == start])
    label = f"{function.name}+{address - start:#x}"
    if (elf.machine, elf.elfclass) != ("EM_X86_64", 64):
        raise OptraceError(
            f"address {address:#x} ({printable(label)}) in {shown}: only function starts can be probed by "
            f"address in {elf.machine} code (instructions are decoded for x86-64 only): use {start:#x}"
        )
    _check_boundary(address, function, elf, read_code, shown)
    return label


def _check_boundary(address: int, function: Symbol, elf: ElfFunctions, read_code: ReadCode,
                    shown: str) -> None:
    name = printable(function.name)
    if address - function.start > MAX_DECODE_BYTES:
        raise OptraceError(
            f"address {address:#x} is {address - function.start} bytes into {name} in {shown}, past the "
            f"{MAX_DECODE_BYTES} bytes optrace decodes to check it is an instruction boundary"
        )
    code = _function_code(address, function, elf, read_code, shown)
    decoder = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    reached = function.start
    for at, size, _mnemonic, _operands in decoder.disasm_lite(code, function.start):
        if at == address:
            return
        if at < address < at + size:
            after = at + size
            use = f"{at:#x} or {after:#x}" if after < function.end else f"{at:#x}"
            raise OptraceError(
                f"address {address:#x} is inside the instruction at {at:#x} of {name} ({size} bytes) "
                f"in {shown}: use {use}"
            )
        reached = at + size
    raise OptraceError(
        f"address {address:#x} in {name} of {shown} cannot be checked: the code from {function.start:#x} "
        f"does not decode as x86-64 past {reached:#x}; probe {function.start:#x} ({name}) instead"
    )


def _function_code(address: int, function: Symbol, elf: ElfFunctions, read_code: ReadCode,
                   shown: str) -> bytes:
    """The bytes from the function start to the end of the longest instruction that could hold ``address``
    (not past the function's end nor its segment's)."""
    segment = elf.code_segment(function.start)
    if segment is None or not segment.holds(address):
        raise OptraceError(
            f"{printable(function.name)} at {function.start:#x} in {shown} is not in the executable segment "
            f"that holds {address:#x}: the ELF symbols do not match its program headers"
        )
    end = min(address + MAX_INSTRUCTION, function.end, segment.vaddr + segment.filesz)
    return read_code(function.start - segment.vaddr + segment.offset, end - function.start)


def _outside_message(address: int, elf: ElfFunctions, shown: str) -> str:
    before = max((f.start for f in elf.functions if f.start < address), default=None)
    after = min((f.start for f in elf.functions if f.start > address), default=None)
    named = {at: preferred_alias([f for f in elf.functions if f.start == at]) for at in (before, after) if at is not None}
    where = ""
    if before is not None:
        previous = max((f for f in elf.functions if f.start == before), key=lambda f: f.size)
        name = printable(named[before].name)
        where = f" (after {name} ends at {previous.end:#x})" if previous.size else \
            f" (after {name} at {before:#x}, a symbol without a size)"
    starts = [f"{at:#x} ({printable(function.name)})" for at, function in named.items()]
    nearest = f": nearest function starts: {', '.join(starts)}" if starts else ": it has no function symbols"
    return f"address {address:#x} is not inside any function of {shown}{where}{nearest}"
