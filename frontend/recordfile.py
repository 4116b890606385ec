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

MAGIC = b"OPTRDATA"
PERF_MAGIC = b"PERFILE2"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
# A record of a long system-wide run is a few MB of JSON; this bounds what a hostile file can make us allocate.
MAX_PAYLOAD_BYTES = 256 << 20


class RecordFileError(OptraceError):
    """A record file that cannot be read or written; the message is one line and says what to do."""


def printable(path: str | os.PathLike[str]) -> str:
    """The path as one printable line (a file name may hold newlines or escapes)."""
    return "".join(c if c.isprintable() else "?" for c in str(path))


def write_record(record: Record, path: str | os.PathLike[str]) -> None:
    """Write `record` atomically: the final name holds either the previous file or the complete new one.

    A previous file is kept as ``<name>.old`` (like perf). Under sudo the file is given to the invoking
    user (``SUDO_UID``/``SUDO_GID``) so they can read, move and delete it.
    """
    final = Path(path)
    data = _serialize(record)
    try:
        tmp_name = _write_temp(final, data)
    except OSError as exc:
        raise RecordFileError(f"cannot write {printable(final)}: {exc.strerror or exc}") from None
    try:
        _keep_previous(final)
        os.replace(tmp_name, final)
        _fsync_dir(final.parent)
    except OSError as exc:
        _unlink_quietly(tmp_name)
        raise RecordFileError(f"cannot write {printable(final)}: {exc.strerror or exc}") from None


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


def _write_temp(final: Path, data: bytes) -> str:
    """Write data to a new file beside `final` (same filesystem, so rename is atomic); return its name."""
    import tempfile  # only writers need it; report start-up stays lean

    directory = final.parent if str(final.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), 0o666 & ~_current_umask())
            _give_to_sudo_user(out.fileno())
            os.fsync(out.fileno())
    except BaseException:
        _unlink_quietly(tmp_name)
        raise
    return tmp_name


def _current_umask() -> int:
    """The umask, read without os.umask()'s set-and-restore (which would race with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _give_to_sudo_user(fd: int) -> None:
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if os.geteuid() != 0 or not uid.isdigit():
        return
    os.fchown(fd, int(uid), int(gid) if gid.isdigit() else -1)


def _keep_previous(final: Path) -> None:
    """Make the current file (if a regular file) also reachable as <name>.old, without ever removing it
    from the final name: a hard link, so a crash before the rename leaves the old file in place."""
    try:
        if not stat.S_ISREG(os.lstat(final).st_mode):
            return
    except FileNotFoundError:
        return
    old = final.with_name(final.name + ".old")
    _unlink_quietly(old)
    try:
        os.link(final, old, follow_symlinks=False)
    except OSError:
        pass  # a filesystem without hard links: the new file still replaces the old one atomically


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory if str(directory) else ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(name: str | os.PathLike[str]) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


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
