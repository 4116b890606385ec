"""`--format csv`: a header line, then one line per report row (the JSON row fields; null is empty,
booleans are true/false). Names are escaped (:mod:`optrace.escape`): a newline or a
terminal escape in a name never reaches the output, so every row is one line; ``--format json`` keeps
the names as recorded.

Lines are written here rather than by the csv module, whose writer holds a line at 4 bytes a character:
a hostile record's megabyte-long names would cost four times their size per row."""
from __future__ import annotations

from typing import TextIO

from optrace.exporters.budget import Names, OutputBudget
from optrace.exporters.jsonrows import row_fields, row_object
from optrace.frontend.report.rows import Profile, ReportOptions, build_rows


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    stream.write(_text(profile, options))


def _text(profile: Profile, options: ReportOptions) -> str:
    lines = [_line(row_fields(options, profile.unit))]
    names, budget = Names(), OutputBudget()
    for row in build_rows(profile.record, options):
        cells = [_cell(value, names) for value in row_object(row, options, profile.unit).values()]
        budget.take(sum(len(cell) + 3 for cell in cells))  # quotes and a comma, at most
        lines.append(_line(cells))
    return "".join(lines)


def _line(cells: list[str]) -> str:
    return ",".join(_quoted(cell) for cell in cells) + "\n"


def _quoted(cell: str) -> str:
    """RFC 4180 quoting, as csv.QUOTE_MINIMAL does for these cells (escaped names hold no line break)."""
    if "," in cell or '"' in cell:
        return '"' + cell.replace('"', '""') + '"'
    return cell


def _cell(value: object, names: Names) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return names(value)
    return "" if value is None else str(value)
