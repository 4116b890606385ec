"""Where the functions of code without symbols start and end: the ranges of its call-frame information.

Compilers write one FDE per function (and one per part split off it, such as gcc's ``.cold`` code), and a
stripped binary keeps them in ``.eh_frame``, which unwinding needs. So an address in a function that no
symbol names still has a function: the FDE around it. Its frames are named after the FDE's start, one
row per function where every sampled address was a row of its own.

Bounded like the symbol tables: the section under cfi.MAX_SECTION_BYTES, at most ``limit`` ranges (past
it the rest of the file's functions show per address), and malformed call-frame information keeps the
ranges read before the fault (the unwind table reports the fault).
"""
from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass, field, replace

from optrace.frontend.symbols.cfi import cfi_sections, read_fdes, read_section
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.symbol import MAX_ADDRESS, MAX_FUNCTION_SYMBOLS, STB_LOCAL, Symbol

MAX_RANGES = MAX_FUNCTION_SYMBOLS  # cc1 has 45,201
UNNAMED = ""  # the name of a function known by its FDE only (a Dso shows it as file+0xSTART)


@dataclass(frozen=True)
class FdeRanges:
    """[start, end) link-time address ranges, sorted by start, none overlapping the one before."""

    starts: array = field(default_factory=lambda: array("Q"))
    ends: array = field(default_factory=lambda: array("Q"))

    def __len__(self) -> int:
        return len(self.starts)


def fde_ranges(elf: ElfFile, limit: int = MAX_RANGES) -> FdeRanges:
    """The ranges of the FDEs in ``elf``'s .eh_frame and .debug_frame (see :func:`_sorted` for overlaps); none
    for a file that is not 64-bit little-endian, whose pointers the decoder does not read. Raises
    BudgetExceeded or ElfFormatError for a section that cannot be read."""
    if elf.elfclass != 64 or not elf.little_endian or limit <= 0:
        return FdeRanges()
    starts, ends = array("Q"), array("Q")
    for header in cfi_sections(elf):
        try:
            for fde in read_fdes(read_section(elf, header)):
                if fde.end > fde.start:
                    starts.append(fde.start)
                    ends.append(fde.end)
                    if len(starts) >= limit:
                        return _sorted(starts, ends)
        except DwarfError:
            continue
    return _sorted(starts, ends)


def _sorted(starts: array, ends: array) -> FdeRanges:
    """The ranges by start, each one that overlaps the range kept before it left out: a linker writes no
    overlapping FDEs, and where .eh_frame and .debug_frame both describe a function with the same start,
    .eh_frame's comes first."""
    order = sorted(range(len(starts)), key=starts.__getitem__)  # stable: the earlier of two equal starts first
    kept = FdeRanges()
    end = 0
    for index in order:
        if starts[index] >= end:
            kept.starts.append(starts[index])
            kept.ends.append(ends[index])
            end = ends[index]
    return kept


def with_unnamed_functions(symbols: list[Symbol], ranges: FdeRanges) -> list[Symbol]:
    """``symbols`` and an UNNAMED function over each range whose start no sized symbol covers. A symbol
    without a size at a range's start (hand-written assembly) takes the range's size instead of becoming
    its own alias."""
    covered_starts, covered_ends = _covered(symbols)
    unsized = {symbol.start for symbol in symbols if not symbol.size}
    sizes: dict[int, int] = {}
    added = []
    for start, end in zip(ranges.starts, ranges.ends):
        index = bisect_right(covered_starts, start) - 1
        if index >= 0 and covered_ends[index] > start:
            continue
        if start in unsized:
            sizes[start] = end - start
        else:
            added.append(Symbol(start, end - start, UNNAMED, STB_LOCAL))
    if sizes:
        symbols = [replace(s, size=sizes[s.start]) if not s.size and s.start in sizes else s for s in symbols]
    return symbols + added


def _covered(symbols: list[Symbol]) -> tuple[array, array]:
    """The addresses the sized symbols cover, as sorted disjoint [start, end) intervals."""
    starts, ends = array("Q"), array("Q")
    for start, end in sorted((s.start, min(s.end, MAX_ADDRESS)) for s in symbols if s.size):
        if ends and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends
