"""The jitdump format (linux tools/perf/Documentation/jitdump-specification.txt): reader and record encoders.

A 40-byte file header (magic ``JiTD`` in the writer's byte order, version 1, flags) then records, each a
16-byte prefix ``id, total_size, timestamp`` and a payload. The reader is incremental like the perf-map
reader: it keeps its offset and parses only complete records; a truncated last record waits for more bytes
(and is ignored at the final read). Unknown record ids are skipped and counted. Anything that cannot be a
jitdump (bad magic, version, flags, a record size smaller than its fixed part, code that would run past the
end of the 64-bit address space) raises :class:`JitDumpError`, the only error this module raises on bad
input. Reads never go past the size the file has (nor past a caller's ``max_size``), so record sizes and
counts written in the file cannot make the reader allocate more than the file holds.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from optrace.errors import MalformedInput

MAGIC = 0x4A695444  # "JiTD" as a u32 in the writer's byte order
MAGIC_SWAPPED = 0x4454694A
VERSION = 1
FLAG_ARCH_TIMESTAMP = 1  # timestamps are TSC, not CLOCK_MONOTONIC
HEADER = "IIIIIIQQ"
HEADER_SIZE = struct.calcsize("<" + HEADER)  # 40
PREFIX = "IIQ"
PREFIX_SIZE = 16
MAX_HEADER_SIZE = 1 << 20

CODE_LOAD, CODE_MOVE, CODE_DEBUG_INFO, CODE_CLOSE, CODE_UNWINDING_INFO = range(5)
LOAD_FIXED = "IIQQQQ"  # pid, tid, vma, code_addr, code_size, code_index
MOVE_FIXED = "IIQQQQQ"  # pid, tid, vma, old_code_addr, new_code_addr, code_size, code_index
DEBUG_FIXED = "QQ"  # code_addr, nr_entry
DEBUG_ENTRY = "Qii"  # addr, lineno, discrim, then a NUL-terminated file name
UNWIND_FIXED = "QQQ"  # unwinding_size, eh_frame_hdr_size, mapped_size
SAME_FILE = b"\xff"  # a debug entry name meaning "same file as the previous entry"
CHUNK = 4 << 20
ADDRESS_LIMIT = 1 << 64


class JitDumpError(MalformedInput):
    """Not a jitdump, or a corrupt record (with its byte offset)."""


@dataclass(frozen=True)
class JitDumpHeader:
    byte_order: str  # "<" or ">" (the writer's)
    version: int
    total_size: int
    elf_mach: int
    pid: int
    timestamp: int
    flags: int

    @property
    def monotonic(self) -> bool:
        return not self.flags & FLAG_ARCH_TIMESTAMP


@dataclass(frozen=True)
class CodeLoad:
    timestamp: int
    pid: int
    tid: int
    vma: int
    code_addr: int
    code_size: int
    code_index: int
    name: str
    code: bytes | None  # None when the record carries no code bytes


@dataclass(frozen=True)
class CodeMove:
    timestamp: int
    pid: int
    tid: int
    vma: int
    old_code_addr: int
    new_code_addr: int
    code_size: int
    code_index: int


@dataclass(frozen=True)
class DebugEntry:
    address: int
    lineno: int
    discrim: int
    filename: str


@dataclass(frozen=True)
class DebugInfo:
    timestamp: int
    code_addr: int
    entries: tuple[DebugEntry, ...]


@dataclass(frozen=True)
class CodeClose:
    timestamp: int


@dataclass(frozen=True)
class UnwindingInfo:
    timestamp: int
    unwinding_size: int
    eh_frame_hdr_size: int
    mapped_size: int


JitRecord = CodeLoad | CodeMove | DebugInfo | CodeClose | UnwindingInfo


def parse_header(data: bytes) -> JitDumpHeader:
    if len(data) < HEADER_SIZE:
        raise JitDumpError(f"truncated header ({len(data)} of {HEADER_SIZE} bytes)")
    (magic,) = struct.unpack_from("<I", data)
    if magic == MAGIC:
        order = "<"
    elif magic == MAGIC_SWAPPED:
        order = ">"
    else:
        raise JitDumpError(f"bad magic 0x{magic:08x} (not a jitdump)")
    _, version, total_size, elf_mach, _pad, pid, timestamp, flags = struct.unpack_from(order + HEADER, data)
    if version != VERSION:
        raise JitDumpError(f"unsupported jitdump version {version} (expected {VERSION})")
    if flags & ~FLAG_ARCH_TIMESTAMP:
        raise JitDumpError(f"unknown header flags 0x{flags:x}")
    if not HEADER_SIZE <= total_size <= MAX_HEADER_SIZE:
        raise JitDumpError(f"bad header size {total_size}")
    return JitDumpHeader(order, version, total_size, elf_mach, pid, timestamp, flags)


def read_header(fd: int) -> JitDumpHeader:
    """The header of the jitdump open at ``fd``."""
    return parse_header(os.pread(fd, HEADER_SIZE, 0))


def _check_span(address: int, size: int, what: str, offset: int) -> None:
    if address + size >= ADDRESS_LIMIT:
        raise JitDumpError(f"{what} record at offset {offset} puts code past the end of the address space")


def _cstring(data: bytes | memoryview, start: int, end: int, offset: int) -> tuple[bytes, int]:
    """The NUL-terminated string at ``start`` (before ``end``) and the index after its NUL."""
    nul = bytes(data[start:end]).find(b"\0")
    if nul < 0:
        raise JitDumpError(f"unterminated string in record at offset {offset}")
    return bytes(data[start : start + nul]), start + nul + 1


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def parse_record(order: str, rid: int, timestamp: int, body: bytes, offset: int) -> JitRecord | None:
    """Decode one record payload (after the prefix); None for ids this reader does not know."""
    try:
        if rid == CODE_LOAD:
            return _parse_load(order, timestamp, body, offset)
        if rid == CODE_MOVE:
            move = CodeMove(timestamp, *struct.unpack_from(order + MOVE_FIXED, body))
            _check_span(move.new_code_addr, move.code_size, "move", offset)
            return move
        if rid == CODE_DEBUG_INFO:
            return _parse_debug(order, timestamp, body, offset)
        if rid == CODE_CLOSE:
            return CodeClose(timestamp)
        if rid == CODE_UNWINDING_INFO:
            return UnwindingInfo(timestamp, *struct.unpack_from(order + UNWIND_FIXED, body))
    except struct.error:
        raise JitDumpError(f"record {rid} at offset {offset} is shorter than its fixed part") from None
    return None


def _parse_load(order: str, timestamp: int, body: bytes, offset: int) -> CodeLoad:
    fixed = struct.calcsize(order + LOAD_FIXED)
    pid, tid, vma, code_addr, code_size, code_index = struct.unpack_from(order + LOAD_FIXED, body)
    _check_span(code_addr, code_size, "load", offset)
    name, after = _cstring(body, fixed, len(body), offset)
    if code_size > len(body) - after:
        code = None  # a writer that leaves the code out (e.g. size-only records)
    else:
        code = bytes(body[len(body) - code_size :]) if code_size else b""
    return CodeLoad(timestamp, pid, tid, vma, code_addr, code_size, code_index, _decode(name), code)


def _parse_debug(order: str, timestamp: int, body: bytes, offset: int) -> DebugInfo:
    code_addr, count = struct.unpack_from(order + DEBUG_FIXED, body)
    pos = struct.calcsize(order + DEBUG_FIXED)
    entry_size = struct.calcsize(order + DEBUG_ENTRY)
    entries: list[DebugEntry] = []
    filename = ""
    for _ in range(count):
        if pos + entry_size > len(body):
            raise JitDumpError(f"debug record at offset {offset} has fewer entries than it says")
        address, lineno, discrim = struct.unpack_from(order + DEBUG_ENTRY, body, pos)
        raw, pos = _cstring(body, pos + entry_size, len(body), offset)
        if raw != SAME_FILE:
            filename = _decode(raw)
        entries.append(DebugEntry(address, lineno, discrim, filename))
    return DebugInfo(timestamp, code_addr, tuple(entries))


class JitDumpReader:
    """Reads one jitdump incrementally from a trusted fd; see the module docstring."""

    def __init__(self) -> None:
        self.header: JitDumpHeader | None = None
        self.offset = 0
        self.size_seen = 0  # the size the file had at the last read
        self.identity: tuple[int, int] | None = None
        self.records = 0
        self.unknown_records = 0
        self.truncated_bytes = 0  # an incomplete last record seen at the final read

    def read_new(self, fd: int, final: bool = False, max_size: int | None = None,
                 budget: int | None = None) -> Iterator[JitRecord]:
        """Yield the records completed since the previous read (never reading past ``max_size`` bytes of
        the file; with ``budget``, stopping once about that many bytes were read, the rest left for the
        next call). Raises JitDumpError on corruption."""
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if self.identity not in (None, identity) or st.st_size < self.offset:
            self.__init__()  # a different file now: start over
        self.identity = identity
        end = st.st_size if max_size is None else min(st.st_size, max_size)
        self.size_seen = end
        if self.header is None:
            if end < HEADER_SIZE and not final:
                return
            self.header = read_header(fd)
            self.offset = self.header.total_size
        chunk = CHUNK if budget is None else min(CHUNK, budget)
        want = chunk
        start = self.offset
        while self.offset < end and (budget is None or self.offset - start < budget):
            data = os.pread(fd, min(want, end - self.offset), self.offset)
            used, needed = yield from self._parse(data)
            self.offset += used
            want = chunk
            if used == 0:
                if needed == 0 or self.offset + needed > end:
                    break  # a partial prefix or a truncated last record: wait for more bytes
                want = needed  # one record larger than a chunk: read it whole
        done = budget is None or self.offset - start < budget
        self.truncated_bytes = max(0, end - self.offset) if final and done else 0

    def _parse(self, data: bytes) -> Iterator[JitRecord]:
        """Parse the complete records at the start of ``data``.

        Returns (bytes used, size of the incomplete record that follows or 0)."""
        order = self.header.byte_order
        pos = 0
        while pos + PREFIX_SIZE <= len(data):
            rid, size, timestamp = struct.unpack_from(order + PREFIX, data, pos)
            at = self.offset + pos
            if size < PREFIX_SIZE:
                raise JitDumpError(f"record at offset {at} has impossible size {size}")
            if pos + size > len(data):
                return pos, size
            record = parse_record(order, rid, timestamp, data[pos + PREFIX_SIZE : pos + size], at)
            pos += size
            self.records += 1
            if record is None:
                self.unknown_records += 1
            else:
                yield record
        return pos, 0


def read_jitdump(fd: int, max_size: int | None = None) -> tuple[JitDumpHeader, list[JitRecord], JitDumpReader]:
    """Read a whole jitdump (final read)."""
    reader = JitDumpReader()
    records = list(reader.read_new(fd, final=True, max_size=max_size))
    if reader.header is None:
        raise JitDumpError("empty file (not a jitdump)")
    return reader.header, records, reader


def encode_header(pid: int, elf_mach: int, timestamp: int, order: str = "<") -> bytes:
    return struct.pack(order + HEADER, MAGIC, VERSION, HEADER_SIZE, elf_mach, 0, pid, timestamp, 0)


def encode_record(rid: int, timestamp: int, payload: bytes, order: str = "<") -> bytes:
    return struct.pack(order + PREFIX, rid, PREFIX_SIZE + len(payload), timestamp) + payload


def encode_load(load: CodeLoad, order: str = "<") -> bytes:
    fixed = struct.pack(order + LOAD_FIXED, load.pid, load.tid, load.vma, load.code_addr, load.code_size,
                        load.code_index)
    payload = fixed + load.name.encode("utf-8", "replace").replace(b"\0", b" ") + b"\0" + (load.code or b"")
    return encode_record(CODE_LOAD, load.timestamp, payload, order)


def encode_move(move: CodeMove, order: str = "<") -> bytes:
    payload = struct.pack(order + MOVE_FIXED, move.pid, move.tid, move.vma, move.old_code_addr,
                          move.new_code_addr, move.code_size, move.code_index)
    return encode_record(CODE_MOVE, move.timestamp, payload, order)


def encode_debug_info(info: DebugInfo, order: str = "<") -> bytes:
    parts = [struct.pack(order + DEBUG_FIXED, info.code_addr, len(info.entries))]
    for entry in info.entries:
        parts.append(struct.pack(order + DEBUG_ENTRY, entry.address, entry.lineno, entry.discrim))
        parts.append(entry.filename.encode("utf-8", "replace").replace(b"\0", b" ") + b"\0")
    return encode_record(CODE_DEBUG_INFO, info.timestamp, b"".join(parts), order)


def encode_close(timestamp: int, order: str = "<") -> bytes:
    return encode_record(CODE_CLOSE, timestamp, b"", order)
