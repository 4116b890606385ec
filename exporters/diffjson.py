"""`optrace diff --format json`: ``{"base": {...}, "new": {...}, "notes": [...], "rows": [...]}``.

Each row: ``comm, pid, dso, symbol, kernel`` (null when not a sort key), ``base_samples, new_samples,
base_percent, new_percent, delta_percent`` (percentage points, new minus base), largest change first."""
from __future__ import annotations

import json
from typing import Any, TextIO

from optrace.exporters.jsonrows import check_size, report_settings
from optrace.frontend.report.diff import Comparison, DiffRow, diff_rows
from optrace.frontend.report.rows import Profile, ReportOptions, build_table


def write(stream: TextIO, comparison: Comparison, options: ReportOptions) -> None:
    rows = diff_rows(comparison, options)
    check_size(rows)  # type: ignore[arg-type]  # reads the keys only
    document = {
        "base": _side(comparison.base, options),
        "new": _side(comparison.new, options),
        "notes": list(comparison.notes),
        "rows": [_row(row) for row in rows],
    }
    stream.write(json.dumps(document, indent=2) + "\n")


def _side(profile: Profile, options: ReportOptions) -> dict[str, Any]:
    meta = profile.record.meta
    return report_settings(profile.record, options, profile.source, build_table(profile.record, options)) | {
        "hostname": meta.hostname, "kernel": meta.kernel, "command": meta.command, "duration_s": meta.duration_s}


def _row(row: DiffRow) -> dict[str, Any]:
    return {"comm": row.key.comm, "pid": row.key.pid, "dso": row.key.dso, "symbol": row.key.symbol,
            "kernel": row.key.kernel, "base_samples": row.base_samples, "new_samples": row.new_samples,
            "base_percent": row.base_percent, "new_percent": row.new_percent,
            "delta_percent": row.delta_percent}
