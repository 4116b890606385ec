"""`optrace report`: read a record file and print it per symbol. Needs no root and never loads BCC."""
from __future__ import annotations

import click

from optrace.escape import escape_controls
from optrace.heap import settle
from optrace.exporters.formats import CALL_GRAPH, PROFILE
from optrace.frontend.cliopts import (PERF_CALL_GRAPH_DEFAULT, pid_option, python_internals_option, report_options,
                                      row_options)
from optrace.frontend.report.events import EVENTS, event_record, main_event
from optrace.frontend.report.gilwaits import gil_waits_only
from optrace.frontend.report.pythonview import python_view_record
from optrace.frontend.report.rows import Profile
from optrace.frontend.report.wakers import with_wakers
from optrace.outputfile import output_stream
from optrace.recordfile import read_record


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
@click.option("--wakers", is_flag=True,
              help="With --event off-cpu or wall (a record made with --wakers): each wait that slept joined to the "
                   "stack of the thread that woke it, as BCC's offwaketime (blocked stack, --, waker's stack, its command).")
@python_internals_option()
@click.option("-o", "--output", default="-", help="Write here instead of stdout.")
def command(source: str, sort: str, event: str | None, fmt: str, pids: tuple[int, ...], tids: tuple[int, ...], comms: str,
            dsos: str, percent_limit: str, children: bool, call_graph: str | None, gil: bool, wakers: bool,
            python_internals: bool,
            output: str) -> None:
    """Show a recorded profile per symbol, like perf report."""
    options = report_options(sort, pids, comms, dsos, percent_limit, children, call_graph, tids)
    write = (CALL_GRAPH if options.call_graph else PROFILE).writer(fmt)
    record = settle(read_record(source))
    event = event or main_event(record.meta)
    record, parts = event_record(record, event)
    if wakers:
        record = with_wakers(record, event)
    record, folded = (record, 0) if python_internals else python_view_record(record)
    if gil:
        record = gil_waits_only(record)
    profile = Profile(record, escape_controls(source), event, parts, python_folded=folded)
    with output_stream(output) as stream:
        write(stream, profile, options)
