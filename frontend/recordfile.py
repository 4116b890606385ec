"""The record file `optrace record` writes and `optrace report` reads.

Layout (all integers little-endian)::

    magic  b"OPTRDATA"      8 bytes
    u32    format version
    u32    CRC32 of the compressed payload
    u64    compressed payload length
    u64    uncompressed payload length
    zlib-compressed JSON of the Record

The reader trusts nothing: every length is checked against the file size and a cap before memory is
allocated, the payload is decompressed with a bound, and the JSON is validated field by field against the
dataclasses in :mod:`optrace.frontend.model`, so any bad input ends in one :class:`RecordFileError`.
"""
from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from pathlib import Path

from optrace.frontend.errors import OptraceError
from optrace.frontend.model import Record
from optrace.frontend.schema import SchemaError, decode, encode
from optrace.fileaccess import printable
from optrace.outputfile import write_atomically

MAGIC = b"OPTRDATA"
PERF_MAGIC = b"PERFILE2"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
# A record of a long system-wide run is a few MB of JSON; this bounds what a hostile file can make us allocate.
MAX_PAYLOAD_BYTES = 256 << 20


class RecordFileError(OptraceError):
    """A record file that cannot be read or written; the message is one line and says what to do."""


def write_record(record: Record, path: str | os.PathLike[str]) -> None:
    """Write `record` atomically (:mod:`optrace.outputfile`); a previous file is kept as ``<name>.old``
    (like perf), and under sudo the file is given to the invoking user."""
    try:
        write_atomically(path, _serialize(record), keep_previous=True)
    except OSError as exc:
        raise RecordFileError(f"cannot write {printable(path)}: {exc.strerror or exc}") from None


def read_record(path: str | os.PathLike[str]) -> Record:
    """Read and validate a record file; any problem raises RecordFileError with a one-line message."""
    shown = printable(path)
    raw = _read_payload(Path(path), shown)
    try:
        document = json.loads(raw)
        return decode(document, Record)
    except SchemaError as exc:
        raise RecordFileError(f"{shown} is corrupt ({exc}): record it again") from None
    except (ValueError, RecursionError) as exc:
        raise RecordFileError(f"{shown} is corrupt (bad JSON: {type(exc).__name__}): record it again") from None


def _serialize(record: Record) -> bytes:
    payload = json.dumps(encode(record), separators=(",", ":")).encode("ascii")
    compressed = zlib.compress(payload, 6)
    header = HEADER.pack(MAGIC, FORMAT_VERSION, zlib.crc32(compressed), len(compressed), len(payload))
    return header + compressed


def _read_payload(path: Path, shown: str) -> bytes:
    """Open without blocking (a FIFO must not hang us), check the header and return the JSON bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RecordFileError(f"no such file: {shown}; record one with optrace record") from None
    except OSError as exc:
        raise RecordFileError(f"cannot read {shown}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory, not a record file" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise RecordFileError(f"{shown} is {kind}")
    with os.fdopen(fd, "rb") as stream:
        header = stream.read(HEADER.size)
        compressed_len, raw_len, crc = _check_header(header, info.st_size, shown)
        compressed = stream.read(compressed_len)
    if len(compressed) != compressed_len:
        raise RecordFileError(f"{shown} is truncated (incomplete optrace record): record it again")
    if zlib.crc32(compressed) != crc:
        raise RecordFileError(f"{shown} is corrupt (checksum mismatch): record it again")
    return _decompress(compressed, raw_len, shown)


def _check_header(header: bytes, size: int, shown: str) -> tuple[int, int, int]:
    """Validate the fixed header; returns (compressed length, uncompressed length, crc)."""
    if header.startswith(PERF_MAGIC):
        raise RecordFileError(f"{shown} is a perf.data file: use perf report")
    if not header:
        raise RecordFileError(f"{shown} is empty: record it again")
    if header[: len(MAGIC)] != MAGIC[: len(header)]:
        raise RecordFileError(f"{shown} is not an optrace record file")
    if len(header) < HEADER.size:
        raise RecordFileError(f"{shown} is truncated (incomplete optrace record): record it again")
    _, version, crc, compressed_len, raw_len = HEADER.unpack(header)
    if version > FORMAT_VERSION:
        raise RecordFileError(f"{shown} was recorded by a newer optrace (format {version}): upgrade optrace")
    if version < 1:
        raise RecordFileError(f"{shown} is corrupt (format version {version}): record it again")
    if raw_len > MAX_PAYLOAD_BYTES or compressed_len > MAX_PAYLOAD_BYTES:
        raise RecordFileError(f"{shown} is corrupt (payload larger than {MAX_PAYLOAD_BYTES >> 20} MiB)")
    if HEADER.size + compressed_len > size:
        raise RecordFileError(f"{shown} is truncated (incomplete optrace record): record it again")
    if HEADER.size + compressed_len < size:
        raise RecordFileError(f"{shown} is corrupt (trailing data after the record): record it again")
    return compressed_len, raw_len, crc


def _decompress(compressed: bytes, raw_len: int, shown: str) -> bytes:
    """Inflate at most raw_len + 1 bytes, so a zip bomb cannot use more memory than the header declared."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, raw_len + 1)
    except zlib.error:
        raise RecordFileError(f"{shown} is corrupt (bad compressed data): record it again") from None
    if len(raw) != raw_len or not inflater.eof or inflater.unused_data:
        raise RecordFileError(f"{shown} is corrupt (payload size mismatch): record it again")
    return raw
