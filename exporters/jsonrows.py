"""`--format json`: the stable machine interface of `optrace report`.

One object: ``{"meta": {...}, "report": {...}, "rows": [...], "calls": [...]}``. Row keys ``comm``, ``pid``,
``tid``, ``dso``, ``symbol``, ``samples``, ``percent`` are always present (a key not in the sort order is null);
``children``/``children_percent`` are added with --children. Later versions add fields, never rename these.

``report.event`` and ``report.unit`` say what the rows count: CPU samples (``samples``), or with
``--event off-cpu``/``wall`` nanoseconds, in a ``nanoseconds`` key (``samples`` is then null), ``children``
in nanoseconds too; ``report.total`` is the event's total in its unit. ``report.python_folded``: how much of it
had the interpreter's own frames folded into the Python function running them (frontend/report/pythonview.py;
0 with --python-internals).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, TextIO

from optrace.exporters.budget import OutputBudget
from optrace.frontend.report.rows import Profile, ReportOptions, Row, RowTable, build_table, sample_total
from optrace.model import EVENT_UNITS, Record

ROW_OVERHEAD = 260  # one row's keys, numbers and indentation, at most


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    record = profile.record
    table = build_table(record, options)
    rows = table.rows
    check_size(rows)
    document = {
        "meta": dataclasses.asdict(record.meta),
        "report": report_settings(record, options, profile.source, table, profile.event, profile.parts)
        | {"python_folded": profile.python_folded},
        "rows": [row_object(row, options, profile.unit) for row in rows],
        "calls": [dataclasses.asdict(call) for call in record.calls],
    }
    stream.write(json.dumps(document, indent=2) + "\n")


def check_size(rows: list[Row]) -> None:
    """Take the rows' size from the output budget before json.dumps builds them (names are measured
    once each, as JSON escapes them: rows repeat names)."""
    budget = OutputBudget()
    lengths: dict[str, int] = {}
    for row in rows:
        names = (name for name in (row.key.comm, row.key.dso, row.key.symbol) if name)
        budget.take(ROW_OVERHEAD + sum(_json_length(name, lengths) for name in names))


def _json_length(name: str, lengths: dict[str, int]) -> int:
    length = lengths.get(name)
    if length is None:
        length = lengths[name] = len(json.dumps(name))
    return length


def report_settings(record: Record, options: ReportOptions, source: str, table: RowTable,
                    event: str = "cpu", parts: dict[str, int] | None = None) -> dict[str, Any]:
    """``event``: what ``record.samples`` count (frontend/report/events.py), ``parts`` its wall split."""
    unit = EVENT_UNITS[event]
    timed = unit == "nanoseconds"
    return {
        "input": source,
        "event": event,
        "unit": unit,
        "total": sample_total(record),
        "parts": parts or {},
        "sort": list(options.sort),
        "children": options.children,
        "total_samples": None if timed else sample_total(record),
        "matched_samples": table.matched,  # kept by the pid/comm/dso filters (self samples, in the event's unit)
        "hidden_rows": table.hidden_rows,  # under percent_limit
        "hidden_samples": table.hidden,
        "filters": {
            "pid": sorted(options.pids),
            "tid": sorted(options.tids),
            "comm": sorted(options.comms),
            "dso": sorted(options.dsos),
            "percent_limit": options.percent_limit,
        },
    }


def row_fields(options: ReportOptions, unit: str = "samples") -> list[str]:
    """The keys of :func:`row_object`, in order."""
    fields = ["comm", "pid", "tid", "dso", "symbol", "kernel", "samples", "percent"]
    if unit == "nanoseconds":
        fields.append("nanoseconds")
    if options.children:
        fields += ["children", "children_percent"]
    return fields


def row_object(row: Row, options: ReportOptions, unit: str = "samples") -> dict[str, Any]:
    """One row as a flat dict; also the shape of a CSV line (:func:`row_fields` are its keys)."""
    timed = unit == "nanoseconds"
    obj: dict[str, Any] = {
        "comm": row.key.comm,
        "pid": row.key.pid,
        "tid": row.key.tid,
        "dso": row.key.dso,
        "symbol": row.key.symbol,
        "kernel": row.key.kernel,
        "samples": None if timed else row.samples,
        "percent": row.percent,
    }
    if timed:
        obj["nanoseconds"] = row.samples
    if options.children:
        obj["children"] = row.children
        obj["children_percent"] = row.children_percent
    return obj
