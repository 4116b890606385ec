"""Address -> symbol over time: reuse, newer wins, late snapshots, and a brute-force model check."""
from __future__ import annotations

import gc
import weakref

from hypothesis import given, settings, strategies as st

from optrace.jitmaps.symtable import SymbolHistory


def name_at(table, address, time):
    found = table.lookup(address, time)
    return None if found is None else found.name


def test_address_reuse_is_named_by_time():
    table = SymbolHistory()
    table.add(0x1000, 0x100, "A", "/tmp/perf-1.map", 1.0)
    table.add(0x1000, 0x80, "B", "/tmp/perf-1.map", 2.0)
    assert name_at(table, 0x1010, 1.0) == "A"
    assert name_at(table, 0x1010, 1.5) == "A"
    assert name_at(table, 0x1010, 2.0) == "B"
    assert name_at(table, 0x10F0, 3.0) == "A"  # B is shorter: A's tail is still A's
    assert name_at(table, 0x1100, 3.0) is None
    assert table.lookup(0x1010, 2.0).source == "/tmp/perf-1.map"


def test_newer_wins_on_overlap_within_one_read():
    table = SymbolHistory()
    table.add(0x1000, 0x100, "old", "m", 1.0)
    table.add(0x1040, 0x10, "new", "m", 1.0)
    assert name_at(table, 0x1044, 1.0) == "new"
    assert name_at(table, 0x1000, 1.0) == "old"


def test_map_written_after_the_samples_still_names_them():
    """DumpPerfMapAtExit / jcmd snapshots: the entry is known only later than the sample."""
    table = SymbolHistory()
    table.add(0x1000, 0x100, "late", "m", 9.0)
    assert name_at(table, 0x1001, 1.0) == "late"


def test_huge_entries_and_repeats_are_handled():
    table = SymbolHistory()
    table.add(0, 1 << 40, "everything", "m", 1.0)
    for _ in range(3):
        table.add(0x5000, 0x10, "same", "m", 2.0)
    assert name_at(table, 0x5004, 2.0) == "same"
    assert name_at(table, 0x9000, 2.0) == "everything"
    table.compact()
    assert len(table) == 2 and len(table.names) == 2


def test_memory_is_bounded_by_distinct_symbols():
    table = SymbolHistory()
    for round_ in range(20):  # a map re-read 20 times (e.g. rewritten by jcmd)
        for i in range(10_000):
            table.add(0x100000 + 64 * i, 64, f"f{i}", "m", float(round_))
    table.compact()
    assert len(table) == 10_000 and len(table.names) == 10_000
    assert name_at(table, 0x100000 + 64 * 5 + 3, 0.0) == "f5"


entry = st.tuples(st.integers(0, 64), st.integers(1, 32), st.integers(0, 5))


@settings(max_examples=300, deadline=None)
@given(st.lists(entry, max_size=30), st.integers(0, 100), st.integers(0, 6))
def test_matches_brute_force_model(entries, address, time):
    """Unique names (so no repeat is dropped): newest known at `time`, else earliest known after."""
    table = SymbolHistory()
    for i, (start, size, stamp) in enumerate(entries):
        table.add(start, size, f"n{i}", "m", float(stamp))
    covering = [(stamp, i) for i, (start, size, stamp) in enumerate(entries) if start <= address < start + size]
    known = [c for c in covering if c[0] <= time]
    if known:
        expect = f"n{max(known)[1]}"
    elif covering:
        expect = f"n{min(covering, key=lambda c: (c[0], -c[1]))[1]}"
    else:
        expect = None
    assert name_at(table, address, float(time)) == expect


def test_a_dropped_table_is_freed_without_the_cycle_collector():
    """A daemon drops a JIT process's table when the process exits: the memory must go back then, not at the
    cycle collector's next full pass (its thresholds count objects, not bytes: a serve soak held ~200 MB of
    dropped tables). So a table and its lookup index must not refer to each other."""
    table = SymbolHistory()
    table.add_many(((0x1000 + 64 * i, 40, f"jit_{i}") for i in range(1000)), "/tmp/perf-1.map", 1.0)
    assert table.lookup(0x1000 + 64 * 7 + 3, 2.0).name == "jit_7"  # builds the index
    gone = weakref.ref(table)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del table
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()
