"""The user side of the stack store (stackstore.c): the records BPF appended since the last read, and
turning the store over when the half being written is half full.

A read maps only the chunks it needs, copies the words out and drops the mapping (the arena's pages
would otherwise count in optrace's RSS), then walks the records: a Python step per new stack, none per
sample, and no system call per stack (a stack map needs one per stack id and drain).
"""
from __future__ import annotations

import mmap
import time
from collections import Counter
from typing import NamedTuple

STACK_KERNEL, STACK_RAW, STACK_BUILD_ID, STACK_CFI = 1, 2, 3, 4  # keep in sync with stackstore.c
CHUNK_WORDS = 4096
PAD_WORDS = 512
CHUNK_BYTES = (CHUNK_WORDS + PAD_WORDS) * 8  # a multiple of the page size: chunks map on their own
RECORD_COMMITTED = 1 << 63
RECORD_SKIP = 1 << 62
EPOCH_SHIFT = 32
PYTHON_STATUS_SHIFT = 48
MIN_CHUNKS = 1  # per half: 32 KiB (--stack-storage-size asked for a tiny store)
MAX_CHUNKS = 2048  # per half: 64 MiB
WORDS_PER_STACK = 24  # for sizing: a stack's record is its header, hash and frames
UNCOMMITTED_RETRIES = 3  # a record being written is done within microseconds: looked at again after a pause
UNCOMMITTED_PAUSE_S = 0.001
TURN_OVER_SHARE = 0.5
GRACE_SECONDS = 0.005  # a program's run takes microseconds; this is long past any run that saw the old state


class StoredStack(NamedTuple):
    """One record, decoded from its bytes (:func:`stored`): ``words`` are the stack's words as the program
    stored them (8 bytes each; a build-id stack's frames are 4 words each), ``status`` the CFI walk's end
    (unwind.c), else 0; ``python`` why its Python frames stopped short (python.c), else 0."""

    kind: int
    status: int
    words: bytes
    python: int = 0


def stored(record: bytes) -> StoredStack:
    """A record as :func:`parse_records` keeps it: its header and hash words, then the stack's words."""
    header = int.from_bytes(record[:8], "little")
    return StoredStack((header >> 16) & 0xFF, (header >> 24) & 0xFF, record[16:], (header >> PYTHON_STATUS_SHIFT) & 0xFF)


