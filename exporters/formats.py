"""From a Record and the report options to the text of one output format.

Each format's module is imported only when asked for: report start-up time is part of its benchmark.
"""
from __future__ import annotations

from optrace.errors import OptraceError
from optrace.model import Record
from optrace.frontend.report.rows import ReportOptions, build_rows

FORMATS = ("table", "json", "csv", "folded")


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise OptraceError(f"unknown format {name!r}: valid formats are {', '.join(FORMATS)}")
    return name


def render_report(record: Record, options: ReportOptions, fmt: str, source: str) -> str:
    if check_format(fmt) == "folded":
        from optrace.exporters.folded import render_folded

        return render_folded(record, options)
    rows = build_rows(record, options)
    if fmt == "json":
        from optrace.exporters.jsonrows import render_json

        return render_json(record, rows, options, source)
    if fmt == "csv":
        from optrace.exporters.csvrows import render_csv

        return render_csv(rows, options)
    from optrace.frontend.report.table import render_table

    return render_table(record, rows, options, source)
