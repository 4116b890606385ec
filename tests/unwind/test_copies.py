"""frontend/unwind/copies.py: a sample whose stack was copied waits for its process's tables, is walked
with the first tables read at its epoch or later since the same exec, and gives up (keeping what the
kernel took) only when they cannot come: after WAIT_DRAINS drains, at the last drain, or once its process
exited with no table being read for it."""
from __future__ import annotations

import dataclasses
import random
import struct
from collections import Counter

from optrace.bpf.unwindmaps import ProcessMapping
from optrace.frontend.unwind.copies import (MAX_COPY_BYTES, MAX_HELD_ROW_BYTES, NO_TABLE, UNNAMED_DRAINS, WAIT_DRAINS,
                                          StackCopies)
from optrace.frontend.unwind.row import CFA_OUTERMOST, CFA_RSP, RBP_SAME, ROW
from optrace.model import RawSample, StackCopy, UserFrame

PID = 4242
BASE = 0x5555_0000_0000
SP = 0x7ffd_0000_1000
BUILD_ID = b"\x11" * 20
JIT_PC = 0x7f00_0000_1000  # in no mapping
# the file's code: 0x1000-0x2000 leaf functions (CFA = rsp + 8), from 0x2000 its outermost frame
ROWS = ROW.pack(0x1000, 8, 0, CFA_RSP, RBP_SAME) + ROW.pack(0x2000, 0, 0, CFA_OUTERMOST, RBP_SAME)
MAPPING = ProcessMapping(BASE + 0x1000, BASE + 0x3000, 0x1000, BASE, "file", ROWS, BUILD_ID)


def copied_sample(copy_id: int) -> tuple[RawSample, StackCopy]:
    """A sample in a leaf at 0x1100 whose caller is the outermost frame at 0x2010, its epoch 5."""
    copy = StackCopy(BASE + 0x1100, SP, 0, struct.pack("<Q", BASE + 0x2010), pid=PID, epoch=5, exec_epoch=3)
    leaf = (UserFrame(None, BASE + 0x1100),)  # what the kernel took
    return RawSample(PID, "fresh", leaf, (), 1, 0.0, copy=copy_id), copy


def walked_frames() -> tuple[UserFrame, ...]:
    return UserFrame(BUILD_ID, 0x1100), UserFrame(BUILD_ID, 0x2010)


def test_a_sample_waits_for_its_tables_and_is_walked_with_them():
    copies = StackCopies()
    sample, copy = copied_sample(1)
    assert copies.add_copies({1: copy}) == {PID}
    assert copies.resolve([sample]) == []
    assert copies.wanted() == {PID}
    copies.add_tables(PID, 4, 3, [MAPPING])  # read before the copy's epoch: not its mappings
    copies.add_tables(PID, 6, 2, [MAPPING])  # read before the process's last exec
    assert copies.end_drain(()) == ([], [])
    copies.add_tables(PID, 6, 3, [MAPPING])
    cpu, off_cpu = copies.end_drain(())
    assert off_cpu == [] and len(cpu) == 1
    assert cpu[0].user == walked_frames() and cpu[0].stop == "outermost" and cpu[0].copy == 0
    assert copies.wanted() == set()


def test_tables_read_already_walk_a_sample_at_once():
    copies = StackCopies()
    copies.add_tables(PID, 5, 3, [MAPPING])
    sample, copy = copied_sample(7)
    assert copies.add_copies({7: copy}) == {PID}  # the kernel holds no table: it copied the stack
    assert [s.user for s in copies.resolve([sample])] == [walked_frames()]


def test_an_exited_process_waits_while_its_tables_are_read():
    copies = StackCopies()
    sample, copy = copied_sample(1)
    copies.add_copies({1: copy})
    copies.resolve([sample])
    assert copies.end_drain([PID], pending={PID}) == ([], [])
    assert copies.end_drain((), pending={PID}) == ([], [])  # its mappings were captured: they will come
    copies.add_tables(PID, 5, 3, [MAPPING])
    assert [s.user for s in copies.end_drain(())[0]] == [walked_frames()]


def test_a_sample_gives_up_when_its_tables_cannot_come():
    """Its process exited with nothing read for it; it waited WAIT_DRAINS drains; the recording ended."""
    for ending in ("exit", "wait", "final"):
        copies = StackCopies()
        sample, copy = copied_sample(1)
        copies.add_copies({1: copy})
        copies.resolve([sample])
        drains = {"exit": 1, "wait": WAIT_DRAINS, "final": 0}[ending]
        for _ in range(drains):
            assert copies.end_drain([PID] if ending == "exit" else (), pending={PID} if ending == "wait" else ()) \
                == ([], []), ending
        cpu, _ = copies.end_drain((), final=ending == "final")
        assert [(s.user, s.stop, s.copy) for s in cpu] == [(sample.user, NO_TABLE, 0)], ending


