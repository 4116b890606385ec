"""One ELF object (perf's ``dso``): where to read it, its PT_LOAD layout (file offset -> virtual
address) and its functions, loaded once on first use: its symbols from the best source available, and for
the code no symbol covers, the functions its FDEs give (named ``basename+0xSTART``, see fderanges)."""
from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from optrace.frontend.symbols import debuginfo
from optrace.fileaccess import BoundedFile
from optrace.frontend.symbols.access import FileProblems, FileRef, open_ref
from optrace.frontend.symbols.buildid import read_build_id
from optrace.frontend.symbols.demangle import demangle
from optrace.frontend.symbols.elffile import PT_LOAD, ElfFile, ProgramHeader
from optrace.frontend.symbols.fderanges import UNNAMED, FdeRanges, fde_ranges, with_unnamed_functions
from optrace.frontend.symbols.srcline import LineRow, line_rows
from optrace.frontend.symbols.symbolstore import store_key
from optrace.frontend.symbols.symbol import (MAX_FUNCTION_SYMBOLS, STB_GLOBAL, Symbol, SymbolTable,
                                             read_function_symbols)

MAX_LOAD_SEGMENTS = 64  # PT_LOADs kept per object (linkers write 2-5)

Identity = tuple[int, int]  # st_dev, st_ino


@dataclass(frozen=True)
class LoadSegment:
    offset: int
    size: int  # bytes in the file
    vaddr: int


@dataclass(frozen=True)
class FunctionBytes:
    """A function's code as read from its object: ``vaddr`` as linked, ``offset`` in the file."""

    name: str
    vaddr: int
    offset: int
    code: bytes
    size: int  # the function's whole size (``code`` may be cut short)


@dataclass(frozen=True)
class _Function:
    """A function of a Dso: its shown name, link-time [start, end), and where its code starts in the file."""

    name: str
    start: int
    end: int
    offset: int
    segment: LoadSegment


@dataclass
class DsoContext:
    """What every Dso shares: where debug files live, where problems and counts go."""

    debug_roots: Sequence[str]
    warn: Callable[[str], None]
    stats: dict[str, int] = field(default_factory=dict)
    store: object | None = None  # a SymbolStore (symbolstore.py): tables read in earlier runs, and kept

    def __post_init__(self) -> None:
        self.problems = FileProblems(self.warn, self.stats)

    def count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1


