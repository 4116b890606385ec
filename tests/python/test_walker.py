"""The reference walker (frontend/runtimes/cpython/walker.py) against each real interpreter: the main thread spins in
a() -> b() -> c(), a second thread in rank() called back by sorted() (programs/spin.py); every frame must be
named in order with its line, and on 3.11+ the eval-call boundaries must be where CPython puts them. This is
the check of each version's layout against the real interpreter. Then processes that fake one."""
from __future__ import annotations

import re
import shutil
import time

import pytest

from optrace.frontend.runtimes.cpython.codeobject import TRUNCATED
from optrace.frontend.runtimes.cpython.interpreter import find_interpreter
from optrace.frontend.runtimes.cpython.walker import MAX_FRAMES, thread_stack, thread_states
from optrace.procfs import read_maps
from optrace.pythonlayout import PythonProcess
from pythons import PROGRAMS, SUPPORTED, build_fake_python, child, command, require

SPIN = PROGRAMS / "spin.py"
LINES = {match.group(1): number for number, line in enumerate(SPIN.read_text().splitlines(), start=1)
         for match in [re.search(r"# LINE (\w+)", line)] if match}
MAIN = ["c", "b", "a", "<module>"]


def found(pid: int) -> PythonProcess:
    process = find_interpreter(pid, [entry for entry in read_maps(pid).entries if entry.executable])
    assert isinstance(process, PythonProcess), process
    return process


def named(stack) -> list[tuple[str, int, bool]]:
    return [(frame.info.name, frame.line, frame.entry) for frame in stack.frames]


@pytest.mark.parametrize("name", SUPPORTED)
def test_each_thread_is_named_in_order(name):
    with child([*command(name), str(SPIN)], lines=2) as (proc, lines):
        ids = {thread: (int(pthread), int(native)) for thread, pthread, native in (line.split() for line in lines)}
        time.sleep(0.05)  # both threads are in their loops once both have printed
        process = found(proc.pid)
        main = thread_stack(process, pthread_id=ids["main"][0])
        worker = thread_stack(process, pthread_id=ids["worker"][0])
        if process.layout.version >= (3, 11):  # the kernel tid, as a sample names the thread
            assert thread_stack(process, tid=ids["main"][1]) == main
            assert thread_stack(process, tid=ids["worker"][1]) == worker
        assert {state.thread_id for state in thread_states(process)} >= {ids["main"][0], ids["worker"][0]}
    assert main.truncated is None and worker.truncated is None
    assert [(frame.info.name, frame.line) for frame in main.frames] == [(f, LINES[f if f != "<module>" else "module"])
                                                                        for f in MAIN]
    assert all(frame.info.filename == str(SPIN) for frame in main.frames)
    assert [(frame.info.name, frame.line) for frame in worker.frames[:2]] == [("rank", LINES["rank"]),
                                                                              ("worker", LINES["worker"])]
    assert worker.frames[-1].info.name == "_bootstrap"
    if process.layout.version >= (3, 11):
        # a() b() c() run in the module's eval call; sorted() (C) calls rank in a new one
        assert [frame.entry for frame in main.frames] == [False, False, False, True]
        assert worker.frames[0].entry and worker.frames[-1].entry
        # Thread._bootstrap_inner calls self.run() in the same eval call up to 3.13, through C from 3.14
        assert worker.frames[2].info.qualname == "Thread.run"
        assert worker.frames[2].entry == (process.layout.version >= (3, 14))
    else:  # one eval call per frame
        assert all(frame.entry for frame in main.frames + worker.frames)


def test_an_unknown_thread_has_no_stack():
    with child([str(require("3.11-debian")), str(SPIN)], lines=2) as (proc, _):
        assert thread_stack(found(proc.pid), tid=1, pthread_id=1) is None


# -- processes that fake an interpreter (programs/fakepython.c) -------------------------------------------
@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    return build_fake_python(tmp_path_factory.mktemp("fakewalk"))


def test_a_frame_chain_that_loops(fake):
    with child([str(fake), "loop"], lines=1) as (proc, (line,)):
        started = time.perf_counter()
        stack = thread_stack(found(proc.pid), tid=int(line.split()[1]))
        took = time.perf_counter() - started
    assert stack.truncated == "loop" and len(stack.frames) == 2
    name = stack.frames[0].info.name  # claims 1 GiB of characters
    assert name.endswith(TRUNCATED) and set(name[:-1]) == {"A"} and len(name) < 5000
    assert not stack.frames[0].info.linetable_complete  # claims 1 TiB
    assert took < 1.0


def test_a_chain_of_ten_thousand_frames(fake):
    with child([str(fake), "deep"], lines=1) as (proc, (line,)):
        started = time.perf_counter()
        stack = thread_stack(found(proc.pid), tid=int(line.split()[1]))
        took = time.perf_counter() - started
    assert stack.truncated == "depth" and len(stack.frames) == MAX_FRAMES
    assert took < 5.0
