"""One long name repeated in many rows or stacks: a 30 KB record file whose report would be gigabytes
stops with one line (the output budget) instead of taking all memory; long cells do not pad every row."""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from optrace.errors import OptraceError
from optrace.model import Frame, Record, Sample
from optrace.recordfile import write_record
from optrace.exporters import budget
from profiletext import TEXT_FORMATS as FORMATS, render_report
from optrace.frontend.report.rows import ReportOptions
from support import OPTRACE

# The flame graph page holds each distinct name once (a table the stacks index), so a repeated name does
# not amplify it: tests/report/test_flamegraph.py checks it on the 30 KB file below.
AMPLIFIED = tuple(fmt for fmt in FORMATS if fmt != "flamegraph")


def repeated_name_record(record: Record, name_chars: int, rows: int) -> Record:
    """One frame with a long symbol and dso, in ``rows`` samples of distinct commands (one row each)."""
    frame = Frame("s" * name_chars, "/lib/" + "d" * name_chars)
    samples = [Sample(pid=1, comm=f"c{i}", frames=(0,), count=1) for i in range(rows)]
    return dataclasses.replace(record, frames=[frame], samples=samples, calls=[])


@pytest.mark.parametrize("fmt", AMPLIFIED)
@pytest.mark.parametrize("children", [False, True])
def test_budget_stops_every_format(record: Record, monkeypatch, fmt: str, children: bool) -> None:
    monkeypatch.setattr(budget, "MAX_OUTPUT_CHARS", 4 << 20)
    big = repeated_name_record(record, 100_000, 200)  # about 40 MB of output, 200 KB of names
    with pytest.raises(OptraceError, match=r"the report would be over 4 MiB of text .*narrow it with --pid"):
        render_report(big, ReportOptions(children=children), fmt, "r")


@pytest.mark.parametrize("fmt", AMPLIFIED)
def test_under_the_budget_the_report_is_whole(record: Record, monkeypatch, fmt: str) -> None:
    monkeypatch.setattr(budget, "MAX_OUTPUT_CHARS", 4 << 20)
    text = render_report(repeated_name_record(record, 1000, 200), ReportOptions(), fmt, "r")
    assert 200_000 < len(text) < 4 << 20
    assert text.count("s" * 1000) == 200


def test_a_long_cell_pads_no_other_row(record: Record) -> None:
    long_dso = "/lib/" + "d" * 10_000 + ".so"
    record.frames.append(Frame("odd", long_dso))
    record.samples.append(Sample(300, "odd", (len(record.frames) - 1,), 10))
    lines = render_report(record, ReportOptions(sort=("dso", "symbol")), "table", "r").splitlines()
    rows = [line for line in lines if line.startswith("  ")]
    assert max(len(line) for line in rows if "ddd" not in line) < budget.MAX_ALIGN + 60
    assert any(line.endswith("[.] odd") and len(line) > 10_000 for line in rows)


def test_cli_on_a_30_kb_file(tmp_path: Path, record: Record) -> None:
    """A 30 MB symbol in 200 rows (6 GB of report, 30 KB on disk): one line, exit 1, little memory."""
    path = tmp_path / "amplified.data"
    write_record(repeated_name_record(record, 30_000_000, 200), path)
    assert path.stat().st_size < 200_000
    for fmt in AMPLIFIED:
        measured = tmp_path / f"{fmt}.time"  # GNU time: a spawned child's ru_maxrss starts from pytest's peak
        result = subprocess.run(["/usr/bin/time", "-o", str(measured), "-f", "%U %S %M", str(OPTRACE), "report",
                                 "-i", str(path), "-f", fmt], capture_output=True, text=True)
        user, system, peak_kb = measured.read_text().split()[-3:]
        assert result.returncode == 1, result.stderr
        assert result.stderr.count("\n") == 1 and "the report would be over" in result.stderr
        assert result.stdout == ""
        assert int(peak_kb) < 400 << 10, f"{fmt}: peak RSS {int(peak_kb) >> 10} MB"
        assert float(user) + float(system) < 5, f"{fmt}: {float(user) + float(system):.1f} s of CPU"


@pytest.mark.parametrize("rows, passes", [(50, 1), (51, 2)])
def test_a_table_makes_its_cells_once_unless_it_is_long(monkeypatch, rows: int, passes: int) -> None:
    """The measuring pass keeps the cells of up to HELD_ROWS rows (the width pass and the text pass each made
    them all: a third of a whole-machine flat report's table time); a longer table makes them again."""
    from optrace.exporters import table
    monkeypatch.setattr(table, "HELD_ROWS", 50)
    made = []

    def cells():
        made.append(1)
        return ([f"{n}", "x" * (n % 7)] for n in range(rows))

    lines = table.format_columns([table.Column("N", True), table.Column("Name")], cells, budget.OutputBudget())
    assert len(made) == passes
    assert lines[3:] == [f"  {n:>2}  {'x' * (n % 7)}".rstrip() for n in range(rows)]
