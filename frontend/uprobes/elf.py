"""The function symbols and executable segments of the object a SPEC names, read through optrace.fileaccess.

``count`` runs as root and the binary it is given may belong to anyone: it is opened with the one rule for
other users' files (no symlink in the real path it was resolved to, a regular file on a disk file system,
bounded size and read time), and anything malformed in it is a one-line error, never a traceback.
Symbols come from ``.symtab`` and ``.dynsym``, read by the symbolizer's bounded ELF reader
(:mod:`optrace.frontend.symbols.symbol`), default symbol versions only.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from optrace.errors import OptraceError
from optrace.fileaccess import BoundedFile, FilePolicy, RefusedFile, open_reader, printable
from optrace.frontend.symbols.elffile import ELF_MAGIC, PT_LOAD, ElfFile, ElfFormatError, ProgramHeader
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.symbols.symbol import Symbol, read_function_symbols

# The binary is one the user named: a generous time budget (a large .symtab takes seconds to read), but a
# budget all the same.
BINARY_POLICY = FilePolicy(read_seconds=30.0)
MAX_CACHED_BINARIES = 64


@dataclass(frozen=True)
class ElfFunctions:
    """The function symbols of one object, the segments that map its file into memory, and its machine."""

    functions: tuple[Symbol, ...]
    segments: tuple[ProgramHeader, ...]  # PT_LOAD
    machine: str = "EM_X86_64"  # e_machine as binutils names it
    elfclass: int = 64

    def file_offset(self, vaddr: int) -> int | None:
        segment = self.code_segment(vaddr)
        return None if segment is None else vaddr - segment.vaddr + segment.offset

    def code_segment(self, vaddr: int) -> ProgramHeader | None:
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


_cache: LruCache[tuple[int, int, int, int], ElfFunctions] = LruCache(MAX_CACHED_BINARIES)


def load_functions(reader: BoundedFile) -> ElfFunctions:
    """Function symbols of the opened ELF file, cached per (device, inode, size, mtime)."""
    st = os.fstat(reader.fd)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    functions = _cache.get(key)
    if functions is None:
        functions = _parse(reader)
        _cache.put(key, functions)
    return functions


def _parse(reader: BoundedFile) -> ElfFunctions:
    shown = printable(reader.name)
    try:
        reader.seek(0)
        if reader.read(4) != ELF_MAGIC:
            raise OptraceError(f"{shown} is not an ELF executable or library")
        elf = ElfFile(reader)
        return ElfFunctions(functions=_read_functions(elf),
                            segments=tuple(s for s in elf.segments() if s.type == PT_LOAD),
                            machine=elf.machine_name, elfclass=elf.elfclass)
    except (ElfFormatError, struct.error) as exc:
        raise OptraceError(f"{shown} is not a valid ELF file: {printable(exc)[:200]}") from None
    except OSError as exc:  # BudgetExceeded included
        raise OptraceError(f"cannot read {shown}: {printable(exc.strerror or exc)}") from None


def _read_functions(elf: ElfFile) -> tuple[Symbol, ...]:
    """.symtab and .dynsym together, each (name, address) once."""
    seen: set[tuple[str, int]] = set()
    functions = []
    for section_name in (".symtab", ".dynsym"):
        for symbol in read_function_symbols(elf, section_name, default_versions_only=True):
            if (symbol.name, symbol.start) not in seen:
                seen.add((symbol.name, symbol.start))
                functions.append(symbol)
    return tuple(functions)
