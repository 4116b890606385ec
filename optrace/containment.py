"""The one way optrace contains a failure: a call that raises costs only what depended on it.

A daemon that runs for months and a recording of a whole machine read files and memory that any user
controls; a bug or a hostile input in one process's work must not end the rest. :func:`contain` is that
boundary, for the session (per process), serve's drain loop (per source) and the symbolizer (per file):
the failure is handed to the caller's ``failed`` (which counts it and words a warning), and the call
gives None. BaseExceptions (KeyboardInterrupt, SystemExit) are never contained.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from optrace.escape import escape_controls

T = TypeVar("T")
MAX_ERROR_CHARS = 200  # of the exception's text in a warning: a hostile name must not fill the log


def contain(call: Callable[[], T], failed: Callable[[Exception], None]) -> T | None:
    """``call()``, or None when it raised an Exception, which ``failed`` is given first."""
    try:
        return call()
    except Exception as exc:  # containment is the point: any bug or bad input in one part of the work
        failed(exc)
        return None


def count_failure(counts: Counter[str], warnings: list[str], kind: str, exc: Exception, consequence: str) -> None:
    """A contained failure counted under ``kind``, with one warning that ends with what it cost."""
    counts[kind] += 1
    warnings.append(f"{kind} failed and was skipped ({type(exc).__name__}: "
                    f"{escape_controls(str(exc))[:MAX_ERROR_CHARS]}); {consequence}")
