"""JIT names kept as UTF-8 in mapped blocks: interning, round trips, hash collisions, names over a block."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

import optrace.jitmaps.namestore as namestore
from optrace.jitmaps.namestore import NameStore


def test_the_same_name_gets_the_same_id_and_comes_back():
    store = NameStore()
    first, second = store.intern("Hot.f(long)"), store.intern("LazyCompile:*g /app.js:3")
    assert store.intern("Hot.f(long)") == first != second
    assert (store.get(first), store.get(second)) == ("Hot.f(long)", "LazyCompile:*g /app.js:3")
    assert len(store) == 2 and store.bytes == len("Hot.f(long)") + len("LazyCompile:*g /app.js:3")


def test_undecodable_bytes_and_names_over_a_block_round_trip():
    store = NameStore()
    odd = b"caf\xc3\xa9 \xff\xfe".decode("utf-8", "surrogateescape")
    huge = "x" * (namestore.BLOCK + 5)
    ids = [store.intern(name) for name in (odd, "small", huge, "after")]
    assert [store.get(i) for i in ids] == [odd, "small", huge, "after"]


def test_colliding_hashes_never_mix_names_up(monkeypatch):
    monkeypatch.setattr(namestore, "hash", lambda data: 0, raising=False)
    store = NameStore()
    a, b = store.intern("a"), store.intern("b")
    assert a != b and store.intern("a") == a
    assert (store.get(a), store.get(b), store.get(store.intern("b"))) == ("a", "b", "b")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=60))
def test_ids_are_equal_exactly_when_names_are(names):
    store = NameStore()
    ids = [store.intern(name) for name in names]
    assert [store.get(i) for i in ids] == names
    assert len(set(ids)) == len(set(names)) == len(store)


def test_names_past_the_first_block_go_to_mapped_blocks():
    store = NameStore()
    names = [f"{i:06d}" + "n" * 194 for i in range(3 * namestore.BLOCK // 200)]  # the first 64 KiB, then 3 MiB
    ids = [store.intern(name) for name in names]
    assert [store.get(i) for i in ids] == names and store.bytes == 200 * len(names)
    assert [type(block).__name__ for block in store._blocks] == ["bytearray", "mmap", "mmap", "mmap"]
