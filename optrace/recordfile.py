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
inflated in chunks whose cost is estimated as they come (:class:`JsonBudget`: its values, object keys, text
and wide strings, from byte counts; then its tables' rows, before they are decoded), so a payload that would
take more memory than its limit is refused before ``json.loads`` builds a single object, and the JSON is
validated field by field against the dataclasses in :mod:`optrace.model`. Any bad input ends in one
:class:`RecordFileError`.

Limits (:class:`Limits`): another user's file may take 400 MiB by the estimate, the user's own file (``record``
gives them to the sudo user) 1600 MiB, so long recordings stay readable. Every shape tried, each as large as the
limits let through (tests/report/recordshapes.py: a million distinct keys, small objects, strings, numbers,
a 64 MiB string made wide by one character, table rows...), peaks at 393 MiB at most in ``report`` for another
user's file (1.47 GiB for one's own) and takes at most 2.3 s of CPU (10.6 s): the estimate charges each
token what the costliest shape of it took (see VALUE_BYTES). A 60 s system-wide record at 999 Hz on a busy
2-CPU machine (79k samples: 77.5k frames, 42k distinct samples of 31 frames on average) is 14.7 MB of JSON
(format 3), estimated at 236 MiB; ``report`` of it peaks at 133 MB. So another user's file holds 1.7 such
minutes (17 at the default 99 Hz), one's own 6.8; the same minute as format 1 (an object per frame and
sample, before format 2's tables) is 22 MB, estimated at 335 MiB (its 850k object keys count): 1.2 and 4.8.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import re
import struct
import sys
import typing
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from optrace.fileaccess import FilePolicy, RefusedFile, open_file, printable, reader_for
from optrace.errors import OptraceError
from optrace.heap import gc_paused
from optrace.model import Record
from optrace.recordupgrade import upgraded
from optrace.schema import TABLE_LENGTHS, SchemaError, decode, encode, table_class, table_columns
from optrace.outputdir import invoking_uid
from optrace.outputfile import check_writable, write_atomically

MAGIC = b"OPTRDATA"
PERF_MAGIC = b"PERFILE2"
# 4: frame kinds (Frame.kind, RecordMeta.runtimes, Record.sources; optrace.recordupgrade reads 1-3); 3: Python
# frames; 2: frames and samples as tables (optrace.schema.table_columns)
FORMAT_VERSION = 4
HEADER = struct.Struct("<8sIIQQ")
INFLATE_CHUNK = 1 << 20


class RecordFileError(OptraceError):
    """A record file that cannot be read or written; the message is one line and says what to do."""


@dataclass(frozen=True)
class Limits:
    """What ``report`` reads from one record file, checked before ``json.loads`` builds anything."""

    payload_bytes: int  # the JSON text
    memory_bytes: int  # what reading it may cost, as JsonBudget estimates it from the text


FOREIGN_LIMITS = Limits(payload_bytes=64 << 20, memory_bytes=400 << 20)
OWN_LIMITS = Limits(payload_bytes=256 << 20, memory_bytes=1600 << 20)
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


def check_record_output(path: str | os.PathLike[str]) -> None:
    """RecordFileError before a recording when :func:`write_record` would refuse ``path`` after it."""
    with _cannot_write(path):
        check_writable(path)


def write_record(record: Record, path: str | os.PathLike[str]) -> None:
    """Write `record` atomically (:mod:`optrace.outputfile`); a previous file is kept as ``<name>.old``
    (like perf), and under sudo the file is given to the invoking user."""
    data = _serialize(record)
    with _cannot_write(path):
        write_atomically(path, data, keep_previous=True)


@contextmanager
def _cannot_write(path: str | os.PathLike[str]) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise RecordFileError(f"cannot write {printable(path)}: {exc.strerror or exc}") from None


