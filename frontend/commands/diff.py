"""`optrace diff BASE NEW`: compare two record files per row, like perf diff (frontend/report/diff.py)."""
from __future__ import annotations

import click

from optrace.escape import escape_controls
from optrace.exporters.formats import DIFF
from optrace.frontend.cliopts import python_internals_option, report_options, row_options
from optrace.frontend.report.diff import compare
from optrace.frontend.report.pythonview import python_view_record
from optrace.frontend.report.rows import Profile
from optrace.outputfile import output_stream
from optrace.recordfile import read_record


@click.command("diff")
@click.argument("base")
@click.argument("new")
@click.option("-f", "--format", "fmt", default="table", show_default=True,
              help=f"{', '.join(DIFF.names[:-1])} or {DIFF.names[-1]} (a differential flame graph, HTML).")
@row_options
@click.option("--percent-limit", default="0", help="Hide rows below this share in both records.")
@click.option("--children", is_flag=True, help="Compare inclusive (children) counts instead of self.")
@click.option("-G", "--call-graph", "call_graph", default="caller", show_default=True, metavar="caller|callee",
              help="Order of the differential flame graph.")
@python_internals_option()
@click.option("-o", "--output", default="-", help="Write here instead of stdout.")
def command(base: str, new: str, sort: str, fmt: str, pids: tuple[int, ...], comms: str, dsos: str, percent_limit: str,
            children: bool, call_graph: str, python_internals: bool, output: str) -> None:
    """Compare two recorded profiles: each row's share in BASE and NEW and the change, largest first.
    Records of other machines compare too (by name, with a note)."""
    options = report_options(sort, pids, comms, dsos, percent_limit, children, call_graph)
    write = DIFF.writer(fmt)
    records = [read_record(path) for path in (base, new)]
    if not python_internals:
        records = [python_view_record(record)[0] for record in records]
    comparison = compare(Profile(records[0], escape_controls(base)), Profile(records[1], escape_controls(new)))
    with output_stream(output) as stream:
        write(stream, comparison, options)
