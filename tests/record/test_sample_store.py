"""The recorder's SampleStore: samples summed over drains; folded counts (key bytes as the kernel gave
them) summed over drains without being decoded, decoded once per distinct key at the end, and merged
with the same stacks that came decoded."""
from __future__ import annotations

import array

from optrace.bpf.profiler import COUNT_KEY, FoldedCounts
from optrace.frontend.recorder import SampleStore
from optrace.model import RawSample, UserFrame

FRAMES = (UserFrame(b"a" * 20, 0x10), UserFrame(b"b" * 20, 0x20))
CFI = 4  # STACK_CFI


def key(pid: int, tid: int, user: int, kernel: int = 0, comm: bytes = b"app") -> bytes:
    return COUNT_KEY.pack(pid, tid, user, kernel, 0, CFI, 0, comm)


def drain(counts: dict[bytes, int], records: dict[int, bytes], ids: object) -> FoldedCounts:
    return FoldedCounts(b"".join(counts), array.array("Q", counts.values()).tobytes(), records, ids)


def test_folded_counts_sum_over_drains_and_each_key_is_decoded_once():
    store = SampleStore()
    ids = object()
    store.add(RawSample(1, "app", FRAMES, (), 2, 5.0, tid=3, stop="outermost"), timed=False)
    store.add_folded(drain({key(1, 3, 7): 5, key(1, 3, 7, kernel=9): 4}, {7: b"user", 9: b"kernel"}, ids))
    store.add_folded(drain({key(1, 3, 7): 1}, {7: b"user"}, ids))  # the next drain: the same stack again
    decoded: list[tuple[dict, list]] = []

    def decode(counts, records):
        decoded.append((dict(counts), [(i, dict(kept)) for i, kept in records]))
        stacks = {7: FRAMES}
        return [RawSample(pid, comm.rstrip(b"\0").decode(), stacks[user], (0xffff1,) if kernel else (), n, tid=tid,
                          stop="outermost")
                for (pid, tid, user, kernel, _, _, _, comm), n in ((COUNT_KEY.unpack(k), n) for k, n in counts.items())]

    assert sorted(store.samples(decode), key=lambda s: s.count) == [
        RawSample(1, "app", FRAMES, (0xffff1,), 4, tid=3, stop="outermost"),
        RawSample(1, "app", FRAMES, (), 8, tid=3, stop="outermost")]  # 2 decoded + 5 + 1 folded
    assert decoded == [({key(1, 3, 7): 6, key(1, 3, 7, kernel=9): 4}, [(ids, {7: b"user", 9: b"kernel"})])]


def test_stack_records_are_kept_with_the_file_ids_they_were_read_with():
    """A new unwinder generation gives new file ids: the records read after it are kept apart."""
    store = SampleStore()
    first, second = object(), object()
    store.add_folded(drain({key(1, 1, 7): 1}, {7: b"old"}, first))
    store.add_folded(drain({key(1, 1, 8): 1}, {8: b"new"}, second))
    store.add_folded(drain({key(1, 1, 8): 1}, {9: b"newer"}, second))
    kept = []
    store.samples(lambda counts, records: kept.extend(records) or [])
    assert kept == [(first, {7: b"old"}), (second, {8: b"new", 9: b"newer"})]


def test_a_comm_is_taken_out_of_folded_counts():
    folded = drain({key(1, 1, 7): 3, key(2, 2, 7, comm=b"optrace-exec"): 4}, {}, None)
    assert folded.comms() == {"app", "optrace-exec"} and folded.pids() == {1, 2}
    kept, dropped = folded.without_comm("optrace-exec")
    assert dropped == 4 and kept.counts() == {key(1, 1, 7): 3}
