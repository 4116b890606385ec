"""The text report, laid out like `perf report --stdio -n`: a `#` header, then one line per row."""
from __future__ import annotations

import os
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TextIO

from optrace.escape import escape_controls
from optrace.exporters.budget import MAX_ALIGN, Names, OutputBudget
from optrace.frontend.report.gilwaits import gil_samples
from optrace.frontend.report.wakers import SEPARATOR, joined_total
from optrace.frontend.report.events import amount, human_time, nothing_line
from optrace.frontend.report.pythonview import PYTHON_INTERNALS
from optrace.frontend.report.rows import (Profile, ReportOptions, Row, RowKey, RowTable, build_table, percent,
                                          sample_total)
from optrace.model import NAMED, STACK_COMPLETE, CallCount, Record, RecordMeta, RuntimeCounts

Cells = Callable[[], Iterable[list[str]]]  # called twice: once for the widths, once for the lines


@dataclass(frozen=True)
class Column:
    title: str
    right: bool = False  # numbers are right-aligned, names left-aligned


KEY_COLUMNS = {
    "comm": Column("Command"),
    "pid": Column("Pid", right=True),
    "tid": Column("Tid", right=True),
    "dso": Column("Shared Object"),
    "symbol": Column("Symbol"),
}


def shown_dso(dso: str) -> str:
    """perf shows the object's basename; bracketed names like [kernel.kallsyms] stay as they are."""
    return os.path.basename(dso) if "/" in dso else dso


@dataclass
class Shown:
    """One table's escaped names (each computed once) and its output budget."""

    names: Names = field(default_factory=Names)
    dsos: Names = field(default_factory=lambda: Names(shown_dso))
    budget: OutputBudget = field(default_factory=OutputBudget)


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    stream.write(_text(profile, options))


def _text(profile: Profile, options: ReportOptions) -> str:
    record, shown = profile.record, Shown()
    lines = header_lines(record, profile.source, profile.event) + event_lines(profile) + ["#"]
    table = build_table(record, options)
    timed = profile.unit == "nanoseconds"
    lines += profile_lines(table.rows, options, shown, timed) + selection_lines(table, record, options, profile.event)
    if record.calls:
        lines += ["", "# Uprobe call counts", "#"] + calls_lines(record.calls, shown)
    return "\n".join(lines) + "\n"


def header_lines(record: Record, source: str, event: str = "cpu") -> list[str]:
    """The ``#`` lines above the profile; every name in them is escaped (:mod:`.escape`). For an event
    other than the CPU samples (``record.samples`` then hold its time), :func:`event_lines` says more."""
    return [escape_controls(line) for line in _header_text(record, source, event)]


def _header_text(record: Record, source: str, event: str) -> list[str]:
    meta = record.meta
    counted = (f"Samples: {sample_total(record)} of event '{meta.event}', {meta.frequency_hz} Hz" if event == "cpu"
               else f"Time: {human_time(sample_total(record))} of event '{event}'")
    lines = [
        f"# optrace report of {source}",
        "#",
        f"# {counted}, {meta.duration_s:.2f} s",
        f"# Target: {target_text(meta)}",
        f"# Recorded: {_when(meta.started)} on {meta.hostname} (kernel {meta.kernel}),"
        f" optrace {meta.optrace_version}",
        f"# {lost_text(meta.lost)}",
    ]
    if meta.idle_samples:
        lines.append(f"# Idle samples (pid 0, not in the profile): {meta.idle_samples}")
    if meta.carried_samples:
        lines.append(f"# Taken at their process's next tick for threads that ended between two ticks: "
                     f"{meta.carried_samples} ({percent(meta.carried_samples, meta.total_samples):.1f}%)")
    if meta.launcher_samples:
        lines.append(f"# optrace's launcher before exec (optrace-exec, not in the profile): {meta.launcher_samples}")
    if not meta.stacks:
        lines.append("# Recorded without stacks (--no-stacks): leaf frames only")
    elif meta.stack_quality:
        lines.append(f"# {quality_line(meta.stack_quality)} (call graph: {meta.call_graph})")
    lines += [f"# {runtime_line(counts)}" for _, counts in sorted(meta.runtimes.items()) if counts.samples]
    if meta.file_problems:
        counted = ", ".join(f"{kind} {n}" for kind, n in sorted(meta.file_problems.items()))
        lines.append(f"# Files that cost their own names: {counted} (the warnings say which)")
    return lines + [f"# Warning: {warning}" for warning in meta.warnings]


