"""One ELF object (perf's ``dso``): where to read it, its PT_LOAD layout (file offset -> virtual
address) and its function symbols, loaded once on first use from the best source available."""
from __future__ import annotations

import io
import lzma
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from elftools.common.exceptions import ELFError

from optrace.frontend.symbols import debuginfo
from optrace.frontend.symbols.buildid import read_build_id
from optrace.frontend.symbols.demangle import demangle
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.symbol import Symbol, SymbolTable, read_function_symbols

READ_ERRORS = (OSError, ELFError, lzma.LZMAError, ValueError, KeyError, IndexError)


@dataclass(frozen=True)
class LoadSegment:
    offset: int
    size: int  # bytes in the file
    vaddr: int


@dataclass
class DsoContext:
    """What every Dso shares: where debug files live, where problems and counts go."""

    debug_roots: Sequence[str]
    warn: Callable[[str], None]
    stats: dict[str, int] = field(default_factory=dict)

    def count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1


class Dso:
    """An ELF object read from ``path`` (or from an in-memory ``image`` such as the vDSO).

    ``name`` is what frames show (the path as the process mapped it). ``debug_only`` means ``path`` is a
    separate debug file found by build-id while the binary itself was not found: its program headers
    keep virtual addresses but not file offsets, so the layout is rebuilt (see
    :func:`reconstruct_segments`).
    """

    def __init__(self, name: str, context: DsoContext, *, path: str | None = None, image: bytes | None = None,
                 build_id: bytes | None = None, debug_only: bool = False) -> None:
        self.name = name
        self.path = path
        self.build_id = build_id
        self.symbol_source = ""  # "symtab", "debug <path>", "minidebuginfo", "dynsym" once loaded
        self._context = context
        self._image = image
        self._debug_only = debug_only
        self._segments: list[LoadSegment] | None = None
        self._symbols = SymbolTable(())

    @property
    def table_bytes(self) -> int:
        """Memory held by the loaded symbol table (0 before it is loaded)."""
        return self._symbols.nbytes

    @property
    def basename(self) -> str:
        return os.path.basename(self.name) or self.name

    def symbol_at(self, file_offset: int) -> str | None:
        """The demangled name of the function at ``file_offset``, or None."""
        if self._segments is None:
            self._load()
        for segment in self._segments:
            if segment.offset <= file_offset < segment.offset + segment.size:
                name = self._symbols.find(segment.vaddr + file_offset - segment.offset)
                return demangle(name) if name else None
        return None

    def _open(self) -> BinaryIO:
        if self._image is not None:
            return io.BytesIO(self._image)
        return open(self.path, "rb")

    def _load(self) -> None:
        self._segments = []
        self._context.count("dsos_loaded")
        try:
            with self._open() as stream:
                if not self._debug_only and not self._build_id_matches(stream):
                    return
                elf = ElfFile(stream)
                segments = reconstruct_segments(elf) if self._debug_only else load_segments(elf)
                self._symbols = SymbolTable(self._read_symbols(elf))
                self._segments = segments
        except READ_ERRORS as err:
            self._context.warn(f"cannot read {self.path or self.name}: {_reason(err)}; "
                               f"its frames show as {self.basename}+0xOFFSET")

    def _build_id_matches(self, stream: BinaryIO) -> bool:
        found = read_build_id(stream)
        stream.seek(0)
        if self.build_id is None:
            self.build_id = found
            return True
        if found == self.build_id:
            return True
        self._context.warn(f"{self.path} changed since it was seen (build-id {self.build_id.hex()} expected, "
                           f"{found.hex() if found else 'none'} found); its frames show as {self.basename}+0xOFFSET")
        return False

    def _read_symbols(self, elf: ElfFile) -> list[Symbol]:
        """.symtab, else the separate debug file's .symtab, else MiniDebugInfo (+ .dynsym), else .dynsym."""
        symbols = read_function_symbols(elf, ".symtab")
        if symbols or self._debug_only:
            self.symbol_source = "symtab"
            return symbols
        debug_symbols = self._separate_debug_symbols(elf)
        if debug_symbols:
            return debug_symbols
        dynamic = read_function_symbols(elf, ".dynsym")
        image = debuginfo.mini_debuginfo(elf)
        if image is not None:
            self.symbol_source = "minidebuginfo"
            return read_function_symbols(ElfFile(io.BytesIO(image)), ".symtab") + dynamic
        self.symbol_source = "dynsym"
        return dynamic

    def _separate_debug_symbols(self, elf: ElfFile) -> list[Symbol]:
        roots = self._context.debug_roots
        path = debuginfo.build_id_debug_path(self.build_id, roots) if self.build_id else None
        if path is None and self.path is not None:
            link = debuginfo.read_debuglink(elf)
            path = debuginfo.find_debuglink_file(self.name, link, roots) if link else None
        if path is None:
            return []
        try:
            with open(path, "rb") as stream:
                symbols = read_function_symbols(ElfFile(stream), ".symtab")
        except READ_ERRORS as err:
            self._context.warn(f"cannot read debug file {path}: {_reason(err)}")
            return []
        self.symbol_source = f"debug {path}"
        return symbols


def load_segments(elf: ElfFile) -> list[LoadSegment]:
    return [LoadSegment(seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
            for seg in elf.segment_headers() if seg["p_type"] == "PT_LOAD"]


def reconstruct_segments(elf: ElfFile) -> list[LoadSegment]:
    """The binary's PT_LOAD layout rebuilt from a debug file's program headers.

    ``objcopy --only-keep-debug`` keeps p_vaddr/p_memsz but zeroes p_offset/p_filesz. Linkers lay
    segments out in order, each at the first file offset past the previous one that is congruent to its
    p_vaddr modulo p_align; replaying that rule gives the original offsets for GNU ld and lld output.
    """
    segments = []
    previous_end = None
    for seg in sorted((s for s in elf.segment_headers() if s["p_type"] == "PT_LOAD"), key=lambda s: s["p_vaddr"]):
        align = max(seg["p_align"], 1)
        vaddr = seg["p_vaddr"]
        offset = vaddr % align if previous_end is None else previous_end + (vaddr - previous_end) % align
        segments.append(LoadSegment(offset, seg["p_memsz"], vaddr))
        previous_end = offset + seg["p_memsz"]
    return segments


def _reason(err: Exception) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return f"not a valid ELF file ({err})" if isinstance(err, ELFError) else str(err) or type(err).__name__
