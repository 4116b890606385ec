"""`--format folded`: one ``comm;root;...;leaf count`` line per distinct stack, the input of flamegraph.pl
and speedscope (the layout of BCC's ``profile -f``; kernel frames end in ``_[k]``)."""
from __future__ import annotations

from collections import Counter

from optrace.frontend.model import Frame, Record, Sample
from optrace.frontend.report.escape import escape_controls
from optrace.frontend.report.rows import (
    ReportOptions,
    dso_selected,
    leaf_frame,
    percent,
    sample_total,
    selected_samples,
    stack_frames,
)


def render_folded(record: Record, options: ReportOptions) -> str:
    """--pid/--comm select stacks, --dso matches the leaf frame (as in the table), --percent-limit
    drops stacks below that share of all samples."""
    stacks: Counter[str] = Counter()
    for sample in selected_samples(record, options):
        if dso_selected(leaf_frame(record, sample), options.dsos):
            stacks[folded_stack(record, sample)] += sample.count
    total = sample_total(record)
    lines = [f"{stack} {count}" for stack, count in sorted(stacks.items())
             if percent(count, total) >= options.percent_limit]
    return "".join(line + "\n" for line in lines)


def folded_stack(record: Record, sample: Sample) -> str:
    names = [_frame_name(frame) for frame in reversed(stack_frames(record, sample))]
    return ";".join([_clean(sample.comm)] + names)


def _frame_name(frame: Frame) -> str:
    name = _clean(frame.symbol)
    return f"{name}_[k]" if frame.kernel else name


def _clean(name: str) -> str:
    """';' separates frames and a newline ends the line: neither may appear inside a name (control
    characters are escaped, :mod:`optrace.frontend.report.escape`)."""
    return escape_controls(name).replace(";", ":")
