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
bytes) rather than raising. A table is decoded once into a :class:`LineIndex` (its address ranges, the
neighbours of one line merged): each line is then a binary search, whatever instruction a frame word names.
Decoding at every lookup cost the whole table each time: a process whose frames named instructions near
the end of 64 KiB tables, new ones at every sample, held record's symbolization for minutes (issue 40).
"""
from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

from optrace.pythonlayout import LINES_310, LINES_LNOTAB, LINES_LOCATIONS

CODE_UNIT = 2  # bytes of an instruction unit (3.6+)
NO_LINE_310 = 0x80  # 3.10's line delta of a range without a line (-128)
MAX_VARINT_CHUNKS = 6  # 36 bits: no real table needs more (CPython writes at most 32-bit values)
LOCATION_NONE, LOCATION_LONG, LOCATION_NO_COLUMNS = 15, 14, 13
LOCATION_ONE_LINE = 10  # codes 10-12: line delta 0-2, two column bytes follow


NO_LINE = -(1 << 63)  # a range without a line, in a LineIndex (no table's sums reach it)
Ranges = Iterator[tuple[int, int, int | None]]  # (start, end, line or None) in code units, in order


@dataclass(frozen=True)
class LineIndex:
    """A table's ranges: ``starts[i]`` to the next start (the last to ``end``) has line ``lines[i]``
    (NO_LINE: none); from ``end`` on, ``tail``."""

    starts: array
    lines: array
    end: int
    tail: int | None
    firstlineno: int

    def line(self, instr: int) -> int | None:
        if instr < 0:
            return self.firstlineno
        if instr >= self.end:
            return self.tail
        index = bisect_right(self.starts, instr) - 1
        return None if index < 0 or self.lines[index] == NO_LINE else self.lines[index]


def line_index(kind: str, table: bytes, firstlineno: int, complete: bool = True) -> LineIndex:
    """The table decoded once (see the module's docstring); a kind not known gives no line at all."""
    tail: list[int | None] = [None]
    ranges = {LINES_LNOTAB: lambda: _lnotab_ranges(table, firstlineno, complete, tail),
              LINES_310: lambda: _linetable310_ranges(table, firstlineno),
              LINES_LOCATIONS: lambda: _locations_ranges(table, firstlineno)}.get(kind, lambda: iter(()))()
    starts, lines, end = array("q"), array("q"), 0
    for start, stop, line in ranges:
        if stop <= start:
            continue
        value = NO_LINE if line is None else line
        if start != end or not lines or lines[-1] != value:  # a gap, or another line: a range of its own
            if start != end and lines:
                starts.append(end)
                lines.append(NO_LINE)
            starts.append(start)
            lines.append(value)
        end = stop
    return LineIndex(starts, lines, end, tail[0], firstlineno)


def line_of(kind: str, table: bytes, firstlineno: int, instr: int, complete: bool = True) -> int | None:
    """The line of instruction ``instr`` (in code units) by a table of ``kind`` (a LINES_* value); None when
    the table gives it no line, or when ``complete`` is False and the cut-off table does not reach it."""
    return line_index(kind, table, firstlineno, complete).line(instr)


def _signed_byte(value: int) -> int:
    return value - 256 if value >= 128 else value


def _units(address: int) -> int:
    """The first code unit at or after byte ``address`` (units are CODE_UNIT bytes)."""
    return -(-address // CODE_UNIT)


def _lnotab_ranges(table: bytes, firstlineno: int, complete: bool, tail: list[int | None]) -> Ranges:
    """Byte offsets from ``at`` up to the next pair's are the line before that pair's increment; past the
    last pair, the last line if the table is complete (``tail[0]``)."""
    at, line = 0, firstlineno
    for index in range(0, len(table) - 1, 2):
        yield _units(at), _units(at + table[index]), line
        at += table[index]
        line += _signed_byte(table[index + 1])
    tail[0] = line if complete else None


def _linetable310_ranges(table: bytes, firstlineno: int) -> Ranges:
    end, line = 0, firstlineno
    for index in range(0, len(table) - 1, 2):
        start, end = end, end + table[index]
        delta = table[index + 1]
        if delta != NO_LINE_310:
            line += _signed_byte(delta)
        yield _units(start), _units(end), None if delta == NO_LINE_310 else line


def _locations_ranges(table: bytes, firstlineno: int) -> Ranges:
    """Up to the first malformed entry (not at an entry's start, or running past the table)."""
    at, end, line = 0, 0, firstlineno
    while at < len(table):
        first = table[at]
        if not first & 0x80:
            return
        code, start, end = (first >> 3) & 0xF, end, end + (first & 7) + 1
        delta, at = _entry_line_delta(table, at + 1, code)
        if at < 0:
            return
        line += delta or 0
        yield start, end, None if delta is None else line


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
