"""Incremental reader for perf maps (``/tmp/perf-PID.map``: one ``START SIZE name`` line per JIT symbol).

START and SIZE are hex, with or without ``0x`` (the JDK writes ``0x``, V8 does not); the name is the rest of
the line and may contain spaces. The reader keeps its byte offset, so each read parses only the bytes added
since the previous one; a last line without its newline is left for the next read, except at the final read
(a process that exited will not finish it). Bad lines are skipped and counted, never echoed.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

CHUNK = 4 << 20
MAX_ADDRESS = 1 << 64


@dataclass(frozen=True)
class PerfMapEntry:
    start: int
    size: int
    name: str


def _hex(field: bytes) -> int:
    if field[:1] in (b"+", b"-") or b"_" in field:
        raise ValueError(field)
    return int(field, 16)  # accepts the optional 0x prefix


def parse_line(line: bytes) -> PerfMapEntry | None:
    """One line (without its newline) -> entry, or None when it is not a valid ``START SIZE name`` line."""
    parts = line.rstrip(b"\r").split(None, 2)
    if len(parts) != 3:
        return None
    try:
        start, size = _hex(parts[0]), _hex(parts[1])
    except ValueError:
        return None
    name = parts[2].rstrip()
    if size == 0 or start + size > MAX_ADDRESS or not name:
        return None
    return PerfMapEntry(start, size, name.decode("utf-8", "replace"))


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
        for line in block.split(b"\n"):
            if not line:
                continue
            self.lines += 1
            entry = parse_line(line)
            if entry is None:
                self.bad_lines += 1
            else:
                yield entry


def read_perf_map(fd: int) -> tuple[list[PerfMapEntry], PerfMapReader]:
    """Read a whole perf map (final read: a last line without newline counts)."""
    reader = PerfMapReader()
    return list(reader.read_new(fd, final=True)), reader
