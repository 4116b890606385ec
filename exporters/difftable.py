"""`optrace diff --format table`: perf diff's layout, one line per row, largest change first."""
from __future__ import annotations

from typing import TextIO

from optrace.escape import escape_controls
from optrace.exporters.table import KEY_COLUMNS, Column, Shown, _key_cell, format_columns, target_text
from optrace.frontend.report.diff import Comparison, DiffRow, diff_rows
from optrace.frontend.report.rows import Profile, ReportOptions, sample_total

COUNT_COLUMNS = [Column("Base", True), Column("New", True), Column("Delta", True), Column("Base samples", True),
                 Column("New samples", True)]


def write(stream: TextIO, comparison: Comparison, options: ReportOptions) -> None:
    shown = Shown()
    rows = diff_rows(comparison, options)
    lines = [escape_controls(line) for line in header(comparison)] + ["#"]
    columns = COUNT_COLUMNS + [KEY_COLUMNS[key] for key in options.sort]
    lines += format_columns(columns, lambda: (_cells(row, options, shown) for row in rows), shown.budget)
    if not rows:
        lines.append("# (no samples match)")
    stream.write("\n".join(lines) + "\n")


def header(comparison: Comparison) -> list[str]:
    lines = ["# optrace diff: shares of each record's samples; Delta = New - Base, in percentage points"]
    lines += [_describe("Base", comparison.base), _describe("New", comparison.new)]
    return lines + [f"# Note: {note}" for note in comparison.notes]


def _describe(label: str, profile: Profile) -> str:
    meta = profile.record.meta
    return (f"# {label}: {profile.source}: {sample_total(profile.record)} samples, {meta.duration_s:.2f} s,"
            f" {target_text(meta)}, on {meta.hostname}")


def _cells(row: DiffRow, options: ReportOptions, shown: Shown) -> list[str]:
    counts = [f"{row.base_percent:.2f}%", f"{row.new_percent:.2f}%", f"{row.delta_percent:+.2f}",
              str(row.base_samples), str(row.new_samples)]
    return counts + [_key_cell(row, key, shown) for key in options.sort]  # type: ignore[arg-type]  # uses .key only

