"""The drains' whole-map read: every entry once, as bytes, the map left empty (real BPF maps)."""
from __future__ import annotations

import array
import struct

import pytest

from optrace.bpf.bcccompile import import_bcc
from optrace.bpf.maptaker import MapTaker

pytestmark = pytest.mark.bpf

PROGRAM = b"""
struct wide { u32 len; u32 status; u64 frames[5]; };
BPF_HASH(small, u64, u64, 8);
BPF_HASH(large, u64, struct wide, 20000);
"""


@pytest.fixture(scope="module")
def maps():
    bpf = import_bcc().BPF(text=PROGRAM)
    yield bpf
    bpf.cleanup()


def fill(table, count: int) -> dict[int, bytes]:
    expected = {}
    for i in range(count):
        key = (i * 2654435761) % (1 << 64)
        value = table.Leaf(i, i % 7, (table.Leaf._fields_[2][1])(*range(i, i + 5)))
        table[table.Key(key)] = value
        expected[key] = struct.pack("=II5Q", i, i % 7, *range(i, i + 5))
    return expected


def test_every_entry_is_taken_once_and_the_map_is_left_empty(maps):
    table = maps[b"large"]
    expected = fill(table, 15_000)  # more than one batch call's worth in a hash map with many buckets
    keys, values, count = MapTaker(table).take()
    size = struct.calcsize("=II5Q")
    got = {key: values[i * size:(i + 1) * size] for i, key in enumerate(array.array("Q", keys))}
    assert count == 15_000 and got == expected
    assert len(table) == 0
    assert MapTaker(table).take() == (b"", b"", 0)


def test_a_full_map_is_taken_whole(maps):
    table = maps[b"small"]
    for i in range(8):
        table[table.Key(i)] = table.Leaf(100 + i)
    taker = MapTaker(table)
    keys, values, count = taker.take()
    assert count == 8 and dict(zip(array.array("Q", keys), array.array("Q", values))) == {
        i: 100 + i for i in range(8)}
    table[table.Key(3)] = table.Leaf(7)  # the buffers are reused: the next take sees only what is new
    assert taker.take()[2] == 1
