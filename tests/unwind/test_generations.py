"""UnwindMaps' generations (bpf/unwindmaps.py) and the session's bookkeeping of them, against stand-ins for
the BPF maps (no BCC, no root): rows full -> a new generation, live processes loaded again when next
sampled, an old file id still decoded by the next drain, ids kept bounded, exited processes dropped."""
from __future__ import annotations

import array
import ctypes
import dataclasses
import os
import struct
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from optrace.bpf import unwindmaps
from optrace.bpf.unwindmaps import FILE_FRAME, FILE_OFFSET_BITS, ROW_SIZE, ProcessMapping, UnwindMaps, decode_cfi
from optrace.frontend import session as session_module
from optrace.frontend.session import TOP, ProfilingSession, SessionOptions
from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.processmaps import ProcessUnwinding
from optrace.frontend.unwind import scheduler as scheduler_module
from optrace.frontend.unwind.quality import outermost_only, outermost_quality
from optrace.frontend.unwind.scheduler import UnwindScheduler
from optrace.frontend.unwind.table import build_table
from optrace.model import Frame, RawSample, Sample, UserFrame
from optrace.procfs import read_maps

CAPACITY = 100  # rows
GONE_PID = 4_194_000  # above every pid_max default: never in /proc


class Table(dict):
    """A BPF hash as BCC shows it, enough for UnwindMaps."""

    Key = staticmethod(lambda value: SimpleNamespace(value=value))
    Leaf = ctypes.c_char * (16 + unwindmaps.MAX_MAPPINGS * 48)

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key.value, value)

    def __delitem__(self, key) -> None:
        super().__delitem__(key.value)

    def __contains__(self, key) -> bool:
        return super().__contains__(key.value)

    def keys(self):
        return [SimpleNamespace(value=k) for k in super().keys()]

    def items(self):
        return [(SimpleNamespace(value=k), v) for k, v in super().items()]



class Array(dict):
    """A BPF array as BCC shows it: ``a[a.Key(i)] = a.Leaf(v)``; values by index."""

    Key = staticmethod(lambda value: value)
    Leaf = staticmethod(lambda value: value)


class Maps(dict):
    """unwind_rows is a memfd (mmap-able like a BPF_F_MMAPABLE array), the rest Tables."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        fd = os.memfd_create("unwind_rows")
        os.ftruncate(fd, capacity * ROW_SIZE)
        super().__init__({b"unwind_rows": SimpleNamespace(map_fd=fd), b"unwind_procs": Table(),
                          b"unwind_generation": Array()})

    def rows(self, start: int, count: int) -> bytes:
        return os.pread(self[b"unwind_rows"].map_fd, count * ROW_SIZE, start * ROW_SIZE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def mapping(name: str, rows: int, start: int) -> ProcessMapping:
    return ProcessMapping(start, start + 0x1000, 0, start, name, name.encode()[:1] * (rows * ROW_SIZE),
                          name.encode().ljust(20, b"\0"))


FILES = {"a": 40, "b": 30, "c": 50, "d": 50}
PROCESSES = {1: ["a"], 2: ["b"], 3: ["c"], 4: ["d"], GONE_PID: ["b"]}


def mappings_of(pid: int, loaded=None) -> list[ProcessMapping]:
    return [mapping(name, FILES[name], 0x10000 * (i + 1)) for i, name in enumerate(PROCESSES[pid])]


class Inline:
    """The unwind worker, run at once."""

    def submit(self, call, *args):
        call(*args)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def maps(clock) -> tuple[UnwindMaps, Maps]:
    bpf = Maps()
    return UnwindMaps(bpf, CAPACITY, clock=clock), bpf


@pytest.fixture
def session(maps) -> ProfilingSession:
    unwind, _ = maps
    session = ProfilingSession(SessionOptions(TOP))
    session.profiler = SimpleNamespace(unwind=unwind, python=None, epoch=lambda pid: 7, exec_epoch=lambda pid: 0)
    session.unwinder = UnwindScheduler(session.profiler, SimpleNamespace(mappings=mappings_of), None, session._contain)
    session.unwinder._unwind_worker = Inline()
    return session


def words(*frames: int) -> bytes:
    """A CFI stack's frames as the walker stores them in the stack store."""
    return array.array("Q", frames).tobytes()


def in_file(file_id: int, offset: int) -> int:
    return FILE_FRAME | file_id << FILE_OFFSET_BITS | offset


def file_id(unwind: UnwindMaps, name: str) -> int:
    return unwind._files[name].file_id