def continued_sample(copy_id: int, user: tuple[UserFrame, ...] = ()) -> tuple[RawSample, StackCopy]:
    """A CFI walk stopped at a PC in no mapping of its (stale) table, e.g. JIT code mapped since: its copy goes
    on from ``user`` (no frame when it stopped at the leaf)."""
    copy = StackCopy(JIT_PC, SP, 0, struct.pack("<Q", BASE + 0x2010), return_address=bool(user), continues=True,
                     pid=PID, epoch=5, exec_epoch=3)
    return RawSample(PID, "jit", user, (), 1, 0.0, stop="copied", copy=copy_id), copy


def test_a_waiting_sample_is_told_at_once_with_the_frames_known_before_its_walk():
    """The session looks for JIT files while the process lives (its tables may come after it exited)."""
    copies = StackCopies()
    at_leaf, copy = continued_sample(1)
    kernel_leaf, kernel_copy = copied_sample(2)
    above, above_copy = continued_sample(3, (UserFrame(BUILD_ID, 0x1100),))
    copies.add_copies({1: copy, 2: kernel_copy, 3: above_copy})
    assert copies.resolve([at_leaf, kernel_leaf, above]) == []
    assert [s.user for s in copies.take_arrived()] == [(UserFrame(None, JIT_PC),), kernel_leaf.user,
                                                       (UserFrame(BUILD_ID, 0x1100), UserFrame(None, JIT_PC))]
    assert copies.take_arrived() == []  # once
    copies.add_tables(PID, 6, 3, [MAPPING])
    assert len(copies.end_drain(())[0]) == 3 and copies.take_arrived() == []  # walked: nothing arrives


def test_a_sample_stopped_at_its_leaf_keeps_its_pc_when_it_gives_up():
    copies = StackCopies()
    sample, copy = continued_sample(1)
    copies.add_copies({1: copy})
    copies.resolve([sample])
    cpu, _ = copies.end_drain((), final=True)
    assert [(s.user, s.stop, s.copy) for s in cpu] == [((UserFrame(None, JIT_PC),), NO_TABLE, 0)]


def test_a_caller_naming_leaves_gets_waiting_samples_at_once_and_once():
    """top without its children column: a sample whose tables are not there comes with its leaf now (not
    after the tables, seconds later under load), and is not handed back again when they come."""
    copies = StackCopies()
    kernel_leaf, copy = copied_sample(1)
    at_leaf, continued = continued_sample(2)
    copies.add_copies({1: copy, 2: continued})
    assert [(s.user, s.copy) for s in copies.resolve([kernel_leaf, at_leaf], leaves=True)] == \
        [(kernel_leaf.user, 0), ((UserFrame(None, JIT_PC),), 0)]
    assert copies.wanted() == set() and copies.stats["unwalked_for_leaves"] == 2
    copies.add_tables(PID, 6, 3, [MAPPING])
    assert copies.end_drain(()) == ([], [])
    again, _ = copied_sample(3)
    copies.add_copies({3: copy})
    assert [s.user for s in copies.resolve([again], leaves=True)] == [walked_frames()]  # tables there: walked


def test_a_first_sample_with_python_frames_keeps_its_copys_pc_when_it_gives_up():
    """copypython.c stores a first sample's Python frames and no leaf: the copy's PC is the leaf (JIT code
    run from Python was named by nothing: tests/jit/test_jit_late_tables.py's 'jitdump, no table')."""
    from optrace.frontend.unwind.stackcopy import CHAIN_CALL_END, CHAIN_WORD
    from optrace.model import RUNTIME_FRAME

    copies = StackCopies()
    chain = (UserFrame(RUNTIME_FRAME, 0x40 | CHAIN_WORD | CHAIN_CALL_END),)
    copy = StackCopy(JIT_PC, SP, 0, struct.pack("<Q", BASE + 0x2010), pid=PID, epoch=5, exec_epoch=3)
    sample = RawSample(PID, "python", chain, (), 1, 0.0, copy=1)
    copies.add_copies({1: copy})
    assert [s.user for s in copies.resolve([sample], leaves=True)] == [(UserFrame(None, JIT_PC),
                                                                         UserFrame(RUNTIME_FRAME, 0x40))]


