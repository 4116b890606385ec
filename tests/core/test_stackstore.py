"""The stack store's reader (bpf/stackstore.py) against hand-made arenas: records, skipped reservations,
a record still being written, a half written in an older epoch, and turning the store over. No BCC, no
root: the arena is a memfd laid out as the kernel lays out the BPF array (chunks with their padding)."""
from __future__ import annotations

import array
import mmap
import os
from types import SimpleNamespace

from hypothesis import given, strategies as st

from optrace.bpf import stackstore
from optrace.bpf.stackstore import (CHUNK_BYTES, CHUNK_WORDS, EPOCH_SHIFT, PYTHON_STATUS_SHIFT, RECORD_COMMITTED, RECORD_SKIP,
                                    STACK_CFI, STACK_KERNEL, StackStore, parse_records, stored)


def record(stack_hash: int, words: list[int], kind: int = STACK_KERNEL, status: int = 0, epoch: int = 0,
           python: int = 0) -> list[int]:
    header = (RECORD_COMMITTED | (epoch & 0xFFFF) << EPOCH_SHIFT | python << PYTHON_STATUS_SHIFT | status << 24
              | kind << 16 | len(words))
    return [header, stack_hash, *words]


def skip(words: int, epoch: int = 0) -> list[int]:
    return [RECORD_SKIP | (epoch & 0xFFFF) << EPOCH_SHIFT | words] + [0xDEAD] * (words - 1)


def as_bytes(words: list[int]) -> bytes:
    return array.array("Q", words).tobytes()


def test_records_are_read_with_their_kind_and_status():
    data = as_bytes(record(7, [0xFFFF1, 0xFFFF2]) + skip(3) + record(8, [1, 2, 3], STACK_CFI, status=4, python=3))
    found: dict[int, bytes] = {}
    assert parse_records(data, 0, found) == len(data) // 8
    assert set(found) == {7, 8}
    assert stored(found[7]) == (STACK_KERNEL, 0, as_bytes([0xFFFF1, 0xFFFF2]), 0)
    assert stored(found[8]) == (STACK_CFI, 4, as_bytes([1, 2, 3]), 3)  # the Python walk's status too


def test_reading_stops_at_a_record_being_written_and_at_an_older_epoch():
    being_written = [0, 9, 1, 2]  # reserved: header not written yet
    data = as_bytes(record(7, [1]) + being_written + record(8, [2]))
    found: dict[int, bytes] = {}
    assert parse_records(data, 0, found) == 3 and set(found) == {7}
    older = as_bytes(record(7, [1], epoch=2) + record(8, [2], epoch=0))  # epoch 0: the half's use before
    found = {}
    assert parse_records(older, 2, found) == 3 and set(found) == {7}


@given(st.lists(st.one_of(
    st.tuples(st.just("record"), st.integers(1, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), max_size=20)),
    st.tuples(st.just("skip"), st.integers(1, 30)),
), max_size=40), st.integers(0, 40), st.integers(0, 0xFFFF))
def test_the_reader_gives_exactly_the_committed_prefix(items, cut, epoch):
    """Whatever the mix of records and skipped reservations, and wherever a record is still being written,
    the reader returns the records before it and says where it stopped."""
    words: list[int] = []
    expected: dict[int, bytes] = {}
    stop = None
    for i, item in enumerate(items):
        if i == cut:
            stop = len(words)
            words += [0] * 3  # a reservation whose header is not written
        if item[0] == "record":
            _, stack_hash, frames = item
            if stop is None:  # a hash stored twice (by two CPUs at once) reads as the last copy
                expected[stack_hash] = as_bytes(record(stack_hash, frames, epoch=epoch))
            words += record(stack_hash, frames, epoch=epoch)
        else:
            words += skip(item[1], epoch)
    found: dict[int, bytes] = {}
    done = parse_records(as_bytes(words), epoch, found)
    assert done == (len(words) if stop is None else stop)
    assert found == expected


