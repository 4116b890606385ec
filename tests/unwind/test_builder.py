"""The child process that converts unwind tables for serve (frontend/unwind/builder.py): the same tables
and errors as a conversion in the calling thread, an unprivileged child, and a child that dies, hangs,
idles or outlives its parent costs at most the file being converted."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cfibytes import mutated_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optrace.fileaccess import reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileRef, problem_kind
from optrace.frontend.symbols.elffile import ElfFormatError
from optrace.frontend.unwind.builder import ChildProcessBuilder, InProcessBuilder
from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.unwind.processmaps import ProcessUnwinding

LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
CC1 = Path("/usr/lib/gcc/x86_64-linux-gnu/12/cc1")
NEVER = lambda: False  # noqa: E731


def converted(builder, path: Path, stop=NEVER):
    with reader_for(os.open(path, os.O_RDONLY), ELF_POLICY, str(path)) as reader:
        return builder.convert(reader, None, stop)


@pytest.fixture
def child():
    builder = ChildProcessBuilder()
    yield builder
    builder.close()


def test_the_child_gives_the_same_files_as_the_calling_thread(child, omit_fp_binary):
    for path in (LIBC, omit_fp_binary):
        ours = converted(child, path)
        assert ours.table.count > 1000 or path == omit_fp_binary
        assert ours == converted(InProcessBuilder(), path)
    assert child.started == 1


def test_the_child_works_beside_thousands_of_descriptors(child):
    """serve holding thousands of connections: its socket to the child is numbered past 1023, where select()
    fails (ValueError: filedescriptor out of range), in the parent and in the child, which keeps the number."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        assert converted(child, LIBC).table.count > 1000
    finally:
        for fd in held:
            os.close(fd)


def test_the_child_runs_unprivileged(child):
    converted(child, LIBC)
    status = Path(f"/proc/{child.child_pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["NoNewPrivs"].strip() == "1"
    if os.geteuid() == 0:
        assert fields["Uid"].split() == ["65534"] * 4 and fields["Gid"].split() == ["65534"] * 4
        assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0
        assert fields["Groups"].strip() == ""


def test_a_bad_file_raises_as_in_the_calling_thread_and_the_child_stays(child, tmp_path):
    bad = tmp_path / "not-elf"
    bad.write_bytes(b"\x7fELF" + b"\xff" * 200)
    converted(child, LIBC)
    pid = child.child_pid
    with pytest.raises(ElfFormatError):
        converted(InProcessBuilder(), bad)
    with pytest.raises(ElfFormatError):
        converted(child, bad)
    assert converted(child, LIBC).table.count and child.child_pid == pid and child.started == 1


def test_a_killed_child_costs_one_file_and_is_replaced(child):
    converted(child, LIBC)
    os.kill(child.child_pid, signal.SIGKILL)
    time.sleep(0.1)
    assert converted(child, LIBC).table.count and child.started == 2


def test_a_child_that_leaves_as_it_is_asked_is_asked_again(child, monkeypatch):
    """An idle child exits after its idle time; a request sent just then finds its socket closed."""
    connected = child._connected
    gone, _ = socket.socketpair()
    _.close()
    answers = iter([gone])
    monkeypatch.setattr(child, "_connected", lambda: next(answers, None) or connected())
    assert converted(child, LIBC).table.count and child.started == 1


@pytest.mark.skipif(not CC1.exists(), reason="gcc's cc1 is not installed")
def test_a_stop_ends_the_wait_and_the_child(child):
    converted(child, LIBC)
    pid = child.child_pid
    calls = []

    def stop_on_the_third_look() -> bool:
        calls.append(1)
        return len(calls) >= 3
    started = time.monotonic()
    with pytest.raises(DwarfError, match="session is ending"):
        converted(child, CC1, stop_on_the_third_look)  # 0.6 s of CPU in the child
    assert time.monotonic() - started < 1.0
    assert not Path(f"/proc/{pid}").exists()


def test_an_idle_child_exits_and_a_new_one_comes_on_demand():
    builder = ChildProcessBuilder(idle_seconds=0.3)
    try:
        converted(builder, LIBC)
        pid = builder.child_pid
        deadline = time.monotonic() + 10
        while builder.child_pid is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert builder.child_pid is None and not Path(f"/proc/{pid}").exists()
        assert converted(builder, LIBC).table.count and builder.started == 2
    finally:
        builder.close()


def test_the_child_dies_with_its_parent(tmp_path):
    script = ("import os, sys\n"
              "from optrace.fileaccess import reader_for\n"
              "from optrace.frontend.symbols.access import ELF_POLICY\n"
              "from optrace.frontend.unwind.builder import ChildProcessBuilder\n"
              "b = ChildProcessBuilder()\n"
              f"b.convert(reader_for(os.open({str(LIBC)!r}, os.O_RDONLY), ELF_POLICY, 'libc'), None, lambda: False)\n"
              "print(b.child_pid, flush=True)\n"
              "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    pid = int(out.stdout)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the builder outlived its parent"


def test_the_cache_counts_a_bad_file_from_the_child_as_from_the_thread(tmp_path):
    bad = tmp_path / "not-elf"
    bad.write_bytes(b"\x7fELF" + b"\xff" * 200)
    stats = []
    for builder in (InProcessBuilder(), ChildProcessBuilder()):
        lines = []
        cache = UnwindTableCache(warn=lines.append, builder=builder)
        assert not cache.of_ref(FileRef(str(bad), str(bad))).count
        stats.append((dict(cache.stats), lines))
        cache.close()
    assert stats[0] == stats[1] and stats[0][0]["bad_files_malformed"] == 1


FUZZ = settings(max_examples=int(os.environ.get("OPTRACE_FUZZ_EXAMPLES", "200")) // 10, deadline=None,
                database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 24), st.integers(0, 255)), min_size=1, max_size=30))
def test_fuzz_the_child_agrees_with_the_thread(omit_fp_binary, tmp_path_factory, shared_child, mutations):
    """Mutated copies of a real binary: the same file, or the same kind of problem (as the cache counts
    it), from both builders."""
    path = mutated_copy(omit_fp_binary, mutations, tmp_path_factory.mktemp("fuzz"))
    results = []
    for builder in (InProcessBuilder(), shared_child):
        try:
            results.append(converted(builder, path))
        except Exception as err:  # noqa: BLE001 - what the cache would count
            results.append(problem_kind(err))
    assert results[0] == results[1]
    assert shared_child.started == 1


@pytest.fixture(scope="module")
def shared_child():
    builder = ChildProcessBuilder()
    yield builder
    builder.close()


def test_the_session_keeps_the_cache_it_was_given():
    """An empty cache is falsy (it has a length): serve's cache, with its child builder and its smaller
    budget, was once replaced by a default one."""
    cache = UnwindTableCache(max_bytes=1 << 20, builder=ChildProcessBuilder())
    assert ProcessUnwinding(cache).tables is cache


def test_the_child_imports_nothing_from_the_working_directory(tmp_path, monkeypatch):
    """``python -m`` puts the working directory first on sys.path: serve started as root from a directory
    another user writes would run their json.py."""
    marker = tmp_path / "ran"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    builder = ChildProcessBuilder()
    try:
        assert converted(builder, LIBC).table.count
    finally:
        builder.close()
    assert not marker.exists()
