"""`optrace report`: read a record file and print it per symbol. Needs no root and never loads BCC."""
from __future__ import annotations

import io
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

import click

from optrace.errors import OptraceError
from optrace.escape import escape_controls
from optrace.exporters.formats import PROFILE
from optrace.frontend.cliopts import pid_option
from optrace.frontend.report.rows import Profile, ReportOptions, parse_sort_keys
from optrace.recordfile import printable, read_record


@click.command("report")
@click.option("-i", "--input", "source", default="optrace.data", show_default=True, help="Record file to read.")
@click.option("-s", "--sort", "sort", default="comm,dso,symbol", show_default=True,
              help="Comma-separated row keys: comm, pid, dso, symbol.")
@click.option("-f", "--format", "fmt", default="table", show_default=True,
              help=f"{', '.join(PROFILE.names[:-1])} or {PROFILE.names[-1]}.")
@pid_option("--pid", help="Only these processes (repeat, or comma list).")
@click.option("--comm", "comms", default="", help="Only these command names (comma-separated).")
@click.option("--dso", "dsos", default="", help="Only these objects, by basename or full path (comma-separated).")
@click.option("--percent-limit", default="0", help="Hide rows below this percentage of all samples.")
@click.option("--children", is_flag=True, help="Add inclusive (children) counts from the stacks.")
@click.option("-o", "--output", default="-", help="Write here instead of stdout.")
def command(source: str, sort: str, fmt: str, pids: tuple[int, ...], comms: str, dsos: str, percent_limit: str,
            children: bool, output: str) -> None:
    """Show a recorded profile per symbol, like perf report."""
    options = ReportOptions(
        sort=parse_sort_keys(sort),
        pids=frozenset(pids),
        comms=_split(comms),
        dsos=_split(dsos),
        percent_limit=_parse_percent(percent_limit),
        children=children,
    )
    write = PROFILE.writer(fmt)
    profile = Profile(read_record(source), escape_controls(source))
    with _output_stream(output) as stream:
        write(stream, profile, options)


def _split(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def _parse_percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 100.0:
        raise OptraceError(f"--percent-limit takes a number from 0 to 100, not {text!r}")
    return value


@contextmanager
def _output_stream(output: str) -> Iterator[TextIO]:
    """stdout, or a file written the way `record -o` writes (:mod:`optrace.outputfile`): a new file
    renamed over the name, so a symlink planted there is replaced, never followed; a report that fails
    (past its output budget) leaves the name as it was. Names a terminal cannot encode are written as
    backslash escapes, in both."""
    if output == "-":
        stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="backslashreplace", newline="")
        try:
            yield stdout
        finally:
            stdout.detach()  # flushed, and sys.stdout's buffer stays open
        return
    from optrace.outputfile import atomic_output

    try:
        with atomic_output(output, "w", encoding="utf-8", errors="backslashreplace") as out:
            yield out
    except OSError as exc:
        raise OptraceError(f"cannot write {printable(output)}: {exc.strerror or exc}") from None
