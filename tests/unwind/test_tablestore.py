"""Stored unwind tables (frontend/unwind/tablestore.py): a table converted in one session is read back by
the next; a rewritten file, a new converter or a bad entry is converted again; the store's directory and
entries are treated as hostile (symlinks, FIFOs, other owners, corrupt bytes); the store stays bounded."""
from __future__ import annotations

import os
import shutil
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import pytest

from optrace.frontend.symbols.access import FileRef
from optrace.frontend.unwind import tablestore
from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.table import UnwindTable
from optrace.frontend.unwind.tablestore import TableStore, default_directory
from optrace.frontend.unwind.unwindfile import UnwindFile

LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
NOBODY = 65534


def _session(directory: Path) -> UnwindTableCache:
    """A new session's cache over the stored tables of ``directory``."""
    return UnwindTableCache(store=TableStore(directory))


def _lookup(cache: UnwindTableCache, path: str | Path) -> UnwindFile:
    return cache.file_of_ref(FileRef(str(path), str(path)))


def _entries(directory: Path) -> list[Path]:
    return sorted(path for path in directory.iterdir() if not path.name.startswith("."))


def test_a_table_converted_once_is_read_back_by_the_next_session(tmp_path: Path):
    first_session = _session(tmp_path)
    converted = _lookup(first_session, LIBC)
    assert first_session.stats["conversions"] == 1 and first_session.store.stats["stored_writes"] == 1
    later_session = _session(tmp_path)
    stored = _lookup(later_session, LIBC)
    assert later_session.stats["conversions"] == 0 and later_session.store.stats["stored_hits"] == 1
    assert stored.table == converted.table and stored.table.count > 1000
    assert (stored.build_id, stored.loads, stored.identity) == (converted.build_id, converted.loads, converted.identity)


def test_released_rows_are_read_back_from_the_store_without_converting(tmp_path: Path):
    """The rows of a file the cache released (the kernel holds them) or evicted come back from the store for a
    walk of stack copies (copies.py keeps at most MAX_HELD_ROW_BYTES of them): read, not converted again."""
    session = _session(tmp_path)
    converted = _lookup(session, LIBC)
    assert session.stored_rows(converted.identity) is converted.table.rows  # still held: no read
    session.release_rows([converted.identity])
    assert session.stored_rows(converted.identity) == converted.table.rows
    assert session.stats["conversions"] == 1 and session.stats["stored_reloads"] == 1
    assert session.stored_rows(("frame pointers", converted.identity)) is None  # no file of the store's


def test_entries_read_at_once_stay_within_a_byte_budget():
    """A read that would take the entries being read over the budget waits for one to end (counted); one alone
    may be larger than the budget."""
    import threading
    import time

    from optrace.cachedir import ByteBudget

    budget, order = ByteBudget(10), []

    def second() -> None:
        with budget.held(6):
            order.append("second")

    with budget.held(25):  # alone: over the budget, not held back
        order.append("large")
    with budget.held(6):
        reader = threading.Thread(target=second)
        reader.start()
        time.sleep(0.2)
        order.append("first done")
    reader.join(5)
    assert order == ["large", "first done", "second"] and budget.waits == 1


