"""`optrace count --format json`: one object per print, every probe (uncalled glob matches too)."""
from __future__ import annotations

import json
from typing import Any, TextIO

from optrace.frontend.report.callcounts import CountOptions, CountReport, ProbeCalls


def write(stream: TextIO, report: CountReport, options: CountOptions) -> None:
    stream.write(json.dumps({
        "probes": [_probe_object(probe, options.per_pid) for probe in report.probes],
        "elapsed_s": round(report.elapsed_s, 3),
        "counts": "interval" if report.interval else "total",  # interval: of the last elapsed_s (count -i)
        "lost_pid_rows": report.lost_pid_rows,
        "exit_status": report.exit_status,
    }) + "\n")


def _probe_object(probe: ProbeCalls, per_pid: bool) -> dict[str, Any]:
    count = probe.count
    row: dict[str, Any] = {"probe": probe.spec, "binary": probe.binary, "symbol": probe.symbol,
                           "offset": probe.offset, "calls": count.calls, "aliases": list(probe.aliases)}
    if per_pid:
        row["per_pid"] = [{"pid": pid, "comm": count.comms.get(pid, ""), "calls": calls}
                          for pid, calls in sorted(count.per_pid.items())]
    return row
