"""Record files that are valid JSON of nearly the right shape, with values no recording makes: absurd
numbers, NaN and Infinity, wrong types, huge lists, deep nesting. Reading one either gives a Record that
every output format renders, or one RecordFileError line: never another exception (the CLI's exit 70)."""
from __future__ import annotations

import copy
import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optrace.errors import OptraceError
from optrace.model import CallCount, Record
from optrace.recordfile import HEADER, MAGIC, RecordFileError, read_record
from profiletext import FORMATS, render_report
from optrace.frontend.report.rows import ReportOptions
from optrace.schema import encode, encode_record

OPTIONS = [ReportOptions(), ReportOptions(sort=("pid", "symbol"), children=True, percent_limit=1.0)]


def packed_text(text: bytes) -> bytes:
    compressed = zlib.compress(text)
    return HEADER.pack(MAGIC, 1, zlib.crc32(compressed), len(compressed), len(text)) + compressed


def read_document(tmp_path: Path, document: Any) -> Record:
    path = tmp_path / "r.data"
    path.write_bytes(packed_text(json.dumps(document).encode()))  # NaN/Infinity written as such
    return read_record(path)


@pytest.fixture
def base(record: Record) -> Record:
    """The synthetic record (conftest.py) with call counts; encode() gives a fresh document each time."""
    record.calls = [CallCount("c:write", "/lib/libc.so.6", "write", 0x9000, 1234, {100: 1234}, {100: "demo"})]
    return record


def leaf_paths(node: Any, path: tuple = ()) -> list[tuple]:
    """Every place in the document a value can be swapped: containers and scalars alike."""
    places = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            places += leaf_paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            places += leaf_paths(value, path + (i,))
    return places


def replaced(document: dict, path: tuple, value: Any) -> dict:
    node = document
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return document


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = st.one_of(
    st.sampled_from([10 ** 400, -10 ** 400, 1 << 64, -1, (1 << 64) - 1, 1 << 63, -(1 << 31) - 1, 1e308, 1e-308,
                     -0.0, True, False, None, "", "\x1b]0;owned\x07\x1b[2J", "a\nb\rc", "\ud800", [], {}, [[]],
                     {"": None}, "0" * 5000]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.integers(min_value=20, max_value=500).map(nested),
    st.integers(min_value=0, max_value=20_000).map(lambda n: list(range(n))),
    st.lists(st.integers(min_value=-3, max_value=20), max_size=30),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=4),
).map(copy.deepcopy)  # sampled lists and dicts are shared: a later swap inside one must not change it

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def read_and_render(tmp_path: Path, document: Any) -> None:
    """The property: a Record that renders in every format, or one line of RecordFileError."""
    try:
        record = read_document(tmp_path, document)
    except RecordFileError as exc:
        assert "\n" not in str(exc)
        return
    for options in OPTIONS:
        for fmt in FORMATS:
            try:
                render_report(record, options, fmt, "r.data")
            except OptraceError as exc:  # pprof, flame graphs: no samples or stacks to show, said in one line
                assert "\n" not in str(exc), (fmt, exc)


# The two shapes a record's frames and samples can have: tables (what record writes, format 2) and objects
# (format 1, still read).
SHAPES = pytest.mark.parametrize("shape", [encode_record, encode], ids=["tables", "objects"])


@SHAPES
@PROPERTY
@given(data=st.data())
def test_one_value_swapped_anywhere(tmp_path: Path, base: Record, shape, data) -> None:
    document = shape(base)
    path = data.draw(st.sampled_from(leaf_paths(document)))
    read_and_render(tmp_path, replaced(document, path, data.draw(HOSTILE)))


@SHAPES
@PROPERTY
@given(data=st.data())
def test_several_values_swapped(tmp_path: Path, base: Record, shape, data) -> None:
    document = shape(base)
    for _ in range(data.draw(st.integers(min_value=2, max_value=6))):
        places = leaf_paths(document)
        if not places:
            break
        document = replaced(document, data.draw(st.sampled_from(places)), data.draw(HOSTILE))
    read_and_render(tmp_path, document)


