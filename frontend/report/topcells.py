"""One `optrace top` refresh as cells of text: the header line, the state line, the column titles and each
row's cells. The plain table (exporters/toptext.py) and the full screen (frontend/top/screen.py) lay out
the same cells. Names come from other users' processes: escaped here, before either shows them."""
from __future__ import annotations

import os

from optrace.escape import escape_controls
from optrace.frontend.report.toprows import Header, TopRow, ViewState

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
