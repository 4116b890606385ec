"""Malformed ELF files given to `count`: a one-line OptraceError, never another exception, never a hang.

Copies of the bundled `calls` workload are corrupted where the ELF reader and the address check look: the
ELF header, the program and section headers, the symbol and string tables, the symbol versions, and the
code; then truncated or not. Each copy is resolved as a symbol, a glob and an address.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optrace.errors import OptraceError
from optrace.frontend.uprobes.resolve import resolve_specs
from support import WORKLOADS

CALLS = WORKLOADS / "calls"
STRUCTURE_SECTIONS = (".symtab", ".strtab", ".dynsym", ".dynstr", ".gnu.version", ".text")


def regions(path: Path) -> list[tuple[int, int]]:
    """(file offset, length) of the parts of the file the resolver reads."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        found = [(0, elf["e_ehsize"]), (elf["e_phoff"], elf["e_phnum"] * elf["e_phentsize"]),
                 (elf["e_shoff"], elf["e_shnum"] * elf["e_shentsize"])]
        for name in STRUCTURE_SECTIONS:
            section = elf.get_section_by_name(name)
            if section is not None:
                found.append((section["sh_offset"], min(section["sh_size"], 4096)))
    return found


@pytest.fixture(scope="module")
def original(workloads) -> tuple[bytes, list[tuple[int, int]]]:
    return CALLS.read_bytes(), regions(CALLS)


mutation = st.tuples(st.integers(min_value=0, max_value=63), st.floats(min_value=0, max_value=1),
                     st.binary(min_size=1, max_size=8))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(mutation, min_size=1, max_size=6),
       keep=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
       address=st.integers(min_value=0, max_value=0x3000))
def test_corrupted_binaries_give_one_line_errors(original, mutations, keep, address):
    data, where = original
    blob = bytearray(data)
    for region, fraction, payload in mutations:
        offset, length = where[region % len(where)]
        at = offset + int(fraction * max(length - 1, 0))
        blob[at:at + len(payload)] = payload
    if keep is not None:
        del blob[int(keep * len(blob)):]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "calls"
        path.write_bytes(bytes(blob))
        for spec in (f"{path}:target", f"{path}:t*", f"{path}:{address:#x}"):
            started = time.monotonic()
            try:
                resolve_specs([spec], max_matches=100000)
            except OptraceError as exc:
                assert "\n" not in str(exc) and str(exc).isprintable()
            assert time.monotonic() - started < 5
