"""The unwind row shared with the BPF unwinder (re-exported by :mod:`optrace.frontend.unwind.table`).

``ROW`` packs ``struct unwind_row { u64 pc; s32 cfa_offset; s16 rbp_offset; u8 cfa_type; u8 rbp_type; }``
(16 bytes, little-endian). ``pc`` is an ELF virtual address of the file (before any load bias) where the
row starts; the row applies until the next row's pc. The return address is always at CFA - 8.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

ROW = struct.Struct("<QihBB")

CFA_RSP = 0  # cfa = rsp + cfa_offset
CFA_RBP = 1  # cfa = rbp + cfa_offset
CFA_PLT = 2  # cfa = rsp + cfa_offset + (((pc & 15) >= 11) ? 8 : 0)  (x86-64 lazy .plt entries)
CFA_END = 3  # no CFI until the next row: the walker falls back to frame pointers
CFA_UNSUPPORTED = 4  # a DWARF expression or register we don't handle: the walker stops ("expression")
CFA_OUTERMOST = 5  # return address undefined (_start): the stack is complete here

RBP_SAME = 0  # rbp unchanged in the caller
RBP_AT_CFA = 1  # caller's rbp = *(cfa + rbp_offset)
RBP_UNSUPPORTED = 2  # stop

S32 = (-(1 << 31), (1 << 31) - 1)
S16 = (-(1 << 15), (1 << 15) - 1)


class Rule(NamedTuple):
    """A row without its pc: how to find the CFA and the caller's rbp."""

    cfa_type: int
    cfa_offset: int
    rbp_type: int
    rbp_offset: int

    @property
    def unsupported(self) -> bool:
        return self.cfa_type == CFA_UNSUPPORTED or self.rbp_type == RBP_UNSUPPORTED


END = Rule(CFA_END, 0, RBP_SAME, 0)
UNSUPPORTED = Rule(CFA_UNSUPPORTED, 0, RBP_SAME, 0)
OUTERMOST = Rule(CFA_OUTERMOST, 0, RBP_SAME, 0)
