"""A report's text in one format, as `optrace report --format FMT` writes it (through the registry)."""
from __future__ import annotations

import io

from optrace.exporters.formats import PROFILE
from optrace.frontend.report.rows import Profile, ReportOptions
from optrace.model import Record

FORMATS = PROFILE.names
BINARY_FORMATS = ("pprof", "otlp")  # bytes (to a file), names interned once: no text to budget or escape
TEXT_FORMATS = tuple(name for name in FORMATS if name not in BINARY_FORMATS)


def render_report(record: Record, options: ReportOptions, fmt: str, source: str, event: str = "cpu",
                  parts: dict[str, int] | None = None) -> str:
    """The text a format writes; a binary format's bytes as latin-1 characters."""
    profile = Profile(record, source, event, parts or {})
    if fmt in BINARY_FORMATS:
        buffer = io.BytesIO()
        stream = io.TextIOWrapper(buffer, encoding="utf-8", newline="")
        PROFILE.writer(fmt)(stream, profile, options)
        stream.flush()
        return buffer.getvalue().decode("latin-1")
    stream = io.StringIO()
    PROFILE.writer(fmt)(stream, profile, options)
    return stream.getvalue()
