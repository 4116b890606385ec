"""Function symbols of one ELF object, the one rule that picks a name among aliases, and the sorted
table that names an address (perf's ``symbol``). `report` (through the symbolizer) and `count` (uprobe
resolution) both read symbols here, so they name a function alike."""
from __future__ import annotations

import bisect
import struct
import sys
from array import array
from itertools import accumulate
from operator import attrgetter
from dataclasses import dataclass
from typing import Iterable, Sequence

from optrace.fileaccess import BudgetExceeded
from optrace.frontend.symbols.elffile import SHT_NOBITS, ElfFile, ElfFormatError, SectionHeader, cstring

STT_FUNC = 2
STT_GNU_IFUNC = 10
STB_LOCAL = 0
STB_GLOBAL = 1
STB_WEAK = 2
SHN_UNDEF = 0
SHT_GNU_VERSYM = 0x6FFFFFFF
VERSYM_HIDDEN = 0x8000
MAX_NESTING = 8  # how far back to look for a sized symbol covering an address (nested symbols)
MAX_TABLE_BYTES = 64 << 20  # a symbol table or its string table (libLLVM's debug .strtab: ~30 MB)
MAX_FUNCTION_SYMBOLS = 1_000_000  # about 130 MB of Symbol objects while a table is built
MAX_NAME_BYTES = 128 << 20
MAX_ADDRESS = (1 << 64) - 1


@dataclass(slots=True)  # slots: a big binary reads 100k at once; not frozen: frozen __init__ made reads 10% slower
class Symbol:
    start: int  # virtual address as linked (st_value)
    size: int
    name: str  # as in the string table (mangled), without a ``@VERSION`` suffix
    binding: int = STB_GLOBAL
    is_ifunc: bool = False  # STT_GNU_IFUNC: the code at ``start`` is the resolver, not the function

    @property
    def end(self) -> int:
        return self.start + self.size


def read_function_symbols(elf: ElfFile, section_name: str, *, default_versions_only: bool = False) -> list[Symbol]:
    """The STT_FUNC / STT_GNU_IFUNC symbols defined in ``section_name`` (.symtab or .dynsym).

    ``default_versions_only`` leaves out non-default symbol versions (``realpath@GLIBC_2.2.5`` beside
    ``realpath@@GLIBC_2.3``: hidden in .gnu.version, or a single ``@`` in a .symtab name), which a
    uprobe on ``realpath`` must not hit; symbolization keeps them (their code runs too).

    Unpacks the raw table with :func:`struct.iter_unpack` (per-symbol objects are too slow for binaries
    with 100k symbols). Bounded for hostile files: the table and its string table are read under
    MAX_TABLE_BYTES each, names are cut at MAX_STRING bytes, and past MAX_FUNCTION_SYMBOLS or
    MAX_NAME_BYTES of names in all (many symbols naming one long string) BudgetExceeded is raised.
    """
    section = elf.section_by_name(section_name)
    if section is None or section.type == SHT_NOBITS or section.entsize == 0:
        return []
    end = elf.endian
    layout = end + ("IBBHQQ" if elf.elfclass == 64 else "IIIBBH")
    if section.entsize != struct.calcsize(layout):
        raise ElfFormatError(f"{section_name} entries of {section.entsize} bytes")
    strings = elf.section_data(elf.section(section.link), MAX_TABLE_BYTES)
    data = elf.section_data(section, MAX_TABLE_BYTES)
    data = data[:len(data) - len(data) % section.entsize]
    if elf.elfclass == 64:
        rows = ((n, i, s, v, z) for n, i, _o, s, v, z in struct.iter_unpack(layout, data))
    else:
        rows = ((n, i, s, v, z) for n, v, z, i, _o, s in struct.iter_unpack(layout, data))
    if default_versions_only:
        hidden = _hidden_versions(elf, section)
        rows = (row for index, row in enumerate(rows) if index not in hidden)
    symbols: list[Symbol] = []
    name_bytes = 0
    for name_at, info, shndx, value, size in rows:
        kind = info & 0xF
        if kind not in (STT_FUNC, STT_GNU_IFUNC) or shndx == SHN_UNDEF or value == 0:
            continue
        name, at, version = cstring(strings, name_at).partition("@")  # glibc's .symtab: "clock_gettime@@GLIBC_2.17"
        if not name or (default_versions_only and at and not version.startswith("@")):
            continue
        symbols.append(Symbol(value, size, name, info >> 4, kind == STT_GNU_IFUNC))
        name_bytes += len(name)
        if len(symbols) > MAX_FUNCTION_SYMBOLS or name_bytes > MAX_NAME_BYTES:
            raise BudgetExceeded(f"{section_name} holds more than {MAX_FUNCTION_SYMBOLS} functions "
                                 f"or {MAX_NAME_BYTES} bytes of names")
    return symbols


