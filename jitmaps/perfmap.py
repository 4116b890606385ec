"""Incremental reader for perf maps (``/tmp/perf-PID.map``: one ``START SIZE name`` line per JIT symbol).

START and SIZE are hex, with or without ``0x`` (the JDK writes ``0x``, V8 does not); the name is the rest of
the line and may contain spaces. The reader keeps its byte offset, so each read parses only the bytes added
since the previous one; a last line without its newline is left for the next read, except at the final read
(a process that exited will not finish it). Bad lines are skipped and counted, never echoed.

Parsing is linear in the input whatever it holds. One C-level regular-expression scan per 256 KiB piece does
the work, and the expression cannot backtrack more than once over a line: every quantifier is followed by a
character class disjoint from its own, except the name, which takes the rest of the line unconditionally
(trailing blanks are stripped afterwards; the expression before issue 8 ended the name at its last
non-blank character, and a line of ``1 1`` and 150,000 blanks took it ~100 s). A line longer than
:data:`MAX_LINE` bytes is a bad line, skipped without being kept in memory even when it spans many reads
(JVM and V8 names are at most a few KB).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import NamedTuple

CHUNK = 4 << 20
PIECE = 256 << 10
MAX_LINE = 16 << 10
MAX_ADDRESS = 1 << 64
LINE = re.compile(rb"^[ \t]*(?:0[xX])?([0-9a-fA-F]+)[ \t]+(?:0[xX])?([0-9a-fA-F]+)[ \t]+([^\n]*)", re.M)
NONBLANK_LINE = re.compile(rb"^[ \t\r\f\v]*[^\s]", re.M)


class PerfMapEntry(NamedTuple):
    start: int
    size: int
    name: str
    line_offset: int | None = None  # in the file, from a reader ``with_offsets`` (None: not known)


def _entries(block: bytes) -> Iterator[PerfMapEntry]:
    new = PerfMapEntry
    for start_hex, size_hex, name in LINE.findall(block):
        start, size, name = int(start_hex, 16), int(size_hex, 16), name.rstrip()
        if size and name and start + size < MAX_ADDRESS:
            yield new(start, size, name.decode("utf-8", "replace"))


def _entries_at(block: bytes, base: int) -> Iterator[PerfMapEntry]:
    """:func:`_entries` with each line's offset, ``block`` being at ``base`` in the file (a match object
    per line: slower, for readers ``with_offsets`` only)."""
    new = PerfMapEntry
    for match in LINE.finditer(block):
        start_hex, size_hex, name = match.groups()
        start, size, name = int(start_hex, 16), int(size_hex, 16), name.rstrip()
        if size and name and start + size < MAX_ADDRESS:
            yield new(start, size, name.decode("utf-8", "replace"), base + match.start())


def parse_line(line: bytes) -> PerfMapEntry | None:
    """One line (without its newline) -> entry, or None when it is not a valid ``START SIZE name`` line."""
    if len(line) > MAX_LINE:
        return None
    found = list(_entries(line.replace(b"\n", b" ")))
    return found[0] if found else None


class PerfMapReader:
    """Reads one perf map incrementally. Call :meth:`read_new` with a freshly opened, trusted fd.
    ``with_offsets``: entries carry their line's offset in the file, except those of a block that held a
    line over MAX_LINE (it is cut out before parsing, which moves the lines after it)."""

    def __init__(self, with_offsets: bool = False) -> None:
        self.with_offsets = with_offsets
        self.offset = 0
        self.size_seen = 0  # the size the file had at the last read
        self.identity: tuple[int, int] | None = None
        self.lines = 0
        self.bad_lines = 0
        self.long_lines = 0  # of the bad lines, those over MAX_LINE bytes
        self.restarts = 0  # the file was replaced or truncated (e.g. `jcmd Compiler.perfmap` rewrites it)
        self._in_long_line = False  # the bytes up to the next newline belong to a line already counted bad

    def read_new(self, fd: int, final: bool = False, max_size: int | None = None,
                 budget: int | None = None) -> Iterator[PerfMapEntry]:
        """Yield the entries of the complete lines added since the previous read (never past ``max_size``
        bytes of the file, nor past the size it has now). With ``budget``, stop once about that many bytes
        were read (at most one chunk more): the next call goes on from there, so one huge map cannot hold
        a drain up."""
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if self.identity not in (None, identity) or st.st_size < self.offset:
            self.offset = 0
            self._in_long_line = False
            self.restarts += 1
        self.identity = identity
        end = st.st_size if max_size is None else min(st.st_size, max_size)
        self.size_seen = end
        start = self.offset
        carry = b""
        while self.offset + len(carry) < end and (budget is None or self.offset - start < budget):
            size = CHUNK if budget is None else min(CHUNK, max(budget, 2 * MAX_LINE))
            chunk = os.pread(fd, min(size, end - self.offset - len(carry)), self.offset + len(carry))
            if not chunk:
                break
            data = self._skip_long_line(carry + chunk)
            cut = data.rfind(b"\n") + 1
            yield from self._parse(data[:cut], self.offset)
            self.offset += cut
            carry = self._keep_partial(data[cut:])
        if final and carry and self.offset + len(carry) >= end:
            yield from self._parse(carry, self.offset)
            self.offset += len(carry)

    def _skip_long_line(self, data: bytes) -> bytes:
        """Drop the rest of a line already counted as too long (consumed: the offset moves past it)."""
        if not self._in_long_line:
            return data
        newline = data.find(b"\n")
        if newline < 0:
            self.offset += len(data)
            return b""
        self._in_long_line = False
        self.offset += newline + 1
        return data[newline + 1 :]

    def _keep_partial(self, partial: bytes) -> bytes:
        """An unfinished last line waits for more bytes, unless it is already too long to be used."""
        if len(partial) <= MAX_LINE:
            return partial
        self.lines += 1
        self.bad_lines += 1
        self.long_lines += 1
        self.offset += len(partial)
        self._in_long_line = True
        return b""

    def _parse(self, block: bytes, base: int) -> Iterator[PerfMapEntry]:
        """Entries of the lines in ``block`` (at ``base`` in the file), a piece at a time: the C-level scans
        build one object per line, and over a whole 4 MiB block those (~8 MB for 20,000 lines) outlived
        their use in the allocator's arenas (a daemon's RSS grew with every large map it read)."""
        for start, piece in _pieces(block):
            yield from self._parse_piece(piece, base + start)

    def _parse_piece(self, block: bytes, base: int) -> Iterator[PerfMapEntry]:
        """Entries of the lines in ``block``; blank lines are ignored, other bad lines counted."""
        kept = self._without_long_lines(block)
        lines = len(NONBLANK_LINE.findall(kept))
        good = 0
        at_offsets = self.with_offsets and kept is block
        for entry in _entries_at(kept, base) if at_offsets else _entries(kept):
            good += 1
            yield entry
        self.lines += lines
        self.bad_lines += lines - good

    def _without_long_lines(self, block: bytes) -> bytes:
        """``block`` without its lines over MAX_LINE bytes (counted as bad): the common case costs one
        C-level pass over the line lengths."""
        if len(block) <= MAX_LINE:
            return block
        lines = block.split(b"\n")
        if max(map(len, lines)) <= MAX_LINE:
            return block
        kept = [line for line in lines if len(line) <= MAX_LINE]
        long_lines = len(lines) - len(kept)
        self.lines += long_lines
        self.bad_lines += long_lines
        self.long_lines += long_lines
        return b"\n".join(kept)


def _pieces(block: bytes) -> Iterator[tuple[int, bytes]]:
    """``block`` cut at line ends into pieces of about PIECE bytes (a longer line is a piece of its own),
    each with its offset in ``block``."""
    start = 0
    while start < len(block):
        cut = block.rfind(b"\n", start, start + PIECE) + 1
        if cut <= start:
            cut = block.find(b"\n", start + PIECE) + 1 or len(block)
        yield start, block[start:cut]
        start = cut


def read_perf_map(fd: int, max_size: int | None = None) -> tuple[list[PerfMapEntry], PerfMapReader]:
    """Read a whole perf map (final read: a last line without newline counts)."""
    reader = PerfMapReader()
    return list(reader.read_new(fd, final=True, max_size=max_size)), reader
