"""`optrace count SPEC... [-p PID ...] [-d SECONDS] [-i INTERVAL] [--per-pid] [--format table|json] [-o FILE] [-- CMD]`."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import TextIO

import click

from optrace.errors import OptraceError
from optrace.exporters.formats import CALL_COUNTS
from optrace.frontend.report.callcounts import CountOptions, CountReport, interval_report
from optrace.frontend.cliopts import pid_option, say_program_loads, verbose_option
from optrace.frontend.startpriority import start_done
from optrace.frontend.stopsignals import StopSignals
from optrace.frontend.target import check_pids, shell_status
from optrace.frontend.uprobes.counter import CallCounter
from optrace.frontend.uprobes.resolve import DEFAULT_MAX_MATCHES
from optrace.outputfile import output_stream
from optrace.procfs import is_alive

POLL_S = 0.05
COMMAND_STDOUT = {"stdout": None, "stderr": 2, "null": subprocess.DEVNULL}  # --command-stdout -> Popen's stdout


class _CommandAfterDoubleDash(click.Command):
    """SPECs and the command are both free arguments: everything after ``--`` is the command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            args, ctx.meta["optrace.count.command"] = args[:at], args[at + 1:]
        return super().parse_args(ctx, args)


class _Run:
    """One counting run: the counter, the optional command, and when to stop."""

    def __init__(self, specs: tuple[str, ...], pids: tuple[int, ...], command: list[str], duration: float | None,
                 max_probes: int, command_stdout: str | None = None) -> None:
        self.counter = CallCounter(specs, self._pid_filter(pids, command), max_probes, pids=pids)
        self.pids = pids
        self.command = command
        self.duration = duration
        self.deadline: float | None = None
        self.child: subprocess.Popen | None = None
        self.followed: set[int] = set()
        self.started = time.monotonic()
        self.command_stdout = COMMAND_STDOUT[command_stdout or "stdout"]

    def _pid_filter(self, pids: tuple[int, ...], command: list[str]) -> Callable[[int], bool] | None:
        """-- CMD: the command and its descendants (kept by the kernel, exited ones too); -p: those pids."""
        if command:
            return lambda pid: pid in self.followed
        return set(pids).__contains__ if pids else None

    def start(self) -> None:
        """Attach, then start the clock (and the command): -d counts attached time, not compile time."""
        self.counter.start()
        start_done()  # the probes are attached: the priority the command started at is given back
        self.started = time.monotonic()
        self.deadline = self.started + self.duration if self.duration else None
        if self.command:
            me = os.getpid()
            self.counter.manager.follow(me)  # our next fork is the command; its forks follow it
            self.child = subprocess.Popen(self.command, stdout=self.command_stdout)

    def refresh_filter(self) -> None:
        if self.child is not None:
            self.followed = self.counter.manager.descendants(os.getpid()) - {os.getpid()}

    def finished(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        if self.child is not None:
            return self.child.poll() is not None
        return bool(self.pids) and not any(is_alive(pid) for pid in self.pids)

    def report(self) -> CountReport:
        self.refresh_filter()
        return CountReport(
            probes=self.counter.probe_calls(),
            elapsed_s=time.monotonic() - self.started,
            lost_pid_rows=self.counter.lost_rows(),
            exit_status=self.child.returncode if self.child is not None else None,
        )

    def stop_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()
            try:
                self.child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()


def _print(out: TextIO, report: CountReport, fmt: str, per_pid: bool, interval_mark: bool = False) -> None:
    CALL_COUNTS.writer(fmt)(out, report, CountOptions(per_pid, interval_mark))
    out.flush()


@click.command(cls=_CommandAfterDoubleDash, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("specs", nargs=-1, metavar="SPEC...")
@pid_option("-p", "--pid", help="Count only in these processes (repeat, or comma list).")
@click.option("-d", "--duration", type=click.FloatRange(min=0, min_open=True), help="Stop after SECONDS.")
@click.option("-i", "--interval", type=click.FloatRange(min=0, min_open=True),
              help="Print the calls of each INTERVAL s (funccount's -i); the end prints the totals.")
@click.option("--cumulative", is_flag=True,
              help="With -i: print running totals instead of each interval's calls.")
@click.option("--per-pid", is_flag=True, help="Also show counts per process.")
@click.option("--format", "fmt", type=click.Choice(CALL_COUNTS.names), default="table", show_default=True)
@click.option("-o", "--output", default="-", metavar="FILE",
              help="Write the counts to FILE (complete when counting ends) instead of stdout.")
@click.option("--command-stdout", type=click.Choice(tuple(COMMAND_STDOUT)), default=None,
              help="Where CMD's standard output goes (default: stdout, with the counts unless -o). With"
                   " --format json on stdout choose stderr or null (or give -o): the JSON stays whole.")
@click.option("--max-probes", type=click.IntRange(min=1), default=DEFAULT_MAX_MATCHES, show_default=True,
              help="Most functions one glob may match.")
@verbose_option()
@click.pass_context
def command(ctx: click.Context, specs: tuple[str, ...], pids: tuple[int, ...], duration: float | None,
            interval: float | None, cumulative: bool, per_pid: bool, fmt: str, output: str,
            command_stdout: str | None, max_probes: int, verbose: bool) -> None:
    """Count exact calls of functions: SPEC is BINARY:SYMBOL, LIB:SYMBOL (c:malloc), LIB:GLOB (c:str*)
    or BINARY:0xADDRESS. Counts every process unless -p or -- CMD ARGS... is given. Ctrl-C prints the
    final counts.

    What goes where: the counts to stdout (or -o FILE), messages and warnings to stderr, CMD's output
    where it would go without optrace (or --command-stdout)."""
    command_args: list[str] = ctx.meta.get("optrace.count.command", [])
    if cumulative and not interval:
        raise OptraceError("--cumulative goes with -i INTERVAL (without -i, count prints only the totals)")
    if pids and command_args:
        raise OptraceError("give either -p PID or -- CMD, not both")
    if command_args and not shutil.which(command_args[0]):
        raise OptraceError(f"command not found: {command_args[0]}")
    check_pids(pids)
    _check_outputs(fmt, output, command_args, command_stdout)
    run = _Run(specs, pids, command_args, duration, max_probes, command_stdout)
    for note in run.counter.resolve().notes:
        click.echo(f"optrace: {note}", err=True)
    for warning in run.counter.resolve().warnings:
        click.echo(f"optrace: warning: {warning}", err=True)
    try:
        with output_stream(output) as out:
            _count(run, out, fmt, per_pid, interval, cumulative, verbose)
    finally:
        run.counter.close()
    if run.child is not None and run.child.returncode:
        ctx.exit(shell_status(run.child.returncode))


def _check_outputs(fmt: str, output: str, command: list[str], command_stdout: str | None) -> None:
    """JSON and CMD's output never share stdout: the user says where one of them goes."""
    if fmt == "json" and output == "-" and command and command_stdout in (None, "stdout"):
        raise OptraceError("--format json on stdout would mix with the command's output: write the counts"
                           " with -o FILE, or send the command's with --command-stdout stderr (or null)")


def _count(run: _Run, out: TextIO, fmt: str, per_pid: bool, interval: float | None, cumulative: bool,
           verbose: bool = False) -> None:
    """Count until the end (-d, the command, the -p processes) or Ctrl-C / SIGTERM, then print the
    totals; with -i, each interval's calls (or the running totals) on the way."""
    with StopSignals() as stops:
        try:
            run.start()
            if verbose:
                say_program_loads()
            for warning in run.counter.warnings[len(run.counter.resolve().warnings):]:
                click.echo(f"optrace: warning: {warning}", err=True)
            functions = len(run.counter.probes)
            click.echo(f"Counting calls of {functions} function{'s' if functions != 1 else ''}. "
                       "Ctrl-C to stop.", err=True)
            next_print = time.monotonic() + interval if interval else None
            previous: CountReport | None = None
            while not run.finished() and not stops.wait(POLL_S):
                if next_print is not None and time.monotonic() >= next_print:
                    next_print += interval
                    report = run.report()
                    _print(out, report if cumulative else interval_report(report, previous), fmt, per_pid, True)
                    previous = report
        finally:
            run.stop_child()
    _print(out, run.report(), fmt, per_pid, interval_mark=interval is not None)
