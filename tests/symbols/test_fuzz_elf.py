"""Hypothesis fuzzing of the ELF reader (issue 8): real small ELF files with their headers, symbol
tables, notes, dynamic section, debug link, compressed sections and program headers mutated.

Properties: the low-level readers raise only their declared errors (a malformed file, a budget, an
OS error), never TypeError/IndexError/struct.error/RecursionError...; nothing at all escapes the
Symbolizer (a bad file is a one-line warning counted in ``bad_files``); each file is done within a time
bound and a bounded heap. OPTRACE_FUZZ_EXAMPLES raises the number of examples for a long run.
"""
from __future__ import annotations

import io
import lzma
import os
import struct
import subprocess
import time
import tracemalloc
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from optrace.fileaccess import BudgetExceeded
from optrace.model import RawSample, UserFrame
from optrace.frontend.symbols import Symbolizer, debuginfo, linker
from optrace.frontend.symbols.buildid import read_build_id
from optrace.frontend.symbols.elffile import ElfFile, ElfFormatError
from optrace.frontend.symbols.linker import read_dynamic
from optrace.frontend.symbols.symbol import read_function_symbols

EXAMPLES = int(os.environ.get("OPTRACE_FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DECLARED = (ElfFormatError, BudgetExceeded, OSError, zlib.error, lzma.LZMAError)
MAX_SECONDS = 2.0  # CPU seconds per file, for everything below
MAX_HEAP = 48 << 20  # peak Python heap per file (the inputs are 20-40 KB)

SHDR = {"sh_name": (0, "I"), "sh_type": (4, "I"), "sh_flags": (8, "Q"), "sh_offset": (24, "Q"), "sh_size": (32, "Q"),
        "sh_link": (40, "I"), "sh_info": (44, "I"), "sh_entsize": (56, "Q")}
PHDR = {"p_type": (0, "I"), "p_offset": (8, "Q"), "p_vaddr": (16, "Q"), "p_filesz": (32, "Q"), "p_memsz": (40, "Q"),
        "p_align": (48, "Q")}
EHDR = {"e_phoff": (0x20, "Q"), "e_shoff": (0x28, "Q"), "e_phentsize": (0x36, "H"), "e_phnum": (0x38, "H"),
        "e_shentsize": (0x3A, "H"), "e_shnum": (0x3C, "H"), "e_shstrndx": (0x3E, "H")}
CONTENT = (".symtab", ".strtab", ".dynsym", ".dynstr", ".dynamic", ".note.gnu.build-id", ".gnu_debuglink",
           ".gnu_debugdata", ".debug_info", ".shstrtab")
BOUNDARY = (0, 1, 2, 3, 8, 24, 56, 64, 0xFF, 0xFFFF, 0xFFFFFFFF, 1 << 31, 1 << 32, (1 << 63) - 1, (1 << 64) - 1)


@dataclass(frozen=True)
class Base:
    """A real ELF file and where its parts are (from readelf, not from the code under test)."""

    data: bytes
    sections: dict[str, tuple[int, int, int]]  # name -> (index, offset, size)
    shoff: int
    phoff: int
    phnum: int


def describe(path: Path) -> Base:
    data = path.read_bytes()
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    (phnum,) = struct.unpack_from("<H", data, 0x38)
    sections = {}
    output = subprocess.run(["readelf", "-SW", str(path)], check=True, capture_output=True, text=True).stdout
    for line in output.splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[0].startswith("[") and fields[0][1:-1].isdigit():
            sections[fields[1]] = (int(fields[0][1:-1]), int(fields[4], 16), int(fields[5], 16))
    return Base(data, sections, shoff, phoff, phnum)


@pytest.fixture(scope="module", autouse=True)
def ld_so_cache_read_once():
    """Each example's fresh Symbolizer would run ``ldconfig -p`` again (most of the run time)."""
    listing = linker.read_ld_so_cache()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linker, "read_ld_so_cache", lambda: listing)
        yield


@pytest.fixture(scope="module")
def bases(tmp_path_factory, elf) -> list[Base]:
    """A compiled program with .symtab, compressed debug sections and a debug link; the same program
    stripped with MiniDebugInfo; /usr/bin/true (stripped, dynamic, Debian's debug link)."""
    work = tmp_path_factory.mktemp("fuzz")
    program = elf.compile(work / "full", extra=("-Wl,--compress-debug-sections=zlib",))
    subprocess.run(["objcopy", f"--add-gnu-debuglink={program}", str(program)], check=True, cwd=work)
    mini = elf.compile(work / "mini")
    elf.add_mini_debuginfo(mini)
    return [describe(program), describe(mini), describe(Path("/usr/bin/true"))]


def integers(bits: int):
    return st.one_of(st.sampled_from([v for v in BOUNDARY if v < 1 << bits]), st.integers(0, (1 << bits) - 1))


def section_edit():
    return st.tuples(st.just("shdr"), st.sampled_from(CONTENT),
                     st.sampled_from(sorted(SHDR))).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.just(t[2]), integers(8 * struct.calcsize(SHDR[t[2]][1]))))


