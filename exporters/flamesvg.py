"""`report --format svg`: a flame graph (icicle: callers on top) in one SVG file that zooms and searches by
itself in a browser, as flamegraph.pl's does: an embedded script (flamesvg.js); without it (an ``<img>``,
an image viewer) it is the same graph, static.

One ``<g>`` per frame holding a ``<title>`` (the tooltip: name, object, count, percent), a ``<rect>``
whose width is the frame's count times :data:`WIDTH` over the count drawn, and its name cut to fit; the
``<g>`` carries the frame's count (``data-samples``) and for the script the length of its name, which
starts its title (``data-name-length``, in UTF-16 code units as JavaScript counts them: a long name is
in the file once).
Frames narrower than :data:`MIN_WIDTH` pixels are left out with their callees, as flamegraph.pl's
``--minwidth`` does: a 100,000-stack record would otherwise be a file of invisible slivers. Counts are
samples, or times for off-cpu and wall.

Every name is escaped twice over: control characters as text escapes (XML 1.0 has no way to carry
most of them), then ``& < > "`` as entities; the script puts names into the document as text only.
"""
from __future__ import annotations

from html import escape
from importlib.resources import files
from typing import TextIO

from optrace.exporters.budget import Names, OutputBudget
from optrace.exporters.flamegraph import header_facts
from optrace.heap import gc_paused
from optrace.frontend.report.callgraph import Node, build_tree, require_stacks, walk
from optrace.frontend.report.events import amount
from optrace.frontend.report.rows import Profile, ReportOptions, percent

WIDTH = 1200.0
ROW = 16
FACT_LINES = 4  # of the record's header, above the controls' line
TOP = 14 * (FACT_LINES + 1) + 16  # the header lines and the controls above the graph
MIN_WIDTH = 0.1
CHAR_WIDTH = 7.0  # of the 12px monospace font, roughly (flamesvg.js's CHAR)
COLOURS = {"user": "#f2a65a", "kernel": "#7fa7d9", "jit": "#8fd17f", "runtime": "#6fd6c6",
           "unknown": "#c8c8c8", "comm": "#b9add6",
           "root": "#d6d0e6"}
STYLE = "g[data-samples] { cursor: pointer; } .button { cursor: pointer; fill: #1a5fb4; }"


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    record = profile.record
    require_stacks(record, "flame graph")
    with gc_paused():
        tree = build_tree(record, options, options.call_graph or "caller", by_comm="comm" in options.sort)
        text = _svg(tree.root, tree.total_samples, header_facts(record, profile.source, profile.event), profile.event)
    stream.write(text)


def _svg(root: Node, total: int, facts: list[tuple[str, str]], event: str = "cpu") -> str:
    budget, names = OutputBudget(), Names()
    scale = WIDTH / root.total if root.total else 0.0
    body: list[str] = []
    x_of: dict[int, float] = {id(root): 0.0}  # a node's left edge, set when its parent is placed
    max_depth = 0
    for depth, node in walk(root):
        x = start = x_of.pop(id(node))
        for child in node.sorted_children():
            x_of[id(child)] = start
            start += child.total * scale
        width = node.total * scale
        if width < MIN_WIDTH:
            continue
        max_depth = max(max_depth, depth)
        line = _frame(node, x, depth, width, total, names, event)
        budget.take(len(line))
        body.append(line)
    height = TOP + (max_depth + 1) * ROW + 8
    head = [f'<text x="4" y="{16 + 14 * i}">{escape(label)}: {escape(value)}</text>'
            for i, (label, value) in enumerate(facts[:FACT_LINES])]
    controls = 16 + 14 * FACT_LINES
    script = files("optrace.exporters").joinpath("flamesvg.js").read_text(encoding="utf-8")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:g}" height="{height}"'
            f' viewBox="0 0 {WIDTH:g} {height}" font-family="monospace" font-size="12">\n'
            f'<style>{STYLE}</style>\n'
            f'<rect width="100%" height="100%" fill="#fafafa"/>\n' + "\n".join(head) + "\n"
            f'<text id="unzoom" class="button" x="4" y="{controls}" opacity="0.3">Reset Zoom</text>\n'
            f'<text id="searchbutton" class="button" x="100" y="{controls}">Search</text>\n'
            f'<text id="matched" x="{WIDTH - 4:g}" y="{controls}" text-anchor="end" fill="#8a1aa0"></text>\n'
            + "\n".join(body) + f"\n<script><![CDATA[\n{script}]]></script>\n</svg>\n")


def _frame(node: Node, x: float, depth: int, width: float, total: int, names: Names, event: str = "cpu") -> str:
    name = names(node.symbol) if node.kind != "root" else f"all ({amount(node.total, event)})"
    where = f" in {names(node.dso)}" if node.dso else ""
    title = f"{name}{where}: {amount(node.total, event)}, {percent(node.total, total):.2f}%"
    y = TOP + depth * ROW
    fit = int((width - 6) / CHAR_WIDTH)
    text = ""
    if fit >= 3:
        shown = name if len(name) <= fit else name[:fit - 2] + ".."
        text = f'<text x="{x + 3:.2f}" y="{y + 12}">{escape(shown)}</text>'
    return (f'<g class="{node.kind}" data-samples="{node.total}" data-name-length="{_utf16_length(name)}">'
            f'<title>{escape(title)}</title>'
            f'<rect x="{x:.4f}" y="{y}" width="{width:.4f}" height="{ROW - 1}" fill="{COLOURS[node.kind]}"'
            f' stroke="#fafafa" stroke-width="0.5"/>{text}</g>')


def _utf16_length(text: str) -> int:
    """The length of ``text`` as JavaScript's strings count it (a character past U+FFFF counts two)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2
