"""Format 2 holds a record's frames and samples as tables (a list per field; a stack column as its rows' lengths
and all their frame indices): what `record` writes, read column by column. A table decodes to what the same
rows as objects (format 1, still read) decode to, and every bad table is one SchemaError naming the place."""
from __future__ import annotations

import json
import zlib

import pytest

from optrace import recordfile
from optrace.model import Frame, Record
from optrace.recordfile import HEADER, MAGIC, read_record, write_record
from optrace.schema import TABLE_CHUNK, SchemaError, decode, encode, encode_record
from test_fast_paths import shared_frames_record


def big_record() -> Record:
    """More rows than one chunk of the object decoder, empty stacks among them."""
    return shared_frames_record(samples=2 * TABLE_CHUNK + 100)


def test_a_table_decodes_to_what_its_objects_decode_to() -> None:
    record = big_record()
    tables, objects = encode_record(record), encode(record)
    assert set(tables["samples"]) == {"pid", "comm", "frames", "count", "tid"}
    assert set(tables["samples"]["frames"]) == {"lengths", "values"}
    assert tables["samples"]["frames"]["lengths"][:3] == [len(s.frames) for s in record.samples[:3]]
    decoded = decode(tables, Record)
    assert decoded == decode(objects, Record) == record
    assert all(type(sample.frames) is tuple for sample in decoded.samples)
    assert {hash(frame) for frame in decoded.frames} == {hash(frame) for frame in record.frames}


def test_record_writes_tables_and_reads_format_1(tmp_path) -> None:
    record = big_record()
    write_record(record, tmp_path / "new.data")
    data = (tmp_path / "new.data").read_bytes()
    assert HEADER.unpack(data[:HEADER.size])[1] == recordfile.FORMAT_VERSION
    payload = zlib.decompress(data[HEADER.size:])
    assert payload.count(b"{") < 20, "a JSON object per row: not a table"
    document = encode(record)
    for frame in document["frames"]:  # format 1 had the kernel boolean where format 4 has a kind
        frame["kernel"] = frame.pop("kind") == "kernel"
    objects = json.dumps(document).encode()
    compressed = zlib.compress(objects)
    (tmp_path / "old.data").write_bytes(HEADER.pack(MAGIC, 1, zlib.crc32(compressed), len(compressed), len(objects))
                                        + compressed)
    assert read_record(tmp_path / "new.data") == read_record(tmp_path / "old.data") == record
    assert len(payload) < 0.75 * len(objects)


def test_a_column_no_optrace_knows_is_left_out_and_a_left_out_one_takes_its_default() -> None:
    document = encode_record(big_record())
    document["samples"]["added_later"] = [1, 2]
    del document["samples"]["tid"]  # records from before threads were recorded
    del document["frames"]["build_id"]
    record = decode(document, Record)
    assert {sample.tid for sample in record.samples} == {0}
    assert {frame.build_id for frame in record.frames} == {None}
    assert record.frames[1] == Frame("strlen", "/usr/lib/x86_64-linux-gnu/libc.so.6", address=0x104)


def test_an_empty_table_is_no_rows() -> None:
    record = big_record()
    record.samples = []
    assert decode(encode_record(record), Record).samples == []


def spoiled(change) -> dict:
    document = encode_record(big_record())
    change(document["samples"], document["frames"])
    return document


@pytest.mark.parametrize("change,message", [
    (lambda s, f: s["frames"]["values"].__setitem__(100, True), r"record\.samples\[\d+\]\.frames\[\d+\]: expected int, got bool"),
    (lambda s, f: s["frames"]["values"].__setitem__(100, -1), r"record\.samples\[\d+\]\.frames\[\d+\]: -1 is out of range"),
    (lambda s, f: s["frames"]["values"].__setitem__(-1, 9999), r"record\.samples\[\d+\]: frame index out of range"),
    (lambda s, f: s["pid"].__setitem__(TABLE_CHUNK + 1, 1 << 32), r"record\.samples\[8193\]\.pid: 4294967296 is out of range"),
    (lambda s, f: s["comm"].__setitem__(3, None), r"record\.samples\[3\]\.comm: expected str, got NoneType"),
    (lambda s, f: f["kind"].__setitem__(2, 1), r"record\.frames\[2\]\.kind: expected str, got int"),
    (lambda s, f: s["count"].pop(), r"record\.samples: its columns have different lengths \(16483 to 16484\)"),
    (lambda s, f: s.pop("count"), r"record\.samples: missing column 'count'"),
    (lambda s, f: s.__setitem__("pid", {}), r"record\.samples\.pid: expected list, got dict"),
    (lambda s, f: s.__setitem__("frames", [[1]]), r"record\.samples\.frames: expected dict, got list"),
    (lambda s, f: s["frames"].__setitem__("extra", []), r"record\.samples\.frames: expected an object of 'lengths' and"),
    (lambda s, f: s["frames"]["values"].pop(), r"record\.samples\.frames: its lengths do not add up to its values"),
    (lambda s, f: s["frames"]["lengths"].__setitem__(0, -1), r"record\.samples\.frames: its lengths do not add up"),
    (lambda s, f: s["frames"]["lengths"].__setitem__(0, 1 << 40), r"record\.samples\.frames: its lengths do not add up"),
    (lambda s, f: s["frames"]["lengths"].__setitem__(0, "2"), r"record\.samples\.frames: its lengths do not add up"),
])
def test_a_bad_table_is_named(change, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        decode(spoiled(change), Record)


def test_a_table_is_written_a_column_chunk_at_a_time(monkeypatch) -> None:
    """The writer never builds a column whole: every list in the payload is made of SERIALIZE_CHUNK pieces."""
    record = big_record()
    pieces = []
    monkeypatch.setattr(recordfile, "SERIALIZE_CHUNK", 1000)
    for piece in recordfile._json_pieces(record):
        pieces.append(piece)
    assert max(map(len, pieces)) < 1000 * 12
    assert json.loads("".join(pieces)) == encode_record(record)
