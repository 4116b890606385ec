"""The line of an instruction, from a code object's line table, for the three formats CPython has used:

- ``co_lnotab`` (3.8, 3.9; ``Objects/lnotab_notes.txt``): pairs (byte offset increment, signed line
  increment); the line of byte offset ``a`` is the sum of the increments before the first pair whose
  running offset passes ``a`` (``PyCode_Addr2Line``).
- ``co_linetable`` of 3.10 (PEP 626): pairs (range length in bytes, signed line delta, -128: no line); each
  pair is one address range.
- ``co_linetable`` of 3.11+ (``Objects/locations.md``): entries of a first byte (bit 7 set, a 4-bit code,
  the range length in code units minus one) and 0-4 varints of 6-bit chunks.

Tables come from another process (possibly cut short by the capture, possibly garbage): every decoder
only moves forward through the bytes it is given, and answers None (no line, or not known from these
bytes) rather than raising.
"""
from __future__ import annotations

from bisect import bisect_right

from optrace.pythonlayout import LINES_310, LINES_LNOTAB, LINES_LOCATIONS

CODE_UNIT = 2  # bytes of an instruction unit (3.6+)
NO_LINE_310 = 0x80  # 3.10's line delta of a range without a line (-128)
MAX_VARINT_CHUNKS = 6  # 36 bits: no real table needs more (CPython writes at most 32-bit values)
LOCATION_NONE, LOCATION_LONG, LOCATION_NO_COLUMNS = 15, 14, 13
LOCATION_ONE_LINE = 10  # codes 10-12: line delta 0-2, two column bytes follow


def line_of(kind: str, table: bytes, firstlineno: int, instr: int, complete: bool = True) -> int | None:
    """The line of instruction ``instr`` (in code units) by a table of ``kind`` (a LINES_* value); None when
    the table gives it no line, or when ``complete`` is False and the cut-off table does not reach it."""
    return LineIndex(kind, table, firstlineno, complete).line(instr)


class LineIndex:
    """A line table decoded once into address ranges, each instruction's line a bisect away: a table is walked
    from its start to find one instruction's line, and a code object as long as a generated module's (a
    million lines) made each distinct instruction of its frames a walk of the whole table."""

    def __init__(self, kind: str, table: bytes, firstlineno: int, complete: bool = True) -> None:
        self.firstlineno = firstlineno
        self._unit = CODE_UNIT if kind in (LINES_LNOTAB, LINES_310) else 1  # the table's addresses: bytes or units
        ranges = {LINES_LNOTAB: _lnotab_ranges, LINES_310: _linetable310_ranges,
                  LINES_LOCATIONS: _locations_ranges}.get(kind)
        self._ends: list[int] = []  # range i covers [ends[i - 1], ends[i])
        self._lines: list[int | None] = []
        self._tail: int | None = None  # past the last range
        if ranges is not None:
            self._tail = ranges(table, firstlineno, complete, self._ends, self._lines)

    def line(self, instr: int) -> int | None:
        if instr < 0:
            return self.firstlineno
        index = bisect_right(self._ends, instr * self._unit)
        return self._lines[index] if index < len(self._lines) else self._tail


def _signed_byte(value: int) -> int:
    return value - 256 if value >= 128 else value


def _lnotab_ranges(table: bytes, firstlineno: int, complete: bool, ends: list[int], lines: list[int | None]
                   ) -> int | None:
    """PyCode_Addr2Line's rule: the line of byte offset ``a`` is the sum of the increments before the first pair
    whose running offset passes ``a``; past the table, the last line (None when the table was cut short)."""
    at, line = 0, firstlineno
    for index in range(0, len(table) - 1, 2):
        if table[index]:
            at += table[index]
            ends.append(at)
            lines.append(line)
        line += _signed_byte(table[index + 1])
    return line if complete else None


def _linetable310_ranges(table: bytes, firstlineno: int, complete: bool, ends: list[int],
                         lines: list[int | None]) -> int | None:
    end, line = 0, firstlineno
    for index in range(0, len(table) - 1, 2):
        delta = table[index + 1]
        if delta != NO_LINE_310:
            line += _signed_byte(delta)
        if table[index]:
            end += table[index]
            ends.append(end)
            lines.append(None if delta == NO_LINE_310 else line)
    return None


def _locations_ranges(table: bytes, firstlineno: int, complete: bool, ends: list[int],
                      lines: list[int | None]) -> int | None:
    at, end, line = 0, 0, firstlineno
    while at < len(table):
        first = table[at]
        if not first & 0x80:
            return None  # not at the start of an entry: malformed, no line from here on
        code, end = (first >> 3) & 0xF, end + (first & 7) + 1
        delta, at = _entry_line_delta(table, at + 1, code)
        if at < 0:
            return None
        line += delta or 0
        ends.append(end)
        lines.append(None if delta is None else line)
    return None


def _entry_line_delta(table: bytes, at: int, code: int) -> tuple[int | None, int]:
    """(line delta or None for "no location", index of the next entry) of the entry whose code is ``code``
    and whose bytes after the first start at ``at``; index -1 when the entry runs past the table."""
    if code == LOCATION_NONE:
        return None, at
    if code in (LOCATION_LONG, LOCATION_NO_COLUMNS):
        delta, at = _varint(table, at)
        delta = -(delta >> 1) if delta & 1 else delta >> 1
        for _ in range(3 if code == LOCATION_LONG else 0):  # end line delta, start and end columns
            _, at = _varint(table, at)
        return delta, at
    extra = 2 if code >= LOCATION_ONE_LINE else 1
    delta = code - LOCATION_ONE_LINE if code >= LOCATION_ONE_LINE else 0
    return delta, (at + extra if at + extra <= len(table) else -1)


def _varint(table: bytes, at: int) -> tuple[int, int]:
    """A varint of 6-bit chunks (bit 6: another follows) at ``at``: (value, index after it), index -1 when
    it runs past the table, past MAX_VARINT_CHUNKS or into the next entry (a byte with bit 7 set)."""
    if at < 0:
        return 0, -1
    value = 0
    for chunk in range(MAX_VARINT_CHUNKS):
        if at >= len(table) or table[at] & 0x80:
            return 0, -1
        byte = table[at]
        value |= (byte & 63) << (6 * chunk)
        at += 1
        if not byte & 64:
            return value, at
    return 0, -1
