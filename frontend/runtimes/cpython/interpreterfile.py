"""What a CPython executable or libpython tells of itself, read once per file: where ``_PyRuntime`` and the
eval function (``_PyEval_EvalFrameDefault``, and its ``.cold`` part: named in .symtab, else found from its
jumps, evalcold.py) are linked, the ``Py_Version`` it was built as (3.11+), and its PT_LOAD segments (for
the load bias of a mapping).

The file is another user's: it is opened as the process maps it (frontend/symbols/filefacts.py:
/proc/PID/map_files or the path inside the process's root, no symlink followed, a regular disk file, bounded
reads) and read with the project's bounded ELF reader. Only a few names are looked up, so the symbol tables
are searched for those names' string offsets rather than decoded whole. Results are cached by the file's
(device, inode, size, mtime).
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.fileaccess import BoundedFile
from optrace.frontend.runtimes.cpython.evalcold import cold_part
from optrace.frontend.runtimes.cpython.functionbounds import FunctionBounds
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.filefacts import FileFacts, FileKey
from optrace.frontend.runtimes.cpython.gilfunction import take_gil_range
from optrace.frontend.runtimes.symbolnames import find_symbols
from optrace.frontend.unwind.unwindfile import UnwindFile, file_without_rows
from optrace.procfs import MapEntry

RUNTIME = "_PyRuntime"
EVAL = "_PyEval_EvalFrameDefault"
EVAL_COLD = "_PyEval_EvalFrameDefault.cold"  # GCC's split-off cold part (local: only in .symtab)
VERSION = "Py_Version"
WANTED = (RUNTIME, EVAL, EVAL_COLD, VERSION)
RUNTIME_SECTION = ".PyRuntime"  # 3.13+: _PyRuntime in its own section, found even without the symbol


@dataclass(frozen=True)
class InterpreterFile:
    """Link-time facts of one interpreter file (addresses before the load bias)."""

    runtime: int | None  # _PyRuntime
    eval_ranges: tuple[tuple[int, int], ...]  # [start, end) of the eval function's parts
    py_version: int | None  # Py_Version (PY_VERSION_HEX), 3.11+
    segments: UnwindFile  # its PT_LOAD segments: segments.bias(entry) places a mapping
    gil: tuple[int, int] | None = None  # [start, end) file offsets of take_gil (gilfunction.py)

    def bias(self, entry: MapEntry) -> int:
        return self.segments.bias(entry)


def interpreter_file(pid: int, entry: MapEntry) -> InterpreterFile | str:
    """The facts of the file ``pid`` maps at ``entry`` (cached), or why it cannot be read."""
    return _files.facts(pid, entry)


def _read_file(elf: ElfFile, reader: BoundedFile, _shown: str, _identity: FileKey) -> InterpreterFile | str:
    symbols = find_symbols(elf, ".dynsym", WANTED)
    if EVAL_COLD not in symbols or RUNTIME not in symbols:
        symbols = {**find_symbols(elf, ".symtab", WANTED), **symbols}
    segments = file_without_rows(reader)
    bounds = FunctionBounds(elf)
    return InterpreterFile(runtime=_runtime(elf, symbols), eval_ranges=_eval_ranges(elf, symbols, bounds),
                           py_version=_py_version(elf, segments, symbols), segments=segments,
                           gil=_file_range(segments, take_gil_range(elf, bounds)))


def _runtime(elf: ElfFile, symbols: dict[str, tuple[int, int]]) -> int | None:
    if RUNTIME in symbols:
        return symbols[RUNTIME][0]
    section = elf.section_by_name(RUNTIME_SECTION)
    return section.addr if section is not None and section.addr else None


def _eval_ranges(elf: ElfFile, symbols: dict[str, tuple[int, int]],
                 bounds: FunctionBounds) -> tuple[tuple[int, int], ...]:
    """The eval function and its split-off part: named in .symtab, else found from its jumps (evalcold.py)."""
    ranges = tuple((start, start + size) for name in (EVAL, EVAL_COLD) if name in symbols
                   for start, size in (symbols[name],) if size > 0)
    if len(ranges) != 1 or EVAL_COLD in symbols:
        return ranges
    cold = cold_part(elf, *symbols[EVAL], bounds)
    return ranges if cold is None else (*ranges, cold)


def _file_range(segments: UnwindFile, vaddrs: tuple[int, int] | None) -> tuple[int, int] | None:
    """Link-time addresses as file offsets (frames name user code by file offset)."""
    if vaddrs is None:
        return None
    segment = next((seg for seg in segments.loads if seg.holds(vaddrs[0])), None)
    return None if segment is None else (vaddrs[0] - segment.vaddr + segment.offset,
                                         vaddrs[1] - segment.vaddr + segment.offset)


def _py_version(elf: ElfFile, segments: UnwindFile, symbols: dict[str, tuple[int, int]]) -> int | None:
    """Py_Version's value (a const unsigned long in the file's read-only data), None when absent."""
    if VERSION not in symbols:
        return None
    vaddr = symbols[VERSION][0]
    segment = next((seg for seg in segments.loads if seg.holds(vaddr) and seg.holds(vaddr + 7)), None)
    if segment is None:
        return None
    data = elf.read_at(vaddr - segment.vaddr + segment.offset, 8)
    return int.from_bytes(data, "little") if len(data) == 8 else None


_files: FileFacts[InterpreterFile] = FileFacts(_read_file)
