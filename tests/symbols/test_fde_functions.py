"""Code without symbols named by function: every address inside an FDE is one frame, ``file+0xSTART``.
Ground truth from binutils: the function's symbol in the unstripped copy (nm) and the FDEs readelf decodes."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from optrace.frontend.symbols import Symbolizer
from optrace.frontend.symbols.access import FileRef
from optrace.frontend.symbols.dso import Dso, DsoContext
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.fderanges import UNNAMED, FdeRanges, fde_ranges, with_unnamed_functions
from optrace.frontend.symbols.symbol import Symbol, SymbolTable
from optrace.model import Frame, RawSample, UserFrame

CC1 = Path("/usr/lib/gcc/x86_64-linux-gnu/12/cc1")
NO_DEBUG_ROOTS: tuple[str, ...] = ()


def ranges(*pairs: tuple[int, int]) -> FdeRanges:
    found = FdeRanges()
    for start, end in pairs:
        found.starts.append(start)
        found.ends.append(end)
    return found


def named(symbolizer: Symbolizer, build_id: bytes, offsets: list[int]) -> list[Frame]:
    """The frames of one sample per offset of the file with ``build_id``."""
    frames, samples = symbolizer.symbolize([RawSample(1, "t", (UserFrame(build_id, offset),), (), 1)
                                            for offset in offsets])
    return [frames[sample.frames[0]] for sample in samples]


def stripped(program: Path, tmp_path: Path, *strip_args: str) -> Path:
    copy = tmp_path / "stripped" / program.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copy(program, copy)
    subprocess.run(["strip", *(strip_args or ("--strip-all",)), str(copy)], check=True)
    return copy


def test_ranges_without_a_symbol_become_unnamed_functions() -> None:
    symbols = [Symbol(0x100, 0x40, "named"), Symbol(0x300, 0, "asm_entry"), Symbol(0x500, 0x100, "outer")]
    found = with_unnamed_functions(symbols, ranges((0x100, 0x140), (0x200, 0x280), (0x300, 0x320),
                                                   (0x520, 0x540), (0x600, 0x610)))
    table = SymbolTable(found)
    assert table.span(0x27F) == (UNNAMED, 0x200, 0x280)  # no symbol: the FDE's range
    assert table.find(0x280) is None and table.find(0x1FF) is None  # outside every FDE and symbol
    assert table.span(0x31F) == ("asm_entry", 0x300, 0x320)  # a sizeless symbol at an FDE's start takes its size
    assert table.find(0x400) is None  # ... and no longer reaches to the next symbol
    assert table.span(0x530) == ("outer", 0x500, 0x600)  # a range a sized symbol covers adds nothing
    assert [table.find(a) for a in (0x100, 0x13F, 0x608)] == ["named", "named", UNNAMED]
    assert len(table) == 5


def test_fde_ranges_are_the_ones_readelf_decodes(program: Path, elf) -> None:
    with open(program, "rb") as stream:
        found = fde_ranges(ElfFile(stream))
    assert list(zip(found.starts, found.ends)) == elf.fdes(program)
    with open(CC1, "rb") as stream:
        assert len(fde_ranges(ElfFile(stream), limit=1000)) == 1000  # the bound on a file's ranges


def test_every_address_of_a_stripped_static_function_is_one_frame(program: Path, tmp_path: Path, elf) -> None:
    """beta is static: once stripped, no symbol names it; its FDE gives every address of it one name,
    prog+0xSTART, the file offset where nm said it started; main keeps its own FDE's name."""
    start, size = elf.symbol(program, "beta")
    binary = stripped(program, tmp_path)
    assert "beta" not in subprocess.run(["nm", "-D", str(binary)], capture_output=True, text=True).stdout
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(binary))
    build_id = elf.build_id(binary)
    offsets = [elf.file_offset(binary, start + delta) for delta in range(size)]
    frames = named(symbolizer, build_id, offsets)
    assert {(f.symbol, f.resolved) for f in frames} == {(f"prog+{offsets[0]:#x}", True)}
    (main,) = named(symbolizer, build_id, [elf.offset_of(program, "main", plus=1)])
    assert main.symbol == f"prog+{elf.offset_of(program, 'main'):#x}"
    code = symbolizer.function_code(frames[-1], 4096)  # annotate reads such a function's code like any other
    assert (code.vaddr, code.size, code.code) == (start, size, binary.read_bytes()[offsets[0]:offsets[0] + size])


def test_debug_frame_names_functions_when_eh_frame_has_none(tmp_path: Path, elf) -> None:
    """-g -fno-asynchronous-unwind-tables puts the program's own FDEs in .debug_frame, which a strip that
    keeps it leaves as the only description of its functions."""
    program = elf.compile(tmp_path / "prog", extra=("-fno-asynchronous-unwind-tables",))
    start, size = elf.symbol(program, "beta")
    binary = stripped(program, tmp_path, "--strip-all", "--keep-section=.debug_frame")
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(binary))
    first, last = (elf.file_offset(binary, start + delta) for delta in (0, size - 1))
    assert named(symbolizer, elf.build_id(binary), [last])[0].symbol == f"prog+{first:#x}"


def test_unreadable_call_frame_information_costs_only_those_names(program: Path, tmp_path: Path, elf,
                                                                  hostile) -> None:
    """An .eh_frame that claims a terabyte: one warning, and the .symtab still names every function."""
    hostile.patch_section(program, ".eh_frame", sh_size=1 << 40)
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(program))
    assert named(symbolizer, elf.build_id(program), [elf.offset_of(program, "beta", plus=2)])[0].symbol == "beta"
    assert any("functions without symbols show per address" in w for w in symbolizer.warnings), symbolizer.warnings


def test_garbage_call_frame_information_keeps_what_came_before(program: Path, tmp_path: Path, elf,
                                                                 hostile) -> None:
    binary = stripped(program, tmp_path)
    offset, size = hostile.section_offset(binary, ".eh_frame")
    data = bytearray(binary.read_bytes())
    data[offset + size // 2:offset + size] = b"\xff" * (size - size // 2)
    binary.write_bytes(data)
    with open(binary, "rb") as stream:
        found = fde_ranges(ElfFile(stream))
    assert 0 < len(found) < len(elf.fdes(program))


@pytest.mark.skipif(not CC1.exists(), reason="gcc's cc1 is not installed")
def test_cc1_table_is_compact_and_quick(elf) -> None:
    """cc1 (stripped, 45,201 FDEs, 26,303 functions in .dynsym): every FDE not covered by a symbol is a
    function of the table, which stays arrays (20 bytes a function and its name's bytes)."""
    dso = Dso(str(CC1), DsoContext((), print), source=FileRef(str(CC1), str(CC1)))
    started = time.process_time()
    dso.symbol_at(0)
    seconds = time.process_time() - started
    table = dso._symbols
    assert len(table) >= 45_000
    assert dso.table_bytes < 2.5 * (1 << 20) and seconds < 2.0, (dso.table_bytes, seconds)
    starts = [start for start, _ in elf.fdes(CC1)]
    named = {table.span(start)[1] for start in starts[::97]}
    assert named == set(starts[::97])  # each FDE start begins a function of the table