def _hidden_versions(elf: ElfFile, symbols: SectionHeader) -> frozenset[int]:
    """Indexes of the ``symbols`` entries whose GNU version (.gnu.version) is hidden: non-default."""
    versions = next((s for s in elf.sections_of_type(SHT_GNU_VERSYM) if s.link == symbols.index), None)
    if versions is None:
        return frozenset()
    data = elf.section_data(versions, MAX_TABLE_BYTES)
    entries = array("H", data[:len(data) - len(data) % 2])
    if (sys.byteorder == "little") != elf.little_endian:
        entries.byteswap()
    return frozenset(index for index, version in enumerate(entries) if version & VERSYM_HIDDEN)


def name_preference(name: str | bytes) -> tuple[int, int]:
    """perf's choice among aliases by name alone (all kallsyms knows): fewer leading underscores,
    then the longest name."""
    underscores = len(name) - len(name.lstrip(b"_" if isinstance(name, bytes) else "_"))
    return -underscores, len(name)


def _preference(symbol: Symbol) -> tuple:
    """perf's choose_best_symbol for aliases at one address: sized, not weak, global, then by name."""
    return (symbol.size > 0, symbol.binding != STB_WEAK, symbol.binding == STB_GLOBAL,
            *name_preference(symbol.name))


def preferred_alias(aliases: Sequence[Symbol]) -> Symbol:
    """The alias whose name is shown for their address (the first of equally preferred ones): the one
    rule for `report`'s frames and `count`'s probes."""
    return max(aliases, key=_preference)


def _preferred_aliases(ordered: list[Symbol]) -> list[Symbol]:
    """One symbol per address of ``ordered`` (sorted by start, aliases in input order): the preferred
    alias."""
    kept: list[Symbol] = []
    for symbol in ordered:
        if kept and kept[-1].start == symbol.start:
            kept[-1] = preferred_alias((kept[-1], symbol))
        else:
            kept.append(symbol)
    return kept


class SymbolTable:
    """Sorted function symbols; :meth:`find` is a bisect, so 100k lookups take well under a second.

    Kept compact (a long-running exporter holds hundreds of tables): starts and ends in arrays, the
    names in one UTF-8 blob cut by an offsets array and decoded on lookup: 20 bytes a symbol plus its
    name's bytes, where Python objects took about 150 more."""

    def __init__(self, symbols: Iterable[Symbol]) -> None:
        ordered = _preferred_aliases(sorted(symbols, key=attrgetter("start")))
        self._starts = array("Q", [s.start for s in ordered])
        self._ends = array("Q", [min(s.start + s.size, MAX_ADDRESS) for s in ordered])
        names = [s.name.encode("utf-8", "surrogateescape") for s in ordered]
        self._name_ends = array("I", accumulate(map(len, names)))  # name i is _names[_name_ends[i-1]:_name_ends[i]]
        self._names = b"".join(names)

    @classmethod
    def from_arrays(cls, starts: array, ends: array, name_ends: array, names: bytes) -> "SymbolTable":
        """A table as :meth:`to_arrays` gave it (frontend/symbols/symbolstore.py); ValueError when the arrays
        do not make one."""
        if not len(starts) == len(ends) == len(name_ends) or (name_ends and name_ends[-1] != len(names)):
            raise ValueError("the arrays of a symbol table do not add up")
        table = cls(())
        table._starts, table._ends, table._name_ends, table._names = starts, ends, name_ends, names
        return table

    def to_arrays(self) -> tuple[array, array, array, bytes]:
        return self._starts, self._ends, self._name_ends, self._names

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def nbytes(self) -> int:
        """Memory held by the table's arrays and names."""
        return sum(a.itemsize * len(a) for a in (self._starts, self._ends, self._name_ends)) + len(self._names)

    def find(self, address: int) -> str | None:
        """The symbol covering ``address``: a sized symbol that contains it, else the nearest symbol
        below it when that one has no size (perf extends zero-size symbols to the next symbol)."""
        index = self._covering(address)
        return None if index is None else self._name(index)

    def span(self, address: int) -> tuple[str, int, int] | None:
        """(name, start, end) of the symbol :meth:`find` names; a zero-size symbol ends at the next one."""
        index = self._covering(address)
        if index is None:
            return None
        end = self._ends[index]
        if end == self._starts[index]:
            end = self._starts[index + 1] if index + 1 < len(self._starts) else end
        return self._name(index), self._starts[index], end

    def _covering(self, address: int) -> int | None:
        nearest = bisect.bisect_right(self._starts, address) - 1
        if nearest < 0:
            return None
        if self._ends[nearest] > address:
            return nearest
        for index in range(nearest - 1, max(nearest - MAX_NESTING, -1), -1):
            if self._ends[index] > address:
                return index
        if self._ends[nearest] == self._starts[nearest]:
            return nearest
        return None

    def _name(self, index: int) -> str:
        start = self._name_ends[index - 1] if index else 0
        return self._names[start:self._name_ends[index]].decode("utf-8", "surrogateescape")