def test_rows_full_starts_a_new_generation_once_a_minute(maps, clock):
    unwind, bpf = maps
    unwind.load_process(1, 7, mappings_of(1))
    unwind.load_process(2, 7, mappings_of(2))
    assert bpf.rows(0, 1) == b"a" * ROW_SIZE and bpf.rows(40, 1) == b"b" * ROW_SIZE
    unwind.load_process(3, 7, mappings_of(3))  # 40 + 30 + 50 > 100, but the generation is new
    assert unwind.generation == 0 and unwind.stats["rows_full"] == 1 and unwind._files["c"].row_count == 0
    assert unwind._files["c"].lazy and not unwind.is_loaded("c")  # its stacks are copied meanwhile, asked again
    unwind.load_process(2, 7, mappings_of(2))
    assert unwind.generation == 0
    clock.now += unwindmaps.MIN_GENERATION_SECONDS
    unwind._used["a"] = unwind._used["b"] = clock.now  # in use: not evicted to make room
    unwind.load_process(4, 7, mappings_of(4))
    assert unwind.generation == 1 and unwind.stats["generations"] == 1
    assert [k.value for k in bpf[b"unwind_procs"].keys()] == [4]  # every other table dropped
    assert unwind._files["d"].row_start == 0 and bpf.rows(0, 1) == b"d" * ROW_SIZE


def mapping_flags(table: bytes) -> list[int]:
    """unwind_mapping.flags of each mapping of a packed unwind_proc (unwind.c)."""
    count = struct.unpack_from("<I", table)[0]
    return [struct.unpack_from("<QQQQIIII", table, 16 + 48 * i)[-1] for i in range(count)]


def test_a_file_refused_rows_is_walked_from_copies(maps, monkeypatch):
    """A file that has rows the array (or the generation's file list) has no room for is marked MAPPING_COPY,
    as a file whose rows wait: the walker copies the stack there rather than follow frame pointers through
    it (false frames through code built without them); a file without CFI stays a frame-pointer file."""
    unwind, bpf = maps
    unwind.load_process(1, 7, mappings_of(1))
    unwind.load_process(2, 7, mappings_of(2))
    unwind.load_process(3, 7, mappings_of(3) + [mapping("e", 0, 0x90000)])  # c: 40 + 30 + 50 > 100 rows
    assert unwind.stats["rows_full"] == 1
    assert mapping_flags(bytes(bpf[b"unwind_procs"][3])) == [unwindmaps.MAPPING_COPY, 0]
    assert mapping_flags(bytes(bpf[b"unwind_procs"][1])) == [0]
    monkeypatch.setattr(unwindmaps, "MAX_GENERATION_FILES", 4)
    unwind.load_process(5, 7, [mapping("f", 1, 0x10000), mapping("g", 1, 0x20000)])  # a, b, c, e: 4 files
    assert unwind.stats["files_full"] == 2
    assert mapping_flags(bytes(bpf[b"unwind_procs"][5])) == [unwindmaps.MAPPING_COPY, unwindmaps.MAPPING_COPY]


def test_a_retired_file_id_decodes_until_the_stacks_before_the_reset_are_read(maps):
    unwind, bpf = maps
    unwind.load_process(1, 7, mappings_of(1))
    old = file_id(unwind, "a")
    unwind.new_generation()
    unwind.load_process(3, 7, mappings_of(3))
    assert file_id(unwind, "c") != old  # not handed out again while it may be read
    for _ in range(unwindmaps.RETIRED_READS):
        stack = decode_cfi(words(in_file(old, 0x123)), 0, unwind.drain_ids())
        assert stack.frames == (UserFrame(b"a".ljust(20, b"\0"), 0x123),)
    assert decode_cfi(words(in_file(old, 0x123)), 0, unwind.drain_ids()).frames == (UserFrame(None, 0),)  # never guessed


def test_a_new_generation_salts_the_walkers_stack_hashes(maps):
    """Equal frame words of two generations may name other files: their stacks must not share a hash."""
    unwind, bpf = maps
    assert bpf[b"unwind_generation"].get(0, 0) == 0
    unwind.new_generation()
    assert bpf[b"unwind_generation"][0] == unwind.generation == 1


def test_file_ids_stay_bounded_over_many_generations(maps):
    unwind, _ = maps
    for generation in range(50):
        unwind.new_generation()
        unwind.load_process(1, 7, [mapping(f"file{generation}-{i}", 1, 0x10000 * (i + 1)) for i in range(10)])
        unwind.drain_ids()
    sizes = unwind.sizes()
    assert sizes["unwind_files"] == 10 and sizes["unwind_file_ids"] <= 10 * (1 + unwindmaps.RETIRED_READS)
    assert len(unwind._retired) <= unwindmaps.RETIRED_READS


