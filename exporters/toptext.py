"""`optrace top --stdio`: one refresh as a plain table (not a terminal, or ``--stdio``), printed once per
interval so it can be logged; its cells are frontend/report/topcells.py's, as on the full screen."""
from __future__ import annotations

from typing import TextIO

from optrace.frontend.report.topcells import cells, header_line, state_line, titles
from optrace.frontend.report.toprows import TopSnapshot


def write(stream: TextIO, snapshot: TopSnapshot, options: None) -> None:
    """One refresh as a plain table under a ``#`` header, then a blank line (the view is the snapshot's:
    ``options`` is always None)."""
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
