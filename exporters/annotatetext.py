"""`optrace annotate`'s text, laid out like `perf annotate --stdio`: ``  percent :   address:   instruction``
lines under a header; on a terminal the hottest lines are coloured (rich), perf's way (red over 5 %,
green over 0.5 %). Names come from the record, possibly another user's: escaped before they are printed."""
from __future__ import annotations

import os
from typing import TextIO

from rich.console import Console
from rich.text import Text

from optrace.escape import escape_controls
from optrace.frontend.report.annotation import AnnotateOptions, AnnotateView, Annotation, Listed, heat
from optrace.frontend.report.sourceannotation import SourceAnnotation

STYLES = {"hot": "bold red", "warm": "green", "": ""}
MAX_NAME = 300  # characters of a symbol or path shown in a header
SUMMARY_LINES = 20


def write(stream: TextIO, view: AnnotateView, options: AnnotateOptions) -> None:
    if view.python is not None:
        lines = source_lines(view.python)
    else:
        lines = listing_lines(view.listing or []) if view.annotation is None else annotation_lines(view.annotation)
    if not options.color:
        stream.write("".join(text + "\n" for text, _ in lines))
        return
    console = Console(file=stream, force_terminal=True, highlight=False, soft_wrap=True)
    for text, kind in lines:
        console.print(Text(text, style=STYLES[kind]))


def _name(text: str) -> str:
    shown = escape_controls(text)
    return shown if len(shown) <= MAX_NAME else shown[:MAX_NAME] + "..."


def _shown_dso(dso: str) -> str:
    return os.path.basename(dso) if "/" in dso and not dso.startswith("[") else dso


def annotation_lines(annotation: Annotation) -> list[tuple[str, str]]:
    where = _shown_dso(annotation.dso)
    syntax = "Intel" if annotation.syntax == "intel" else "AT&T"
    lines = summary_lines(annotation)
    lines += [(f" Percent |  Disassembly of {_name(where)} ({annotation.samples} samples, {syntax} syntax)", ""),
             ("-" * 72, ""),
             (f"         :   {annotation.start:016x} <{_name(annotation.symbol)}>:", "")]
    for ins in annotation.instructions:
        if ins.source is not None:
            lines.append((f"         :   {_name(ins.source)}", ""))
        shown = f"{ins.percent:8.2f}" if ins.samples else " " * 8
        lines.append((f"{shown} :   {ins.address:8x}:   {escape_controls(ins.text)}", heat(ins.percent)))
    if annotation.truncated:
        lines.append(("         :   ... (the function is longer: record kept its first bytes only)", ""))
    return lines


def source_lines(annotation: SourceAnnotation) -> list[tuple[str, str]]:
    """A Python function's lines: ``  total     self :   line  source``, shares of the samples whose stacks hold
    the function."""
    lines = [(f"   Total     Self |  Source of {_name(annotation.symbol)} in {_name(annotation.file)} "
              f"({annotation.samples} samples in its stacks, {annotation.self_samples} in its own lines)", ""),
             ("                  |  Total: a line and the Python and C code it called; Self: the line and the C "
              "code it called", ""),
             ("-" * 72, "")]
    for row in annotation.lines:
        total = f"{row.percent:8.2f}" if row.samples else " " * 8
        own = f"{row.self_percent:8.2f}" if row.self_samples else " " * 8
        lines.append((f"{total} {own} :   {row.line:6d}  {escape_controls(row.text)}", heat(row.percent)))
    if annotation.truncated:
        lines.append(("                  :   ... (the function is longer: record kept its first lines only)", ""))
    return lines


def summary_lines(annotation: Annotation) -> list[tuple[str, str]]:
    """With -l: the source lines by share, like perf annotate --print-line's sorted summary."""
    if annotation.lines is None:
        return []
    if not annotation.lines:
        return [("Sorted summary: no source lines in the record (the object had no .debug_line)", ""), ("", "")]
    shown = [line for line in annotation.lines if line.samples][:SUMMARY_LINES]
    return ([("Sorted summary of source lines (% of the function's samples)", ""), ("-" * 60, "")]
            + [(f"{line.percent:8.2f}   {_name(line.source)}", heat(line.percent)) for line in shown] + [("", "")])


def listing_lines(listing: list[Listed]) -> list[tuple[str, str]]:
    dsos = [_name(_shown_dso(row.dso)) for row in listing]
    width = min(max([len("Shared Object"), *map(len, dsos)]), MAX_NAME)
    lines = [("# Annotatable functions (optrace annotate SYMBOL): own samples, % of all samples", ""),
             (f"# {'Samples':>9}  {'Overhead':>8}  {'Shared Object':<{width}}  Symbol", "")]
    for row, dso in zip(listing, dsos):
        lines.append((f"  {row.samples:>9}  {row.percent:>7.2f}%  {dso:<{width}}  {_name(row.symbol)}", ""))
    if not listing:
        lines.append(("# (none: the record kept no function's code)", ""))
    return lines
