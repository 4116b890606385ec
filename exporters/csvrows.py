"""`--format csv`: a header line, then one line per report row (the JSON row fields; null is empty,
booleans are true/false). Names are escaped (:mod:`optrace.frontend.report.escape`): a newline or a
terminal escape in a name never reaches the output, so every row is one line; ``--format json`` keeps
the names as recorded."""
from __future__ import annotations

import csv
import io

from optrace.exporters.jsonrows import row_object
from optrace.frontend.report.escape import escape_controls
from optrace.frontend.report.rows import ReportOptions, Row


def render_csv(rows: list[Row], options: ReportOptions) -> str:
    fields = ["comm", "pid", "dso", "symbol", "kernel", "samples", "percent"]
    if options.children:
        fields += ["children", "children_percent"]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({name: _cell(value) for name, value in row_object(row, options).items()})
    return out.getvalue()


def _cell(value: object) -> object:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return escape_controls(value)
    return "" if value is None else value
