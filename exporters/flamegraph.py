"""`report --format flamegraph`: one self-contained HTML file with an interactive icicle graph.

No network: the script (flamegraph.js) and style (flamegraph.css) are inlined. The tree travels as a
JSON table of frames and gzipped arrays with one entry per node (:class:`Encoded`, base64 in the page,
unpacked synchronously by fflate, vendored as exporters/fflate.js from npm's fflate 0.8.3: the browser's
own DecompressionStream is asynchronous, and a page still unpacking when it reports "loaded" is blank
to headless screenshots), drawn on a canvas: 100,000 distinct stacks (a
million nodes) make a page of about 2.5 MB that is drawn in about a second (bench/bench_flamegraph.py).

Every name comes from a record another user may have written: in the JSON ``<``, ``>`` and ``&`` are
``\\u`` escapes (no ``</script>`` can end the block), the header is HTML-escaped, and the page's script
puts names into the page only as text (``textContent``, canvas ``fillText``), never as markup.
"""
from __future__ import annotations

import base64
import gzip
import html
import json
import sys
from array import array
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, TextIO

from optrace.escape import escape_controls
from optrace.exporters.budget import OutputBudget
from optrace.exporters.table import _when, lost_text, target_text
from optrace.heap import gc_paused
from optrace.frontend.report.callgraph import CallTree, build_tree, require_stacks, walk
from optrace.frontend.report.events import human_time
from optrace.frontend.report.rows import Profile, ReportOptions, sample_total
from optrace.model import Record

KINDS = ("root", "comm", "user", "kernel", "jit", "unknown", "runtime")
NODE_OVERHEAD = 24  # a node's three numbers and commas, at most


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    record = profile.record
    require_stacks(record, "flame graph")
    with gc_paused():
        tree = build_tree(record, options, options.call_graph or "caller", by_comm="comm" in options.sort)
        data = encode(tree)
        data.meta["unit"] = profile.unit  # the page's label of the counts (samples, nanoseconds)
    stream.write(page(f"optrace flame graph: {profile.source}", header_facts(record, profile.source, profile.event),
                      data))


def header_facts(record: Record, source: str, event: str = "cpu") -> list[tuple[str, str]]:
    """The record's header as (label, value) pairs, shown above the graph (plain text, escaped later).
    For an event in nanoseconds (off-cpu, wall) the counts are nanoseconds, and the header says so."""
    meta = record.meta
    counted = (("Samples", f"{sample_total(record)} of {meta.event} at {meta.frequency_hz} Hz") if event == "cpu"
               else ("Time", f"{human_time(sample_total(record))} of {event} (counts in nanoseconds)"))
    facts = [
        ("Profile", source),
        ("Target", target_text(meta)),
        counted,
        ("Duration", f"{meta.duration_s:.2f} s"),
        ("Lost", lost_text(meta.lost).removeprefix("Total Lost Samples: ")),
        ("Recorded", f"{_when(meta.started)} on {meta.hostname} (kernel {meta.kernel})"),
    ]
    quality = stack_quality(meta)
    if quality:
        facts.append(("Stacks", quality))
    return [(label, escape_controls(value)) for label, value in facts]


def stack_quality(meta: Any) -> str:
    """How complete the user stacks are: the record's ``stack_quality`` counts (complete, or why a stack
    stopped) where the recorder wrote them, else how the user stacks were taken."""
    counts = getattr(meta, "stack_quality", None) or {}
    if isinstance(counts, dict) and counts:
        total = sum(counts.values())
        complete = counts.get("complete", 0)
        others = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()) if kind != "complete" and n)
        text = f"{100 * complete / total:.1f}% of {total} user stacks complete" if total else "no user stacks"
        mode = getattr(meta, "call_graph", "")
        return text + (f" (stopped: {others})" if others else "") + (f", unwound by {mode}" if mode else "")
    if meta.user_stacks:
        return "user stacks: " + ", ".join(f"{kind} {n}" for kind, n in sorted(meta.user_stacks.items()))
    return ""


