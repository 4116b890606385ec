"""A small, bounded ELF reader: the header, the section and program header tables, and the bytes of a
few sections, which is all the symbolizer and `count`'s uprobe resolution (the one reader of function
symbols for both) need.

The files come from any local user, so every count and size in them is checked against the file's
real size and a budget before anything is read or allocated, links between sections are plain indexes
(never followed recursively), strings are cut at a bounded length, and compressed sections
(``SHF_COMPRESSED``) are inflated to at most the caller's byte budget. A malformed file raises
:class:`ElfFormatError` (a ValueError) or ``BudgetExceeded``; the caller's per-file boundary turns
either into a warning. (pyelftools, used before, builds linked sections recursively, inflates
compressed sections without a bound and raises TypeError, struct errors or RecursionError on a
crafted file; its header parse was also the slow part.)
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import BinaryIO

from optrace.errors import MalformedInput
from optrace.fileaccess import BudgetExceeded, decompress_zlib

ELF_MAGIC = b"\x7fELF"
SHT_NOBITS = 8
SHT_DYNAMIC = 6
SHF_COMPRESSED = 0x800
ELFCOMPRESS_ZLIB = 1
SHN_XINDEX = 0xFFFF
PN_XNUM = 0xFFFF
PT_LOAD = 1
PF_X = 0x1
EM_386, EM_X86_64, EM_AARCH64 = 3, 62, 183
MACHINE_NAMES = {EM_386: "EM_386", EM_X86_64: "EM_X86_64", EM_AARCH64: "EM_AARCH64"}

MAX_HEADER_TABLE_BYTES = 8 << 20  # section or program header table read at once (65536 x 64 = 4 MiB)
MAX_SECTION_NAMES_BYTES = 1 << 20  # .shstrtab
MAX_SECTION_NAME = 1024
MAX_STRING = 16 << 10  # one symbol or library name (longer ones are cut)

_LAYOUTS = {  # elfclass -> (ELF header after e_ident, section header, program header)
    32: ("HHIIIIIHHHHHH", "IIIIIIIIII", "IIIIIIII"),
    64: ("HHIQQQIHHHHHH", "IIQQQQIIQQ", "IIQQQQQQ"),
}


class ElfFormatError(MalformedInput):
    """The file is not a well-formed ELF object (or not one at all)."""


@dataclass(frozen=True, slots=True)
class SectionHeader:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int
    addr: int = 0  # sh_addr: where the section is loaded (pc-relative pointers in .eh_frame need it)


@dataclass(frozen=True, slots=True)
class ProgramHeader:
    type: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int
    flags: int = 0

    @property
    def executable(self) -> bool:
        return bool(self.flags & PF_X)

    def holds(self, vaddr: int) -> bool:
        """Whether ``vaddr`` is mapped from the file by this segment."""
        return self.vaddr <= vaddr < self.vaddr + self.filesz


class ElfFile:
    """The ELF object in ``stream`` (any seekable binary stream: a BoundedFile, a BytesIO)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.file_size = stream.seek(0, io.SEEK_END)
        ident = self.read_at(0, 16)
        if len(ident) < 16 or ident[:4] != ELF_MAGIC or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfFormatError("no ELF identification")
        self.elfclass = 32 if ident[4] == 1 else 64
        self.little_endian = ident[5] == 1
        self.endian = "<" if self.little_endian else ">"
        header_layout, self._shdr_layout, self._phdr_layout = (self.endian + f for f in _LAYOUTS[self.elfclass])
        raw = self.read_at(16, struct.calcsize(header_layout))
        if len(raw) < struct.calcsize(header_layout):
            raise ElfFormatError("truncated ELF header")
        (self.type, self.machine, _version, self.entry, self._phoff, self._shoff, _flags, _ehsize,
         self._phentsize, self._phnum, self._shentsize, self._shnum, self._shstrndx) = struct.unpack(header_layout, raw)
        self._sections: list[SectionHeader] | None = None
        self._by_name: dict[str, SectionHeader] | None = None

    # -- sections ---------------------------------------------------------------------------------------
    def sections(self) -> list[SectionHeader]:
        """Every section header the file really holds (read once)."""
        if self._sections is None:
            rows = self._table(self._shoff, self._shentsize, self._section_count(), self._shdr_layout)
            names = self._section_names(rows)
            self._sections = [SectionHeader(i, cstring(names, row[0], MAX_SECTION_NAME), row[1], row[2], *row[4:8], row[9],
                                            row[3])
                              for i, row in enumerate(rows)]
        return self._sections

    def section(self, index: int) -> SectionHeader:
        """The section at ``index`` (e.g. a ``sh_link``); ElfFormatError when there is none."""
        sections = self.sections()
        if not 0 < index < len(sections):
            raise ElfFormatError(f"section index {index} out of range")
        return sections[index]

    def section_by_name(self, name: str) -> SectionHeader | None:
        """The last section called ``name`` (as pyelftools and binutils pick), or None."""
        if self._by_name is None:
            self._by_name = {section.name: section for section in self.sections()}
        return self._by_name.get(name)

    def sections_of_type(self, section_type: int) -> list[SectionHeader]:
        return [section for section in self.sections() if section.type == section_type]

    def section_data(self, section: SectionHeader, max_bytes: int) -> bytes:
        """The section's bytes, inflated when compressed; BudgetExceeded past ``max_bytes``."""
        if section.type == SHT_NOBITS:
            return b""
        if section.size > max_bytes:
            raise BudgetExceeded(f"section {section.name} is {section.size} bytes, over the {max_bytes}-byte limit")
        data = self.read_at(section.offset, section.size)
        if len(data) < section.size:
            raise ElfFormatError(f"section {section.name} extends past the end of the file")
        if section.flags & SHF_COMPRESSED:
            return self._inflate(section, data, max_bytes)
        return data

    def read_string(self, section: SectionHeader, offset: int) -> str:
        """The NUL-terminated string at ``offset`` of a string table, read alone (at most MAX_STRING)."""
        if section.type == SHT_NOBITS or not 0 <= offset < section.size:
            raise ElfFormatError(f"string offset {offset} outside section {section.name}")
        data = self.read_at(section.offset + offset, min(MAX_STRING, section.size - offset))
        return cstring(data, 0, MAX_STRING)

    # -- program headers --------------------------------------------------------------------------------
    def segments(self) -> list[ProgramHeader]:
        count = self._phnum
        if count == PN_XNUM:
            count = self._first_section_field(7)  # sh_info
        rows = self._table(self._phoff, self._phentsize, count, self._phdr_layout)
        if self.elfclass == 64:  # type flags offset vaddr paddr filesz memsz align
            return [ProgramHeader(r[0], r[2], r[3], r[5], r[6], r[7], r[1]) for r in rows]
        return [ProgramHeader(r[0], r[1], r[2], r[4], r[5], r[7], r[6]) for r in rows]  # type offset vaddr paddr filesz memsz flags align

    @property
    def machine_name(self) -> str:
        """e_machine as binutils and pyelftools name it (``EM_X86_64``), for messages."""
        return MACHINE_NAMES.get(self.machine, f"e_machine {self.machine}")

    # -- helpers ----------------------------------------------------------------------------------------
    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset``, nothing past the end of the file (b"" outside it)."""
        if offset < 0 or offset >= self.file_size or size <= 0:
            return b""
        self.stream.seek(offset)
        return self.stream.read(min(size, self.file_size - offset))

    def _section_count(self) -> int:
        if self._shoff == 0:
            return 0
        return self._shnum if self._shnum else self._first_section_field(5)  # sh_size

    def _first_section_field(self, field: int) -> int:
        """A field of section header 0 (extended numbering: the real counts when they overflow 16 bits)."""
        rows = self._table(self._shoff, self._shentsize, 1, self._shdr_layout)
        return rows[0][field] if rows else 0

    def _table(self, offset: int, entsize: int, count: int, layout: str) -> list[tuple[int, ...]]:
        """``count`` fixed-size records at ``offset``, cut to what the file and the budget hold."""
        if offset == 0 or count == 0:
            return []
        size = struct.calcsize(layout)
        if entsize < size:
            raise ElfFormatError(f"header table entries of {entsize} bytes, fewer than {size}")
        count = min(count, max(0, self.file_size - offset) // entsize, MAX_HEADER_TABLE_BYTES // entsize)
        data = self.read_at(offset, count * entsize)
        return [struct.unpack_from(layout, data, i * entsize) for i in range(len(data) // entsize)]

    def _section_names(self, rows: list[tuple[int, ...]]) -> bytes:
        index = self._shstrndx
        if index == SHN_XINDEX and rows:
            index = rows[0][6]  # sh_link of section 0
        if not 0 < index < len(rows) or rows[index][1] == SHT_NOBITS:
            return b""
        offset, size = rows[index][4], rows[index][5]
        return self.read_at(offset, min(size, MAX_SECTION_NAMES_BYTES))

    def _inflate(self, section: SectionHeader, data: bytes, max_bytes: int) -> bytes:
        layout = self.endian + ("III" if self.elfclass == 32 else "IIQQ")  # ch_type [reserved] ch_size ch_addralign
        header_size = struct.calcsize(layout)
        if len(data) < header_size:
            raise ElfFormatError(f"compressed section {section.name} has no compression header")
        fields = struct.unpack_from(layout, data)
        kind, size = fields[0], fields[-2]
        if kind != ELFCOMPRESS_ZLIB:
            raise ElfFormatError(f"section {section.name} uses compression type {kind} (only zlib is read)")
        if size > max_bytes:
            raise BudgetExceeded(f"section {section.name} inflates to {size} bytes, over the {max_bytes}-byte limit")
        return decompress_zlib(data[header_size:], size, f"section {section.name}")


def cstring(data: bytes, offset: int, limit: int = MAX_STRING) -> str:
    """The NUL-terminated string at ``offset`` of ``data``, cut at ``limit`` bytes ("" when outside)."""
    if not 0 <= offset < len(data):
        return ""
    end = data.find(b"\0", offset, offset + limit)
    return data[offset:end if end >= 0 else offset + limit].decode("utf-8", "replace")

