"""`report --format flamegraph`: one self-contained HTML file with an interactive icicle graph.

No network: the script (flamegraph.js) and style (flamegraph.css) are inlined. The tree travels as one
compact JSON document (a frame table and a flat preorder array of ``frame, total, children`` triples:
about 12 bytes a node) inside ``<script type="application/json">``, drawn on a canvas, so 100,000
distinct stacks stay a few MB and draw in well under a second (bench/bench_flamegraph.py).

Every name comes from a record another user may have written: in the JSON ``<``, ``>`` and ``&`` are
``\\u`` escapes (no ``</script>`` can end the block), the header is HTML-escaped, and the page's script
puts names into the page only as text (``textContent``, canvas ``fillText``), never as markup.
"""
from __future__ import annotations

import html
import json
from importlib.resources import files
from typing import Any, TextIO

from optrace.escape import escape_controls
from optrace.exporters.budget import OutputBudget
from optrace.exporters.table import _when, lost_text, target_text
from optrace.frontend.report.callgraph import CallTree, build_tree, require_stacks, walk
from optrace.frontend.report.rows import Profile, ReportOptions, sample_total
from optrace.model import Record

KINDS = ("root", "comm", "user", "kernel", "jit", "unknown")
NODE_OVERHEAD = 24  # a node's three numbers and commas, at most


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    record = profile.record
    require_stacks(record, "flame graph")
    tree = build_tree(record, options, options.call_graph or "caller", by_comm="comm" in options.sort)
    title = f"optrace flame graph: {profile.source}"
    stream.write(page(title, header_facts(record, profile.source), encode(tree)))


def header_facts(record: Record, source: str) -> list[tuple[str, str]]:
    """The record's header as (label, value) pairs, shown above the graph (plain text, escaped later)."""
    meta = record.meta
    facts = [
        ("Profile", source),
        ("Target", target_text(meta)),
        ("Samples", f"{sample_total(record)} of {meta.event} at {meta.frequency_hz} Hz"),
        ("Duration", f"{meta.duration_s:.2f} s"),
        ("Lost", lost_text(meta.lost).removeprefix("Total Lost Samples: ")),
        ("Recorded", f"{_when(meta.started)} on {meta.hostname} (kernel {meta.kernel})"),
    ]
    quality = stack_quality(meta)
    if quality:
        facts.append(("Stacks", quality))
    return [(label, escape_controls(value)) for label, value in facts]


def stack_quality(meta: Any) -> str:
    """How complete the stacks are, from whichever counts the record has (``stack_quality`` when the
    recorder writes it, else how user stacks were taken)."""
    counts = getattr(meta, "stack_quality", None) or {}
    if isinstance(counts, dict) and counts:
        return ", ".join(f"{kind} {value}" for kind, value in sorted(counts.items()))
    if meta.user_stacks:
        return "user stacks: " + ", ".join(f"{kind} {n}" for kind, n in sorted(meta.user_stacks.items()))
    return ""


def encode(tree: CallTree, base: dict[int, int] | None = None, base_total: int = 0) -> dict[str, Any]:
    """The tree as the page reads it: ``frames`` [[symbol, dso index, kind index]], ``dsos``, and
    ``nodes`` = frame, total, number of children, for each node in preorder. With ``base`` (node id ->
    samples in the base profile), a differential graph: ``base`` holds those counts in the same order."""
    budget = OutputBudget()
    frame_ids: dict[tuple[str, str, str], int] = {}
    dso_ids: dict[str, int] = {}
    frames: list[list[Any]] = []
    nodes: list[int] = []
    base_counts: list[int] = []
    for _, node in walk(tree.root):
        key = (node.symbol, node.dso, node.kind)
        frame = frame_ids.get(key)
        if frame is None:
            frame = frame_ids[key] = len(frames)
            dso = dso_ids.setdefault(node.dso, len(dso_ids))
            frames.append([escape_controls(node.symbol), dso, KINDS.index(node.kind)])
            budget.take(len(node.symbol) + len(node.dso) + NODE_OVERHEAD)
        budget.take(NODE_OVERHEAD)
        nodes += (frame, node.total, len(node.children))
        if base is not None:
            base_counts.append(base.get(id(node), 0))
    data: dict[str, Any] = {
        "kinds": KINDS, "dsos": [escape_controls(dso) for dso in dso_ids], "frames": frames, "nodes": nodes,
        "total": tree.total_samples, "order": tree.order,
    }
    if base is not None:
        data["base"] = base_counts
        data["baseTotal"] = base_total
    return data


def page(title: str, facts: list[tuple[str, str]], data: dict[str, Any], note: str = "") -> str:
    """The whole HTML document."""
    assets = files("optrace.exporters")
    script = assets.joinpath("flamegraph.js").read_text(encoding="utf-8")
    style = assets.joinpath("flamegraph.css").read_text(encoding="utf-8")
    header = "".join(f"<div><dt>{html.escape(label)}</dt><dd>{html.escape(value)}</dd></div>"
                     for label, value in facts)
    note_html = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>{html.escape(title)}</title>
<style>{style}</style></head>
<body>
<header><h1>{html.escape(title)}</h1><dl id="facts">{header}</dl>{note_html}
<div id="controls"><button id="reset" type="button">Reset zoom</button>
<input id="search" type="search" placeholder="Search (substring or /regex/)" aria-label="Search">
<span id="match"></span><span id="legend"></span></div></header>
<main><div id="graph"><canvas id="canvas"></canvas><div id="tip" hidden></div></div>
<h2>Hottest functions</h2><table id="top"><thead></thead><tbody></tbody></table></main>
<script type="application/json" id="data">{script_json(data)}</script>
<script>{script}</script>
</body></html>
"""


def script_json(data: dict[str, Any]) -> str:
    """JSON that cannot end its ``<script>`` element nor open a comment, whatever the names hold."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