def test_processes_of_one_file_share_its_rows():
    """A file the kernel does not hold comes with its rows for each process, read again from the table store
    each time (a new bytes object): the processes' tables keep one of them, not one each (root's serve held
    python3.11's 7.3 MB for each of 14-30 processes beside the issue-40 attack). Without the sharing: 64 MB
    held here."""
    import tracemalloc
    rows = ROWS + b"".join(ROW.pack(0x3000 + pc, 0, 0, CFA_OUTERMOST, RBP_SAME) for pc in range((1 << 20) // ROW.size))
    copies = StackCopies()
    tracemalloc.start()
    try:
        for pid in range(64):
            copies.add_tables(PID + pid, 5, 3, [dataclasses.replace(MAPPING, rows=bytes(bytearray(rows)))])
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 4 << 20, held
    sample, copy = copied_sample(1)
    copies.add_copies({1: copy})
    assert copies.resolve([sample])[0].user == walked_frames()  # the shared rows walk as the process's own


def test_the_rows_of_files_the_kernel_does_not_hold_are_kept_within_a_byte_bound():
    """64 processes each mapping a file of its own (1 MiB of rows each, the kernel holding none): the tables keep
    at most MAX_HELD_ROW_BYTES of rows, the files past it without theirs (counted), and a walk through such a
    file asks ``rows_of`` for them (the table store's copy in a session). Without the bound: 64 MB held (root's
    serve held 76-127 MB of them on this machine's processes, issue 40)."""
    import tracemalloc
    rows = ROWS + b"".join(ROW.pack(0x3000 + pc, 0, 0, CFA_OUTERMOST, RBP_SAME) for pc in range((1 << 20) // ROW.size))
    asked = []
    copies = StackCopies(lambda key: asked.append(key) or rows)
    tracemalloc.start()
    try:
        for pid in range(64):
            own = dataclasses.replace(MAPPING, file_key=("file", pid), rows=bytes(bytearray(rows)))
            copies.add_tables(PID + pid, 5, 3, [own])
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < MAX_HELD_ROW_BYTES + (4 << 20), held
    assert copies.stats["rows_not_held"] >= 64 - MAX_HELD_ROW_BYTES // len(rows)
    sample, copy = copied_sample(1)
    copies.add_copies({1: copy})
    assert copies.resolve([sample])[0].user == walked_frames()  # the first process's rows, held
    last, copy = copied_sample(2)
    last, copy = dataclasses.replace(last, pid=PID + 63), dataclasses.replace(copy, pid=PID + 63)
    copies.add_copies({2: copy})
    assert copies.resolve([last])[0].user == walked_frames()  # the last one's, asked for
    assert asked == [("file", 63)]


PAGE = 1 << 18  # a copy's bytes in the store-bound tests: 64 of them fill MAX_COPY_BYTES


def sized_sample(pid: int, copy_id: int) -> tuple[RawSample, StackCopy]:
    """copied_sample's, of ``pid`` (its thread the copy's id, to know it once walked), with PAGE bytes of stack
    (the bytes past its return address unread)."""
    sample, copy = copied_sample(copy_id)
    stack = copy.stack.ljust(PAGE, b"\0")
    return dataclasses.replace(sample, pid=pid, tid=copy_id), dataclasses.replace(copy, pid=pid, stack=stack)


def kept_after(added: list[tuple[int, int]]) -> tuple[StackCopies, list[int]]:
    """Copies (pid, id) added one at a time, as the ring watcher does; the ids whose copies were kept (walked
    once their tables came, not given up)."""
    copies = StackCopies()
    samples = []
    for pid, copy_id in added:
        sample, copy = sized_sample(pid, copy_id)
        copies.add_copies({copy_id: copy})
        samples.append(sample)
    for pid in {pid for pid, _ in added}:
        copies.add_tables(pid, 5, 3, [MAPPING])
    walked = copies.resolve(samples)
    assert sum(s.stop == NO_TABLE for s in walked) + sum(s.user == walked_frames() for s in walked) == len(added)
    return copies, [s.tid for s in walked if s.user == walked_frames()]


def test_over_its_bound_the_store_walks_the_copies_whose_tables_are_here_rather_than_drop_them():
    """Issue 43: a busy process all of whose samples are copied while its tables are known (cc1, its rows refused
    by a full row array) put more than MAX_COPY_BYTES into the store between two drains, was its largest holder
    and lost its own copies (cc1 29-34 % complete). Over the bound, those are walked, not dropped: every one of
    them is walked, and the copies of a process whose tables are not here yet stay."""
    copies = StackCopies()
    copies.add_tables(PID, 5, 3, [MAPPING])
    samples = []
    for copy_id in [1001, 1002, *range(1, 101)]:
        sample, copy = sized_sample(PID if copy_id < 1000 else 7, copy_id)
        copies.add_copies({copy_id: copy})  # one at a time, as the ring watcher reads them
        samples.append(sample)
    assert 100 * PAGE > MAX_COPY_BYTES
    walked = copies.resolve(samples)
    assert [s.tid for s in walked if s.user == walked_frames()] == list(range(1, 101))
    assert copies.stats["dropped_bytes"] == 0 and copies.stats["walked_to_make_room"] > 0
    assert copies.wanted() == {7}
    copies.add_tables(7, 5, 3, [MAPPING])
    assert [s.tid for s in copies.end_drain(())[0] if s.user == walked_frames()] == [1001, 1002]


def test_walks_made_to_make_room_are_bounded_and_go_when_no_sample_names_them(monkeypatch):
    monkeypatch.setattr("optrace.frontend.unwind.copies.MAX_COPY_BYTES", 1)  # every copy over the bound
    monkeypatch.setattr("optrace.frontend.unwind.copies.MAX_WALKED_FRAMES", 6)  # 2 frames a walk: 3 kept
    copies = StackCopies()
    copies.add_tables(PID, 5, 3, [MAPPING])
    samples = []
    for copy_id in range(1, 6):
        sample, copy = copied_sample(copy_id)
        copies.add_copies({copy_id: copy})
        samples.append(sample)
    assert copies.stats["dropped_walks"] == 2 and copies.stats["dropped_bytes"] == 0
    walked = copies.resolve(samples[:1] + samples[3:])
    assert [(s.user, s.stop) for s in walked] == [(samples[0].user, NO_TABLE)] + [(walked_frames(), "outermost")] * 2
    for _ in range(UNNAMED_DRAINS + 1):  # the one no sample named goes
        copies.end_drain(())
    assert copies.resolve(samples[2:3])[0].stop == NO_TABLE


def test_a_flood_of_one_process_copies_does_not_evict_another_process_few():
    """Issue 43: a busy machine's copies waiting for tables dropped a short-lived compiler's (the oldest of
    all went first): the process holding the most bytes loses its oldest, the total stays in the bound."""
    few = [(7, i) for i in range(1, 4)]
    flood = [(PID, i) for i in range(100, 200)]
    copies, kept = kept_after(few + flood)
    kept_bytes = MAX_COPY_BYTES // PAGE
    assert kept[:3] == [1, 2, 3]  # every one of the few
    assert len(kept) * PAGE == MAX_COPY_BYTES  # the bound, exactly
    assert kept[3:] == list(range(200 - (kept_bytes - 3), 200))  # the flood's newest, up to the bound
    assert copies.stats["dropped_bytes"] == 103 - kept_bytes  # counted as before


def test_the_largest_holder_loses_first_whichever_it_is():
    """Two floods interleaved: they are cut to the same size, each its oldest first; the few stay."""
    floods = [(pid, pid * 1000 + i) for i in range(40) for pid in (PID, PID + 1)]
    _, kept = kept_after([(7, 1), (7, 2)] + floods)
    each = (MAX_COPY_BYTES // PAGE - 2) // 2
    assert kept[:2] == [1, 2]
    assert sorted(kept[2:]) == sorted(pid * 1000 + i for i in range(40 - each, 40) for pid in (PID, PID + 1))


def test_the_store_keeps_what_a_model_of_its_rule_keeps():
    """Random copies of a few processes, of random sizes, in random batches: what is kept is what the rule
    (drop the largest holder's oldest, the lowest pid among equals, until in the bound) keeps."""
    rng = random.Random(43)
    copies = StackCopies()
    model: dict[int, tuple[int, int]] = {}  # id -> (pid, bytes), oldest first
    samples = []
    for batch in range(300):
        added = {}
        for copy_id in range(batch * 8, batch * 8 + rng.randint(1, 8)):
            pid, size = rng.choice((1, 2, 3, 4, 5)), rng.choice((8, 4096, 28672, 1 << 20))
            sample, copy = copied_sample(copy_id + 1)
            added[copy_id + 1] = dataclasses.replace(copy, pid=pid, stack=copy.stack.ljust(size, b"\0"))
            samples.append(dataclasses.replace(sample, pid=pid, tid=copy_id + 1))
            model[copy_id + 1] = (pid, size)
        copies.add_copies(added)
        while sum(size for _, size in model.values()) > MAX_COPY_BYTES:
            held = Counter()
            for pid, size in model.values():
                held[pid] += size
            largest = min(held, key=lambda pid: (-held[pid], pid))
            del model[next(i for i, (pid, _) in model.items() if pid == largest)]
    for pid in range(1, 6):
        copies.add_tables(pid, 5, 3, [MAPPING])
    kept = [s.tid for s in copies.resolve(samples) if s.user == walked_frames()]
    assert kept == sorted(model) and len(kept) > 20
    assert copies.stats["dropped_bytes"] == len(samples) - len(kept)
