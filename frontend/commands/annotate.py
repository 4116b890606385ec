"""`optrace annotate`: a recorded function's instructions with their share of its samples, from the record
alone (no root, no binary). Without a SYMBOL, lists the functions the record kept code for."""
from __future__ import annotations

import sys

import click

from optrace.errors import OptraceError
from optrace.escape import escape_controls
from optrace.exporters.formats import ANNOTATE
from optrace.frontend.cliopts import comma_list, pid_option
from optrace.frontend.report.annotation import (SYNTAXES, AnnotateOptions, AnnotateView, annotate, find,
                                                functions_of, listing, seen_in, selected, selected_sources)
from optrace.frontend.report.sourceannotation import annotate_source, matching_sources, sources_of
from optrace.outputfile import output_stream
from optrace.recordfile import read_record

MAX_WARNINGS = 20  # skipped functions named (a hostile record may hold thousands)


@click.command("annotate")
@click.argument("symbol", required=False)
@click.option("-i", "--input", "source", default="optrace.data", show_default=True, help="Record file to read.")
@click.option("--dso", "dsos", default="", help="Only functions of these objects (basename or path, comma-separated).")
@pid_option("--pid", help="Only samples of these processes (repeat, or comma list).")
@click.option("-M", "--disassembler-style", "syntax", default="att", show_default=True,
              help="Assembly syntax: att or intel.")
@click.option("-l", "--print-line", "source_lines", is_flag=True,
              help="Interleave source lines (from .debug_line, kept by record) and sum the samples per line.")
@click.option("--stdio", is_flag=True, help="Plain text, no colours (the default when not on a terminal).")
@click.option("-f", "--format", "fmt", default="stdio", show_default=True, help=" or ".join(ANNOTATE.names) + ".")
@click.option("-o", "--output", default="-", help="Write here instead of stdout.")
def command(symbol: str | None, source: str, dsos: str, pids: tuple[int, ...], syntax: str, source_lines: bool,
            stdio: bool, fmt: str,
            output: str) -> None:
    """Show where in a recorded function its samples fell, instruction by instruction (like perf annotate);
    for a Python function, line by line."""
    if syntax not in SYNTAXES:
        raise OptraceError(f"-M takes {' or '.join(SYNTAXES)}, not {escape_controls(syntax)!r}")
    write = ANNOTATE.writer(fmt)
    color = symbol is not None and not stdio and output == "-" and sys.stdout.isatty()
    options = AnnotateOptions(symbol, comma_list(dsos), frozenset(pids), syntax, source_lines, color)
    record = read_record(source)
    skipped: dict[str, str] = {}
    functions = selected(functions_of(record, skipped), options)
    sources = selected_sources(sources_of(record, skipped), options)
    shown = escape_controls(source)
    python = matching_sources(sources, symbol, record) if symbol is not None else []
    if symbol is None:
        for name, problem in list(skipped.items())[:MAX_WARNINGS]:
            click.echo(f"optrace: warning: {escape_controls(name)[:120]} skipped: {problem}", err=True)
        view = AnnotateView(shown, listing=listing(record, functions, sources))
    elif python and not any(f.symbol == symbol for f in functions):
        view = AnnotateView(shown, python=annotate_source(python, record))
    else:
        seen = {pid: n for pid, n in seen_in(record, symbol).items() if not options.pids or pid in options.pids}
        found = find(functions, symbol, skipped, (s.symbol for s in sources if not seen or s.pid in seen), seen)
        view = AnnotateView(shown, annotation=annotate(found, syntax, source_lines))
    with output_stream(output) as stream:
        write(stream, view, options)

