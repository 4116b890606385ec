"""The split-off part of a stripped interpreter's eval function (frontend/runtimes/cpython/evalcold.py): found from the
exported function's jumps where no .symtab names it. A program GCC splits so (programs/coldsplit.c) is built,
stripped, and the part found is the one its .symtab named; the stripped interpreters of this machine (Debian
bookworm's python3.11, sid's 3.14 and 3.15: 82-84 KiB of their eval loop is there) have theirs found."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from optrace.frontend.runtimes.cpython.evalcold import cold_part
from optrace.frontend.runtimes.cpython.interpreterfile import EVAL, EVAL_COLD, InterpreterFile, _read_file
from optrace.frontend.runtimes.symbolnames import find_symbols
from optrace.fileaccess import reader_for
from optrace.frontend.symbols.access import ELF_POLICY
from optrace.frontend.symbols.elffile import ElfFile
from pythons import PROGRAMS, require

STRIPPED = ["3.11-debian", "3.14-sid", "3.15-sid"]


def build(folder: Path, *flags: str) -> tuple[Path, Path]:
    """programs/coldsplit.c built (its eval function exported, as an interpreter's is), and a stripped copy."""
    if shutil.which("gcc") is None or shutil.which("strip") is None:
        pytest.skip("gcc or strip is not installed")
    full, stripped = folder / "coldsplit", folder / "coldsplit.stripped"
    subprocess.run(["gcc", "-O2", "-freorder-blocks-and-partition", "-rdynamic", *flags, "-o", str(full),
                    str(PROGRAMS / "coldsplit.c")], check=True, capture_output=True)
    subprocess.run(["strip", "-o", str(stripped), str(full)], check=True, capture_output=True)
    return full, stripped


def symbols(path: Path, section: str) -> dict[str, tuple[int, int]]:
    with open(path, "rb") as stream:
        return find_symbols(ElfFile(stream), section, (EVAL, EVAL_COLD))


def found(path: Path) -> tuple[int, int] | None:
    with open(path, "rb") as stream:
        return cold_part(ElfFile(stream), *symbols(path, ".dynsym")[EVAL])


def facts(path: Path) -> InterpreterFile:
    with reader_for(os.open(path, os.O_RDONLY), ELF_POLICY, str(path)) as reader:
        read = _read_file(ElfFile(reader), reader, str(path), None)
    assert not isinstance(read, str), read
    return read


def test_the_part_a_stripped_file_does_not_name_is_the_one_its_symtab_named(tmp_path):
    full, stripped = build(tmp_path)
    start, size = symbols(full, ".symtab")[EVAL_COLD]
    assert EVAL_COLD not in symbols(stripped, ".symtab")
    assert found(stripped) == (start, start + size)
    evaluated = symbols(full, ".dynsym")[EVAL]
    assert facts(stripped).eval_ranges == ((evaluated[0], evaluated[0] + evaluated[1]), (start, start + size))
    assert facts(full).eval_ranges == facts(stripped).eval_ranges  # .symtab's, where it names it


def test_no_part_when_the_function_only_leaves_by_a_tail_call(tmp_path):
    _, stripped = build(tmp_path, "-DNO_SPLIT")
    assert found(stripped) is None
    assert len(facts(stripped).eval_ranges) == 1


@pytest.mark.parametrize("name", STRIPPED)
def test_stripped_interpreters_have_their_part_found(name):
    path = require(name)
    assert not symbols(path, ".symtab")
    eval_start, eval_size = symbols(path, ".dynsym")[EVAL]
    part = found(path)
    assert part is not None and part[1] - part[0] > 8192
    assert part[1] <= eval_start or part[0] >= eval_start + eval_size
