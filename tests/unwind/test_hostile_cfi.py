"""Hostile call-frame information: truncated, looping, oversized or self-referencing CFI costs the
file's table (partial or empty, problems counted), never raises out of build_table, and stays within a
time bound. Hypothesis mutates real .eh_frame sections and hand-made ones."""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from cfibytes import EhFrame, elf, mutated_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optrace.frontend.symbols.access import FileRef
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols import cfi
from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.table import CFA_END, CFA_RSP, CFA_UNSUPPORTED, EMPTY, build_table

PC = 0x1000
EXAMPLES = int(os.environ.get("OPTRACE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MAX_SECONDS = 2.0  # per hostile section (each is at most a few hundred KB)


def good_then(broken: bytes | None = None, length: int | None = None) -> bytes:
    """An .eh_frame with a sound FDE at PC, then ``broken`` as one more entry (its length forced)."""
    frame = EhFrame()
    frame.fde(frame.cie(), PC, 0x10, bytes([0x41, 0x0E, 16]))
    if broken is not None:
        frame.raw(broken, length)
    return frame.bytes()


def built(section: bytes, name: str = ".eh_frame"):
    started = time.process_time()
    table = build_table(elf({name: section}))
    assert time.process_time() - started < MAX_SECONDS
    return table


def assert_kept_the_good_fde(table) -> None:
    assert table.problems >= 1 and table.problem
    assert table.find(PC).cfa_type == CFA_RSP and table.find(PC + 1).cfa_offset == 16


def test_entry_longer_than_the_section():
    assert_kept_the_good_fde(built(good_then(struct.pack("<I", 4), length=1 << 20)))


def test_64bit_length_past_the_section():
    assert_kept_the_good_fde(built(good_then(b"") + b"\xff\xff\xff\xff" + struct.pack("<Q", 1 << 62)))


def test_truncated_section():
    section = good_then()
    frame = EhFrame()
    frame.data += section
    frame.fde(0, PC + 0x100, 0x10, bytes([0x41, 0x0E, 16]))
    assert_kept_the_good_fde(built(frame.bytes()[:-6]))


def test_fde_pointing_outside_the_section():
    frame = EhFrame()
    frame.fde(frame.cie(), PC, 0x10, bytes([0x41, 0x0E, 16]))
    frame.raw(struct.pack("<Ii", 0x7FFFFFF0, 0) + struct.pack("<i", 0x10) + b"\0")
    assert_kept_the_good_fde(built(frame.bytes()))


def test_fde_pointing_at_an_fde_or_itself():
    """The "CIE" of an FDE must be a CIE: another FDE, or the FDE itself, is refused (no recursion)."""
    for target in ("previous", "self"):
        frame = EhFrame()
        first = frame.fde(frame.cie(), PC, 0x10, bytes([0x41, 0x0E, 16]))
        at = len(frame.data)
        cie_at = first if target == "previous" else at
        frame.raw(struct.pack("<Ii", at + 4 - cie_at, 0) + struct.pack("<i", 0x10) + b"\0")
        assert_kept_the_good_fde(built(frame.bytes()))


def test_bad_programs_cost_their_fde_only():
    """Unbalanced restore_state, deep remember_state, too long a program, an unknown opcode, a ULEB
    without end: that FDE's PCs are CFA_UNSUPPORTED, the others are kept."""
    programs = [bytes([0x0B]), bytes([0x0A]) * 100, bytes([0x00]) * (cfi.MAX_PROGRAM_BYTES + 1),
                bytes([0x3F]), bytes([0x0E]) + b"\xff" * 20, bytes([0x01, 0, 0, 0, 0])]
    frame = EhFrame()
    cie = frame.cie()
    frame.fde(cie, PC, 0x10, bytes([0x41, 0x0E, 16]))
    for index, program in enumerate(programs, 1):
        frame.fde(cie, PC + 0x100 * index, 0x10, program)
    table = built(frame.bytes())
    assert table.problems == len(programs)
    for index in range(1, len(programs) + 1):
        assert table.find(PC + 0x100 * index).cfa_type == CFA_UNSUPPORTED
        assert table.find(PC + 0x100 * index + 0x10).cfa_type == CFA_END
    assert table.find(PC + 1).cfa_offset == 16


def test_huge_advance_and_range():
    """advance_loc4 by 4 GiB in a 16-byte FDE, an FDE covering the whole address space: bounded rows."""
    frame = EhFrame()
    cie = frame.cie()
    frame.fde(cie, PC, 0x10, bytes([0x04]) + struct.pack("<I", 0xFFFFFFFF) + bytes([0x0E, 16]))
    frame.fde(cie, PC + 0x100, 0x7FFFFFFF, bytes([0x04]) + struct.pack("<I", 0xFFFFFFFF) + bytes([0x0E, 16]))
    table = built(frame.bytes())
    assert table.count <= 4 and table.problems == 0


def test_many_tiny_fdes_are_bounded():
    """A section of 300,000 minimal FDEs (3.6 MB) converts within the time bound."""
    frame = EhFrame()
    cie = frame.cie()
    for index in range(300_000):
        frame.fde(cie, PC + 16 * index, 8, b"", aug=True)
    started = time.process_time()
    table = build_table(elf({".eh_frame": frame.bytes()}))
    assert time.process_time() - started < 10
    assert table.count == 600_000


def test_time_budget_gives_a_partial_table():
    frame = EhFrame()
    cie = frame.cie()
    for index in range(50_000):
        frame.fde(cie, PC + 16 * index, 8, bytes([0x41, 0x0E, 16 + index % 100]))
    table = build_table(elf({".eh_frame": frame.bytes()}), seconds=0.0)
    assert table.problems == 1 and "time budget" in table.problem and 0 < table.count < 100_000


def test_other_machines_have_the_empty_table():
    """An aarch64 or i386 file is no fault of its own: no rows, no problem counted."""
    data = bytearray(elf({".eh_frame": good_then()}))
    data[18:20] = struct.pack("<H", 183)  # EM_AARCH64
    assert build_table(bytes(data)) is EMPTY
    data = bytearray(elf({".eh_frame": good_then()}))
    data[4] = 1  # ELFCLASS32
    assert build_table(bytes(data)) is EMPTY


# -- fuzzing ------------------------------------------------------------------------------------------------
def _real_eh_frame(path: str) -> tuple[bytes, int]:
    with open(path, "rb") as stream:
        elf_file = ElfFile(stream)
        header = elf_file.section_by_name(".eh_frame")
        return elf_file.section_data(header, 1 << 24), header.addr


LIBLZMA = _real_eh_frame("/lib/x86_64-linux-gnu/liblzma.so.5") if Path("/lib/x86_64-linux-gnu/liblzma.so.5").exists() else None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=20),
       st.integers(0, 1 << 20))