def test_a_file_rewritten_in_place_with_its_old_size_and_mtime_is_converted_again(omit_fp_binary: Path, tmp_path: Path):
    """The owner can put back the mtime, not the ctime."""
    binary = tmp_path / "calls"
    shutil.copyfile(omit_fp_binary, binary)
    _lookup(_session(tmp_path / "store"), binary)
    before = binary.stat()
    binary.write_bytes(binary.read_bytes())
    os.utime(binary, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (binary.stat().st_size, binary.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again = _session(tmp_path / "store")
    _lookup(again, binary)
    assert again.stats["conversions"] == 1 and again.store.stats["stored_hits"] == 0


def test_a_new_converter_converts_again(omit_fp_binary: Path, tmp_path: Path, monkeypatch):
    _lookup(_session(tmp_path), omit_fp_binary)
    monkeypatch.setattr(tablestore, "converter_fingerprint", lambda: "a later optrace")
    again = _session(tmp_path)
    _lookup(again, omit_fp_binary)
    assert again.stats["conversions"] == 1 and len(_entries(tmp_path)) == 2


def test_the_fingerprint_covers_the_converters_sources():
    assert {Path(module.__file__).name for module in tablestore.CONVERTER_MODULES} == {
        "cfi.py", "rules.py", "row.py", "table.py", "unwindfile.py"}
    assert len(tablestore.converter_fingerprint()) == 64


def _stored_entry(omit_fp_binary: Path, directory: Path) -> Path:
    _lookup(_session(directory), omit_fp_binary)
    (entry,) = _entries(directory)
    return entry


@pytest.mark.parametrize("damage", ["garbage", "flipped row", "truncated", "bad header", "nested header"])
def test_a_damaged_entry_is_converted_again_and_replaced(omit_fp_binary: Path, tmp_path: Path, damage: str):
    entry = _stored_entry(omit_fp_binary, tmp_path)
    data = entry.read_bytes()
    if damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "flipped row":
        data = data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "nested header":  # json.loads would raise RecursionError, not ValueError
        data = tablestore.MAGIC + struct.pack("<I", 60_000) + b"[" * 60_000
    else:
        data = data.replace(b'"count"', b'"cuont"', 1)
    entry.write_bytes(data)
    again = _session(tmp_path)
    unwind = _lookup(again, omit_fp_binary)
    assert again.stats["conversions"] == 1 and again.store.stats["stored_bad"] == 1 and unwind.table.count > 10
    third = _session(tmp_path)
    _lookup(third, omit_fp_binary)
    assert third.stats["conversions"] == 0 and third.store.stats["stored_hits"] == 1


def test_a_symlink_fifo_or_foreign_entry_is_never_read(omit_fp_binary: Path, tmp_path: Path):
    entry = _stored_entry(omit_fp_binary, tmp_path)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    shutil.copyfile(entry, elsewhere)
    for plant in ("symlink", "fifo", "foreign"):
        entry.unlink()
        if plant == "symlink":
            entry.symlink_to(elsewhere)
        elif plant == "fifo":
            os.mkfifo(entry)  # a blocking open would hang the session
        else:
            shutil.copyfile(elsewhere, entry)
            os.chown(entry, NOBODY, NOBODY)
        again = _session(tmp_path)
        with _fails_if_blocked(10):
            _lookup(again, omit_fp_binary)
        assert again.stats["conversions"] == 1 and again.store.stats["stored_hits"] == 0, plant
        assert entry.is_file() and not entry.is_symlink() and entry.stat().st_uid == os.geteuid(), plant
    assert elsewhere.read_bytes() == entry.read_bytes()  # the symlink's target was not written through


@contextmanager
def _fails_if_blocked(seconds: float):
    def blocked(_signum, _frame):
        raise AssertionError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("unsafe", ["world-writable", "another owner", "another user's symlink"])
def test_a_store_directory_others_can_change_is_not_used(omit_fp_binary: Path, tmp_path: Path, unsafe: str):
    directory = tmp_path / "unwind"
    if unsafe == "another user's symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "real")
        os.lchown(directory, NOBODY, NOBODY)
    else:
        directory.mkdir(mode=0o700)
        if unsafe == "world-writable":
            directory.chmod(0o777)
        else:
            os.chown(directory, NOBODY, NOBODY)
    store = TableStore(directory)
    assert not store.usable and str(directory) in store.problem
    cache = UnwindTableCache(store=store)
    assert _lookup(cache, omit_fp_binary).table.count > 10 and cache.stats["conversions"] == 1
    assert not any(path.is_file() for path in tmp_path.rglob("*"))


def test_tables_with_problems_or_no_rows_are_not_stored(tmp_path: Path):
    store = TableStore(tmp_path)
    store.save("partial", UnwindFile(UnwindTable(b"\0" * 16, 1, ".eh_frame", 0, problems=1, problem="bad FDE")))
    store.save("empty", UnwindFile(UnwindTable(b"", 0, "", 0)))
    assert _entries(tmp_path) == [] and store.stats["stored_writes"] == 0


def test_the_store_keeps_at_most_its_bytes_the_least_recently_used_go(omit_fp_binary: Path, tmp_path: Path,
                                                                       monkeypatch):
    copies = []
    for index in range(3):
        copies.append(tmp_path / f"calls{index}")
        shutil.copyfile(omit_fp_binary, copies[-1])
    store_dir = tmp_path / "store"
    _lookup(_session(store_dir), copies[0])
    (entry,) = _entries(store_dir)
    monkeypatch.setattr(tablestore, "MAX_STORE_BYTES", 2 * entry.stat().st_size)
    _lookup(_session(store_dir), copies[1])
    os.utime(entry, ns=(1, 1))  # the first is the oldest...
    _lookup(_session(store_dir), copies[0])  # ...until it is read again: the second is now
    _lookup(_session(store_dir), copies[2])
    assert len(_entries(store_dir)) == 2  # the third save listed the directory again: over the bound
    survivors = _session(store_dir)
    for path in (copies[0], copies[2]):
        _lookup(survivors, path)
    assert len(_entries(store_dir)) == 2 and survivors.store.stats["stored_hits"] == 2


def test_where_tables_are_stored(monkeypatch):
    monkeypatch.setenv("OPTRACE_CACHE_DIR", "/some/where")
    assert default_directory() == Path("/some/where/unwind")
    monkeypatch.setenv("OPTRACE_CACHE_DIR", "")
    assert default_directory() is None and not TableStore.default().usable
    monkeypatch.delenv("OPTRACE_CACHE_DIR")
    assert default_directory() == Path("/var/cache/optrace/unwind" if os.geteuid() == 0 else
                                       os.path.expanduser("~/.cache/optrace/unwind"))


def test_a_second_recording_reads_the_first_ones_tables(bpf_ready, workloads: Path, tmp_path: Path, optrace):
    """Two `optrace record` runs of one workload: the first stores the tables of what it unwound, the
    second reads them back (each hit refreshes its entry) and stores nothing new: a table converted and
    stored again would be a new file (a rename), not the same inode with a new mtime."""
    env = {**os.environ, "OPTRACE_CACHE_DIR": str(tmp_path / "cache")}
    store = tmp_path / "cache" / "unwind"
    command = ["record", "-F", "499", "-o", str(tmp_path / "run.data"), "--", str(workloads / "demo"), "0.5"]
    optrace(*command, env=env, check=True)
    first = {path.name: path.stat().st_ino for path in _entries(store)}
    assert len(first) >= 2  # the program and libc at least
    for path in _entries(store):
        os.utime(path, ns=(1, 1))
    optrace(*command, env=env, check=True)
    second = {path.name: path.stat() for path in _entries(store)}
    assert {name: info.st_ino for name, info in second.items()} == first
    assert all(info.st_mtime_ns > 1 for info in second.values())



def test_one_session_saving_many_tables_stays_in_bound(tmp_path: Path):
    """The directory is listed at the first save, then counted: a save that would pass the bound lists it
    again and trims."""
    store = TableStore(tmp_path)
    table = UnwindFile(UnwindTable(bytes(16 * 100), 100, ".eh_frame", 0))
    store.save("first", table)
    (entry,) = _entries(tmp_path)
    store.entries.max_bytes = 2 * entry.stat().st_size
    for index, key in enumerate(("second", "third", "fourth")):
        store.save(key, table)
        os.utime(tmp_path / key, ns=(10 + index, 10 + index))
    os.utime(entry, ns=(1, 1))
    store.save("fifth", table)
    assert [path.name for path in _entries(tmp_path)] == ["fifth", "fourth"]
