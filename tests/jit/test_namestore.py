"""JIT names kept as UTF-8 in mapped blocks: interning, round trips, hash collisions, names over a block."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

import optrace.jitmaps.namestore as namestore
from optrace.jitmaps.namestore import NameStore


def intern(store: NameStore, name: str) -> int:
    name_id, _ = store.intern(name)
    return name_id


def test_the_same_name_gets_the_same_id_and_comes_back():
    store = NameStore()
    first, second = intern(store, "Hot.f(long)"), intern(store, "LazyCompile:*g /app.js:3")
    assert store.intern("Hot.f(long)") == (first, 0) and first != second
    assert (store.get(first), store.get(second)) == ("Hot.f(long)", "LazyCompile:*g /app.js:3")
    assert len(store) == 2 and store.bytes == len("Hot.f(long)") + len("LazyCompile:*g /app.js:3")


def test_undecodable_bytes_and_names_over_a_block_round_trip():
    store = NameStore()
    odd = b"caf\xc3\xa9 \xff\xfe".decode("utf-8", "surrogateescape")
    huge = "x" * (namestore.BLOCK + 5)
    ids = [intern(store, name) for name in (odd, "small", huge, "after")]
    assert [store.get(i) for i in ids] == [odd, "small", huge, "after"]


def test_a_new_name_over_the_room_left_is_not_stored():
    store = NameStore()
    assert store.intern("abcd", room=3) == (None, 0) and len(store) == 0 and store.bytes == 0
    name_id, added = store.intern("abcd", room=4)
    assert added == 4 and store.intern("abcd", room=0) == (name_id, 0)  # held already: no room needed


def test_colliding_hashes_never_mix_names_up(monkeypatch):
    monkeypatch.setattr(namestore, "hash", lambda data: 0, raising=False)
    store = NameStore()
    a, b = intern(store, "a"), intern(store, "b")
    assert a != b and intern(store, "a") == a
    assert (store.get(a), store.get(b), store.get(intern(store, "b"))) == ("a", "b", "b")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=60))
def test_ids_are_equal_exactly_when_names_are(names):
    store = NameStore()
    ids = [intern(store, name) for name in names]
    assert [store.get(i) for i in ids] == names
    assert len(set(ids)) == len(set(names)) == len(store)


def test_names_past_the_first_block_go_to_mapped_blocks():
    store = NameStore()
    names = [f"{i:06d}" + "n" * 194 for i in range(3 * namestore.BLOCK // 200)]  # the first 64 KiB, then 3 MiB
    ids = [intern(store, name) for name in names]
    assert [store.get(i) for i in ids] == names and store.bytes == 200 * len(names)
    assert [type(block).__name__ for block in store._blocks] == ["bytearray", "mmap", "mmap", "mmap"]
