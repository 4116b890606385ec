"""DWARF's LEB128 numbers, and the error of malformed DWARF: both the call-frame information's decoder
(cfi.py) and the line programs' (srcline.py) read them, so they live in a module of their own."""
from __future__ import annotations

from optrace.errors import MalformedInput


class DwarfError(MalformedInput):
    """DWARF data (call-frame information, a line program) is malformed, or beyond a limit."""


def uleb128(data: bytes, pos: int, end: int) -> tuple[int, int]:
    return _leb128(data, pos, end, False)


def sleb128(data: bytes, pos: int, end: int) -> tuple[int, int]:
    return _leb128(data, pos, end, True)


def _leb128(data: bytes, pos: int, end: int, signed: bool) -> tuple[int, int]:
    """(value, position after it) of the LEB128 number at ``pos``; at most 64 bits, never past ``end``."""
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise DwarfError(f"bad LEB128 number at {pos:#x}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return (result - (1 << shift) if signed and byte & 0x40 else result), pos
