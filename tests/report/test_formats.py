"""Each output format, parsed back and compared with the synthetic record's known counts."""
from __future__ import annotations

import csv
import io
import json

from optrace.model import Record
from profiletext import render_report
from optrace.frontend.report.rows import ReportOptions


def test_table_header_columns_and_markers(record: Record) -> None:
    text = render_report(record, ReportOptions(), "table", "optrace.data")
    lines = text.splitlines()
    assert lines[0] == "# optrace report of optrace.data"
    assert "# Samples: 1000 of event 'cpu-clock', 499 Hz, 2.50 s" in lines
    assert "# Target: command /work/main/workloads/build/demo 3 (exit status 0)" in lines
    assert "# Total Lost Samples: 0; samples without their stack: 3 (user_stack_missing: 3)" in lines
    assert "# Warning: one test warning" in lines
    assert "# Overhead  Samples  Command  Shared Object      Symbol" in lines
    body = [line for line in lines if line and not line.startswith("#")]
    assert body[0].split() == ["40.00%", "400", "demo", "demo", "[.]", "hot_a"]
    assert body[3].split() == ["10.00%", "100", "demo", "[kernel.kallsyms]", "[k]", "ksys_write"]
    assert body[2].split()[3] == "libburn.so"  # basename, like perf
    assert "Uprobe call counts" not in text


def test_table_has_only_the_sort_key_columns(record: Record) -> None:
    text = render_report(record, ReportOptions(sort=("pid", "symbol")), "table", "f")
    assert "# Overhead  Samples  Pid  Symbol" in text.splitlines()
    assert "Command" not in text and "Shared Object" not in text


def test_table_children_columns(record: Record) -> None:
    lines = render_report(record, ReportOptions(children=True), "table", "f").splitlines()
    assert "# Children    Self  Samples  Command  Shared Object      Symbol" in lines
    body = [line for line in lines if line and not line.startswith("#")]
    assert body[0].split() == ["90.00%", "0.00%", "0", "demo", "demo", "[.]", "main"]


def test_table_shows_call_counts_under_the_profile(record: Record) -> None:
    from optrace.model import CallCount

    record.calls = [CallCount("c:write", "/lib/libc.so.6", "write", 0x10, 1234, {100: 1234})]
    lines = render_report(record, ReportOptions(), "table", "f").splitlines()
    start = lines.index("# Uprobe call counts")
    assert start > 10
    assert lines[start + 2].split() == ["#", "Calls", "Probe", "Binary", "Symbol"]
    assert lines[-1].split() == ["1234", "c:write", "/lib/libc.so.6", "write"]


def test_table_without_matching_rows(record: Record) -> None:
    text = render_report(record, ReportOptions(comms=frozenset({"nothing"})), "table", "f")
    assert "# (no samples match --comm nothing)" in text


def test_json_rows_meta_and_nulls(record: Record) -> None:
    doc = json.loads(render_report(record, ReportOptions(), "json", "f"))
    assert doc["meta"]["frequency_hz"] == 499 and doc["meta"]["lost"]["user_stack_missing"] == 3
    assert doc["calls"] == []
    assert doc["report"]["total_samples"] == 1000
    first = doc["rows"][0]
    assert first == {"comm": "demo", "pid": None, "tid": None, "dso": "/work/main/workloads/build/demo", "symbol": "hot_a",
                     "kernel": False, "samples": 400, "percent": 40.0}
    samples = [row["samples"] for row in doc["rows"]]
    assert samples == sorted(samples, reverse=True) and sum(samples) == 1000


def test_json_children_and_calls(record: Record) -> None:
    from optrace.model import CallCount

    record.calls = [CallCount("c:write", "/lib/libc.so.6", "write", 0x10, 7, {100: 7})]
    doc = json.loads(render_report(record, ReportOptions(sort=("pid",), children=True), "json", "f"))
    assert doc["rows"] == [
        {"comm": None, "pid": 100, "tid": None, "dso": None, "symbol": None, "kernel": None, "samples": 900,
         "percent": 90.0, "children": 900, "children_percent": 90.0},
        {"comm": None, "pid": 200, "tid": None, "dso": None, "symbol": None, "kernel": None, "samples": 100,
         "percent": 10.0, "children": 100, "children_percent": 10.0},
    ]
    expected = {"probe": "c:write", "binary": "/lib/libc.so.6", "symbol": "write", "offset": 16, "calls": 7,
                "per_pid": {"100": 7}}
    assert len(doc["calls"]) == 1
    assert {key: doc["calls"][0][key] for key in expected} == expected


