"""Source lines of addresses from DWARF ``.debug_line`` (perf's ``srcline``), for `annotate -l`.

Only what annotate needs: the rows (address -> file, line) of the line programs, versions 2 to 5, kept for
the address ranges asked for. The file is someone else's: every read is bounded (the section under
:data:`MAX_SECTION_BYTES`, at most :data:`MAX_ROWS` rows kept, names cut), and a malformed program raises
:class:`~optrace.frontend.symbols.elffile.ElfFormatError`, which costs the object its source lines only.
"""
from __future__ import annotations

import os
import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from optrace.frontend.symbols.elffile import ElfFile, ElfFormatError
from optrace.frontend.symbols.leb128 import DwarfError, sleb128, uleb128

MAX_SECTION_BYTES = 4 << 20  # larger line tables (big libraries' debug files) take seconds here: no lines
MAX_ROWS = 100_000
MAX_NAME = 512
DW_FORM = {"string": 0x08, "line_strp": 0x1F, "strp": 0x0E, "udata": 0x0F, "data1": 0x0B, "data2": 0x05,
           "data4": 0x06, "data8": 0x07, "data16": 0x1E, "block": 0x09}
FIXED_FORM_SIZES = {0x0B: 1, 0x05: 2, 0x06: 4, 0x07: 8, 0x1E: 16}
DW_LNCT_PATH, DW_LNCT_DIRECTORY_INDEX = 1, 2


@dataclass(frozen=True)
class LineRow:
    address: int
    file: str
    line: int


class _Reader:
    def __init__(self, data: bytes, pos: int, end: int, endian: str) -> None:
        self.data, self.pos, self.end, self.endian = data, pos, end, endian

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > self.end:
            raise ElfFormatError(".debug_line: a read past its unit")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def unsigned(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little" if self.endian == "<" else "big")

    def uleb(self) -> int:
        return self._leb128(uleb128)

    def sleb(self) -> int:
        return self._leb128(sleb128)

    def _leb128(self, decode) -> int:
        try:
            value, self.pos = decode(self.data, self.pos, self.end)
        except DwarfError as err:
            raise ElfFormatError(f".debug_line: {err}") from None
        return value

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos, self.end)
        if end < 0:
            raise ElfFormatError(".debug_line: an unterminated string")
        text = self.data[self.pos:min(end, self.pos + MAX_NAME)].decode("utf-8", "replace")
        self.pos = end + 1
        return text


def line_rows(elf: ElfFile, ranges: Sequence[tuple[int, int]]) -> list[LineRow]:
    """The line-table rows whose address is in one of ``ranges`` ([start, end) link-time addresses),
    sorted by address; [] without ``.debug_line`` or with one over :data:`MAX_SECTION_BYTES` (stored)."""
    section = elf.section_by_name(".debug_line")
    if section is None or not ranges or section.size > MAX_SECTION_BYTES:
        return []
    data = elf.section_data(section, MAX_SECTION_BYTES)
    strings = _strings(elf, ".debug_line_str"), _strings(elf, ".debug_str")
    rows: list[LineRow] = []
    inside = _Ranges(ranges)
    pos = 0
    while pos < len(data) and len(rows) < MAX_ROWS:
        pos = _unit(data, pos, elf.endian, strings, inside, rows)
    rows.sort(key=lambda row: row.address)
    return rows[:MAX_ROWS]


def _strings(elf: ElfFile, name: str) -> bytes:
    section = elf.section_by_name(name)
    return elf.section_data(section, MAX_SECTION_BYTES) if section is not None else b""


def _unit(data: bytes, pos: int, endian: str, strings: tuple[bytes, bytes], inside: _Ranges,
          rows: list[LineRow]) -> int:
    """Read one line-program unit at ``pos`` into ``rows``; returns where the next unit starts."""
    head = _Reader(data, pos, len(data), endian)
    length, offset_size = head.unsigned(4), 4
    if length == 0xFFFFFFFF:
        length, offset_size = head.unsigned(8), 8
    end = head.pos + length
    if end > len(data):
        raise ElfFormatError(".debug_line: a unit longer than the section")
    r = _Reader(data, head.pos, end, endian)
    version = r.unsigned(2)
    if not 2 <= version <= 5:
        raise ElfFormatError(f".debug_line: version {version}")
    if version >= 5:
        r.take(2)  # address_size, segment_selector_size
    header_length = r.unsigned(offset_size)
    program = r.pos + header_length
    min_inst = r.unsigned(1)
    if version >= 4:
        r.take(1)  # maximum_operations_per_instruction (VLIW only)
    r.take(1)  # default_is_stmt
    line_base = struct.unpack("b", r.take(1))[0]
    line_range = r.unsigned(1)
    opcode_base = r.unsigned(1)
    if line_range == 0 or opcode_base == 0:
        raise ElfFormatError(".debug_line: a zero line_range or opcode_base")
    lengths = list(r.take(opcode_base - 1))
    files = _files_v5(r, offset_size, strings) if version >= 5 else _files_v4(r)
    r.pos = program
    _run(r, files, min_inst, line_base, line_range, opcode_base, lengths, inside, rows)
    return end


