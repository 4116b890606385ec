"""report -G caller|callee: the call tree against the synthetic record's known stacks, and its totals
against --children (the acceptance: both are inclusive counts, computed two ways)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from optrace.exporters.formats import CALL_GRAPH
from optrace.frontend.report.callgraph import Node, build_tree, walk
from optrace.frontend.report.rows import Profile, ReportOptions, build_rows
from optrace.model import Frame, Record, RecordMeta, Sample
from optrace.recordfile import write_record
from support import assert_one_line_error


def outermost_totals(root: Node) -> dict[tuple[str, str], int]:
    """Each function's samples from the tree: the totals of its nodes that have no ancestor of the same
    function (a recursive function's inner calls are in its outer ones)."""
    totals: dict[tuple[str, str], int] = {}
    pending = [(root, frozenset())]
    while pending:
        node, above = pending.pop()
        for child in node.children.values():
            key = (child.dso, child.symbol)
            if key not in above:
                totals[key] = totals.get(key, 0) + child.total
            pending.append((child, above | {key}))
    return totals


def recursive_record() -> Record:
    """main -> fib -> fib -> fib (leaf) 30, main -> fib -> work 20, main -> work 50: fib calls itself."""
    frames = [Frame("main", "/bin/r"), Frame("fib", "/bin/r"), Frame("work", "/bin/r")]
    meta = RecordMeta("0.1.0", "h", "6.18", 0.0, 1.0, 99, "cpu-clock", total_samples=100)
    samples = [Sample(1, "r", (1, 1, 1, 0), 30), Sample(1, "r", (2, 1, 0), 20), Sample(1, "r", (2, 0), 50)]
    return Record(meta=meta, frames=frames, samples=samples)


@pytest.mark.parametrize("make", ["synthetic", "recursive"])
def test_tree_totals_equal_children(record: Record, make: str) -> None:
    record = record if make == "synthetic" else recursive_record()
    options = ReportOptions(sort=("dso", "symbol"), children=True)
    children = {(row.key.dso, row.key.symbol): row.children for row in build_rows(record, options)}
    for order in ("caller", "callee"):
        assert outermost_totals(build_tree(record, options, order).root) == children


def test_caller_tree_shape(record: Record) -> None:
    tree = build_tree(record, ReportOptions(), "caller")
    assert tree.total_samples == 1000 and tree.root.total == 1000
    main = next(n for n in tree.root.children.values() if n.symbol == "main" and "demo" in n.dso)
    assert (main.total, main.self_count) == (900, 0)
    assert [(n.symbol, n.total, n.kind) for n in main.sorted_children()] == [
        ("hot_a", 400, "user"), ("hot_b", 200, "user"), ("lib_burn", 200, "user"), ("write", 100, "user")]
    write = main.sorted_children()[3]
    assert [(n.symbol, n.kind, n.self_count) for n in write.children.values()] == [("ksys_write", "kernel", 100)]


def test_callee_roots_are_self_counts(record: Record) -> None:
    tree = build_tree(record, ReportOptions(), "callee")
    rows = {(r.key.dso, r.key.symbol): r.samples for r in build_rows(record, ReportOptions(sort=("dso", "symbol")))}
    assert {(n.dso, n.symbol): n.total for n in tree.root.children.values()} == rows
    ksys = next(n for n in tree.root.children.values() if n.symbol == "ksys_write")
    assert [d_n[1].symbol for d_n in walk(ksys)] == ["ksys_write", "write", "main"]


def test_by_comm_puts_commands_first(record: Record) -> None:
    tree = build_tree(record, ReportOptions(), "caller", by_comm=True)
    assert sorted((n.symbol, n.kind, n.total) for n in tree.root.children.values()) == [
        ("bash", "comm", 100), ("demo", "comm", 900)]


def graph(record: Record, options: ReportOptions, fmt: str = "table") -> str:
    """`report -G ... --format FMT` through the registry, as the command calls it."""
    out = io.StringIO()
    CALL_GRAPH.writer(fmt)(out, Profile(record, "f"), options)
    return out.getvalue()


def test_text_graph_like_perf(record: Record) -> None:
    text = graph(record, ReportOptions(call_graph="caller"))
    expected = """\
   90.00%    0.00%       900  demo  [.] main
            |
            ---main
               |
               |--40.00%--hot_a
               |
               |--20.00%--hot_b
               |
               |--20.00%--lib_burn
               |
                --10.00%--write
                          ksys_write
"""
    assert expected in text
    assert "# Call graph, caller order: percentages of all 1000 samples" in text


def test_text_callee_and_percent_limit(record: Record) -> None:
    text = graph(record, ReportOptions(call_graph="callee", percent_limit=15))
    entries = [line.split() for line in text.splitlines() if line.startswith("  ") and "%" in line
               and not line.strip().startswith(("|", "-"))]
    assert entries == [["40.00%", "40.00%", "400", "demo", "[.]", "hot_a"],
                       ["20.00%", "20.00%", "200", "demo", "[.]", "hot_b"],
                       ["20.00%", "20.00%", "200", "libburn.so", "[.]", "lib_burn"]]
    assert "ksys_write" not in text and "branches under 15% hidden" in text


def test_json_tree(record: Record) -> None:
    doc = json.loads(graph(record, ReportOptions(call_graph="caller", percent_limit=10), "json"))
    assert doc["report"]["call_graph"] == "caller" and doc["report"]["total_samples"] == 1000
    main = doc["tree"][0]
    assert {k: main[k] for k in ("symbol", "self", "total", "total_percent")} == {
        "symbol": "main", "self": 0, "total": 900, "total_percent": 90.0}
    assert main["dso"].endswith("/demo")
    assert [(c["symbol"], c["total"], c["self"]) for c in main["children"]] == [
        ("hot_a", 400, 400), ("hot_b", 200, 200), ("lib_burn", 200, 200), ("write", 100, 0)]
    assert main["children"][3]["children"] == [{
        "symbol": "ksys_write", "dso": "[kernel.kallsyms]", "kind": "kernel", "self": 100, "total": 100,
        "self_percent": 10.0, "total_percent": 10.0, "children": []}]
    assert len(doc["tree"]) == 1  # bash's 5% branches are under the limit


def test_cli_call_graph_and_bad_value(optrace, record_file: Path) -> None:
    proc = optrace("report", "-i", str(record_file), "-G", "caller", check=True)
    assert "---main" in proc.stdout
    proc = optrace("report", "-i", str(record_file), "--call-graph", "callee", "-f", "json", check=True)
    assert json.loads(proc.stdout)["tree"][0]["symbol"] == "hot_a"
    assert_one_line_error(optrace("report", "-i", str(record_file), "-G", "sideways"),
                          "--call-graph takes perf's forms")
    assert_one_line_error(optrace("report", "-i", str(record_file), "-G", "caller", "-f", "csv"),
                          "unknown format 'csv'")


def test_no_stacks_and_empty_records_say_so(optrace, record: Record, tmp_path: Path) -> None:
    record.meta.stacks = False
    record.samples = [Sample(s.pid, s.comm, s.frames[:1], s.count) for s in record.samples]
    write_record(record, tmp_path / "nostacks.data")
    empty = Record(meta=RecordMeta("0.1.0", "h", "6.18", 0.0, 1.0, 99, "cpu-clock"))
    write_record(empty, tmp_path / "empty.data")
    for fmt in ("table", "json", "flamegraph", "svg"):
        proc = optrace("report", "-i", str(tmp_path / "nostacks.data"), "-G", "caller", "-f", fmt)
        assert_one_line_error(proc, "made with --no-stacks (leaf frames only)")
        proc = optrace("report", "-i", str(tmp_path / "empty.data"), "-G", "callee", "-f", fmt)
        assert_one_line_error(proc, "the record has no samples")
    for fmt in ("flamegraph", "svg"):
        proc = optrace("report", "-i", str(tmp_path / "nostacks.data"), "-f", fmt, "-o", str(tmp_path / "x"))
        assert_one_line_error(proc, "a flame graph needs stacks")
        assert not (tmp_path / "x").exists()
