"""`report -G caller|callee --format json`: the call tree as nested objects.

``{"meta": {...}, "report": {..., "call_graph": "caller"}, "tree": [node, ...]}`` where a node is
``{"symbol", "dso", "kind", "self", "total", "self_percent", "total_percent", "children": [node, ...]}``
(children largest first; percentages of all samples; ``--percent-limit`` drops nodes below it; ``self`` and
``total`` in ``report.unit``: samples, or nanoseconds for off-cpu and wall).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, TextIO

from optrace.exporters.budget import OutputBudget
from optrace.exporters.jsonrows import ROW_OVERHEAD, report_settings
from optrace.frontend.report.callgraph import Node, build_tree, require_stacks, walk
from optrace.frontend.report.rows import Profile, ReportOptions, build_table, percent


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    record = profile.record
    require_stacks(record, "call graph")
    tree = build_tree(record, options, options.call_graph or "caller")
    _check_size(tree.root)
    settings = report_settings(record, options, profile.source, build_table(record, options), profile.event,
                               profile.parts) | {"call_graph": tree.order}
    document = {
        "meta": dataclasses.asdict(record.meta),
        "report": settings,
        "tree": _objects(tree.root, tree.total_samples, options.percent_limit),
    }
    stream.write(json.dumps(document, indent=1) + "\n")


def _check_size(root: Node) -> None:
    budget = OutputBudget()
    lengths: dict[str, int] = {}
    for _, node in walk(root):
        for name in (node.symbol, node.dso):
            if name not in lengths:
                lengths[name] = len(json.dumps(name))
            budget.take(ROW_OVERHEAD + lengths[name])


def _objects(root: Node, total: int, limit: float) -> list[dict[str, Any]]:
    """The root's children as nested dicts, built without recursion (deep stacks)."""
    top: list[dict[str, Any]] = []
    pending: list[tuple[Node, list[dict[str, Any]]]] = [(root, top)]
    while pending:
        node, into = pending.pop()
        for child in node.sorted_children():
            if percent(child.total, total) < limit:
                continue
            obj = {"symbol": child.symbol, "dso": child.dso, "kind": child.kind, "self": child.self_count,
                   "total": child.total, "self_percent": percent(child.self_count, total),
                   "total_percent": percent(child.total, total), "children": []}
            into.append(obj)
            pending.append((child, obj["children"]))
    return top
