"""`optrace report`: read a record file and print it per symbol. Needs no root and never loads BCC."""
from __future__ import annotations

from collections.abc import Callable

import click

from optrace.errors import OptraceError
from optrace.escape import escape_controls
from optrace.heap import settle
from optrace.exporters.formats import CALL_GRAPH, PROFILE
from optrace.frontend.cliopts import (PERF_CALL_GRAPH_DEFAULT, parse_call_graph, parse_percent, perf_sort_keys,
                                      pid_option)
from optrace.frontend.report.gilwaits import gil_waits_only
from optrace.frontend.report.events import EVENTS, event_record, main_event
from optrace.frontend.report.rows import SORT_KEYS, Profile, ReportOptions, parse_sort_keys
from optrace.outputfile import output_stream
from optrace.recordfile import read_record


ROW_OPTIONS = (  # the rows' keys and filters, the same in report and diff
    click.option("-s", "--sort", "sort", default="comm,dso,symbol", show_default=True,
                 help="Comma-separated row keys: comm, pid, tid, dso, symbol (perf's sym, overhead... too)."),
    pid_option("--pid", help="Only these processes (repeat, or comma list)."),
    click.option("--comm", "comms", default="", help="Only these command names (comma-separated)."),
    click.option("--dso", "dsos", default="", help="Only these objects, by basename or full path (comma-separated)."),
)


def row_options(function: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(ROW_OPTIONS):
        function = option(function)
    return function


@click.command("report")
@click.option("-i", "--input", "source", default="optrace.data", show_default=True, help="Record file to read.")
@click.option("-e", "--event", default=None, type=click.Choice(EVENTS),
              help=f"Which of the record's events: {', '.join(EVENTS)} (off-cpu and wall are times). Default: the "
                   "one it was recorded for: wall with record --wall, off-cpu with --off-cpu, else cpu.")
@click.option("-f", "--format", "fmt", default="table", show_default=True,
              help=f"{', '.join(PROFILE.names[:-1])} or {PROFILE.names[-1]}.")
@row_options
@pid_option("--tid", dest="tids", help="Only these threads (repeat, or comma list).")
@click.option("--percent-limit", default="0", help="Hide rows below this percentage of all samples (1 or 1%).")
@click.option("--children/--no-children", default=False, help="Add inclusive (children) counts from the stacks.")
@click.option("--stdio", is_flag=True, expose_value=False, help="perf's spelling of the default text table.")
@click.option("-n", "--show-nr-samples", is_flag=True, expose_value=False,
              help="perf's spelling: the table always shows the Samples column.")
@click.option("-G", "-g", "--call-graph", "call_graph", default=None, metavar="caller|callee",
              is_flag=False, flag_value=PERF_CALL_GRAPH_DEFAULT,
              help="Show the call graph: caller (from main down) or callee (from the hot function up);"
                   " perf's forms (graph,0.5,caller...) too; -g alone is perf's default, caller.")
@click.option("--gil", is_flag=True,
              help="Only the stacks waiting for Python's GIL (through the interpreter's take_gil): with "
                   "--event off-cpu or wall, which Python code waited for it, and how long.")
@click.option("-o", "--output", default="-", help="Write here instead of stdout.")
def command(source: str, sort: str, event: str | None, fmt: str, pids: tuple[int, ...], tids: tuple[int, ...], comms: str,
            dsos: str, percent_limit: str, children: bool, call_graph: str | None, gil: bool,
            output: str) -> None:
    """Show a recorded profile per symbol, like perf report."""
    options = report_options(sort, pids, comms, dsos, percent_limit, children, call_graph, tids)
    write = (CALL_GRAPH if options.call_graph else PROFILE).writer(fmt)
    record = settle(read_record(source))
    event = event or main_event(record.meta)
    record, parts = event_record(record, event)
    if gil:
        record = gil_waits_only(record)
    profile = Profile(record, escape_controls(source), event, parts)
    with output_stream(output) as stream:
        write(stream, profile, options)


def report_options(sort: str, pids: tuple[int, ...], comms: str, dsos: str, percent_limit: str, children: bool,
                   call_graph: str | None, tids: tuple[int, ...] = ()) -> ReportOptions:
    """The options as report's model takes them (also diff's)."""
    return ReportOptions(
        sort=parse_sort_keys(perf_sort_keys(sort, SORT_KEYS)),
        pids=frozenset(pids),
        tids=frozenset(tids),
        comms=_split(comms),
        dsos=_split(dsos),
        percent_limit=parse_percent(percent_limit),
        children=children,
        call_graph=_graph_order(call_graph),
    )


def _graph_order(text: str | None) -> str:
    """-G's order, or "" for no call graph (no -G, or perf's `none`)."""
    if text is None:
        return ""
    spec = parse_call_graph(text)
    return "" if spec.mode == "none" else spec.order


def _split(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())
