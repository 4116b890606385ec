"""`optrace diff BASE NEW`: compare two record files per row, like perf diff (frontend/report/diff.py)."""
from __future__ import annotations

import click

from optrace.escape import escape_controls
from optrace.exporters.formats import DIFF
from optrace.frontend.cliopts import parse_percent, perf_sort_keys, pid_option
from optrace.frontend.commands.report import _graph_order, _split
from optrace.outputfile import output_stream
from optrace.frontend.report.diff import compare
from optrace.frontend.report.rows import SORT_KEYS, Profile, ReportOptions, parse_sort_keys
from optrace.recordfile import read_record


@click.command("diff")
@click.argument("base")
@click.argument("new")
@click.option("-s", "--sort", "sort", default="comm,dso,symbol", show_default=True,
              help="Comma-separated row keys: comm, pid, dso, symbol.")
@click.option("-f", "--format", "fmt", default="table", show_default=True,
              help=f"{', '.join(DIFF.names[:-1])} or {DIFF.names[-1]} (a differential flame graph, HTML).")
@pid_option("--pid", help="Only these processes (repeat, or comma list).")
@click.option("--comm", "comms", default="", help="Only these command names (comma-separated).")
@click.option("--dso", "dsos", default="", help="Only these objects, by basename or full path (comma-separated).")
@click.option("--percent-limit", default="0", help="Hide rows below this share in both records.")
@click.option("--children", is_flag=True, help="Compare inclusive (children) counts instead of self.")
@click.option("-G", "--call-graph", "call_graph", default="caller", show_default=True, metavar="caller|callee",
              help="Order of the differential flame graph.")
@click.option("-o", "--output", default="-", help="Write here instead of stdout.")
def command(base: str, new: str, sort: str, fmt: str, pids: tuple[int, ...], comms: str, dsos: str, percent_limit: str,
            children: bool, call_graph: str, output: str) -> None:
    """Compare two recorded profiles: each row's share in BASE and NEW and the change, largest first.
    Records of other machines compare too (by name, with a note)."""
    options = ReportOptions(
        sort=parse_sort_keys(perf_sort_keys(sort, SORT_KEYS)),
        pids=frozenset(pids),
        comms=_split(comms),
        dsos=_split(dsos),
        percent_limit=parse_percent(percent_limit),
        children=children,
        call_graph=_graph_order(call_graph) or "caller",
    )
    write = DIFF.writer(fmt)
    comparison = compare(Profile(read_record(base), escape_controls(base)),
                         Profile(read_record(new), escape_controls(new)))
    with output_stream(output) as stream:
        write(stream, comparison, options)
