"""The one exception type user-facing code raises: its message is printed as one line, no traceback."""
from __future__ import annotations


class OptraceError(Exception):
    """An error the user can act on. ``str(exc)`` says what failed and what to do."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class MalformedInput(ValueError):
    """Input that is not what its format says: an ELF file, its CFI or line program, a jitdump, the kernel's
    BTF, a record file's JSON, a stored cache entry. Any user may have written it, so it is expected, not
    a bug: each format's own error derives from this one, and a boundary that contains one bad input
    (frontend/symbols/access.py's FileProblems, the stored caches) catches them all as one class."""