def test_files_per_generation_are_capped(maps, monkeypatch):
    unwind, _ = maps
    monkeypatch.setattr(unwindmaps, "MAX_GENERATION_FILES", 3)
    unwind.load_process(1, 7, [mapping(f"f{i}", 1, 0x10000 * (i + 1)) for i in range(5)])
    assert len(unwind._files) == 3 and unwind.stats["files_full"] == 2


def test_session_loads_live_processes_again_after_a_new_generation(session, maps, clock):
    unwind, bpf = maps
    for pid in (1, 2):
        session.unwinder.unwind(pid)
    assert set(session.unwinder._unwound) == {1, 2}
    clock.now += unwindmaps.MIN_GENERATION_SECONDS
    unwind._used["a"] = unwind._used["b"] = clock.now  # in use: no eviction makes room, a new generation does
    session.unwinder.unwind(3)  # c does not fit: a new generation, 1 and 2 dropped
    assert unwind.generation == 1 and set(session.unwinder._unwound) == {3}
    assert [k.value for k in bpf[b"unwind_procs"].keys()] == [3]
    frame_pointer_sample = RawSample(1, "p", (UserFrame(None, 0x10010),), (), 4)  # stop "": not unwound
    session.unwinder.unwind_processes([frame_pointer_sample])
    assert set(session.unwinder._unwound) == {1, 3} and unwind.has_process(1)


def test_files_no_process_uses_make_room_for_a_new_one(session, maps, clock):
    """The rows of files whose processes were not sampled for ACTIVE_SECONDS are given back (their processes'
    tables dropped, loaded again once sampled) before any new generation: cc1's 479k rows waited a whole
    recording behind files of processes sampled once (no_cfi 6393, issue 43)."""
    unwind, bpf = maps
    for pid in (1, 2):
        session.unwinder.unwind(pid)
    old_a = file_id(unwind, "a")
    clock.now += unwindmaps.ACTIVE_SECONDS + 1
    session.unwinder.unwind(3)  # c (50) fits once a (40) and b (30) are given back: both were idle
    assert unwind.generation == 0 and unwind.stats["files_evicted"] == 2 and "c" in unwind._files
    assert unwind._files["c"].row_count == 50 and set(session.unwinder._unwound) == {3}
    assert [k.value for k in bpf[b"unwind_procs"].keys()] == [3]
    stack = decode_cfi(words(in_file(old_a, 0x10)), 0, unwind.drain_ids())  # read before the eviction
    assert stack.frames == (UserFrame(b"a".ljust(20, b"\0"), 0x10),)
    unwind.load_process(1, 7, mappings_of(1))  # a again: the 50 rows left hold it
    assert unwind._files["a"].row_count == 40 and unwind.stats["rows_full"] == 0
    frame_pointer_sample = RawSample(1, "p", (UserFrame(None, 0x10010),), (), 4)  # stop "": not unwound
    session.unwinder.unwind_processes([frame_pointer_sample])
    assert set(session.unwinder._unwound) == {1, 3} and unwind.has_process(1)


def test_exited_processes_tables_are_dropped(session, maps, monkeypatch):
    unwind, bpf = maps
    for pid in (1, GONE_PID):
        session.unwinder.unwind(pid)  # GONE_PID: its exit was handled before the worker loaded it
    session._end_processes([1], now=1.0)  # 1's exit event
    assert not unwind.has_process(1) and 1 not in session.unwinder._unwound and unwind.has_process(GONE_PID)
    session._drains = session_module.PRUNE_EVERY - 1
    session._end_processes([], now=2.0)
    assert not unwind.has_process(GONE_PID) and not session.unwinder._unwound


def test_quality_names_only_outermost_frames_of_stacks_the_unwinder_did_not_end():
    root, inner = UserFrame(b"x" * 20, 1), UserFrame(b"x" * 20, 2)
    raw = [RawSample(1, "p", (inner, root), (), 5, stop="outermost"), RawSample(1, "p", (inner, root), (9,), 3),
           RawSample(1, "p", (inner, inner), (), 2, stop="read_fault"), RawSample(1, "k", (), (9,), 7)]
    outermost = outermost_only(raw)
    assert [(s.user, s.kernel) for s in outermost] == [((root,), ()), ((inner,), ())]
    frames = [Frame("_start", "/p"), Frame("inner", "/p")]
    rows = [Sample(s.pid, s.comm, (0 if s.user[0] is root else 1,), s.count) for s in outermost]
    assert outermost_quality(raw, outermost, frames, rows) == {"complete": 8, "read_fault": 2}
    assert outermost_quality(raw[:1], [], [], []) == {"complete": 5}