def read_record(path: str | os.PathLike[str]) -> Record:
    """Read and validate a record file; any problem raises RecordFileError with a one-line message."""
    shown = printable(path)
    raw, budget, version = _read_payload(os.fspath(path), shown)
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads decodes bytes
        del raw  # gone before the objects are built
        with gc_paused(), _digits_capped():  # gc: a million acyclic objects, collections cost a fifth of a report
            document = json.loads(text, parse_constant=_no_constant)
            del text
            budget.take_tables(document)
            return decode(upgraded(document, version), Record)
    except SchemaError as exc:
        raise RecordFileError(f"{shown} is corrupt ({printable(exc)}): record it again") from None
    except (ValueError, RecursionError) as exc:
        raise RecordFileError(f"{shown} is corrupt (bad JSON: {type(exc).__name__}): record it again") from None


MAX_INT_DIGITS = 640  # the least sys.set_int_max_str_digits takes; a record's integers have at most 20


@contextmanager
def _digits_capped() -> Iterator[None]:
    """JSON integers of at most MAX_INT_DIGITS digits: converting digits is quadratic, and 64 MiB of numbers of
    4300 digits (Python's default cap) took 1.25 s of CPU to parse, 0.29 s at 640."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(MAX_INT_DIGITS)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(previous)


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


def _read_payload(path: str, shown: str) -> tuple[bytearray, JsonBudget, int]:
    """Open under :data:`RECORD_POLICY`, check the header and return the JSON bytes, what they cost and the
    format's version."""
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
            compressed_len, raw_len, crc, version = _check_header(header, stream.size, source)
            compressed = stream.read(compressed_len)
    except OSError as exc:
        raise RecordFileError(f"cannot read {shown}: {printable(exc.strerror or exc)}") from None
    if len(compressed) != compressed_len:
        raise RecordFileError(f"{shown} is truncated (incomplete optrace record): record it again")
    if zlib.crc32(compressed) != crc:
        raise RecordFileError(f"{shown} is corrupt (checksum mismatch): record it again")
    return (*_decompress(compressed, raw_len, source), version)


def _refuse(refused: RefusedFile, shown: str) -> NoReturn:
    if refused.reason == "unreadable":
        raise RecordFileError(f"cannot read {shown}: {refused.detail.removeprefix('cannot open: ')}") from None
    if refused.reason == "not_regular" and refused.detail == "is a directory":
        raise RecordFileError(f"{shown} is a directory, not a record file") from None
    raise RecordFileError(f"{shown} {refused.detail}") from None


def _check_header(header: bytes, size: int, source: Source) -> tuple[int, int, int, int]:
    """Validate the fixed header; returns (compressed length, uncompressed length, crc, format version)."""
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
    return compressed_len, raw_len, crc, version


def _decompress(compressed: bytes, raw_len: int, source: Source) -> tuple[bytearray, JsonBudget]:
    """Inflate in chunks, never past raw_len + 1 bytes (the header's word, itself capped), and estimate what
    the JSON costs as it comes (:class:`JsonBudget`): a zip bomb of tiny lists stops at the limit, after
    inflating a few tens of MB."""
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
    budget.take_wide_strings(raw)
    return raw, budget


# What reading the JSON costs per token of its text, the most any shape took (CPython 3.11, peak RSS over the
# text itself, 1M to 2M tokens; the shapes are in tests/report/recordshapes.py): a value (a ',' or '['/'{'
# byte, so every value but the first of each container) up to VALUE_BYTES (a list of 13-character strings:
# 72 B, of 1-item lists: 60 B an item, ints: 49, floats: 49), an object key (':') up to KEY_BYTES more
# ({"a":0} objects with distinct keys: 304 B each, 2 values and a key; json.loads keeps every distinct key
# twice, in its object and in its table of keys seen). The text counts as decoded (1 byte a character, 4
# once a byte is not ASCII) plus the characters of its strings (as many, +25 % for a string with escapes,
# built by growing; 4 bytes each once non-ASCII, or in a string a \u escape past \u00ff makes wide).
# Decoding then makes an object of each row of a table (format 2), ROW_FIELD_BYTES a field, left-out
# fields too (370 B a frame of 8 fields, 210 a sample of 5), while the table's JSON is still held.
VALUE_BYTES = 72
KEY_BYTES = 160
WIDE_CHAR = 4
STRING_GROWTH = 1.25
ROW_FIELD_BYTES = 64
WIDE_ESCAPE = re.compile(rb"\\u(?!00)")  # a character past U+00FF: its string is 2 or 4 bytes a character
UNESCAPED_QUOTE = re.compile(rb'(?<!\\)"')  # a quote no backslash precedes: never inside a string
MAX_WIDE_STEPS = 10_000  # escapes and quotes looked at one by one; past them every string counts as wide


