"""The function (FDE) around an address of a stripped interpreter, from ``.eh_frame_hdr``'s search table.

Finding the eval function's split-off part and take_gil asks for a few dozen functions' bounds. Parsing all
of .eh_frame for them (frontend/symbols/fderanges.py: 20-25k FDEs in python3.11/3.14) took 0.8-0.9 s of CPU
per interpreter file, on the way to the Python walker's first frames; the table the linker writes for
unwinders (sorted initial locations, each with its FDE's address) answers each lookup with a binary search
and one FDE read. A file whose table is missing or encoded otherwise than GNU ld writes it (datarel|sdata4
pairs, FDEs with pcrel|sdata4 addresses) falls back to the full parse.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_right

from optrace.frontend.symbols.elffile import SHT_NOBITS, ElfFile
from optrace.frontend.symbols.fderanges import fde_ranges
from optrace.frontend.symbols.symbol import MAX_TABLE_BYTES

DATAREL_SDATA4 = 0x3B  # DW_EH_PE_datarel | DW_EH_PE_sdata4: the search table's entries
PCREL_SDATA4 = 0x1B  # DW_EH_PE_pcrel | DW_EH_PE_sdata4: eh_frame_ptr, and an FDE's initial location
UDATA4 = 0x03
_HEADER = struct.Struct("<BBBBiI")  # version, eh_frame_ptr_enc, fde_count_enc, table_enc, eh_frame_ptr, count
_FDE = struct.Struct("<IIii")  # length, CIE pointer, initial location (pcrel), address range


class FunctionBounds:
    """[start, end) of the FDE around an address of one ELF file (link-time addresses)."""

    def __init__(self, elf: ElfFile) -> None:
        self._elf = elf
        self._starts: list[int] = []
        self._fdes: list[int] = []
        self._eh_frame = elf.section_by_name(".eh_frame")
        if not self._read_table():
            ranges = fde_ranges(elf)
            self._starts, self._ends = list(ranges.starts), list(ranges.ends)
        else:
            self._ends = []

    def around(self, address: int) -> tuple[int, int] | None:
        at = bisect_right(self._starts, address) - 1
        if at < 0:
            return None
        end = self._ends[at] if self._ends else self._fde_end(at)
        return (self._starts[at], end) if end is not None and address < end else None

    def starting_at(self, address: int) -> int | None:
        """The end of the FDE that starts at ``address`` (a function's first instruction), None when none does."""
        found = self.around(address)
        return found[1] if found is not None and found[0] == address else None

    def _read_table(self) -> bool:
        header = self._elf.section_by_name(".eh_frame_hdr")
        if header is None or header.type == SHT_NOBITS or self._eh_frame is None or header.size < _HEADER.size:
            return False
        data = self._elf.section_data(header, MAX_TABLE_BYTES)
        version, pointer_enc, count_enc, table_enc, _pointer, count = _HEADER.unpack_from(data)
        if (version, pointer_enc, count_enc, table_enc) != (1, PCREL_SDATA4, UDATA4, DATAREL_SDATA4):
            return False
        table = array("i", data[_HEADER.size:_HEADER.size + 8 * count])
        if len(table) != 2 * count:
            return False
        self._starts = [header.addr + value for value in table[0::2]]
        self._fdes = [header.addr + value for value in table[1::2]]
        return all(a < b for a, b in zip(self._starts, self._starts[1:]))

    def _fde_end(self, at: int) -> int | None:
        """The end of the at-th FDE of the table, read from .eh_frame (None unless it starts where the table says)."""
        section = self._eh_frame
        offset = self._fdes[at] - section.addr
        if not 0 <= offset <= section.size - _FDE.size:
            return None
        raw = self._elf.read_at(section.offset + offset, _FDE.size)
        if len(raw) != _FDE.size:
            return None
        _length, _cie, start, size = _FDE.unpack(raw)
        start += self._fdes[at] + 8
        return start + size if start == self._starts[at] and size > 0 else None