def program_header_edit():
    return st.tuples(st.just("phdr"), st.integers(0, 15), st.sampled_from(sorted(PHDR))).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.just(t[2]), integers(8 * struct.calcsize(PHDR[t[2]][1]))))


def header_edit():
    return st.sampled_from(sorted(EHDR)).flatmap(
        lambda field: st.tuples(st.just("ehdr"), st.just(field), st.just(0), integers(8 * struct.calcsize(EHDR[field][1]))))


def content_edit():
    return st.tuples(st.just("bytes"), st.sampled_from(CONTENT), st.floats(0, 1), st.binary(min_size=1, max_size=16))


EDITS = st.lists(st.one_of(section_edit(), program_header_edit(), header_edit(), content_edit(),
                           st.tuples(st.just("truncate"), st.floats(0, 1), st.just(0), st.just(0))),
                 min_size=1, max_size=6)


def mutate(base: Base, edits) -> bytes:
    data = bytearray(base.data)
    for kind, where, field, value in edits:
        if kind == "truncate":
            del data[int(len(data) * where):]
            continue
        if kind == "bytes":
            if where not in base.sections:
                continue
            _, offset, size = base.sections[where]
            at = offset + int(size * field)
            data[at:at + len(value)] = value
            continue
        if kind == "shdr":
            if where not in base.sections:
                continue
            at, (pos, fmt) = base.shoff + 64 * base.sections[where][0], SHDR[field]
        elif kind == "phdr":
            at, (pos, fmt) = base.phoff + 56 * (where % max(base.phnum, 1)), PHDR[field]
        else:
            at, (pos, fmt) = 0, EHDR[where]
        if at + pos + struct.calcsize(fmt) <= len(data):
            struct.pack_into("<" + fmt, data, at + pos, value)
    return bytes(data)


def read_everything_low_level(data: bytes) -> None:
    """Each reader on its own: only the declared errors may come out."""
    for read in (lambda: read_build_id(io.BytesIO(data)), lambda: read_dynamic(io.BytesIO(data)),
                 lambda: read_function_symbols(ElfFile(io.BytesIO(data)), ".symtab"),
                 lambda: read_function_symbols(ElfFile(io.BytesIO(data)), ".dynsym"),
                 lambda: debuginfo.read_debuglink(ElfFile(io.BytesIO(data))),
                 lambda: debuginfo.mini_debuginfo(ElfFile(io.BytesIO(data)))):
        try:
            read()
        except DECLARED:
            pass


def symbolize_file(path: Path, data: bytes) -> Symbolizer:
    """The whole path root's daemon takes: index the exec'd file, then name frames in it."""
    symbolizer = Symbolizer(debug_roots=(str(path.parent / "debug"),))
    symbolizer.machine.scan_standard_dirs(())
    symbolizer.add_executable(str(path))
    try:
        build_id = read_build_id(io.BytesIO(data)) or bytes(20)
    except DECLARED:
        build_id = bytes(20)
    step = max(len(data) // 16, 1)
    symbolizer.symbolize([RawSample(1, "t", tuple(UserFrame(build_id, offset) for offset in range(0, len(data), step)),
                                    (), 1)])
    return symbolizer


@FUZZ
@given(which=st.integers(0, 2), edits=EDITS)
@example(which=2, edits=[("bytes", ".dynstr", 0.78125, b"\n")])  # a newline in a needed library's name (found Dec 1)
def test_mutated_elf_files_cost_only_their_own_names(bases, tmp_path_factory, which, edits) -> None:
    data = mutate(bases[which], edits)
    path = tmp_path_factory.getbasetemp() / "fuzzed" / "prog"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    tracemalloc.start()
    started = time.process_time()  # CPU time: the machine running the tests may be busy
    try:
        read_everything_low_level(data)
        symbolizer = symbolize_file(path, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.process_time() - started
    assert elapsed < MAX_SECONDS, f"{elapsed:.2f} s for {edits}"
    assert peak < MAX_HEAP, f"{peak} bytes for {edits}"
    assert all("\n" not in line for line in symbolizer.warnings)
    assert symbolizer.stats.get("bad_files", 0) <= len(symbolizer.warnings)