def event_lines(profile: Profile) -> list[str]:
    """What the rows count: when it is time (off-cpu, wall), the total, how it was measured, its parts; and the
    samples the Python view changed."""
    return _time_lines(profile) + python_view_lines(profile)


def python_view_lines(profile: Profile) -> list[str]:
    """What folding the interpreter's frames into Python functions (frontend/report/pythonview.py) changed."""
    if not profile.python_folded:
        return []
    share = percent(profile.python_folded, sample_total(profile.record))
    return [f"# Python view: the interpreter's own frames below a Python function count as its time in "
            f"{amount(profile.python_folded, profile.event)} ({share:.2f}%); {PYTHON_INTERNALS} shows them"]


def _time_lines(profile: Profile) -> list[str]:
    off_cpu = profile.record.meta.off_cpu
    if profile.event == "cpu" or off_cpu is None:
        return []
    states = ", ".join(off_cpu.states) or "all"
    lines = [f"# Off CPU measured on the {off_cpu.source}: waits of {off_cpu.min_block_us} us or more,"
             f" states: {states}; percentages are of all the event's time"]
    if off_cpu.every > 1:
        lines.append(f"# One wait in {off_cpu.every} recorded (at random), counted {off_cpu.every} times: times are estimates")
    if off_cpu.stack_quality:
        lines.append(f"# {quality_line(off_cpu.stack_quality, 'Off-CPU stacks', human_time)}")
    if profile.parts:
        total = sum(profile.parts.values())
        lines.append("# " + ", ".join(f"{part} {human_time(ns)} ({percent(ns, total):.2f}%)"
                                      for part, ns in profile.parts.items()))
    if SEPARATOR in profile.record.frames:
        slept = joined_total(profile.record)
        lines.append(f"# Wakers: the waits that slept ({human_time(slept)} of {human_time(off_cpu.total_ns)} off CPU; the"
                     " others waited for a CPU), each joined to the stack of the thread that woke it: the blocked"
                     " stack, --, the waker's from the wake-up to its root, then its command")
    gil = sum(s.count for s in gil_samples(profile.record))
    if gil:
        total = sum(s.count for s in profile.record.samples)
        lines.append(f"# Waiting for Python's GIL (in take_gil): {human_time(gil)} ({percent(gil, total):.2f}%);"
                     " report --gil shows which Python code waited")
    return [escape_controls(line) for line in lines]


def target_text(meta: RecordMeta) -> str:
    if meta.command:
        status = "still running" if meta.exit_status is None else f"exit status {meta.exit_status}"
        command = f"command {shlex.join(meta.command)} ({status})"
        return f"whole machine, while running {command}" if meta.system_wide else command
    if meta.system_wide:
        return "whole machine"
    return "pids " + ", ".join(str(pid) for pid in meta.pids) if meta.pids else "unknown"


