"""jitdump reader: header checks, every record kind, byte-swapped files, truncation, unknown records,
incremental reads, and property tests (only JitDumpError, never a hang)."""
from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from jithelpers import dump_bytes, load

from optrace.jitmaps import jitdump as jd


def parse(data: bytes, tmp_path, final=True):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = jd.JitDumpReader()
        return list(reader.read_new(fd, final)), reader
    finally:
        os.close(fd)


ALL = [
    jd.DebugInfo(5, 0x1000, (jd.DebugEntry(0x1000, 3, 0, "a.js"), jd.DebugEntry(0x1004, 4, 0, "a.js"))),
    load(0x1000, 4, "first", 10, 0, b"\x90\x90\x90\xc3"),
    jd.CodeMove(20, 42, 42, 0x2000, 0x1000, 0x2000, 4, 0),
    jd.CodeClose(30),
]


@pytest.mark.parametrize("order", ["<", ">"])
def test_every_record_kind_in_both_byte_orders(tmp_path, order):
    records, reader = parse(dump_bytes(ALL, order=order), tmp_path)
    assert reader.header.byte_order == order and reader.header.pid == 42
    assert [type(r) for r in records] == [jd.DebugInfo, jd.CodeLoad, jd.CodeMove, jd.CodeClose]
    assert records[0].entries[1] == jd.DebugEntry(0x1004, 4, 0, "a.js")
    assert records[1].name == "first" and records[1].code == b"\x90\x90\x90\xc3"
    assert records[2].new_code_addr == 0x2000


def test_same_file_marker_in_debug_entries(tmp_path):
    body = struct.pack("<QQ", 0x1000, 2) + struct.pack("<Qii", 0x1000, 1, 0) + b"f.c\0" + \
        struct.pack("<Qii", 0x1002, 2, 0) + b"\xff\0"
    records, _ = parse(dump_bytes([jd.encode_record(jd.CODE_DEBUG_INFO, 1, body)]), tmp_path)
    assert [e.filename for e in records[0].entries] == ["f.c", "f.c"]


def test_unwinding_info_and_unknown_records(tmp_path):
    unwind = jd.encode_record(jd.CODE_UNWINDING_INFO, 3, struct.pack("<QQQ", 8, 4, 16) + bytes(12))
    unknown = jd.encode_record(77, 4, b"whatever")
    records, reader = parse(dump_bytes([unwind, unknown, load(0x1000, 1, "x", 5)]), tmp_path)
    assert isinstance(records[0], jd.UnwindingInfo) and records[0].mapped_size == 16
    assert records[1].name == "x"
    assert (reader.records, reader.unknown_records) == (3, 1)


def test_truncated_last_record_tolerated(tmp_path):
    data = dump_bytes([load(0x1000, 4, "a", 1), load(0x2000, 4, "b", 2)])
    records, reader = parse(data[:-3], tmp_path)
    assert [r.name for r in records] == ["a"]
    assert reader.truncated_bytes > 0


@pytest.mark.parametrize("mutate,message", [
    (lambda h: b"XXXX" + h[4:], "bad magic"),
    (lambda h: h[:4] + struct.pack("<I", 2) + h[8:], "version 2"),
    (lambda h: h[:32] + struct.pack("<Q", 2), "flags"),
    (lambda h: h[:8] + struct.pack("<I", 8) + h[12:], "header size"),
    (lambda h: h[:20], "truncated header"),
])
def test_bad_headers(tmp_path, mutate, message):
    with pytest.raises(jd.JitDumpError, match=message):
        parse(mutate(dump_bytes([])), tmp_path)


def test_impossible_record_size(tmp_path):
    with pytest.raises(jd.JitDumpError, match="impossible size"):
        parse(dump_bytes([struct.pack("<IIQ", 0, 8, 0)]), tmp_path)


def test_incremental_reads_and_big_records(tmp_path, monkeypatch):
    monkeypatch.setattr(jd, "CHUNK", 50)  # records bigger than a chunk are read whole
    data = dump_bytes([load(0x1000, 300, "big", 1), load(0x2000, 4, "small", 2)])
    path = tmp_path / "jit-42.dump"
    reader = jd.JitDumpReader()
    seen = []
    for cut in (10, 45, 100, len(data) - 1, len(data)):
        path.write_bytes(data[:cut])
        fd = os.open(path, os.O_RDONLY)
        seen += [r.name for r in reader.read_new(fd)]
        os.close(fd)
    assert seen == ["big", "small"]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_only_documented_error(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("jd")
    for blob in (data, jd.encode_header(1, 62, 0) + data, jd.encode_header(1, 62, 0, ">") + data):
        try:
            parse(blob, tmp)
        except jd.JitDumpError:
            pass


loads = st.lists(st.tuples(st.integers(0, 2**47), st.binary(min_size=1, max_size=64),
                           st.text(min_size=1, max_size=30).filter(lambda s: "\0" not in s)), max_size=20)


@settings(max_examples=80, deadline=None)
@given(loads, st.sampled_from(["<", ">"]), st.data())
def test_truncated_or_swapped_round_trip(tmp_path_factory, rows, order, data):
    """A prefix of a valid dump yields exactly the records that fit completely."""
    records = [load(a, len(code), name, i, i, code) for i, (a, code, name) in enumerate(rows)]
    blob = dump_bytes(records, order=order)
    cut = data.draw(st.integers(jd.HEADER_SIZE, len(blob)))
    got, _ = parse(blob[:cut], tmp_path_factory.mktemp("jd"))
    ends, pos = [], jd.HEADER_SIZE
    for r in records:
        pos += len(jd.encode_load(r))
        ends.append(pos)
    assert got == records[: sum(1 for e in ends if e <= cut)]