class Dso:
    """An ELF object read from ``source`` (or from an in-memory ``image`` such as the vDSO).

    ``name`` is what frames show (the path as the process mapped it). ``debug_only`` means ``source`` is
    a separate debug file found by build-id while the binary itself was not found: its program headers
    keep virtual addresses but not file offsets, so the layout is rebuilt (see
    :func:`reconstruct_segments`). Whatever goes wrong while reading one file costs that file's names
    only (:class:`FileProblems`): its frames show as ``basename+0xOFFSET``.
    """

    def __init__(self, name: str, context: DsoContext, *, source: FileRef | None = None, image: bytes | None = None,
                 build_id: bytes | None = None, debug_only: bool = False) -> None:
        self.name = name
        self.source = source
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

    @property
    def shown(self) -> str:
        """The file named in warnings: the one read (a debug file for debug-only objects)."""
        return (self.source.read_path if self.source is not None else None) or self.name

    def symbol_at(self, file_offset: int) -> str | None:
        """The demangled name of the function at ``file_offset`` (``basename+0xSTART`` for one known by its
        FDE only), or None."""
        found = self._function_at(file_offset)
        return found.name if found is not None else None

    def function_code(self, file_offset: int, max_bytes: int) -> FunctionBytes | None:
        """The machine code of the function at ``file_offset`` (at most ``max_bytes`` of it), read from
        the object itself; None for a debug file (no code in it), an image-less object or a function
        outside the file's loaded bytes."""
        found = self._function_at(file_offset)
        if found is None or self._debug_only:
            return None
        segment = found.segment
        size = min(found.end - found.start, segment.offset + segment.size - found.offset)
        if found.offset < segment.offset or size <= 0:
            return None
        kept = min(size, max_bytes)
        code = self._context.problems.contained(self.shown, "its code is not kept for annotate",
                                                lambda: self._read_code(found.offset, kept))
        if code is None or len(code) != kept:
            return None
        return FunctionBytes(found.name, found.start, found.offset, code, size)

    def _function_at(self, file_offset: int) -> _Function | None:
        """The function whose code holds ``file_offset``, in the segment that maps it."""
        if self._segments is None:
            self._load()
        for segment in self._segments:
            if segment.offset <= file_offset < segment.offset + segment.size:
                span = self._symbols.span(segment.vaddr + file_offset - segment.offset)
                if span is None:
                    return None
                name, start, end = span
                offset = segment.offset + start - segment.vaddr
                if name != UNNAMED:
                    return _Function(demangle(name), start, end, offset, segment)
                if offset < segment.offset:  # a range from before the segment (a crafted FDE): no function
                    return None
                return _Function(f"{self.basename}+0x{offset:x}", start, end, offset, segment)
        return None

    def _read_code(self, offset: int, size: int) -> bytes:
        with self._open() as stream:
            if not self._build_id_matches(stream):
                return b""
            stream.seek(offset)
            return stream.read(size)

    def source_lines(self, ranges: Sequence[tuple[int, int]]) -> list[LineRow]:
        """The object's ``.debug_line`` rows in these link-time address ranges, by address, read in one pass
        however many ranges (a big library's line program takes a second or more); [] when the object has
        none, a large one, or a bad one (which costs the lines only)."""
        def read() -> list[LineRow]:
            with self._open() as stream:
                return line_rows(ElfFile(stream), ranges) if self._build_id_matches(stream) else []
        if self._debug_only or not self._readable:
            return []
        return self._context.problems.contained(self.shown, "its source lines are not kept for annotate", read) or []

    def _load(self) -> None:
        self._segments = []
        self._context.count("dsos_loaded")
        if not self._readable:
            return  # nothing to read: the file was reported when it was indexed
        loaded = self._context.problems.contained(self.shown, f"its frames show as {self.basename}+0xOFFSET",
                                                  self._read)
        if loaded is not None:
            self._segments, self._symbols = loaded

    def _read(self) -> tuple[list[LoadSegment], SymbolTable] | None:
        """The file's layout and symbols (None when it is no longer the file that was seen), read back from
        the context's store when an earlier run read this very file (and stored there once read)."""
        with self._open() as stream:
            if not self._debug_only and not self._build_id_matches(stream):
                return None
            store = self._context.store
            fd = getattr(stream, "fd", None)
            key = store_key(fd) if store is not None and store.usable and fd is not None and not self._debug_only \
                else None
            debug_now = debuginfo.build_id_debug_path(self.build_id, self._context.debug_roots) \
                if key is not None and self.build_id else None
            stored = store.load(key, debug_now) if key is not None else None
            if stored is not None:
                segments, table, self.symbol_source = stored
                self._context.count("dsos_stored")
                return [LoadSegment(*segment) for segment in segments], table
            problems_before = self._context.stats.get("bad_files", 0)
            identity = _identity(stream)
            elf = ElfFile(stream)
            segments = reconstruct_segments(elf) if self._debug_only else load_segments(elf)
            symbols = self._read_symbols(elf, identity)
            symbols += entry_point(elf, symbols)
            table = SymbolTable(with_unnamed_functions(symbols, self._fde_ranges(elf, len(symbols))))
            if key is not None and self._context.stats.get("bad_files", 0) == problems_before:
                debug_used = self.symbol_source[len("debug "):] if self.symbol_source.startswith("debug ") else None
                store.save(key, [(seg.offset, seg.size, seg.vaddr) for seg in segments], table, self.symbol_source,
                           debug_used)
            return segments, table

    @property
    def _readable(self) -> bool:
        return self._image is not None or (self.source is not None and (self.source.read_path is not None
                                                                        or self.source.fd is not None))

    def open_file(self) -> BoundedFile | None:
        """The object's file, opened (None for an in-memory image: the vDSO). Raises OSError, RefusedFile."""
        if self._image is not None:
            return None
        if self.source is None:
            raise FileNotFoundError(2, "no file", self.shown)
        return open_ref(self.source)

    def _open(self) -> BinaryIO:
        return io.BytesIO(self._image) if self._image is not None else open_ref(self.source)

    def _build_id_matches(self, stream: BinaryIO) -> bool:
        found = read_build_id(stream)
        stream.seek(0)
        if self.build_id is None:
            self.build_id = found
            return True
        if found == self.build_id:
            return True
        self._context.problems.warn(
            f"{self.shown} changed since it was seen (build-id {self.build_id.hex()} expected, "
            f"{found.hex() if found else 'none'} found); its frames show as {self.basename}+0xOFFSET")
        return False

    def _read_symbols(self, elf: ElfFile, identity: Identity | None) -> list[Symbol]:
        """.symtab, else the separate debug file's .symtab, else MiniDebugInfo (+ .dynsym), else .dynsym."""
        symbols = read_function_symbols(elf, ".symtab")
        if symbols or self._debug_only:
            self.symbol_source = "symtab"
            return symbols
        problems = self._context.problems
        debug_symbols = problems.contained(self.shown, "its debug file is not used",
                                           lambda: self._separate_debug_symbols(elf, identity))
        if debug_symbols:
            return debug_symbols
        dynamic = read_function_symbols(elf, ".dynsym")
        mini = problems.contained(f"{self.shown} (.gnu_debugdata)", "only its dynamic symbols are used",
                                  lambda: _mini_debuginfo_symbols(elf))
        if mini:
            self.symbol_source = "minidebuginfo"
            return mini + dynamic
        self.symbol_source = "dynsym"
        return dynamic

    def _fde_ranges(self, elf: ElfFile, symbols: int) -> FdeRanges:
        """The ranges of the file's FDEs, which name the functions no symbol names (none when unreadable),
        at most as many as the symbol budget leaves beside ``symbols``."""
        found = self._context.problems.contained(self.shown, "its functions without symbols show per address",
                                                 lambda: fde_ranges(elf, MAX_FUNCTION_SYMBOLS - symbols))
        return found if found is not None else FdeRanges()

    def _separate_debug_symbols(self, elf: ElfFile, identity: Identity | None) -> list[Symbol]:
        """The .symtab of the debug file found by build-id, else by .gnu_debuglink ([] when none)."""
        ref = self._debug_file(elf, identity)
        if ref is None:
            return []
        with open_ref(ref) as stream:
            symbols = read_function_symbols(ElfFile(stream), ".symtab")
        self.symbol_source = f"debug {ref.read_path}"
        return symbols

    def _debug_file(self, elf: ElfFile, identity: Identity | None) -> FileRef | None:
        roots = self._context.debug_roots
        path = debuginfo.build_id_debug_path(self.build_id, roots) if self.build_id else None
        if path is not None:
            return FileRef(path, path, follow_symlinks=True)
        if self.source is None or identity is None:
            return None
        link = debuginfo.read_debuglink(elf)
        return debuginfo.find_debuglink_file(self.source, identity, link, roots) if link else None


