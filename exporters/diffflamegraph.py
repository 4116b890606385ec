"""`optrace diff --format flamegraph`: a differential flame graph, as difffolded.pl + flamegraph.pl draw
one: frames sized by NEW, coloured by the change of their share since BASE (red grew, blue shrank,
white unchanged), with both shares in each tooltip. The page is report's (flamegraph.py)."""
from __future__ import annotations

from typing import TextIO

from optrace.exporters.flamegraph import encode, header_facts, page
from optrace.heap import gc_paused
from optrace.frontend.report.callgraph import build_tree, require_stacks
from optrace.frontend.report.diff import Comparison, base_counts
from optrace.frontend.report.rows import ReportOptions

NOTE = ("Width: samples in NEW. Colour: change of each frame's share of all samples, red grew, blue shrank."
        " Frames only in BASE are not drawn (swap the records to see them).")


def write(stream: TextIO, comparison: Comparison, options: ReportOptions) -> None:
    base, new = comparison.base.record, comparison.new.record
    for record in (base, new):
        require_stacks(record, "differential flame graph")
    order, by_comm = options.call_graph or "caller", "comm" in options.sort
    with gc_paused():
        new_tree = build_tree(new, options, order, by_comm)
        base_tree = build_tree(base, options, order, by_comm)
        data = encode(new_tree, base_counts(new_tree.root, base_tree.root), base_tree.total_samples)
    facts = [("Base", comparison.base.source), ("New", comparison.new.source)]
    facts += header_facts(new, comparison.new.source)[1:]  # NEW's header, after its name
    notes = " ".join((NOTE, *(f"Note: {note}." for note in comparison.notes)))
    title = f"optrace diff: {comparison.base.source} \u2192 {comparison.new.source}"
    stream.write(page(title, facts, data, notes))
