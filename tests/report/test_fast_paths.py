"""The flat report's short cuts give what the full paths give: self counts summed per leaf frame (rows.py
without --children) equal the self counts of the whole-stack walk (--children) and a sample-by-sample
count written here, and the schema's field-at-a-time check of frames and samples decodes what the
item-by-item decoder does, and names the same problems."""
from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from optrace.frontend.report.rows import ReportOptions, RowKey, build_table
from optrace.model import KERNEL_DSO, Frame, Record, RecordMeta, Sample
from optrace.schema import TABLE_CHUNK, SchemaError, decode, encode

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
APP = "/usr/bin/app"


def shared_frames_record(samples: int = 3000, seed: int = 7) -> Record:
    """Functions with several frames each (one per address), a user and a kernel `strlen`, recursion,
    the same leaf in several processes and threads, and lost stacks."""
    rnd = random.Random(seed)
    frames = [Frame("strlen", LIBC, address=0x100), Frame("strlen", LIBC, address=0x104),
              Frame("strlen", KERNEL_DSO, kind="kernel", address=0xFFFFFFFF81000000),
              Frame("main", APP, address=0x10), Frame("main", APP, address=0x14),
              Frame("walk", APP, address=0x20), Frame("walk", APP, address=0x28),
              Frame("app+0x99", APP, address=0x99, resolved=False, build_id="ab" * 20),
              Frame("[unknown]", "[unknown]", resolved=False)]
    rows = []
    for _ in range(samples):
        pid = rnd.choice((10, 11, 12))
        stack = tuple(rnd.choice(range(len(frames))) for _ in range(rnd.randint(0, 12)))
        if stack and rnd.random() < 0.3:  # recursion: the leaf's function again further out
            stack += (stack[0], 5, 6, 5)
        rows.append(Sample(pid, "app" if pid != 12 else "other", stack, rnd.randint(1, 5), tid=pid + rnd.randint(0, 2)))
    meta = RecordMeta(optrace_version="0.1.0", hostname="h", kernel="6.18.0", started=1.0, duration_s=1.0,
                      frequency_hz=99, event="cpu-clock")
    return Record(meta=meta, frames=frames, samples=rows)


def sample_by_sample(record: Record, options: ReportOptions) -> Counter[RowKey]:
    """Self counts the plain way: every sample's leaf (or [unknown]), filtered and keyed as the rows are."""
    counts: Counter[RowKey] = Counter()
    unknown = Frame("[unknown]", "[unknown]", resolved=False)
    for sample in record.samples:
        if (options.pids and sample.pid not in options.pids) or (options.comms and sample.comm not in options.comms):
            continue
        leaf = record.frames[sample.frames[0]] if sample.frames else unknown
        if options.dsos and leaf.dso not in options.dsos and leaf.dso.rsplit("/", 1)[-1] not in options.dsos:
            continue
        sort = options.sort
        counts[RowKey(sample.comm if "comm" in sort else None, sample.pid if "pid" in sort else None,
                      leaf.dso if "dso" in sort else None, leaf.symbol if "symbol" in sort else None,
                      leaf.kernel if "symbol" in sort else None, sample.tid if "tid" in sort else None)] += sample.count
    return counts


@pytest.mark.parametrize("options", [
    ReportOptions(), ReportOptions(sort=("symbol",)), ReportOptions(sort=("pid", "tid", "symbol")),
    ReportOptions(sort=("dso",)), ReportOptions(sort=("comm", "pid", "tid", "dso", "symbol")),
    ReportOptions(dsos=frozenset({"libc.so.6"})), ReportOptions(pids=frozenset({10, 12}), sort=("tid", "symbol")),
    ReportOptions(comms=frozenset({"other"}), dsos=frozenset({KERNEL_DSO, APP})),
], ids=lambda options: ",".join(options.sort))
def test_flat_self_counts_equal_the_stack_walk_and_a_plain_count(options: ReportOptions) -> None:
    record = shared_frames_record()
    flat = build_table(record, options)
    walked = build_table(record, ReportOptions(**{**options.__dict__, "children": True}))
    expected = sample_by_sample(record, options)
    assert {row.key: (row.samples, row.percent) for row in flat.rows} == {
        row.key: (row.samples, row.percent) for row in walked.rows if row.samples}
    assert {row.key: row.samples for row in flat.rows} == expected
    assert flat.matched == walked.matched == sum(expected.values())
    assert len(flat.rows) > 1


