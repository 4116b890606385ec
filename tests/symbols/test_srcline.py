"""The .debug_line reader (frontend/symbols/srcline.py) against pyelftools on the workloads' own line
tables (DWARF 5 from gcc 12), and on damaged copies: a bad table is an ElfFormatError, never anything else."""
from __future__ import annotations

import io
import random

import pytest
from elftools.elf.elffile import ELFFile

from optrace.fileaccess import BudgetExceeded
from optrace.frontend.symbols.elffile import ElfFile, ElfFormatError
from optrace.frontend.symbols.srcline import line_rows

EVERYTHING = [(0, 1 << 64)]


def reference_rows(path) -> set[tuple[int, str, int]]:
    with open(path, "rb") as stream:
        dwarf = ELFFile(stream).get_dwarf_info()
        rows = set()
        for unit in dwarf.iter_CUs():
            program = dwarf.line_program_for_CU(unit)
            files = program["file_entry"]
            dirs = program["include_directory"]
            for entry in program.get_entries():
                state = entry.state
                if state is None or state.end_sequence:
                    continue
                index = state.file if program.header.version >= 5 else state.file - 1
                name = files[index].name.decode()
                directory = dirs[files[index].dir_index].decode()
                rows.add((state.address, name if name.startswith("/") else f"{directory}/{name}", state.line))
        return rows


@pytest.mark.parametrize("name", ["demo", "libburn.so", "calls"])
def test_rows_match_pyelftools(name, workloads):
    with open(workloads / name, "rb") as stream:
        ours = {(row.address, row.file, row.line) for row in line_rows(ElfFile(stream), EVERYTHING)}
    assert ours and ours == reference_rows(workloads / name)


def test_only_the_asked_ranges(workloads):
    with open(workloads / "demo", "rb") as stream:
        rows = line_rows(ElfFile(stream), [(0x1260, 0x1270)])
    assert rows and all(0x1260 <= row.address < 0x1270 for row in rows)


def test_damaged_tables_fail_in_one_way(workloads):
    image = bytearray((workloads / "demo").read_bytes())
    section = ElfFile(io.BytesIO(bytes(image))).section_by_name(".debug_line")
    rng = random.Random(13)
    for _ in range(300):
        damaged = bytearray(image)
        for _ in range(rng.randint(1, 8)):
            damaged[section.offset + rng.randrange(section.size)] = rng.randrange(256)
        try:
            line_rows(ElfFile(io.BytesIO(bytes(damaged))), EVERYTHING)
        except (ElfFormatError, BudgetExceeded):
            pass