def test_serve_keeps_no_rows_the_kernel_holds_and_converts_again_after_a_new_generation(omit_fp_binary):
    """keep_unwind_rows=False (serve): after a process's tables are loaded, the user-space cache holds
    none of their rows; a second process of the same files needs no conversion; a new generation that
    starts while a process's files are passed without rows has them converted and loaded again."""
    capacity = 1 << 21
    bpf = Maps(capacity)
    unwind = UnwindMaps(bpf, capacity)
    session = ProfilingSession(SessionOptions(TOP))
    session.profiler = SimpleNamespace(unwind=unwind, python=None, epoch=lambda pid: 7, exec_epoch=lambda pid: 0)
    session.unwinder = UnwindScheduler(session.profiler, ProcessUnwinding(UnwindTableCache()), None, session._contain,
                                       keep_rows=False)
    tables = session.unwinder.unwinding.tables
    procs = [subprocess.Popen([str(omit_fp_binary), "1", "0", "-"], stdin=subprocess.PIPE) for _ in range(3)]
    try:
        entries = [_wait_for_mapping(proc.pid, str(omit_fp_binary)) for proc in procs]
        session.unwinder.unwind(procs[0].pid)
        ours = tables.file_of_mapping(procs[0].pid, entries[0], need_rows=lambda identity: False)
        loaded = unwind._files[ours.identity]
        rows = build_table(omit_fp_binary.read_bytes()).rows
        assert loaded.row_count == len(rows) // ROW_SIZE and bpf.rows(loaded.row_start, loaded.row_count) == rows
        assert tables.held_bytes == 0 and tables.stats["released_bytes"] > len(rows)
        conversions = tables.stats["conversions"]
        session.unwinder.unwind(procs[1].pid)
        assert tables.stats["conversions"] == conversions and unwind._files[ours.identity] is loaded

        load_process = unwind.load_process

        def new_generation_first(pid, epoch, mappings):
            if unwind.generation == 0:
                unwind.new_generation()
            load_process(pid, epoch, mappings)
        unwind.load_process = new_generation_first
        session.unwinder.unwind(procs[2].pid)
        again = unwind._files[ours.identity]
        assert unwind.generation == 1 and tables.stats["conversions"] > conversions
        assert again.row_count == len(rows) // ROW_SIZE and bpf.rows(again.row_start, again.row_count) == rows
        assert set(session.unwinder._unwound) == {procs[2].pid} and tables.held_bytes == 0
    finally:
        for proc in procs:
            proc.communicate(b"\n", timeout=10)


def _wait_for_mapping(pid: int, path: str):
    """The mapping of `path`, once the process waits on stdin: by then the loader has mapped every library,
    so each process of the test has the same files (the binary alone is mapped before ld.so runs)."""
    for _ in range(500):
        entries = read_maps(pid).entries
        ours = [entry for entry in entries if entry.path == path and entry.executable]
        libc = any("libc.so" in (entry.path or "") and entry.executable for entry in entries)
        if ours and libc and _waiting_on_stdin(pid):
            return ours[0]
        time.sleep(0.01)
    raise AssertionError(f"{path} never mapped executable in {pid}, or {pid} never waited on stdin")


