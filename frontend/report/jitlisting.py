"""What `optrace jit show` lists: a perf map's entries or a jitdump's records as read, with the reader's
counts (printed by exporters/jitlisting.py)."""
from __future__ import annotations

from dataclasses import dataclass

from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.perfmap import PerfMapEntry, PerfMapReader


@dataclass(frozen=True)
class PerfMapListing:
    path: str
    entries: list[PerfMapEntry]  # the ones kept
    reader: PerfMapReader  # its counts of bad and long lines
    skipped: int  # entries read after the kept ones, counted only


@dataclass(frozen=True)
class JitDumpListing:
    path: str
    header: jd.JitDumpHeader
    records: list[jd.JitRecord]  # the ones kept
    reader: jd.JitDumpReader  # its counts of records, unknown records and truncated bytes
    skipped: int  # records read after the kept ones, counted only


Listing = PerfMapListing | JitDumpListing


def skipped_note(kept: int, skipped: int, what: str) -> str:
    """What a summary line adds when ``skipped`` items were read after the ``kept`` ones."""
    return f"; {skipped} {what} after the first {kept} not shown" if skipped else ""
