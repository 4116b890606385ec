"""`optrace top`'s text: the header and the rows of one refresh. The plain table (not a terminal, or
``--stdio``) is printed once per interval so it can be logged; the full-screen view lays out the same
cells (frontend/top/screen.py). Names come from other users' processes: escaped before they are shown."""
from __future__ import annotations

import os
from typing import TextIO

from optrace.escape import escape_controls
from optrace.frontend.report.toprows import Header, TopRow, TopSnapshot, ViewState

TITLES = {"comm": "Command", "pid": "Pid", "dso": "Shared Object", "symbol": "Symbol"}
MAX_CELL = 200


def header_line(header: Header, view: ViewState) -> str:
    quality = "" if header.deep_stacks is None else f"  stacks >1 frame: {header.deep_stacks:.0f}%"
    line = (f"Samples: {header.samples_per_s:.0f}/s  lost: {header.lost}  CPUs: {header.cpus}  "
            f"event: {header.event} {header.frequency_hz} Hz  totals: {header.totals}{quality}")
    return line + (f"  warnings: {header.warnings}" if header.warnings else "")


def state_line(view: ViewState) -> str:
    parts = [f"sort: {','.join(view.sort)}", f"kernel: {'shown' if view.show_kernel else 'hidden'}",
             f"children: {'on' if view.children else 'off'}"]
    if view.filter:
        parts.append(f"filter: {escape_controls(view.filter)}")
    if view.paused:
        parts.append("PAUSED")
    return "  ".join(parts)


def titles(view: ViewState) -> list[str]:
    counts = ["Children", "Self"] if view.children else ["Overhead"]
    return counts + ["Samples"] + [TITLES[key] for key in view.sort]


def cells(row: TopRow, view: ViewState) -> list[str]:
    counts = [f"{row.children_percent:.2f}%", f"{row.percent:.2f}%"] if view.children else [f"{row.percent:.2f}%"]
    return counts + [f"{row.samples:.0f}"] + [_key_cell(row, key) for key in view.sort]


def _key_cell(row: TopRow, key: str) -> str:
    if key == "symbol":
        return f"{'[k]' if row.key.kernel else '[.]'} {_shown(row.key.symbol or '')}"
    if key == "dso":
        dso = row.key.dso or ""
        return _shown(os.path.basename(dso) if "/" in dso and not dso.startswith("[") else dso)
    if key == "comm":
        return _shown(row.key.comm or "")
    return str(row.key.pid)


def _shown(name: str) -> str:
    shown = escape_controls(name)
    return shown if len(shown) <= MAX_CELL else shown[:MAX_CELL] + "..."


def write(stream: TextIO, snapshot: TopSnapshot) -> None:
    """One refresh as a plain table under a ``#`` header, then a blank line."""
    head = titles(snapshot.view)
    rows = [cells(row, snapshot.view) for row in snapshot.rows]
    widths = [max([len(title)] + [len(r[i]) for r in rows]) for i, title in enumerate(head)]
    numeric = len(head) - len(snapshot.view.sort)
    lines = [f"# optrace top {snapshot.time}  {header_line(snapshot.header, snapshot.view)}",
             f"# {state_line(snapshot.view)}",
             "# " + "  ".join(_align(t, w, i < numeric) for i, (t, w) in enumerate(zip(head, widths))).rstrip()]
    for row in rows:
        lines.append("  " + "  ".join(_align(c, w, i < numeric) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    if not rows:
        lines.append("# (no samples yet)")
    stream.write("\n".join(lines) + "\n\n")
    stream.flush()


def _align(text: str, width: int, right: bool) -> str:
    return text.rjust(width) if right else text.ljust(width)
