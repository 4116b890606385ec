"""The record file `optrace record` writes and `optrace report` reads.

Layout (all integers little-endian)::

    magic  b"OPTRDATA"      8 bytes
    u32    format version
    u32    CRC32 of the compressed payload
    u64    compressed payload length
    u64    uncompressed payload length
    zlib-compressed JSON of the Record (``schema.encode_record``: frames and samples as tables)

The reader trusts nothing (``report`` may be given a file another user made): the file is opened under
:mod:`optrace.fileaccess`'s rule (no FIFO, device or pseudo-file-system file, bounded size and read time),
every length is checked against the file size and a cap before memory is allocated, the payload is
inflated in chunks that are counted as they come, so a payload holding more JSON containers or values than
any real record is refused before ``json.loads`` builds a single object, and the JSON is validated field by
field against the dataclasses in :mod:`optrace.model`. Any bad input ends in one
:class:`RecordFileError`.

Caps (:class:`Limits`), from real records: a 60 s system-wide record at 999 Hz on a busy 2-CPU machine
(compiles, a 500-function workload, Python: 120k samples, 73k stacks, 119k frames) is 21.8 MB of JSON with
433k ``[``/``{`` bytes and 1.78M values (``,`` plus containers, counted as bytes, so brackets and commas in
names count too: an over-estimate, the safe side); ``report`` of it peaks at 155 MB. A file owned by
another user is held to 2.2-2.9 times that (2 minutes of such a run, 20 at the default 99 Hz): files built
to those caps in the worst shapes tried (a million one-sample rows, 8M distinct strings, one 64 MiB
string) peak under 500 MB. The user's own files (``record`` gives them to the sudo user) may be four
times larger, so long recordings stay readable. Those figures are of format 1 (an object per frame and
sample); format 2's tables hold the same rows in fewer bytes and values and almost no containers (91k samples
of 83k stacks: 9.1 MB, 184k containers, 1.46M values as objects; 5.7 MB, 479, 1.37M as tables), so every real
record is further under the caps, and the caps still bound what a hand-made file of either shape can build.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import struct
import typing
import zlib
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from optrace.fileaccess import FilePolicy, RefusedFile, open_file, printable, reader_for
from optrace.errors import OptraceError
from optrace.heap import gc_paused
from optrace.model import Record
from optrace.schema import SchemaError, decode, encode, table_class, table_columns
from optrace.outputdir import invoking_uid
from optrace.outputfile import write_atomically

MAGIC = b"OPTRDATA"
PERF_MAGIC = b"PERFILE2"
FORMAT_VERSION = 3  # 3: Python frames (Frame.python, Frame.line, RecordMeta.python); 2: frames and samples as tables (optrace.schema.table_columns); 1 and 2 are still read
HEADER = struct.Struct("<8sIIQQ")
INFLATE_CHUNK = 1 << 20


class RecordFileError(OptraceError):
    """A record file that cannot be read or written; the message is one line and says what to do."""


@dataclass(frozen=True)
class Limits:
    """What ``report`` reads from one record file, checked before ``json.loads`` builds anything."""

    payload_bytes: int  # the JSON text
    containers: int  # '[' and '{' bytes in it
    values: int  # ',' bytes plus containers: every value but the first of each container


FOREIGN_LIMITS = Limits(payload_bytes=64 << 20, containers=1_000_000, values=4_000_000)
OWN_LIMITS = Limits(payload_bytes=256 << 20, containers=4_000_000, values=16_000_000)
MAX_PAYLOAD_BYTES = OWN_LIMITS.payload_bytes
# The user named the file: a symlink they made is followed (magic links never are); the rest of the rule holds.
RECORD_POLICY = FilePolicy(max_size=HEADER.size + MAX_PAYLOAD_BYTES, follow_symlinks=True, read_seconds=30.0)


@dataclass(frozen=True)
class Source:
    """The file being read: its name for messages, and the owner when that is another user."""

    shown: str
    foreign_owner: int | None

    @property
    def limits(self) -> Limits:
        return OWN_LIMITS if self.foreign_owner is None else FOREIGN_LIMITS

    def too_much(self, what: str) -> RecordFileError:
        if self.foreign_owner is None:
            return RecordFileError(f"{self.shown} is corrupt or from too long a run ({what}): record it again,"
                                   f" shorter or at a lower -F")
        return RecordFileError(f"{self.shown} is owned by uid {self.foreign_owner} and holds {what}, more than"
                               f" report reads from another user's file: if you trust it, report a copy of it")


def foreign_owner(uid: int) -> int | None:
    """None for the user's own file (theirs, or under sudo the invoking user's, as `record` leaves it)."""
    return None if uid in (os.geteuid(), invoking_uid()) else uid


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
    raw = _read_payload(os.fspath(path), shown)
    try:
        with gc_paused():  # a million acyclic objects: the collections they trigger cost a fifth of a report
            document = json.loads(raw, parse_constant=_no_constant)
            del raw
            return decode(document, Record)
    except SchemaError as exc:
        raise RecordFileError(f"{shown} is corrupt ({printable(exc)}): record it again") from None
    except (ValueError, RecursionError) as exc:
        raise RecordFileError(f"{shown} is corrupt (bad JSON: {type(exc).__name__}): record it again") from None


def _no_constant(name: str) -> NoReturn:
    """json accepts NaN and Infinity, which are not JSON and never in a record."""
    raise ValueError(f"{name} is not a JSON number")


SERIALIZE_CHUNK = 4096  # list items encoded, written and compressed at a time


def _serialize(record: Record) -> bytes:
    """The file's bytes. The JSON is made and compressed a piece at a time (a list's items a chunk at a
    time): a record of 100k samples held whole as encoded dicts and one JSON string was 35 MB of peak RSS
    on top of the record; the bytes are those of ``json.dumps(encode_record(record))``, compressed."""
    compressor = zlib.compressobj(6)
    pieces: list[bytes] = []
    length = 0
    for text in _json_pieces(record):
        data = text.encode("ascii")
        length += len(data)
        pieces.append(compressor.compress(data))
    pieces.append(compressor.flush())
    compressed = b"".join(pieces)
    header = HEADER.pack(MAGIC, FORMAT_VERSION, zlib.crc32(compressed), len(compressed), length)
    return header + compressed


def _json_pieces(record: Record) -> Iterator[str]:
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    hints = typing.get_type_hints(Record)
    yield "{"
    for i, field in enumerate(dataclasses.fields(record)):
        yield f'{"," if i else ""}{dumps(field.name)}:'
        value = getattr(record, field.name)
        table = table_class(hints[field.name])
        if table is not None:
            yield from _object_pieces(table_columns(value, table), dumps)
        elif isinstance(value, list):
            yield from _list_pieces(map(encode, value), dumps)
        else:
            yield dumps(encode(value))
    yield "}"


def _object_pieces(columns: dict[str, Any], dumps: Callable[[Any], str]) -> Iterator[str]:
    """A table (schema.table_columns): its columns are iterators, written a chunk at a time."""
    yield "{"
    for i, (name, column) in enumerate(columns.items()):
        yield f'{"," if i else ""}{dumps(name)}:'
        yield from _object_pieces(column, dumps) if isinstance(column, dict) else _list_pieces(column, dumps)
    yield "}"


def _list_pieces(items: Iterator[Any], dumps: Callable[[Any], str]) -> Iterator[str]:
    yield "["
    separator = ""
    while chunk := list(itertools.islice(items, SERIALIZE_CHUNK)):
        yield separator + dumps(chunk)[1:-1]
        separator = ","
    yield "]"


def _read_payload(path: str, shown: str) -> bytearray:
    """Open under :data:`RECORD_POLICY`, check the header and return the JSON bytes."""
    try:
        fd = open_file(path, RECORD_POLICY, shown=shown)
    except RefusedFile as refused:
        _refuse(refused, shown)
    if fd is None:
        raise RecordFileError(f"no such file: {shown}; record one with optrace record")
    try:
        with reader_for(fd, RECORD_POLICY, shown) as stream:
            source = Source(shown, foreign_owner(os.fstat(stream.fd).st_uid))
            header = stream.read(HEADER.size)
            compressed_len, raw_len, crc = _check_header(header, stream.size, source)
            compressed = stream.read(compressed_len)
    except OSError as exc:
        raise RecordFileError(f"cannot read {shown}: {printable(exc.strerror or exc)}") from None
    if len(compressed) != compressed_len:
        raise RecordFileError(f"{shown} is truncated (incomplete optrace record): record it again")
    if zlib.crc32(compressed) != crc:
        raise RecordFileError(f"{shown} is corrupt (checksum mismatch): record it again")
    return _decompress(compressed, raw_len, source)


def _refuse(refused: RefusedFile, shown: str) -> NoReturn:
    if refused.reason == "unreadable":
        raise RecordFileError(f"cannot read {shown}: {refused.detail.removeprefix('cannot open: ')}") from None
    if refused.reason == "not_regular" and refused.detail == "is a directory":
        raise RecordFileError(f"{shown} is a directory, not a record file") from None
    raise RecordFileError(f"{shown} {refused.detail}") from None


def _check_header(header: bytes, size: int, source: Source) -> tuple[int, int, int]:
    """Validate the fixed header; returns (compressed length, uncompressed length, crc)."""
    shown = source.shown
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
    cap = source.limits.payload_bytes
    if raw_len > cap or compressed_len > cap:
        raise source.too_much(f"a payload larger than {cap >> 20} MiB")
    if HEADER.size + compressed_len > size:
        raise RecordFileError(f"{shown} is truncated (incomplete optrace record): record it again")
    if HEADER.size + compressed_len < size:
        raise RecordFileError(f"{shown} is corrupt (trailing data after the record): record it again")
    return compressed_len, raw_len, crc


def _decompress(compressed: bytes, raw_len: int, source: Source) -> bytearray:
    """Inflate in chunks, never past raw_len + 1 bytes (the header's word, itself capped), and count the
    JSON's containers and values as they come: a zip bomb of tiny lists stops at the cap, after a few MB."""
    shown = source.shown
    inflater = zlib.decompressobj()
    raw = bytearray()
    budget = JsonBudget(source)
    pending = compressed
    try:
        while len(raw) <= raw_len:
            chunk = inflater.decompress(pending, min(INFLATE_CHUNK, raw_len + 1 - len(raw)))
            pending = inflater.unconsumed_tail
            if not chunk:
                break
            budget.take(chunk)
            raw += chunk
    except zlib.error:
        raise RecordFileError(f"{shown} is corrupt (bad compressed data): record it again") from None
    if len(raw) != raw_len or not inflater.eof or inflater.unused_data:
        raise RecordFileError(f"{shown} is corrupt (payload size mismatch): record it again")
    return raw


class JsonBudget:
    """Counts what ``json.loads`` would build from JSON text, by bytes (strings included: an
    over-estimate), and refuses the text once past its source's :class:`Limits`."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.containers = 0
        self.values = 0

    def take(self, text: bytes | bytearray) -> None:
        containers = text.count(b"[") + text.count(b"{")
        self.containers += containers
        self.values += containers + text.count(b",")
        limits = self.source.limits
        if self.containers > limits.containers or self.values > limits.values:
            raise self.source.too_much(f"over {limits.containers} JSON containers or {limits.values} values")
