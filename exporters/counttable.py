"""`optrace count --format table`: a table like funccount's, one line per probe (and per process with
--per-pid), then what was left out and how long it counted."""
from __future__ import annotations

import time
from typing import TextIO

from optrace.escape import escape_controls
from optrace.frontend.report.callcounts import CountOptions, CountReport, ProbeCalls

HEADER = ("PROBE", "SYMBOL", "OFFSET", "CALLS", "BINARY")
CALLS_COLUMN = 3  # right-aligned; the others are left-aligned


def write(stream: TextIO, report: CountReport, options: CountOptions) -> None:
    if options.interval_mark:
        stream.write(f"--- {time.strftime('%H:%M:%S')} {_span(report)}\n")
    stream.write(_text(report, options.per_pid) + "\n")


def _span(report: CountReport) -> str:
    if report.interval:
        return f"calls in the last {report.elapsed_s:.1f} s (per interval; --cumulative for running totals)"
    return f"calls since the start, {report.elapsed_s:.1f} s (totals)"


def _shown(probe: ProbeCalls) -> bool:
    """Glob matches that were never called are left out of the table (JSON keeps them)."""
    return probe.count.calls > 0 or not probe.glob


def _text(report: CountReport, per_pid: bool) -> str:
    rows: list[tuple[str, ...]] = [HEADER]
    pid_rows: dict[int, list[tuple[str, ...]]] = {}
    shown = [probe for probe in report.probes if _shown(probe)]
    for probe in shown:
        count = probe.count
        rows.append((escape_controls(probe.spec), escape_controls(probe.symbol), f"{probe.offset:#x}",
                     str(count.calls), escape_controls(probe.binary)))
        if per_pid:
            pid_rows[len(rows) - 1] = [
                (f"  pid {pid}", escape_controls(count.comms.get(pid, "")), "", str(calls), "")
                for pid, calls in sorted(count.per_pid.items(), key=lambda item: -item[1])
            ]
    widths = [max(len(r[i]) for r in rows + sum(pid_rows.values(), [])) for i in range(len(HEADER))]
    lines = []
    for index, row in enumerate(rows):
        for line in [row, *pid_rows.get(index, [])]:
            lines.append("  ".join(
                cell.rjust(width) if column == CALLS_COLUMN else cell.ljust(width)
                for column, (cell, width) in enumerate(zip(line, widths))
            ).rstrip())
    hidden = len(report.probes) - len(shown)
    footer = [f"{hidden} more matched functions were not called" if hidden else "",
              f"{report.lost_pid_rows} calls not attributed to a pid (per-pid map full)"
              if report.lost_pid_rows else "",
              f"counted for {report.elapsed_s:.2f} s" + (
                  f"; command exited with status {report.exit_status}" if report.exit_status is not None else "")]
    return "\n".join(lines + [f for f in footer if f])
