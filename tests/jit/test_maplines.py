"""Perf-map names left in their file (serve, top): read back when a sample needs them, right or not at all,
with the descriptors bounded and closed when the table goes."""
from __future__ import annotations

import os
import tracemalloc

from optrace.jitmaps.jitsymbols import JitSymbols
from optrace.jitmaps.perfmap import PerfMapReader
from optrace.jitmaps.symtable import TABLE_FILES, SymbolBudget, SymbolHistory


def write(path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def load(table: SymbolHistory, path, stamp: float = 1.0, reader: PerfMapReader | None = None) -> PerfMapReader:
    """Read ``path`` into ``table`` the way JitSymbols does with names in files."""
    reader = reader or PerfMapReader(with_offsets=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        in_file = table.keep_file(fd)
        table.add_many(reader.read_new(fd, final=True), str(path), stamp, in_file)
    finally:
        os.close(fd)
    return reader


def name_at(table: SymbolHistory, address: int, time: float = 1.0) -> str | None:
    found = table.lookup(address, time)
    return None if found is None else found.name


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_names_stay_in_the_file_and_read_back_after_unlink(tmp_path):
    path = tmp_path / "perf-1.map"
    write(path, "1000 100 Lfoo/Bar;::baz\n2000 10 LazyCompile:~f a.js:1:2\n")
    table = SymbolHistory()
    load(table, path)
    os.unlink(path)  # a runtime's map removed at its exit: the kept descriptor still reads it
    assert name_at(table, 0x1010) == "Lfoo/Bar;::baz"
    assert name_at(table, 0x2004) == "LazyCompile:~f a.js:1:2"
    assert len(table.names) == 0 and len(table.lines) == 2 and table.name_bytes == 0
    assert [s.name for s in table.entries()] == ["Lfoo/Bar;::baz", "LazyCompile:~f a.js:1:2"]


def test_a_replaced_map_keeps_the_old_names_and_adds_the_new(tmp_path):
    path = tmp_path / "perf-1.map"
    write(path, "1000 100 old_name\n")
    table = SymbolHistory()
    reader = load(table, path, 1.0)
    write(tmp_path / "new", "1000 100 new_name\n3000 10 other\n")
    os.rename(tmp_path / "new", path)
    load(table, path, 2.0, reader)
    assert name_at(table, 0x1010, 1.5) == "old_name"
    assert name_at(table, 0x1010, 2.0) == "new_name"
    assert len(table.lines.fds) == 2


def test_a_map_rewritten_in_place_loses_names_it_no_longer_has_never_names_them_wrong(tmp_path):
    path = tmp_path / "perf-1.map"
    write(path, "1000 100 first\n2000 100 second\n")
    table = SymbolHistory()
    reader = load(table, path, 1.0)
    with open(path, "r+") as f:  # same file, same lengths, other names (or no line at all)
        f.write("1000 100 FIRST\n9999 zz second\n")
    assert name_at(table, 0x1010) is None
    assert name_at(table, 0x2010) is None
    write(path, "1000 100 first\n")  # truncated (the reader starts over) to what the first line was
    load(table, path, 2.0, reader)
    assert name_at(table, 0x1010, 1.0) == "first"


def test_descriptors_are_bounded_per_table_and_in_all_then_names_are_copied(tmp_path):
    budget = SymbolBudget(kept_files=TABLE_FILES + 1)
    before = open_fds()
    first, second = SymbolHistory(budget), SymbolHistory(budget)
    for generation in range(TABLE_FILES + 2):  # a map replaced again and again
        path = tmp_path / f"perf-{generation}.map"
        write(path, f"{0x1000 * (generation + 1):x} 10 gen{generation}\n")
        load(first, path, float(generation))
    assert len(first.lines.fds) == TABLE_FILES and len(first.names) == 2
    load(second, tmp_path / "perf-0.map")
    write(tmp_path / "last.map", "9000 10 copied\n")
    load(second, tmp_path / "last.map")
    assert budget.files == TABLE_FILES + 1 and second.names.get(0) == "copied"
    assert [name_at(first, 0x1000 * (g + 1), 10.0) for g in range(TABLE_FILES + 2)] == \
        [f"gen{g}" for g in range(TABLE_FILES + 2)]
    assert open_fds() == before + TABLE_FILES + 1
    first.release()
    second.release()
    assert budget.files == 0 and open_fds() == before


def test_repeats_are_dropped_by_name_not_by_line(tmp_path):
    path = tmp_path / "perf-1.map"
    write(path, "1000 100 same\n1000 100 same\n1000 100 other\n")
    table = SymbolHistory()
    load(table, path)
    table.compact()
    assert len(table) == 2 and name_at(table, 0x1010) == "other"


def test_a_large_map_costs_its_entries_not_its_names(tmp_path):
    """What this is for: serve's soak (20,001 names of ~200 bytes per JIT process) held 6-7 MB per live
    process with copied names. Left in the file, the table is its arrays: about 1.4 MB here."""
    path = tmp_path / "perf-1.map"
    tail = "x" * 180
    write(path, "".join(f"{0x10000000 + 64 * i:x} 40 soak::cold_{i}_{tail}\n" for i in range(20_001)))
    tracemalloc.start()
    try:
        table = SymbolHistory()
        load(table, path)
        assert name_at(table, 0x10000000 + 64 * 777 + 3) == f"soak::cold_777_{tail}"
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table) == 20_001 and held < 1_600_000, held


def test_jit_symbols_keep_maps_open_only_while_the_process_is_remembered(spawn):
    proc = spawn(["sleep", "30"])
    path = f"/tmp/perf-{proc.pid}.map"
    write(path, "1000 100 in_file\n")
    jit = JitSymbols(names_in_files=True)
    before = open_fds()
    jit.poll(proc.pid, 1.0)
    assert jit.budget.files == 1 and open_fds() == before + 1
    proc.kill()
    proc.wait()
    os.unlink(path)
    jit.process_exited(proc.pid, 2.0)
    assert jit.lookup(proc.pid, 0x1010, 1.0) == ("in_file", path)
    jit.forget_process(proc.pid)
    assert jit.budget.files == 0 and open_fds() == before


def test_closing_jit_symbols_closes_every_kept_map(spawn):
    procs = [spawn(["sleep", "30"]) for _ in range(3)]
    jit = JitSymbols(names_in_files=True)
    before = open_fds()
    for proc in procs:
        write(f"/tmp/perf-{proc.pid}.map", "1000 100 f\n")
        jit.poll(proc.pid, 1.0)
    assert open_fds() == before + 3
    jit.close()
    assert open_fds() == before and jit.budget.files == 0


def test_a_map_read_again_and_again_keeps_references_to_its_distinct_entries_only(tmp_path):
    """Line references are not interned like copied names: compacting the table must drop those of the
    repeats, or a map rewritten every drain (jcmd) would grow them for as long as its process lives."""
    path = tmp_path / "perf-1.map"
    write(path, "".join(f"{0x1000 + 16 * i:x} 10 f{i}\n" for i in range(100)))
    table = SymbolHistory()
    fd = os.open(path, os.O_RDONLY)
    try:
        in_file = table.keep_file(fd)
        for round_ in range(5):  # a new reader each time: the whole map again
            table.add_many(PerfMapReader(with_offsets=True).read_new(fd, final=True), str(path), float(round_),
                           in_file)
    finally:
        os.close(fd)
    assert len(table.lines) == 500
    table.compact()
    assert len(table) == 100 and len(table.lines) == 100
    assert [name_at(table, 0x1000 + 16 * i + 3, 9.0) for i in (0, 42, 99)] == ["f0", "f42", "f99"]
