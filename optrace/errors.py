"""The one exception type user-facing code raises: its message is printed as one line, no traceback."""
from __future__ import annotations


class OptraceError(Exception):
    """An error the user can act on. ``str(exc)`` says what failed and what to do."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
