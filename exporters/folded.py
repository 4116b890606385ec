"""`--format folded`: one ``comm;root;...;leaf count`` line per distinct stack, the input of flamegraph.pl
and speedscope (the layout of BCC's ``profile -f``; kernel frames end in ``_[k]``)."""
from __future__ import annotations

from collections import Counter
from typing import TextIO

from optrace.escape import escape_controls
from optrace.exporters.budget import Names, OutputBudget
from optrace.frontend.report.framenames import frame_label
from optrace.frontend.report.rows import (
    UNKNOWN_FRAME,
    Profile,
    ReportOptions,
    dso_selected,
    percent,
    sample_total,
    selected_samples,
)
from optrace.model import Frame, Record


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    """Counts are in the event's unit; for an event other than CPU samples a first ``#`` line says which
    (flamegraph.pl skips it as a line it cannot read; give it ``--countname=ns``)."""
    if profile.event != "cpu":
        stream.write(f"# optrace folded stacks: event {profile.event}, unit {profile.unit}\n")
    stream.write(_text(profile.record, options))


def _text(record: Record, options: ReportOptions) -> str:
    """--pid/--comm select stacks, --dso matches the leaf frame (as in the table), --percent-limit
    drops stacks below that share of all samples.

    Each frame's name and --dso match are computed once, and each stack's length is taken from the
    budget before the stack is joined: one long name in many stacks stops the report, not the machine."""
    names = [_frame_name(frame) for frame in record.frames]
    selected = [dso_selected(frame, options.dsos) for frame in record.frames]
    unknown = _frame_name(UNKNOWN_FRAME)
    comms = Names(_clean)
    budget = OutputBudget()
    stacks: Counter[str] = Counter()
    for sample in selected_samples(record, options):
        if not (selected[sample.frames[0]] if sample.frames else dso_selected(UNKNOWN_FRAME, options.dsos)):
            continue
        parts = [comms(sample.comm)] + ([names[i] for i in reversed(sample.frames)] or [unknown])
        budget.take(sum(len(part) + 1 for part in parts) + 21)  # the ';'s, a space and a count
        stacks[";".join(parts)] += sample.count
    total = sample_total(record)
    lines = [f"{stack} {count}" for stack, count in sorted(stacks.items())
             if percent(count, total) >= options.percent_limit]
    return "".join(line + "\n" for line in lines)


def _frame_name(frame: Frame) -> str:
    name = _clean(frame_label(frame))
    return f"{name}_[k]" if frame.kernel else name


def _clean(name: str) -> str:
    """';' separates frames and a newline ends the line: neither may appear inside a name (control
    characters are escaped, :mod:`optrace.escape`)."""
    return escape_controls(name).replace(";", ":")