@dataclass
class Encoded:
    """The tree as the page reads it. ``meta``: ``frames`` [[symbol, dso index, kind index]], ``dsos``,
    ``kinds``, ``nodes`` (how many), ``total`` (samples, the base of percentages), ``order``. ``arrays``:
    gzip of four little-endian arrays, one entry per node in preorder: frame (int32), number of children
    (int32), self samples (float64: exact to 2**53, a hostile count never overflows it) and, in a
    differential graph, the samples of the same path in BASE (float64)."""

    meta: dict[str, Any]
    arrays: bytes


def encode(tree: CallTree, base: dict[int, int] | None = None, base_total: int = 0) -> Encoded:
    budget = OutputBudget()
    frame_ids: dict[tuple[str, str, str], int] = {}
    dso_ids: dict[str, int] = {}
    frames: list[list[Any]] = []
    walked = walk(tree.root)
    budget.take(NODE_OVERHEAD * len(walked))
    node_frames = array("i", bytes(4 * len(walked)))
    for i, (_, node) in enumerate(walked):
        key = (node.symbol, node.dso, node.kind)
        frame = frame_ids.get(key)
        if frame is None:
            frame = frame_ids[key] = len(frames)
            dso = dso_ids.setdefault(node.dso, len(dso_ids))
            frames.append([escape_controls(node.symbol), dso, KINDS.index(node.kind)])
            budget.take(len(node.symbol) + len(node.dso) + NODE_OVERHEAD)
        node_frames[i] = frame
    columns = [node_frames, array("i", [len(node.children) for _, node in walked]),
               array("d", [node.self_count for _, node in walked])]
    meta: dict[str, Any] = {
        "kinds": KINDS, "dsos": [escape_controls(dso) for dso in dso_ids], "frames": frames,
        "nodes": len(walked), "total": tree.total_samples, "order": tree.order, "diff": base is not None,
    }
    if base is not None:
        columns.append(array("d", [base.get(id(node), 0) for _, node in walked]))
        meta["baseTotal"] = base_total
    if sys.byteorder == "big":
        for column in columns:
            column.byteswap()
    return Encoded(meta, gzip.compress(b"".join(column.tobytes() for column in columns), compresslevel=6))


def page(title: str, facts: list[tuple[str, str]], data: Encoded, note: str = "") -> str:
    """The whole HTML document."""
    assets = files("optrace.exporters")
    script = assets.joinpath("flamegraph.js").read_text(encoding="utf-8")
    inflate = assets.joinpath("fflate.js").read_text(encoding="utf-8")
    style = assets.joinpath("flamegraph.css").read_text(encoding="utf-8")
    header = "".join(f"<div><dt>{html.escape(label)}</dt><dd>{html.escape(value)}</dd></div>"
                     for label, value in facts)
    note_html = f'<p class="note">{html.escape(note)}</p>' if note else ""
    count_title = "Time" if data.meta.get("unit") == "nanoseconds" else "Samples"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>{html.escape(title)}</title>
<style>{style}</style></head>
<body>
<header><h1>{html.escape(title)}</h1><dl id="facts">{header}</dl>{note_html}
<div id="controls"><button id="reset" type="button">Reset zoom</button>
<button id="flip" type="button">Flip order</button>
<input id="search" type="search" placeholder="Search (substring or /regex/)" aria-label="Search">
<span id="match"></span><span id="legend"></span></div>
<div id="matches" hidden><table id="matchlist"><thead><tr><th>Total</th><th>{count_title}</th><th>Function</th>
<th>Object</th></tr></thead><tbody></tbody></table></div></header>
<main><div id="graph"><canvas id="canvas"></canvas><div id="tip" hidden></div></div>
<h2>Hottest functions</h2><table id="top"><thead></thead><tbody></tbody></table></main>
<script type="application/json" id="data">{script_json(data.meta)}</script>
<script type="application/octet-stream" id="arrays">{base64.b64encode(data.arrays).decode("ascii")}</script>
<script>/* fflate 0.8.3 (MIT, (c) Arjun Barrett): https://github.com/101arrowz/fflate */{inflate}</script>
<script>{script}</script>
</body></html>
"""


def script_json(data: dict[str, Any]) -> str:
    """JSON that cannot end its ``<script>`` element nor open a comment, whatever the names hold."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