def test_csv_parses_back(record: Record) -> None:
    text = render_report(record, ReportOptions(children=True), "csv", "f")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["comm", "pid", "tid", "dso", "symbol", "kernel", "samples", "percent", "children",
                             "children_percent"]
    main = rows[0]
    assert (main["symbol"], main["pid"], main["samples"], main["children"], main["children_percent"]) == (
        "main", "", "0", "900", "90.0")
    kernel = next(row for row in rows if row["symbol"] == "ksys_write")
    assert kernel["kernel"] == "true" and kernel["percent"] == "10.0"


def test_folded_one_line_per_stack_root_first(record: Record) -> None:
    text = render_report(record, ReportOptions(), "folded", "f")
    assert text.splitlines() == [
        "bash;[unknown] 50",
        "bash;main;hot_a 50",
        "demo;main;hot_a 400",
        "demo;main;hot_b 200",
        "demo;main;lib_burn 200",
        "demo;main;write;ksys_write_[k] 100",
    ]


def test_folded_merges_pids_filters_and_cleans_names(record: Record) -> None:
    from optrace.model import Frame, Sample

    record.frames.append(Frame("Lfoo;bar", "/x.jar"))
    record.samples += [Sample(101, "demo", (1, 0), 5), Sample(102, "demo", (len(record.frames) - 1,), 3)]
    lines = render_report(record, ReportOptions(comms=frozenset({"demo"}), percent_limit=1.0), "folded", "f")
    assert "demo;main;hot_a 405" in lines.splitlines()
    assert "demo;Lfoo:bar 3" not in lines  # 0.3% is under the 1% limit
    every = render_report(record, ReportOptions(pids=frozenset({102})), "folded", "f")
    assert every == "demo;Lfoo:bar 3\n"


def test_whole_machine_with_a_command_says_whole_machine(record: Record) -> None:
    """`record -a -- CMD` profiles the machine; the command only sets how long (and the launcher's
    pre-exec samples are optrace's own, left out and counted apart)."""
    record.meta.system_wide, record.meta.launcher_samples = True, 3
    lines = render_report(record, ReportOptions(), "table", "f").splitlines()
    assert ("# Target: whole machine, while running command /work/main/workloads/build/demo 3 (exit status 0)"
            in lines)
    assert "# optrace's launcher before exec (optrace-exec, not in the profile): 3" in lines
    assert json.loads(render_report(record, ReportOptions(), "json", "f"))["meta"]["launcher_samples"] == 3


def test_carried_samples_are_said_in_the_header(record: Record) -> None:
    """Samples of threads that ended between two ticks, taken at their process's next tick (bpf/profile.c's
    sample_due): counted in the profile, and the header says how many (none: no line)."""
    assert "next tick" not in render_report(record, ReportOptions(), "table", "f")
    record.meta.carried_samples = record.meta.total_samples // 10
    lines = render_report(record, ReportOptions(), "table", "f").splitlines()
    line = [text for text in lines if "next tick" in text]
    assert line == [f"# Taken at their process's next tick for threads that ended between two ticks: "
                    f"{record.meta.carried_samples} (10.0%)"], line
    assert json.loads(render_report(record, ReportOptions(), "json", "f"))["meta"]["carried_samples"] > 0


def test_launcher_samples_are_told_apart() -> None:
    from optrace.frontend.recorder import is_launcher

    assert is_launcher("optrace-exec")  # any pid: under -a, another optrace run's launcher too
    assert not is_launcher("demo")  # after the exec: the command's own


def test_the_synthetic_record_loses_samples_for_reasons_real_records_have(record: Record) -> None:
    """The README's JSON example comes from this record: its `lost` keys must be the profiler's."""
    from optrace.bpf.profiler import LOST_REASONS

    assert record.meta.lost and set(record.meta.lost) <= set(LOST_REASONS)
