"""Incremental reader for perf maps (``/tmp/perf-PID.map``: one ``START SIZE name`` line per JIT symbol).

START and SIZE are hex, with or without ``0x`` (the JDK writes ``0x``, V8 does not); the name is the rest of
the line and may contain spaces. The reader keeps its byte offset, so each read parses only the bytes added
since the previous one; a last line without its newline is left for the next read, except at the final read
(a process that exited will not finish it). Bad lines are skipped and counted, never echoed.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import NamedTuple

CHUNK = 4 << 20
MAX_ADDRESS = 1 << 64
# START SIZE NAME: hex fields with an optional 0x, separated by blanks; the name runs to the line's last
# non-blank character. One C-level scan per block; Python only converts the matches.
LINE = re.compile(rb"^[ \t]*(?:0[xX])?([0-9a-fA-F]+)[ \t]+(?:0[xX])?([0-9a-fA-F]+)[ \t]+([^\n]*[^\s])", re.M)
NONBLANK_LINE = re.compile(rb"^[ \t\r\f\v]*[^\s]", re.M)


class PerfMapEntry(NamedTuple):
    start: int
    size: int
    name: str


def _entries(block: bytes) -> Iterator[PerfMapEntry]:
    new = PerfMapEntry
    for start_hex, size_hex, name in LINE.findall(block):
        start, size = int(start_hex, 16), int(size_hex, 16)
        if size and start + size <= MAX_ADDRESS:
            yield new(start, size, name.decode("utf-8", "replace"))


def parse_line(line: bytes) -> PerfMapEntry | None:
    """One line (without its newline) -> entry, or None when it is not a valid ``START SIZE name`` line."""
    found = list(_entries(line.replace(b"\n", b" ")))
    return found[0] if found else None


class PerfMapReader:
    """Reads one perf map incrementally. Call :meth:`read_new` with a freshly opened, trusted fd."""

    def __init__(self) -> None:
        self.offset = 0
        self.identity: tuple[int, int] | None = None
        self.lines = 0
        self.bad_lines = 0
        self.restarts = 0  # the file was replaced or truncated (e.g. `jcmd Compiler.perfmap` rewrites it)

    def read_new(self, fd: int, final: bool = False) -> Iterator[PerfMapEntry]:
        """Yield the entries of the complete lines added since the previous read."""
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if self.identity not in (None, identity) or st.st_size < self.offset:
            self.offset = 0
            self.restarts += 1
        self.identity = identity
        end = st.st_size  # read no further than fstat said: the size limit was checked on it
        carry = b""
        while self.offset + len(carry) < end:
            chunk = os.pread(fd, min(CHUNK, end - self.offset - len(carry)), self.offset + len(carry))
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            yield from self._parse(data[:cut])
            self.offset += cut
            carry = data[cut:]
        if final and carry:
            yield from self._parse(carry)
            self.offset += len(carry)

    def _parse(self, block: bytes) -> Iterator[PerfMapEntry]:
        """Entries of the complete lines in ``block``; blank lines are ignored, other bad lines counted."""
        lines = len(NONBLANK_LINE.findall(block))
        good = 0
        for entry in _entries(block):
            good += 1
            yield entry
        self.lines += lines
        self.bad_lines += lines - good


def read_perf_map(fd: int) -> tuple[list[PerfMapEntry], PerfMapReader]:
    """Read a whole perf map (final read: a last line without newline counts)."""
    reader = PerfMapReader()
    return list(reader.read_new(fd, final=True)), reader