def runtime_line(counts: RuntimeCounts) -> str:
    """``Python: N of M samples with Python frames (P%); native only n, refused: ... n; CPython 3.11.2 (1
    process)`` (one of RecordMeta.runtimes)."""
    outcomes, language = counts.samples, counts.language or "runtime"
    total = sum(n for outcome, n in outcomes.items() if not outcome.startswith("cut: "))
    named = outcomes.get(NAMED, 0)
    share = 100.0 * named / total if total else 0.0
    text = f"{language}: {named} of {total} samples with {language} frames ({share:.1f}%)"
    others = sorted(((n, outcome) for outcome, n in outcomes.items() if outcome != NAMED and n), reverse=True)
    if others:
        text += "; " + ", ".join(f"{outcome} {n}" for n, outcome in others)
    versions = Counter()
    for process, n in counts.processes.items():
        versions[process.split(" ", 1)[0] if not process.startswith("refused") else "refused"] += n
    product = counts.product + " " if counts.product else ""
    return text + "; " + ", ".join(f"{product + v if v != 'refused' else v} ({n} process{'es' if n > 1 else ''})"
                                   for v, n in sorted(versions.items()))


def quality_line(quality: dict[str, int], label: str = "Stacks", shown: Callable[[int], str] = str) -> str:
    """``Stacks: N of M complete (P%); stopped: reason n, ...`` (RecordMeta.stack_quality; off-CPU time's
    with ``shown`` a time's words)."""
    total = sum(quality.values())
    complete = quality.get(STACK_COMPLETE, 0)
    text = f"{label}: {shown(complete)} of {shown(total)} complete ({100.0 * complete / total if total else 0.0:.1f}%)"
    stopped = sorted(((n, reason) for reason, n in quality.items() if reason != STACK_COMPLETE and n), reverse=True)
    if stopped:
        text += "; stopped: " + ", ".join(f"{reason} {shown(n)}" for n, reason in stopped)
    return text


def lost_text(lost: dict[str, int]) -> str:
    """Samples lost outright (a full counts map) apart from samples kept without their stack
    (a stack-map collision or a failed unwind: they count, under [unknown] or their kernel frames)."""
    stacks = {reason: n for reason, n in lost.items() if "stack" in reason and n}
    samples = {reason: n for reason, n in lost.items() if reason not in stacks and n}
    text = f"Total Lost Samples: {_counted(samples)}"
    if stacks:
        text += f"; samples without their stack: {_counted(stacks)}"
    return text


def _counted(reasons: dict[str, int]) -> str:
    total = sum(reasons.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items())) + ")"


def profile_lines(rows: list[Row], options: ReportOptions, shown: Shown, timed: bool = False) -> list[str]:
    """``timed``: the rows count nanoseconds, shown as a Time column in ms, s..."""
    columns = _profile_columns(options, timed)
    keys = [KEY_CELLS[key] for key in options.sort]
    return format_columns(columns, lambda: (_profile_cells(row, options, shown, timed, keys) for row in rows),
                          shown.budget)


def selection_lines(table: RowTable, record: Record, options: ReportOptions, event: str = "cpu") -> list[str]:
    """What the filters matched and what --percent-limit hid, under the rows, in the event's words (a
    time for off-cpu and wall): a limit that hides every row must not read as "no samples match", and an
    event that holds nothing says where the record's time is."""
    filters = filter_text(options)
    lines = []
    if not table.matched:
        return [f"# {nothing_line(record, event, filters)}"]
    total = sample_total(record)
    if filters:
        lines.append(f"# Matched {filters}: {amount(table.matched, event)} ({percent(table.matched, total):.2f}% of all)")
    if table.hidden_rows:
        rows = f"{table.hidden_rows} row{'s' if table.hidden_rows != 1 else ''}"
        lines.append(f"# Hidden by --percent-limit {options.percent_limit:g}: {rows} with {amount(table.hidden, event)} "
                     f"({percent(table.hidden, total):.2f}% of all)")
    return ["#", *lines] if lines else []


def filter_text(options: ReportOptions) -> str:
    """The stack and row filters given, as typed (``--pid 100 --comm demo``), escaped; "" when none."""
    return escape_controls(" ".join(f"--{name} {','.join(str(v) for v in sorted(values))}" for name, values in
                                    (("pid", options.pids), ("tid", options.tids), ("comm", options.comms),
                                     ("dso", options.dsos)) if values))


