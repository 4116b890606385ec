"""A report's text in one format, as `optrace report --format FMT` writes it (through the registry)."""
from __future__ import annotations

import io

from optrace.exporters.formats import PROFILE
from optrace.frontend.report.rows import Profile, ReportOptions
from optrace.model import Record

FORMATS = PROFILE.names


def render_report(record: Record, options: ReportOptions, fmt: str, source: str) -> str:
    stream = io.StringIO()
    PROFILE.writer(fmt)(stream, Profile(record, source), options)
    return stream.getvalue()