def _waiting_on_stdin(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "S"


def test_optrace_itself_is_walked_by_frame_pointers(session, maps, monkeypatch):
    """Its BCC libraries alone hold more rows than the kernel's array (see UnwindScheduler.unwind_later):
    its table has no rows, and keys of its own, so no other process is walked without rows for its files."""
    unwind, _ = maps
    monkeypatch.setitem(PROCESSES, os.getpid(), ["a"])
    session.unwinder.unwinding.frame_pointer_mappings = lambda pid: [
        dataclasses.replace(m, rows=b"", file_key=("frame pointers", m.file_key)) for m in mappings_of(pid)]
    samples = [RawSample(pid, "p", (UserFrame(None, 0x10010),), (), 4) for pid in (os.getpid(), 1)]
    session.unwinder.unwind_processes(samples)
    assert set(session.unwinder._unwound) == {1, os.getpid()}
    assert unwind._files["a"].row_count == 40 and unwind._files[("frame pointers", "a")].row_count == 0


# -- CFI stacks decoded with their drain's file ids (record: once, at the end) ------------------------------

def test_a_cfi_stack_decodes_file_frames_and_raw_addresses(maps):
    unwind, _ = maps
    unwind.load_process(1, 7, mappings_of(1))
    frame = in_file(file_id(unwind, "a"), 0)
    stack = decode_cfi(words(frame | 0x10, frame | 0x20, 0x7f00), 1, unwind.drain_ids())
    assert stack == unwindmaps.UnwoundStack(
        (UserFrame(b"a".ljust(20, b"\0"), 0x10), UserFrame(b"a".ljust(20, b"\0"), 0x20), UserFrame(None, 0x7f00)),
        "chain_end")


def test_drains_of_one_generation_share_their_file_ids(maps):
    """The recording keeps stack records by the file ids they were read with: one set while the generation
    lasts, however many files it loads."""
    unwind, _ = maps
    unwind.load_process(1, 7, mappings_of(1))
    first = unwind.drain_ids()
    unwind.load_process(2, 7, mappings_of(2))  # a file more: the same generation, the same ids
    assert unwind.drain_ids() is first
    unwind.new_generation()  # other generations: the ids may mean other files
    assert unwind.drain_ids() is not first


def test_a_stack_keeps_its_file_after_the_id_is_handed_out_again(maps, monkeypatch):
    """Decoded when the recording ends: by then a retired generation's ids may name other files."""
    monkeypatch.setattr(unwindmaps, "MAX_FILE_IDS", 2)
    unwind, _ = maps
    unwind.load_process(1, 7, mappings_of(1))
    old = file_id(unwind, "a")
    ids = unwind.drain_ids()
    given_old_id = []
    for name in ("b", "c", "d"):  # ids 1 and 2 over and over, once the retired ones are forgotten
        unwind.new_generation()
        unwind.load_process(2, 7, [mapping(name, 1, 0x10000)])
        given_old_id += [name] if file_id(unwind, name) == old else []
        for _ in range(unwindmaps.RETIRED_READS):
            unwind.drain_ids()
    assert given_old_id  # another file has the id now
    assert decode_cfi(words(in_file(old, 0x10)), 0, ids).frames == (UserFrame(b"a".ljust(20, b"\0"), 0x10),)


def test_folded_stacks_count_their_tables_build_ids(session, monkeypatch):
    """A folded stack's frames are not looked at before the end: its process's CFI tables' build-ids stand
    for them, so a process showing a new file is snapshotted while it is alive."""
    snapshots = []
    session.unwinder.fold = True
    session.symbolizer = SimpleNamespace(snapshot_process=snapshots.append, add_executable=lambda path, pid=None: None)
    session.unwinder.unwind(1)
    assert session.unwinder.table_build_ids(1) == {b"a".ljust(20, b"\0")}
    session._learn_processes([], 0.0, {1})
    session._learn_processes([], 0.0, {1})  # nothing new the second time
    assert snapshots == [1]


def test_polls_reload_a_young_table_whose_process_mapped_more_after_a_drain(session, maps):
    """A table loaded at exec, just before a drain: the libraries the dynamic loader maps after that drain
    change the epoch, and the polls of the next YOUNG_SECONDS load the table again (not the next drain); the
    symbolizer looks at the process again at once, while it runs (a library's frames of a process gone by
    the drain were [unknown])."""
    unwind, _ = maps
    snapshots = []
    session.symbolizer = SimpleNamespace(snapshot_process=snapshots.append, add_executable=lambda path, pid=None: None)
    session.profiler.poll_events = lambda ready=None: ([], [])
    session.unwinder.unwind(1)
    session.unwinder.unwind_processes([])  # a drain
    session.profiler.epoch = lambda pid: 8  # ld.so mapped libpython
    session.poll(time.monotonic())
    assert session.unwinder._unwound[1] == 8 and snapshots == [1]
    session.profiler.epoch = lambda pid: 9  # a dlopen long after the start: left to the drains
    session.poll(time.monotonic() + scheduler_module.YOUNG_SECONDS + 1)
    assert session.unwinder._unwound[1] == 8 and not session.unwinder._young
    session.unwinder.unwind(2)
    session.unwinder._young[2] -= scheduler_module.YOUNG_SECONDS + 1
    session.unwinder.unwind_processes([])  # drains forget old entries too (serve's loop does not poll)
    assert 2 not in session.unwinder._young