def calls_lines(calls: list[CallCount], shown: Shown) -> list[str]:
    columns = [Column("Calls", right=True), Column("Probe"), Column("Binary"), Column("Symbol")]
    ordered = sorted(calls, key=lambda call: (-call.calls, call.probe, call.symbol))
    names = shown.names
    return format_columns(columns, lambda: (
        [str(c.calls), names(c.probe), names(c.binary), names(c.symbol)] for c in ordered), shown.budget)


HELD_ROWS = 100_000  # rows whose cells format_columns keeps between its two passes


def format_columns(columns: list[Column], cells: Cells, budget: OutputBudget) -> list[str]:
    """perf's layout: `# Title` line, a line of dots under each title, `#`, then the aligned rows.

    The first pass measures the cells against the budget, so the text is never built past it; the cells
    of up to :data:`HELD_ROWS` rows are kept from it, those of a longer table (a hostile record can have a
    million rows) are made again. Columns are padded to at most :data:`MAX_ALIGN` characters and the last
    one not at all."""
    widths = [len(col.title) for col in columns]
    rows = 0
    held: list[list[str]] | None = []
    for row in cells():
        lengths = list(map(len, row))
        budget.take(sum(lengths) + 2 * len(lengths) + 1)
        widths = list(map(max, widths, lengths))
        rows += 1
        if held is not None:
            held.append(row)
            if rows > HELD_ROWS:
                held = None
    widths = [min(width, MAX_ALIGN) for width in widths]
    budget.take(rows * sum(widths[:-1]))  # the padding, at most
    head = [_align(col.title, width, col.right) for col, width in zip(columns, widths)]
    dots = ["." * width for width in widths]
    justify = [None if i == len(columns) - 1 and not col.right else str.rjust if col.right else str.ljust
               for i, col in enumerate(columns)]  # the last column is not padded, unless right-aligned
    return ["# " + "  ".join(head).rstrip(), "# " + "  ".join(dots), "#"] + [
        _line(row, justify, widths) for row in (cells() if held is None else held)]


def _line(cells: list[str], justify: list[Callable[[str, int], str] | None], widths: list[int]) -> str:
    aligned = [cell if pad is None else pad(cell, width) for cell, pad, width in zip(cells, justify, widths)]
    return ("  " + "  ".join(aligned)).rstrip()


def _profile_columns(options: ReportOptions, timed: bool) -> list[Column]:
    counts = [Column("Children", True), Column("Self", True)] if options.children else [Column("Overhead", True)]
    time = "Total Time" if options.children else "Time"  # with --children: the inclusive time
    return counts + [Column(time if timed else "Samples", True)] + [KEY_COLUMNS[key] for key in options.sort]


def _profile_cells(row: Row, options: ReportOptions, shown: Shown, timed: bool, keys: list[KeyCell]) -> list[str]:
    counts = [f"{row.percent:.2f}%"]
    if options.children:
        counts.insert(0, f"{row.children_percent:.2f}%")
    value = row.children if timed and options.children else row.samples
    shown_value = human_time(value or 0) if timed else str(row.samples)
    return counts + [shown_value] + [cell(row.key, shown) for cell in keys]


def _key_cell(row: Row, key: str, shown: Shown) -> str:
    return KEY_CELLS[key](row.key, shown)


KeyCell = Callable[[RowKey, Shown], str]
KEY_CELLS: dict[str, KeyCell] = {  # a sort key's cell in a row
    "comm": lambda key, shown: shown.names(key.comm or ""),
    "pid": lambda key, shown: str(key.pid),
    "tid": lambda key, shown: str(key.tid) if key.tid else "-",
    "dso": lambda key, shown: shown.dsos(key.dso or ""),
    "symbol": lambda key, shown: f"{'[k]' if key.kernel else '[.]'} {shown.names(key.symbol or '')}",
}


def _align(text: str, width: int, right: bool) -> str:
    return text.rjust(width) if right else text.ljust(width)


def _when(started: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    except (OverflowError, OSError, ValueError):  # a hand-edited or zero start time
        return "unknown time"
