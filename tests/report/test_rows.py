"""Aggregation into rows: exact counts and percentages from the synthetic record (conftest.py)."""
from __future__ import annotations

import pytest

from optrace.errors import OptraceError
from optrace.model import Record, Sample
from optrace.frontend.report.rows import ReportOptions, RowKey, build_rows, parse_sort_keys


def table(rows) -> list[tuple]:
    return [(row.key.comm, row.key.pid, row.key.dso, row.key.symbol, row.samples, row.percent) for row in rows]


def test_default_sort_self_counts_and_percentages(record: Record) -> None:
    rows = build_rows(record, ReportOptions())
    assert [(r.key.comm, r.key.symbol, r.samples, r.percent) for r in rows] == [
        ("demo", "hot_a", 400, 40.0),
        ("demo", "hot_b", 200, 20.0),
        ("demo", "lib_burn", 200, 20.0),
        ("demo", "ksys_write", 100, 10.0),
        ("bash", "hot_a", 50, 5.0),
        ("bash", "[unknown]", 50, 5.0),
    ]
    assert all(row.key.pid is None for row in rows)
    assert [row.key.kernel for row in rows] == [False, False, False, True, False, False]


def test_sort_by_symbol_only_merges_across_commands(record: Record) -> None:
    rows = build_rows(record, ReportOptions(sort=("symbol",)))
    assert table(rows)[0] == (None, None, None, "hot_a", 450, 45.0)
    assert sum(row.samples for row in rows) == 1000


def test_sort_by_pid_and_dso(record: Record) -> None:
    rows = build_rows(record, ReportOptions(sort=("pid", "dso")))
    assert table(rows) == [
        (None, 100, "/work/main/workloads/build/demo", None, 600, 60.0),
        (None, 100, "/work/main/workloads/build/libburn.so", None, 200, 20.0),
        (None, 100, "[kernel.kallsyms]", None, 100, 10.0),
        (None, 200, "/usr/bin/bash", None, 50, 5.0),
        (None, 200, "[unknown]", None, 50, 5.0),
    ]


def test_pid_and_comm_filters_keep_absolute_percentages(record: Record) -> None:
    by_pid = build_rows(record, ReportOptions(pids=frozenset({200})))
    by_comm = build_rows(record, ReportOptions(comms=frozenset({"bash"})))
    assert table(by_pid) == table(by_comm) == [
        ("bash", None, "/usr/bin/bash", "hot_a", 50, 5.0),
        ("bash", None, "[unknown]", "[unknown]", 50, 5.0),
    ]


@pytest.mark.parametrize("dso", ["libburn.so", "/work/main/workloads/build/libburn.so"])
def test_dso_filter_by_basename_or_full_path(record: Record, dso: str) -> None:
    rows = build_rows(record, ReportOptions(dsos=frozenset({dso})))
    assert table(rows) == [("demo", None, "/work/main/workloads/build/libburn.so", "lib_burn", 200, 20.0)]


def test_percent_limit_hides_small_rows(record: Record) -> None:
    rows = build_rows(record, ReportOptions(percent_limit=10.0))
    assert [row.key.symbol for row in rows] == ["hot_a", "hot_b", "lib_burn", "ksys_write"]


def test_children_counts_each_symbol_once_per_stack(record: Record) -> None:
    rows = build_rows(record, ReportOptions(children=True))
    got = {(r.key.comm, r.key.symbol): (r.children, r.samples, r.children_percent) for r in rows}
    assert got[("demo", "main")] == (900, 0, 90.0)
    assert got[("demo", "write")] == (100, 0, 10.0)
    assert got[("demo", "hot_a")] == (400, 400, 40.0)
    assert got[("bash", "main")] == (50, 0, 5.0)
    assert rows[0].key.symbol == "main"  # sorted by children with --children


def test_children_recursion_is_counted_once() -> None:
    from optrace.model import Frame, RecordMeta

    meta = RecordMeta("0", "h", "k", 0.0, 1.0, 99, "cpu-clock")
    frames = [Frame("fib", "/bin/x"), Frame("main", "/bin/x")]
    record = Record(meta, frames, [Sample(1, "x", (0, 0, 0, 1), 10), Sample(1, "x", (1,), 10)])
    rows = build_rows(record, ReportOptions(children=True))
    assert {(r.key.symbol, r.children, r.samples) for r in rows} == {("fib", 10, 10), ("main", 20, 10)}


def test_empty_record_has_no_rows_and_no_division_by_zero(record: Record) -> None:
    record.samples = []
    assert build_rows(record, ReportOptions(children=True)) == []


def test_row_key_defaults_are_none() -> None:
    assert RowKey() == RowKey(None, None, None, None, None)


@pytest.mark.parametrize("text,keys", [("comm,dso,symbol", ("comm", "dso", "symbol")),
                                       (" pid , symbol,pid", ("pid", "symbol"))])
def test_parse_sort_keys(text: str, keys: tuple[str, ...]) -> None:
    assert parse_sort_keys(text) == keys


@pytest.mark.parametrize("text", ["sym", "comm,cpu", "", ","])
def test_bad_sort_keys_list_the_valid_ones(text: str) -> None:
    with pytest.raises(OptraceError, match="valid keys are comm, pid, tid, dso, symbol"):
        parse_sort_keys(text)