@PROPERTY
@given(key=st.one_of(st.text(max_size=25), st.sampled_from(["1_0", " 1", "+1", "١", "-1", "4294967296", "1e3",
                                                           "99999999999999999999999"])),
       value=HOSTILE)
def test_pid_keyed_dicts(tmp_path: Path, base: Record, key: str, value: Any) -> None:
    document = encode(base)
    document["calls"][0]["per_pid"] = {key: value}
    document["calls"][0]["comms"] = {key: value}
    read_and_render(tmp_path, document)


@pytest.mark.parametrize("path", [
    ("samples", 0, "count"), ("samples", 0, "pid"), ("frames", 0, "address"), ("meta", "frequency_hz"),
    ("meta", "total_samples"), ("calls", 0, "calls"), ("calls", 0, "offset"), ("meta", "pids"),
    ("meta", "started"), ("meta", "duration_s"), ("meta", "exit_status"), ("samples", 0, "frames"),
])
@pytest.mark.parametrize("number", [10 ** 400, -(10 ** 400), 1 << 64, -1])
def test_out_of_range_numbers_are_named(tmp_path: Path, base: Record, path: tuple, number: int) -> None:
    document = encode(base)
    if path[-1] in ("pids", "frames"):
        number = [number]
    elif path[-1] == "exit_status" and number == -1:
        return  # -1: killed by SIGHUP, a real exit status
    with pytest.raises(RecordFileError, match=r"is corrupt \(record\..*(out of range|frame index)"):
        read_document(tmp_path, replaced(document, path, number))


def test_numbers_at_the_edges_are_read_and_rendered(tmp_path: Path, base: Record) -> None:
    document = encode(base)
    top = (1 << 64) - 1
    for sample in document["samples"]:
        sample["count"] = top
    document["frames"][0]["address"] = top
    document["meta"]["exit_status"] = -9
    document["calls"][0]["per_pid"] = {"4294967295": top}
    record = read_document(tmp_path, document)
    assert record.samples[0].count == top and record.calls[0].per_pid == {(1 << 32) - 1: top}
    table = render_report(record, ReportOptions(), "table", "r")
    assert "exit status -9" in table and f"{top}" in table


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_not_json(tmp_path: Path, base: Record, text: bytes) -> None:
    raw = json.dumps(encode(base)).replace('"duration_s": 2.5', '"duration_s": ' + text.decode()).encode()
    assert text in raw
    (tmp_path / "r.data").write_bytes(packed_text(raw))
    with pytest.raises(RecordFileError, match=r"bad JSON: ValueError"):
        read_record(tmp_path / "r.data")


def test_overflowing_float_literal_is_out_of_range(tmp_path: Path, base: Record) -> None:
    raw = json.dumps(encode(base)).replace('"started": 1795000000.0', '"started": 1e400').encode()
    assert math.isinf(json.loads(raw)["meta"]["started"])
    (tmp_path / "r.data").write_bytes(packed_text(raw))
    with pytest.raises(RecordFileError, match=r"record\.meta\.started: inf is out of range"):
        read_record(tmp_path / "r.data")


def test_deep_nesting_is_one_error(tmp_path: Path, base: Record) -> None:
    for depth in (50, 5000, 200_000):
        document = encode(base)
        document["samples"][0]["frames"] = nested(depth)
        raw = json.dumps(document, check_circular=False) if depth < 900 else \
            json.dumps(encode(base)).replace('"frames": [1, 0]', '"frames": ' + "[" * depth + "]" * depth, 1)
        (tmp_path / "r.data").write_bytes(packed_text(raw.encode()))
        with pytest.raises(RecordFileError, match=r"is corrupt \("):
            read_record(tmp_path / "r.data")