def _mini_debuginfo_symbols(elf: ElfFile) -> list[Symbol]:
    image = debuginfo.mini_debuginfo(elf)
    return read_function_symbols(ElfFile(io.BytesIO(image)), ".symtab") if image else []


def _identity(stream: BinaryIO) -> Identity | None:
    """Device and inode of a file-backed stream (None for an in-memory image)."""
    fd = getattr(stream, "fd", None)
    if fd is None:
        return None
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def load_segments(elf: ElfFile) -> list[LoadSegment]:
    return [LoadSegment(seg.offset, seg.filesz, seg.vaddr) for seg in _loads(elf)]


def _loads(elf: ElfFile) -> list[ProgramHeader]:
    return [seg for seg in elf.segments() if seg.type == PT_LOAD][:MAX_LOAD_SEGMENTS]


def reconstruct_segments(elf: ElfFile) -> list[LoadSegment]:
    """The binary's PT_LOAD layout rebuilt from a debug file's program headers.

    ``objcopy --only-keep-debug`` keeps p_vaddr/p_memsz but zeroes p_offset/p_filesz. Linkers lay
    segments out in order, each at the first file offset past the previous one that is congruent to its
    p_vaddr modulo p_align; replaying that rule gives the original offsets for GNU ld and lld output.
    """
    segments = []
    previous_end = None
    for seg in sorted(_loads(elf), key=lambda s: s.vaddr):
        align = max(seg.align, 1)
        offset = seg.vaddr % align if previous_end is None else previous_end + (seg.vaddr - previous_end) % align
        segments.append(LoadSegment(offset, seg.memsz, seg.vaddr))
        previous_end = offset + seg.memsz
    return segments


ENTRY_NAME = "_start"  # what the ELF entry point of every C runtime is called


def entry_point(elf: ElfFile, symbols: Sequence[Symbol]) -> list[Symbol]:
    """The ELF entry point as ``_start`` where no symbol covers it (a stripped program, or the dynamic
    loader, where every process's first frames are before its program's ``_start`` is run): a stack that
    reaches it is whole. Unsized: it ends where the next function starts."""
    if not elf.entry or any(s.start <= elf.entry < s.start + max(s.size, 1) for s in symbols):
        return []
    return [Symbol(elf.entry, 0, ENTRY_NAME, STB_GLOBAL)]
