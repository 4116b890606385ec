"""Unwind tables checked row by row against `readelf --debug-dump=frames-interp` on real binaries:
Debian's own (liblzma, libc, libpython3.11, gcc's cc1) and a workload built without frame pointers.
For every PC range readelf lists (a sample for the large files), the table gives the same CFA rule and
the same rule for the caller's rbp; PC ranges outside every FDE are CFA_END."""
from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
from framesinterp import frames, matches, plt_sections, ranges

from optrace.frontend.unwind.table import CFA_END, CFA_PLT, CFA_RSP, UnwindTable, build_table

LIBLZMA = "/lib/x86_64-linux-gnu/liblzma.so.5"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LIBPYTHON = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"
CC1 = "/usr/lib/gcc/x86_64-linux-gnu/12/cc1"
SAMPLED = 40_000  # row ranges checked per large file (all of them below that)


def _existing(path: str) -> str:
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed")
    return path


def check_against_readelf(path: str, source: str = ".eh_frame") -> UnwindTable:
    with open(path, "rb") as stream:
        table = build_table(stream.read())
    assert table.source == source and table.problems == 0, table.problem
    listed = frames(path)
    fdes = [fde for section in source.split("+") for fde in listed[section]]
    expected = ranges(fdes)
    assert len(expected) > 10
    if len(expected) > SAMPLED:
        expected = random.Random(10).sample(expected, SAMPLED)
    plts = plt_sections(path)
    mismatches = []
    for first, last, rule in expected:
        for pc in {first, last, (first + last) // 2}:
            if not matches(table.find(pc), rule, pc, plts):
                mismatches.append(f"{pc:#x}: readelf {rule}, table {table.find(pc)}")
    assert not mismatches, f"{len(mismatches)} mismatches, e.g. {mismatches[:5]}"
    _check_gaps(table, fdes)
    return table


def _check_gaps(table: UnwindTable, fdes) -> None:
    covered = sorted((fde.start, fde.end) for fde in fdes if fde.end > fde.start)
    for (_, end), (next_start, _) in zip(covered, covered[1:]):
        if next_start > end:
            assert table.find(end).cfa_type == CFA_END, hex(end)
    assert table.find(covered[-1][1]).cfa_type == CFA_END
    assert table.find(covered[0][0] - 1) is None or table.find(covered[0][0] - 1).cfa_type == CFA_END


def test_liblzma_every_row():
    check_against_readelf(_existing(LIBLZMA))


def test_libc_every_row_and_its_plt():
    table = check_against_readelf(_existing(LIBC))
    plt_rows = [pc for pc, rule in table if rule.cfa_type == CFA_PLT]
    assert plt_rows, "libc's .plt expression was not recognised"
    assert table.unsupported > 0  # __restore_rt's expressions: marked, never guessed


def test_libpython():
    check_against_readelf(_existing(LIBPYTHON))


def test_python_executable():
    """Debian links the interpreter into /usr/bin/python3.11 itself (a non-PIE executable): its code,
    not libpython's, is what a python3.11 process runs."""
    check_against_readelf(_existing("/usr/bin/python3.11"))


@pytest.mark.slow
def test_cc1_sampled():
    check_against_readelf(_existing(CC1))


def test_workload_without_frame_pointers(omit_fp_binary: Path):
    table = check_against_readelf(str(omit_fp_binary))
    assert any(rule.cfa_type == CFA_PLT for _, rule in table)


def test_debug_frame_and_eh_frame(debug_frame_binary: Path):
    """Built with -g -fno-asynchronous-unwind-tables: its own code in .debug_frame, the C runtime's
    start files in .eh_frame; the table holds both."""
    table = check_against_readelf(str(debug_frame_binary), ".eh_frame+.debug_frame")
    assert table.find(_symbol(debug_frame_binary, "main")).cfa_type == CFA_RSP


def test_separate_debug_file(debug_frame_binary: Path, tmp_path: Path):
    """objcopy --only-keep-debug: .eh_frame is NOBITS there, the rows come from .debug_frame."""
    debug_file = tmp_path / "calls.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(debug_frame_binary), str(debug_file)], check=True)
    table = check_against_readelf(str(debug_file), ".debug_frame")
    assert table.find(_symbol(debug_frame_binary, "main")).cfa_type == CFA_RSP


def _symbol(path: Path, name: str) -> int:
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as stream:
        return ELFFile(stream).get_section_by_name(".symtab").get_symbol_by_name(name)[0]["st_value"]