_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b",[{:")  # JsonBudget.take counts the rest


class JsonBudget:
    """Estimates what ``json.loads`` and the decoding would build from JSON text, from byte counts taken as it
    is inflated (in C: brackets, commas and colons in strings count too, an over-estimate, the safe side),
    then the strings made wide and, once parsed, the rows of its tables; refuses the text once past its
    source's :class:`Limits`."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.text_bytes = 0
        self.values = 0
        self.keys = 0
        self.wide_text = False  # a byte that is not ASCII: the decoded text and all its strings are wide
        self.wide_string_bytes = 0
        self.rows_bytes = 0

    def take(self, text: bytes | bytearray) -> None:
        self.text_bytes += len(text)
        structure = text.translate(None, _NOT_STRUCTURE)  # one pass, 3x faster than four counts
        keys = structure.count(b":")
        self.values += len(structure) - keys
        self.keys += keys
        self.wide_text = self.wide_text or not text.isascii()
        self._check()

    def take_wide_strings(self, text: bytes | bytearray) -> None:
        """The whole text once taken: the strings a \\u escape makes wide."""
        self.wide_string_bytes = 0 if self.wide_text else wide_string_bytes(text)
        self._check()

    def take_tables(self, document: Any) -> None:
        """The rows of the parsed document's tables, each an object once decoded."""
        if type(document) is dict:
            for name, fields in _table_fields().items():
                table = document.get(name)
                if type(table) is dict:
                    self.rows_bytes += _table_rows(table) * fields * ROW_FIELD_BYTES
        self._check()

    def estimate(self) -> int:
        """Bytes, the most what was taken so far could cost."""
        width = WIDE_CHAR if self.wide_text else 1
        text = self.text_bytes * width * (1 + STRING_GROWTH)
        wide_strings = self.wide_string_bytes * STRING_GROWTH * (WIDE_CHAR - 1)
        return int(text + wide_strings) + self.values * VALUE_BYTES + self.keys * KEY_BYTES + self.rows_bytes

    def _check(self) -> None:
        limit = self.source.limits.memory_bytes
        if self.estimate() > limit:
            raise self.source.too_much(f"JSON that would take over {limit >> 20} MiB to read")


def wide_string_bytes(text: bytes | bytearray) -> int:
    """The bytes of ASCII JSON's strings that hold a \\u escape past U+00FF, over-estimated: each from the
    last quote before the escape that no backslash precedes to the first such quote after it (any quote
    between is escaped, inside the string). All the text once past MAX_WIDE_STEPS escapes or quotes."""
    total, end, steps = 0, 0, 0
    for escape in WIDE_ESCAPE.finditer(text):
        steps += 1
        if escape.start() < end:
            continue  # in the string already counted
        start = text.rfind(b'"', 0, escape.start())
        while start > 0 and text[start - 1] == ord("\\") and steps <= MAX_WIDE_STEPS:
            steps += 1
            start = text.rfind(b'"', 0, start)
        if steps > MAX_WIDE_STEPS:
            return len(text)
        closing = UNESCAPED_QUOTE.search(text, escape.end())
        end = closing.end() if closing else len(text)
        total += end - max(start, 0)
    return total


@functools.cache
def _table_fields() -> dict[str, int]:
    """The record's fields written as tables, with their classes' numbers of fields."""
    hints = typing.get_type_hints(Record)
    classes = {name: table_class(hint) for name, hint in hints.items()}
    return {name: len(dataclasses.fields(cls)) for name, cls in classes.items() if cls is not None}


def _table_rows(table: dict[str, Any]) -> int:
    """The most rows any column of a table (schema.table_columns) claims; a tuple column's are its lengths."""
    columns = (column.get(TABLE_LENGTHS) if type(column) is dict else column for column in table.values())
    return max((len(column) for column in columns if type(column) is list), default=0)