class Arena:
    """The BPF arena and state maps as StackStore reads them: a memfd of 2 x chunks chunks, and
    ``store_state`` ([0]: epoch, [1 + half]: words reserved)."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.fd = os.memfd_create("store_arena")
        os.ftruncate(self.fd, 2 * chunks * CHUNK_BYTES)
        self.state = {0: 0, 1: 0, 2: 0}

    def maps(self) -> dict:
        arena = self

        class State:
            Key = staticmethod(lambda i: i)
            Leaf = staticmethod(lambda v: v)

            def __getitem__(self, key):
                return SimpleNamespace(value=arena.state[key])

            def __setitem__(self, key, value):
                arena.state[key] = value

        return {b"store_arena": SimpleNamespace(map_fd=self.fd), b"store_state": State()}

    def append(self, words: list[int]) -> None:
        """As the BPF side does: into the half being written, a record never across a chunk's end."""
        half = self.state[0] & 1
        start = self.state[1 + half]
        if start % CHUNK_WORDS + len(words) > CHUNK_WORDS:
            self.append(skip(CHUNK_WORDS - start % CHUNK_WORDS, self.state[0]))
            start = self.state[1 + half]
        chunk, offset = divmod(start, CHUNK_WORDS)
        with mmap.mmap(self.fd, 2 * self.chunks * CHUNK_BYTES) as view:
            at = (half * self.chunks + chunk) * CHUNK_BYTES + offset * 8
            view[at:at + 8 * len(words)] = as_bytes(words)
        self.state[1 + half] = start + len(words)


def test_the_store_turns_over_when_the_half_is_half_full():
    arena = Arena(chunks=1)
    store = StackStore(arena.maps(), chunks=1, grace_s=0)
    arena.append(record(1, [1] * 100))
    assert set(store.read()) == {1} and store.epoch == 0 and store.get(1) is not None
    while arena.state[1] <= CHUNK_WORDS // 2:  # past half of the half being written
        arena.append(record(arena.state[1] + 10, [2] * 100))
    arena.append(record(5, [5]))
    new = store.read()
    assert store.epoch == 1 and store.stats["turnovers"] == 1 and arena.state[0] == 1 and 5 in new
    assert store.get(1) is not None  # the old half is kept until it is written again
    arena.append(record(6, [6], epoch=1))  # the other half now, from its start
    assert arena.state[2] == 3 and set(store.read()) == {6}
    for stack_hash in range(100, 125):  # fill it past half: the first half is written again
        arena.append(record(stack_hash, [7] * 100, epoch=1))
    store.read()
    assert store.epoch == 2 and arena.state[1] == 0 and store.get(1) is None and store.get(6) is not None


def test_a_record_being_written_is_looked_at_again_after_a_pause(monkeypatch):
    arena = Arena(chunks=1)
    store = StackStore(arena.maps(), chunks=1, grace_s=0)
    arena.append([0, 9, 1])  # reserved, not written yet
    arena.append(record(8, [2]))
    pauses = []

    def pause(seconds: float) -> None:  # the writer finishes during the reader's pause
        pauses.append(seconds)
        with mmap.mmap(arena.fd, 2 * CHUNK_BYTES) as view:
            view[0:24] = as_bytes(record(9, [1]))

    monkeypatch.setattr(stackstore.time, "sleep", pause)
    assert set(store.read()) == {8, 9} and pauses == [stackstore.UNCOMMITTED_PAUSE_S]


def test_chunks_grow_with_the_stacks_asked_for():
    assert stackstore.chunks_for(2) == stackstore.MIN_CHUNKS
    assert stackstore.chunks_for(8192) * CHUNK_WORDS >= 2 * 8192 * stackstore.WORDS_PER_STACK
    assert stackstore.chunks_for(1 << 30) == stackstore.MAX_CHUNKS
