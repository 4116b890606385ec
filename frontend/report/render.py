"""From a Record and the report options to the text of one output format."""
from __future__ import annotations

from optrace.exporters.csvrows import render_csv
from optrace.exporters.folded import render_folded
from optrace.exporters.jsonrows import render_json
from optrace.frontend.errors import OptraceError
from optrace.frontend.model import Record
from optrace.frontend.report.rows import ReportOptions, build_rows
from optrace.frontend.report.table import render_table

FORMATS = ("table", "json", "csv", "folded")


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise OptraceError(f"unknown format {name!r}: valid formats are {', '.join(FORMATS)}")
    return name


def render_report(record: Record, options: ReportOptions, fmt: str, source: str) -> str:
    if check_format(fmt) == "folded":
        return render_folded(record, options)
    rows = build_rows(record, options)
    if fmt == "json":
        return render_json(record, rows, options, source)
    if fmt == "csv":
        return render_csv(rows, options)
    return render_table(record, rows, options, source)
