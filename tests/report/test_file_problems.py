"""Files that cost their own names are counted in the record and shown in the report's header."""
from __future__ import annotations

import dataclasses
import json

from optrace.frontend.recorder import file_problems
from optrace.recordfile import read_record, write_record


def test_symbol_and_jit_counts_become_file_problems() -> None:
    symbols = {"bad_files": 3, "bad_files_refused": 2, "bad_files_malformed": 1, "frames_resolved": 10}
    jit = {"refused_mount": 1, "refused_owner": 0, "symbols_dropped": 7, "perfmap_lines": 99,
           "files_not_read_to_the_end": 1}
    assert file_problems(symbols, jit) == {"elf_refused": 2, "elf_malformed": 1, "jit_mount": 1,
                                           "jit_symbols_dropped": 7, "jit_unread": 1}


def test_header_and_json_carry_them(record, tmp_path, optrace) -> None:
    record.meta.file_problems = {"elf_refused": 2, "jit_mount": 1}
    path = tmp_path / "r.data"
    write_record(record, path)
    assert read_record(path).meta.file_problems == {"elf_refused": 2, "jit_mount": 1}
    table = optrace("report", "-i", str(path)).stdout
    assert "# Files that cost their own names: elf_refused 2, jit_mount 1 (the warnings say which)" in table
    meta = json.loads(optrace("report", "-i", str(path), "--format", "json").stdout)["meta"]
    assert meta["file_problems"] == {"elf_refused": 2, "jit_mount": 1}


def test_records_without_them_still_read(record, tmp_path) -> None:
    path = tmp_path / "old.data"
    write_record(record, path)
    assert read_record(path).meta.file_problems == {} == dataclasses.asdict(record.meta)["file_problems"]