def _files_v4(r: _Reader) -> list[str]:
    dirs = [""]
    while True:
        name = r.cstring()
        if not name:
            break
        dirs.append(name)
    files = [""]  # file numbers start at 1 before DWARF 5
    while True:
        name = r.cstring()
        if not name:
            return files
        directory = r.uleb()
        r.uleb(), r.uleb()
        files.append(_join(dirs[directory] if directory < len(dirs) else "", name))


def _files_v5(r: _Reader, offset_size: int, strings: tuple[bytes, bytes]) -> list[str]:
    dirs = [entry.get(DW_LNCT_PATH, "") for entry in _entries(r, offset_size, strings)]
    files = []
    for entry in _entries(r, offset_size, strings):
        index = entry.get(DW_LNCT_DIRECTORY_INDEX, 0)
        directory = dirs[index] if isinstance(index, int) and index < len(dirs) else ""
        files.append(_join(directory, str(entry.get(DW_LNCT_PATH, "?"))))
    return files


def _entries(r: _Reader, offset_size: int, strings: tuple[bytes, bytes]) -> list[dict[int, object]]:
    formats = [(r.uleb(), r.uleb()) for _ in range(r.unsigned(1))]
    count = r.uleb()
    if count > MAX_ROWS:
        raise ElfFormatError(".debug_line: too many directory or file entries")
    return [{content: _form(r, form, offset_size, strings) for content, form in formats} for _ in range(count)]


def _form(r: _Reader, form: int, offset_size: int, strings: tuple[bytes, bytes]) -> object:
    if form == DW_FORM["string"]:
        return r.cstring()
    if form in (DW_FORM["line_strp"], DW_FORM["strp"]):
        table = strings[0] if form == DW_FORM["line_strp"] else strings[1]
        return _string_at(table, r.unsigned(offset_size))
    if form == DW_FORM["udata"]:
        return r.uleb()
    if form in FIXED_FORM_SIZES:
        size = FIXED_FORM_SIZES[form]
        return r.unsigned(size) if size <= 8 else r.take(size)
    if form == DW_FORM["block"]:
        return r.take(r.uleb())
    raise ElfFormatError(f".debug_line: form 0x{form:x} in an entry format")


def _string_at(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ElfFormatError(".debug_line: a string offset past its table")
    return table[offset:min(end, offset + MAX_NAME)].decode("utf-8", "replace")


def _join(directory: str, name: str) -> str:
    return name if not directory or name.startswith("/") else os.path.join(directory, name)


def _run(r: _Reader, files: list[str], min_inst: int, line_base: int, line_range: int, opcode_base: int,
         lengths: list[int], inside: _Ranges, rows: list[LineRow]) -> None:
    """The line-number state machine (DWARF 5, 6.2.5), emitting rows at addresses ``inside``. Written for speed
    (a big library's program is megabytes): bytes read in place, one-byte LEB128s inline."""
    data, pos, end, order = r.data, r.pos, r.end, "little" if r.endian == "<" else "big"
    address, file, line = 0, 1, 1
    try:
        while pos < end:
            op = data[pos]
            pos += 1
            if op >= opcode_base:
                adjusted = op - opcode_base
                address += (adjusted // line_range) * min_inst
                line += line_base + adjusted % line_range
            elif op == 1:
                pass
            elif op == 0:
                size, pos = uleb128(data, pos, end)
                after = pos + size
                sub = data[pos] if size else 0
                if sub == 1:  # end_sequence
                    address, file, line = 0, 1, 1
                elif sub == 2:
                    address = int.from_bytes(data[pos + 1:after], order)
                pos = after
                continue
            elif op == 2:
                advance, pos = (data[pos], pos + 1) if data[pos] < 0x80 else uleb128(data, pos, end)
                address += advance * min_inst
                continue
            elif op == 3:
                delta, pos = sleb128(data, pos, end)
                line += delta
                continue
            elif op == 4:
                file, pos = (data[pos], pos + 1) if data[pos] < 0x80 else uleb128(data, pos, end)
                continue
            elif op == 8:
                address += ((255 - opcode_base) // line_range) * min_inst
                continue
            elif op == 9:
                address += int.from_bytes(data[pos:pos + 2], order)
                pos += 2
                continue
            else:  # set_column, negate_stmt, ... and unknown opcodes: skip their operands
                for _ in range(lengths[op - 1] if op - 1 < len(lengths) else 0):
                    _, pos = uleb128(data, pos, end)
                continue
            if address in inside and len(rows) < MAX_ROWS:  # a row: special opcodes and copy
                rows.append(LineRow(address, files[file] if 0 <= file < len(files) else "?", line))
    except (DwarfError, IndexError):
        raise ElfFormatError(".debug_line: an opcode past its unit") from None
    if pos > end:
        raise ElfFormatError(".debug_line: an opcode past its unit")


class _Ranges:
    """``address in ranges`` for sorted, merged [start, end) ranges, by bisection."""

    def __init__(self, ranges: Sequence[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, stop in sorted(ranges):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        self._starts = [start for start, _ in merged]
        self._ends = [stop for _, stop in merged]
        self._low, self._high = (self._starts[0], self._ends[-1]) if merged else (0, 0)

    def __contains__(self, address: int) -> bool:
        if not self._low <= address < self._high:
            return False
        i = bisect_right(self._starts, address) - 1
        return i >= 0 and address < self._ends[i]
