"""Bounds on what one report prints. A record file may repeat one long name (a 30 MB symbol is a 30 KB
zlib payload) in every row or stack; the report's size is counted before its text is built, and past
:data:`MAX_OUTPUT_CHARS` the report stops with a one-line error instead of taking all memory. The
largest output of the measured 60 s system-wide record (recordfile.py) is 4.2 MB of JSON."""
from __future__ import annotations

from collections.abc import Callable

from optrace.errors import OptraceError
from optrace.escape import escape_controls

MAX_OUTPUT_CHARS = 128 << 20
MAX_ALIGN = 256  # a table column is padded to at most this width; longer cells overflow it


class OutputBudget:
    """Characters a report may still produce; :meth:`take` raises once they run out."""

    def __init__(self, limit: int | None = None) -> None:
        self.left = MAX_OUTPUT_CHARS if limit is None else limit

    def take(self, chars: int) -> None:
        self.left -= chars
        if self.left < 0:
            raise OptraceError(
                f"the report would be over {MAX_OUTPUT_CHARS >> 20} MiB of text (long names repeated in many"
                f" rows or stacks): narrow it with --pid, --comm, --dso or --percent-limit")


class Names:
    """:func:`escape_controls` (after ``transform``, e.g. a path's basename) computed once per distinct
    name: rows repeat names, and a repeated megabyte-long one must cost its length once, not once per row."""

    def __init__(self, transform: Callable[[str], str] | None = None) -> None:
        self._transform = transform
        self._shown: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        shown = self._shown.get(name)
        if shown is None:
            shown = self._shown[name] = escape_controls(self._transform(name) if self._transform else name)
        return shown