def chunks_for(stacks: int) -> int:
    """Chunks per half for ``stacks`` distinct stacks (the store turns over at half of a half)."""
    wanted = -(-stacks * WORDS_PER_STACK * 2 // CHUNK_WORDS)
    return min(MAX_CHUNKS, max(MIN_CHUNKS, 1 << max(0, (wanted - 1).bit_length())))


class StackStore:
    """Reads one loaded program's stack store. :meth:`read` returns the records new since the last call and
    keeps them while their half is not written again (:meth:`get`: a count names a stack of the half
    being written or of the other one); :attr:`epoch` is the one being written (its parity: the half)."""

    def __init__(self, bpf, chunks: int, grace_s: float) -> None:
        self._fd = bpf[b"store_arena"].map_fd
        self._state = bpf[b"store_state"]
        self._chunks = chunks
        self._words = chunks * CHUNK_WORDS
        self._grace_s = grace_s
        self._cursor = [0, 0]
        self._records: list[dict[int, bytes]] = [{}, {}]  # by half, as parse_records keeps them
        self._kept: dict[int, bytes] = {}  # records kept past their half's turnover (see keep)
        self._kept_last: dict[int, bytes] = {}  # those the last call to keep was given
        self.epoch = 0
        self.stats: Counter[str] = Counter()  # "records" (distinct per read) and "words" read, "turnovers"

    def get(self, stack_hash: int) -> bytes | None:
        """A stack record (see :func:`stored`) of either half, or kept (:meth:`keep`)."""
        found = self._records[self.epoch & 1].get(stack_hash)
        if found is None:
            found = self._records[1 - (self.epoch & 1)].get(stack_hash)
        return found if found is not None else self._kept.get(stack_hash)

    def keep(self, hashes: set[int]) -> None:
        """These records outlive their half's turnover until the call after the next (the stacks of off-CPU
        waits still open: a wait may last longer than the store takes to turn over twice, and one that ends
        after this call is read by the next drain). Call it before :meth:`read`."""
        now = {h: record for h in hashes if (record := self.get(h)) is not None}
        self._kept, self._kept_last = {**self._kept_last, **now}, now

    def read(self) -> dict[int, bytes]:
        """Records new since the last read, by hash (a stack stored twice, by two CPUs at once or after a
        turnover, comes once). When the written half is past TURN_OVER_SHARE, the store turns over first:
        the other half is written from its start, and this one is read to its end."""
        half = self.epoch & 1
        records = self._read_half(half)
        if self._cursor[half] > TURN_OVER_SHARE * self._words:
            self._turn_over()
            records.update(self._read_half(half))
        return records

    def _turn_over(self) -> None:
        other = 1 - (self.epoch & 1)  # read to its end at the last turnover
        self._set(1 + other, 0)
        self._cursor[other] = 0
        self._records[other] = {}
        self.epoch += 1
        self._set(0, self.epoch)
        self.stats["turnovers"] += 1
        time.sleep(self._grace_s)  # programs that saw the old epoch finish their records in the old half

    def _set(self, slot: int, value: int) -> None:
        self._state[self._state.Key(slot)] = self._state.Leaf(value)

    def _used(self, half: int) -> int:
        return min(self._state[self._state.Key(1 + half)].value, self._words)

    def _read_half(self, half: int) -> dict[int, bytes]:
        records: dict[int, bytes] = {}
        epoch_bits = (self.epoch if half == self.epoch & 1 else self.epoch - 1) & 0xFFFF  # when it was written
        for attempt in range(UNCOMMITTED_RETRIES + 1):
            start, end = self._cursor[half], self._used(half)
            if start >= end:
                break
            words = self._copy(half, start, end)
            done = parse_records(words, epoch_bits, records)
            self._cursor[half] = start + done
            self.stats["words"] += done
            if start + done >= end:
                break
            time.sleep(UNCOMMITTED_PAUSE_S)
        self._records[half].update(records)
        self.stats["records"] += len(records)
        return records

    def _copy(self, half: int, start: int, end: int) -> bytes:
        """Words [start, end) of the half, without the chunks' padding."""
        first, last = start // CHUNK_WORDS, (end - 1) // CHUNK_WORDS
        base = (half * self._chunks + first) * CHUNK_BYTES
        with mmap.mmap(self._fd, (last - first + 1) * CHUNK_BYTES, mmap.MAP_SHARED, mmap.PROT_READ,
                       offset=base) as view:
            pieces = []
            for chunk in range(first, last + 1):
                lo = max(start, chunk * CHUNK_WORDS) - chunk * CHUNK_WORDS
                hi = min(end, (chunk + 1) * CHUNK_WORDS) - chunk * CHUNK_WORDS
                offset = (chunk - first) * CHUNK_BYTES
                pieces.append(view[offset + lo * 8:offset + hi * 8])
        return b"".join(pieces)


def parse_records(data: bytes, epoch_bits: int, into: dict[int, bytes]) -> int:
    """Adds the committed records of ``data`` (whole words from a record's start) to ``into``, by hash, as
    the record's bytes (:func:`stored` reads them); returns how many words were read: up to
    the first record not committed in this epoch (being written: read later). One step per record, in the
    drain of a recording at 10k new stacks a second: kept to a few operations."""
    words = memoryview(data).cast("Q")
    count, position = len(words), 0
    committed = RECORD_COMMITTED | epoch_bits << EPOCH_SHIFT
    skip = RECORD_SKIP | epoch_bits << EPOCH_SHIFT
    tag = 0xC000_FFFF_0000_0000
    while position < count:
        header = words[position]
        end = position + 2 + (header & 0xFFFF)
        if header & tag == committed and end <= count:
            into[words[position + 1]] = data[8 * position:8 * end]
            position = end
        elif header & tag == skip and header & 0xFFFF:
            position += header & 0xFFFF
        else:
            break
    return min(position, count)
