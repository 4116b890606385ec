"""Output of `optrace count`: a table like funccount's, or JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass

from optrace.model import CallCount
from optrace.frontend.uprobes.resolve import ResolvedProbe
from optrace.frontend.uprobes.spec import parse_spec

HEADER = ("PROBE", "SYMBOL", "OFFSET", "CALLS", "BINARY")


@dataclass
class CountReport:
    probes: list[ResolvedProbe]
    counts: list[CallCount]  # same order as probes
    elapsed_s: float
    lost_pid_rows: int = 0
    exit_status: int | None = None


def _shown(probe: ResolvedProbe, count: CallCount) -> bool:
    """Glob matches that were never called are left out of the table (JSON keeps them)."""
    return count.calls > 0 or not parse_spec(probe.spec).is_glob


def render_table(report: CountReport, per_pid: bool) -> str:
    rows: list[tuple[str, ...]] = [HEADER]
    pid_rows: dict[int, list[tuple[str, ...]]] = {}
    pairs = [(p, c) for p, c in zip(report.probes, report.counts) if _shown(p, c)]
    for probe, count in pairs:
        rows.append((probe.spec, probe.symbol, f"{probe.offset:#x}", str(count.calls), probe.binary))
        if per_pid:
            pid_rows[len(rows) - 1] = [
                (f"  pid {pid}", count.comms.get(pid, ""), "", str(calls), "")
                for pid, calls in sorted(count.per_pid.items(), key=lambda item: -item[1])
            ]
    widths = [max(len(r[i]) for r in rows + sum(pid_rows.values(), [])) for i in range(len(HEADER))]
    lines = []
    for index, row in enumerate(rows):
        for line in [row, *pid_rows.get(index, [])]:
            lines.append("  ".join(
                cell.rjust(width) if column == 3 else cell.ljust(width)
                for column, (cell, width) in enumerate(zip(line, widths))
            ).rstrip())
    hidden = len(report.probes) - len(pairs)
    footer = [f"{hidden} more matched functions were not called" if hidden else "",
              f"{report.lost_pid_rows} calls not attributed to a pid (per-pid map full)"
              if report.lost_pid_rows else "",
              f"counted for {report.elapsed_s:.2f} s" + (
                  f"; command exited with status {report.exit_status}" if report.exit_status is not None else "")]
    return "\n".join(lines + [f for f in footer if f])


def _probe_json(probe: ResolvedProbe, count: CallCount, per_pid: bool) -> dict:
    row = {"probe": probe.spec, "binary": probe.binary, "symbol": probe.symbol, "offset": probe.offset,
           "calls": count.calls, "aliases": list(probe.aliases)}
    if per_pid:
        row["per_pid"] = [{"pid": pid, "comm": count.comms.get(pid, ""), "calls": calls}
                          for pid, calls in sorted(count.per_pid.items())]
    return row


def render_json(report: CountReport, per_pid: bool) -> str:
    return json.dumps({
        "probes": [_probe_json(p, c, per_pid) for p, c in zip(report.probes, report.counts)],
        "elapsed_s": round(report.elapsed_s, 3),
        "lost_pid_rows": report.lost_pid_rows,
        "exit_status": report.exit_status,
    })