def test_rows_of_equal_counts_are_in_key_order() -> None:
    """Whatever the hash seed: [.] strlen before [k] strlen when their counts are equal."""
    record = shared_frames_record()
    record.samples = [Sample(1, "a", (0,), 3), Sample(1, "a", (2,), 3), Sample(1, "a", (5,), 3), Sample(1, "a", (), 4)]
    rows = build_table(record, ReportOptions(sort=("symbol",))).rows
    assert [(row.key.symbol, row.key.kernel) for row in rows] == [
        ("[unknown]", False), ("strlen", False), ("strlen", True), ("walk", False)]
    order = [(-row.samples, row.key.symbol, row.key.kernel) for row in rows]
    assert order == sorted(order)


def big_document() -> dict:
    """More samples than one chunk of the field-at-a-time check, with empty stacks among them."""
    return encode(shared_frames_record(samples=2 * TABLE_CHUNK + 100))


def test_field_at_a_time_decoding_round_trips() -> None:
    record = shared_frames_record(samples=2 * TABLE_CHUNK + 100)
    decoded = decode(encode(record), Record)
    assert decoded == record
    assert all(type(sample.frames) is tuple for sample in decoded.samples)
    assert {hash(frame) for frame in decoded.frames} == {hash(frame) for frame in record.frames}
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.frames[0].symbol = "changed"  # type: ignore[misc]


def test_a_field_no_optrace_knows_is_left_out() -> None:
    document = encode(shared_frames_record())
    document["frames"][1]["added_later"] = [1, 2]
    frame = decode(document, Record).frames[1]
    assert frame == Frame("strlen", LIBC, address=0x104) and not hasattr(frame, "added_later")


def test_left_out_fields_take_their_defaults_in_any_chunk() -> None:
    document = big_document()
    for sample in document["samples"][TABLE_CHUNK:]:
        del sample["tid"]  # records from before threads were recorded
    del document["frames"][0]["build_id"]
    record = decode(document, Record)
    assert {sample.tid for sample in record.samples[TABLE_CHUNK:]} == {0}
    assert record.samples[0].tid != 0 and record.frames[0].build_id is None


@pytest.mark.parametrize("place,value,message", [
    (("samples", TABLE_CHUNK + 5, "frames"), [1, True], r"record\.samples\[8197\]\.frames\[1\]: expected int, got bool"),
    (("samples", TABLE_CHUNK + 5, "frames"), [1, -1], r"record\.samples\[8197\]\.frames\[1\]: -1 is out of range"),
    (("samples", 2 * TABLE_CHUNK + 1, "pid"), 1 << 32, r"record\.samples\[16385\]\.pid: 4294967296 is out of range"),
    (("samples", 3, "comm"), None, r"record\.samples\[3\]\.comm: expected str, got NoneType"),
    (("frames", 2, "kind"), 1, r"record\.frames\[2\]\.kind: expected str, got int"),
    (("frames", 2, "build_id"), 5, r"record\.frames\[2\]\.build_id: expected str, got int"),
])
def test_a_bad_value_in_any_chunk_is_named(place: tuple, value: object, message: str) -> None:
    document = big_document()
    *path, last = place
    node = document
    for part in path:
        node = node[part]
    node[last] = value
    with pytest.raises(SchemaError, match=message):
        decode(document, Record)


def test_a_missing_required_field_is_named() -> None:
    document = big_document()
    del document["samples"][TABLE_CHUNK]["count"]
    with pytest.raises(SchemaError, match=r"record\.samples\[8192\]: missing field 'count'"):
        decode(document, Record)


def test_the_json_budget_counts_values_and_keys_in_one_pass() -> None:
    """JsonBudget.take counts ``,[{`` (values) and ``:`` (keys) with one translate, as four counts did."""
    from optrace.recordfile import JsonBudget, Source
    text = b'{"a": [1, 2, {"b": "x,y:z["}], "c": {}}' + bytes(range(256))
    budget = JsonBudget(Source("t", None))
    budget.take(text)
    budget.take(bytearray(text))
    assert budget.values == 2 * sum(map(text.count, (b",", b"[", b"{")))
    assert budget.keys == 2 * text.count(b":")