def test_fuzz_mutated_liblzma_eh_frame(mutations, cut):
    if LIBLZMA is None:
        pytest.skip("liblzma is not installed")
    data, address = LIBLZMA
    mutated = bytearray(data)
    for position, value in mutations:
        mutated[position % len(mutated)] = value
    mutated = bytes(mutated[:max(1, cut % (len(mutated) + 1))])
    table = built_at(mutated, address)
    assert table.count * 16 == len(table.rows)
    assert list(table.pcs()) == sorted(set(table.pcs()))


@FUZZ
@given(st.binary(max_size=400), st.sampled_from([".eh_frame", ".debug_frame"]))
def test_fuzz_random_entries_after_a_good_cie(tail, name):
    frame = EhFrame()
    frame.cie()
    table = built(frame.bytes() + tail, name)
    assert table.count * 16 == len(table.rows)


def built_at(section: bytes, address: int):
    started = time.process_time()
    table = build_table(elf({".eh_frame": section}, addresses={".eh_frame": address}))
    assert time.process_time() - started < MAX_SECONDS
    return table


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 24), st.integers(0, 255)), min_size=1, max_size=30))
def test_fuzz_whole_files_through_the_cache(omit_fp_binary, tmp_path_factory, mutations):
    """Mutated copies of a real binary (headers, section table, CFI alike): the cache returns a table
    for each and raises nothing; a file it cannot use is one counted warning."""
    path = mutated_copy(omit_fp_binary, mutations, tmp_path_factory.mktemp("fuzz"))
    lines = []
    cache = UnwindTableCache(warn=lines.append)
    started = time.process_time()
    table = cache.of_ref(FileRef(str(path), str(path)))
    assert time.process_time() - started < MAX_SECONDS
    assert table.count * 16 == len(table.rows) and list(table.pcs()) == sorted(set(table.pcs()))
    assert len(lines) == cache.stats["bad_files"] <= 2  # the file; its partial CFI
