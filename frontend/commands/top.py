"""`optrace top`: the hottest functions now, refreshed live (like perf top), from the same profiling
session as record and serve. Full screen on a terminal; a plain table per refresh otherwise."""
from __future__ import annotations

import sys

import click

from optrace.errors import OptraceError
from optrace.frontend.cliopts import (check_frequency, frequency_option, pid_option, python_internals_option,
                                      python_option, say_program_loads, subprocesses_option, unwind_option, verbose_option)
from optrace.frontend.report.rows import parse_sort_keys


@click.command("top")
@pid_option("-p", "--pid", help="Only these processes and their children (repeat, or comma list).")
@subprocesses_option()
@click.option("-a", "--all-cpus", "system_wide", is_flag=True, help="The whole machine (the default without -p).")
@frequency_option()
@click.option("-d", "--delay", "interval", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="Refresh every SECONDS.")
@click.option("-s", "--sort", "sort", default="dso,symbol", show_default=True,
              help="Row keys: comm, pid, dso, symbol (symbol always included).")
@unwind_option()
@python_option()
@python_internals_option()
@click.option("-z", "--zero", is_flag=True, help="Show each interval alone instead of decayed totals.")
@click.option("--children", is_flag=True, help="Start with the inclusive (children) column on.")
@click.option("--stdio", is_flag=True, help="Print a plain table every interval (the default when not on a terminal).")
@click.option("--rows", type=click.IntRange(1), default=50, show_default=True, help="Rows per plain table.")
@click.option("-n", "--iterations", type=click.IntRange(1), help="Stop after this many refreshes.")
@verbose_option()
def command(pids, subprocesses, system_wide, frequency, interval, sort, call_graph, python, python_internals, zero,
            children, stdio, rows, iterations, verbose) -> None:
    """Show the hottest functions now, refreshed live, like perf top (q, Ctrl-C or SIGTERM to stop)."""
    from optrace.frontend.preflight import require_recording
    from optrace.frontend.stopsignals import StopSignals
    from optrace.frontend.top.engine import TopEngine, TopOptions

    check_frequency(frequency)
    if not 0.1 <= interval <= 3600:
        raise OptraceError(f"-d takes seconds from 0.1 to 3600, not {interval}")
    keys = parse_sort_keys(sort)
    if "symbol" not in keys:
        keys = (*keys, "symbol")
    targets = list(pids)
    if subprocesses and (system_wide or not targets):
        raise OptraceError("--subprocesses goes with -p PID")
    options = TopOptions(frequency_hz=frequency, pids=None if system_wide or not targets else targets,
                         subprocesses=subprocesses, interval_s=interval, sort=keys, call_graph=call_graph, python=python,
                         python_internals=python_internals, zero=zero, children=children, iterations=iterations)
    screen = not stdio and sys.stdin.isatty() and sys.stdout.isatty()
    require_recording()
    from optrace.frontend.top.screen import PlainUi, run, run_screen  # rich: imported before the attach

    engine = TopEngine(options)
    with StopSignals() as stop:
        try:
            if screen:
                run_screen(engine, stop)
            else:
                run(engine, PlainUi(sys.stdout, stop, rows), stop)
        finally:
            engine.close()
    if verbose:  # after the screen is gone
        say_program_loads()
