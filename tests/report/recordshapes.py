"""Record files in the shapes that cost ``report`` the most memory or time per byte of JSON, each as large as
a file's limits let through (``recordfile.JsonBudget``): everything under them is parsed, and decoded too
when it is a record, before anything can be refused.

Each shape is ``make(n)``: the JSON text of ``n`` units (keys, strings, rows, characters...); :func:`largest`
finds the ``n`` that fills a :class:`~optrace.recordfile.Limits` (the estimate is affine in ``n``).
"""
from __future__ import annotations

import itertools
import json
import string
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from optrace.recordfile import HEADER, MAGIC, JsonBudget, Limits
from optrace.schema import encode_record
from synthetic import synthetic_record

NAME_CHARS = (string.ascii_letters + string.digits).encode()
Shape = Callable[[int], bytes]


def names(count: int, width: int = 4) -> Iterator[bytes]:
    """``count`` distinct names of ``width`` characters (62**4: 14.7M of 4)."""
    return map(bytes, itertools.islice(itertools.product(NAME_CHARS, repeat=width), count))


def listed(items: Iterator[bytes] | list[bytes], open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ + b",".join(items) + close


def many_keys(n: int) -> bytes:  # one object, n distinct keys
    return listed((b'"%s":0' % name for name in names(n)), b"{", b"}")


def keys_and_strings(n: int) -> bytes:  # distinct keys, distinct string values
    return listed((b'"%s":"%s"' % (name, name) for name in names(n)), b"{", b"}")


def objects_of_one_key(n: int) -> bytes:  # n objects, each its own key
    return listed(b'{"%s":0}' % name for name in names(n))


def nested_objects(n: int) -> bytes:  # objects three deep, distinct keys at each level
    return listed(b'{"%s":{"%s":{"%s":0}}}' % (name, name, name) for name in names(n))


def many_strings(n: int) -> bytes:  # distinct 13-character strings (64-byte objects)
    return listed(b'"abcdefghi%s"' % name for name in names(n))


def many_ints(n: int) -> bytes:
    return listed(b"%d" % (10 ** 12 + i) for i in range(n))


def many_floats(n: int) -> bytes:
    return listed(b"%d.5" % (10 ** 8 + i) for i in range(n))


def long_ints(n: int) -> bytes:  # n integers of 600 digits (just under the reader's cap of 640)
    return listed([b"9" * 600] * n)


def too_long_ints(n: int) -> bytes:  # n integers of 4300 digits (Python's own cap)
    return listed([b"9" * 4300] * n)


def long_float(n: int) -> bytes:  # one number of n digits
    return b"[0." + b"0" * n + b"1]"


def lists_of_one(n: int) -> bytes:
    return listed([b"[0]"] * n)


def empty_objects(n: int) -> bytes:
    return listed([b"{}"] * n)


def deep_lists(n: int) -> bytes:
    return b"[" * n + b"]" * n


def long_string(n: int) -> bytes:
    return b'"' + b"a" * n + b'"'


def long_escaped_string(n: int) -> bytes:  # built by growing, as a string with escapes is
    return b'"' + b"a\\n" * n + b'"'


def wide_escape_string(n: int) -> bytes:  # ASCII text; the string becomes 4 bytes a character at its end
    return b'"' + b"a" * n + b'\\ud83d\\ude00"'


def wide_text_string(n: int) -> bytes:  # the text itself 4 bytes a character, and one string as long
    return b'["\xf0\x9f\x98\x80",' + long_string(n) + b"]"


def many_wide_strings(n: int) -> bytes:
    return listed([b'"\xf0\x9f\x98\x80a"'] * n)


def many_wide_escapes(n: int) -> bytes:  # ASCII text; n strings each made wide by an escape
    return listed([b'"\\u4e00a"'] * n)


def quotes_then_wide_escape(n: int) -> bytes:  # the string's start hidden behind n escaped quotes
    return b'"' + b'\\"' * n + b'\\u4e00"'


def record_with(field: str, value: bytes) -> bytes:
    """The synthetic record's JSON (tests/report/synthetic.py) with one field's JSON replaced."""
    document = encode_record(synthetic_record())
    document[field] = "@"
    return json.dumps(document, separators=(",", ":")).encode().replace(b'"@"', value)


def sample_rows(n: int) -> bytes:  # a record of n samples (format 2's table), stackless, 2-character comms
    return record_with("samples", b'{"pid":%s,"comm":%s,"frames":{"lengths":%s,"values":[]},"count":%s}' % (
        listed([b"7"] * n), listed([b'"cc"'] * n), listed([b"0"] * n), listed([b"1"] * n)))


def sample_rows_with_stacks(n: int) -> bytes:  # n samples of distinct pids and one-frame stacks
    return record_with("samples", b'{"pid":%s,"comm":%s,"frames":{"lengths":%s,"values":%s},"count":%s,"tid":%s}' % (
        listed(b"%d" % (1000 + i % 4_000_000) for i in range(n)), listed([b'"cc"'] * n), listed([b"1"] * n),
        listed([b"0"] * n), listed([b"1"] * n), listed([b"0"] * n)))


def frame_rows(n: int) -> bytes:  # n distinct frames (format 2's table)
    return record_with("frames", b'{"symbol":%s,"dso":%s,"address":%s}' % (
        listed(b'"%s"' % name for name in names(n)), listed([b'"/x"'] * n), listed(b"%d" % i for i in range(n))))


def sample_objects(n: int) -> bytes:  # format 1: a record of n sample objects
    return record_with("samples", listed([b'{"pid":7,"comm":"cc","frames":[],"count":1}'] * n))


def pids_of_a_call(n: int) -> bytes:  # a uprobe's count for n distinct pids
    keys = listed((b'"%d":1' % (1000 + i) for i in range(n)), b"{", b"}")
    return record_with("calls", b'[{"probe":"c:write","binary":"/x","symbol":"write","offset":0,"calls":1,'
                                b'"per_pid":%s}]' % keys)


SHAPES: dict[str, Shape] = {shape.__name__: shape for shape in [
    many_keys, keys_and_strings, objects_of_one_key, nested_objects, many_strings, many_ints, many_floats,
    long_ints, too_long_ints, long_float, lists_of_one, empty_objects, deep_lists, long_string,
    long_escaped_string, wide_escape_string, wide_text_string, many_wide_strings, many_wide_escapes,
    quotes_then_wide_escape, sample_rows,
    sample_rows_with_stacks, frame_rows, sample_objects, pids_of_a_call]}
RECORDS = {"sample_rows", "sample_rows_with_stacks", "frame_rows", "sample_objects", "pids_of_a_call"}


class UNLIMITED:
    """A file's source that no estimate goes past."""

    limits = Limits(payload_bytes=1 << 62, memory_bytes=1 << 62)


def estimate(payload: bytes, parse: bool = False) -> int:
    """The reader's estimate of ``payload`` (with ``parse``, its tables' rows too: for small payloads)."""
    budget = JsonBudget(UNLIMITED)  # type: ignore[arg-type]
    for start in range(0, len(payload), 1 << 20):
        budget.take(payload[start:start + (1 << 20)])
    budget.take_wide_strings(payload)
    if parse:
        budget.take_tables(json.loads(payload))
    return budget.estimate()


def largest(shape: Shape, limits: Limits, fill: float = 0.97) -> bytes:
    """``shape(n)`` for the largest ``n`` that stays under ``fill`` of the limits (estimate and payload): found
    from two small sizes (the estimate grows linearly, or a little faster: then ``n`` shrinks until it fits)."""
    sizes = (1000, 2000)
    small, large = (shape(n) for n in sizes)
    measures = (lambda text: estimate(text, parse=shape.__name__ in RECORDS), len)
    per_unit = [(measure(large) - measure(small)) / (sizes[1] - sizes[0]) for measure in measures]
    room = [limit * fill - measure(small) for limit, measure in zip((limits.memory_bytes, limits.payload_bytes),
                                                                    measures)]
    n = sizes[0] + int(min(left / unit for left, unit in zip(room, per_unit) if unit > 0))
    while len(payload := shape(n)) > limits.payload_bytes or estimate(payload) > limits.memory_bytes * fill:
        n = int(n * 0.97)
    return payload


def record_file(path: Path, payload: bytes) -> Path:
    compressed = zlib.compress(payload, 1)
    path.write_bytes(HEADER.pack(MAGIC, 2, zlib.crc32(compressed), len(compressed), len(payload)) + compressed)
    return path
