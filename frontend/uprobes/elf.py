"""The function symbols and executable segments of the object a SPEC names, read through optrace.fileaccess.

``count`` runs as root and the binary it is given may belong to anyone: it is opened with the one rule for
other users' files (no symlink in the real path it was resolved to, a regular file on a disk file system,
bounded size and read time), and anything malformed in it is a one-line error, never a traceback.
Symbols come from ``.symtab`` and ``.dynsym`` (pyelftools).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerSymSection

from optrace.fileaccess import BoundedFile, FilePolicy, RefusedFile, open_reader, printable
from optrace.errors import OptraceError

# The binary is one the user named: a generous time budget (a large .symtab takes seconds to parse), but a
# budget all the same.
BINARY_POLICY = FilePolicy(read_seconds=30.0)
_FUNCTION_TYPES = {"STT_FUNC": False, "STT_LOOS": True, "STT_GNU_IFUNC": True}  # type -> is IFUNC
_VERSYM_HIDDEN = 0x8000
_PF_X = 0x1
_SYM_SIZES = {32: 16, 64: 24}  # sizeof(Elf32_Sym), sizeof(Elf64_Sym)
_CACHED = 64
# What a malformed ELF makes pyelftools raise, besides ELFError: a bad sh_link or sh_entsize, a string
# table that is not text, a count that does not fit.
_MALFORMED = (ELFError, ConstructError, struct.error, ValueError, LookupError, TypeError, AttributeError,
              ArithmeticError, AssertionError, RecursionError)


@dataclass(frozen=True)
class FunctionSymbol:
    name: str
    vaddr: int
    size: int
    is_ifunc: bool
    is_global: bool

    @property
    def end(self) -> int:
        return self.vaddr + self.size


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD program header: ``filesz`` bytes at file ``offset`` mapped at ``vaddr``."""

    vaddr: int
    filesz: int
    offset: int
    executable: bool

    def holds(self, vaddr: int) -> bool:
        return self.vaddr <= vaddr < self.vaddr + self.filesz


@dataclass(frozen=True)
class ElfFunctions:
    """The function symbols of one object, the segments that map its file into memory, and its machine."""

    functions: tuple[FunctionSymbol, ...]
    segments: tuple[Segment, ...]
    machine: str = "EM_X86_64"  # e_machine as pyelftools names it
    elfclass: int = 64

    def file_offset(self, vaddr: int) -> int | None:
        segment = self.code_segment(vaddr)
        return None if segment is None else vaddr - segment.vaddr + segment.offset

    def code_segment(self, vaddr: int) -> Segment | None:
        """The executable segment that maps ``vaddr`` from the file, if any."""
        return next((s for s in self.segments if s.executable and s.holds(vaddr)), None)


def open_binary(path: str) -> BoundedFile:
    """``path`` (a real path: symlinks already resolved) opened under :data:`BINARY_POLICY`."""
    try:
        reader = open_reader(path, BINARY_POLICY)
    except RefusedFile as exc:
        raise OptraceError(f"cannot use {exc}") from None
    except OSError as exc:
        raise OptraceError(f"cannot read {printable(path)}: {exc.strerror or exc}") from None
    if reader is None:
        raise OptraceError(f"no such file: {printable(path)}")
    return reader


_cache: dict[tuple[int, int, int, int], ElfFunctions] = {}


def load_functions(reader: BoundedFile) -> ElfFunctions:
    """Function symbols of the opened ELF file, cached per (device, inode, mtime, size)."""
    st = os.fstat(reader.fd)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _cache:
        if len(_cache) >= _CACHED:
            del _cache[next(iter(_cache))]
        _cache[key] = _parse(reader)
    return _cache[key]


def _parse(reader: BoundedFile) -> ElfFunctions:
    shown = printable(reader.name)
    try:
        reader.seek(0)
        if reader.read(4) != b"\x7fELF":
            raise OptraceError(f"{shown} is not an ELF executable or library")
        elf = ELFFile(reader)
        return ElfFunctions(functions=_read_functions(elf), segments=_segments(elf),
                            machine=str(elf["e_machine"]), elfclass=elf.elfclass)
    except _MALFORMED as exc:
        raise OptraceError(f"{shown} is not a valid ELF file: {printable(exc)[:200]}") from None
    except OSError as exc:  # BudgetExceeded included
        raise OptraceError(f"cannot read {shown}: {printable(exc.strerror or exc)}") from None


def _segments(elf: ELFFile) -> tuple[Segment, ...]:
    return tuple(
        Segment(seg["p_vaddr"], seg["p_filesz"], seg["p_offset"], bool(seg["p_flags"] & _PF_X))
        for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"
    )


def _hidden_versions(elf: ELFFile) -> set[int]:
    """Indices of .dynsym entries that are non-default symbol versions (``name@VER``, not ``@@``)."""
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    if versym is None:
        return set()
    hidden = set()
    for index in range(versym.num_symbols()):
        ndx = versym.get_symbol(index).entry["ndx"]  # an int, or a name for the reserved values
        if isinstance(ndx, int) and ndx & _VERSYM_HIDDEN:
            hidden.add(index)
    return hidden


def _read_functions(elf: ELFFile) -> tuple[FunctionSymbol, ...]:
    seen: set[tuple[str, int]] = set()
    functions = []
    for section_name in (".symtab", ".dynsym"):
        section = elf.get_section_by_name(section_name)
        if section is None:
            continue
        if section["sh_entsize"] != _SYM_SIZES[elf.elfclass]:  # else one byte could be read as many symbols
            raise ELFError(f"{section_name} has entries of {section['sh_entsize']} bytes")
        hidden = _hidden_versions(elf) if section_name == ".dynsym" else set()
        for index, sym in enumerate(section.iter_symbols()):
            kind = sym["st_info"]["type"]
            if kind not in _FUNCTION_TYPES or sym["st_shndx"] == "SHN_UNDEF" or not sym["st_value"]:
                continue
            if index in hidden or not sym.name or (sym.name, sym["st_value"]) in seen:
                continue
            seen.add((sym.name, sym["st_value"]))
            functions.append(FunctionSymbol(
                name=sym.name, vaddr=sym["st_value"], size=sym["st_size"],
                is_ifunc=_FUNCTION_TYPES[kind], is_global=sym["st_info"]["bind"] != "STB_LOCAL",
            ))
    return tuple(functions)
