"""A new generation of the BPF unwinder's rows (bpf/unwindmaps.py) with the real walker, in a session set
up as serve's (build-id stacks, exited processes forgotten): a second process whose files do not fit drops
the first one's table; the first is loaded again once sampled and its stacks are whole again, from rows
written again from the array's start; its table goes when it exits."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from optrace.bpf import unwindmaps
from optrace.frontend.session import TOP, ProfilingSession, SessionOptions

pytestmark = [pytest.mark.bpf, pytest.mark.usefixtures("bpf_ready")]


def drain_for(session: ProfilingSession, seconds: float) -> dict[int, Counter]:
    """pid -> samples by unwinder status ("" for frame-pointer stacks) over ``seconds``."""
    outcomes: dict[int, Counter] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.25)
        session.poll(time.monotonic())
        for sample in session.drain().samples:
            outcomes.setdefault(sample.pid, Counter())[sample.stop] += sample.count
    return outcomes


def wait_until(condition, session: ProfilingSession, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        drain_for(session, 0.5)


def wait_mapped(pid: int, path: Path, timeout: float = 30) -> None:
    """Until the process maps ``path`` (its libraries are mapped however loaded the machine is)."""
    deadline = time.monotonic() + timeout
    while str(path) not in Path(f"/proc/{pid}/maps").read_text():
        assert time.monotonic() < deadline, f"{path} not mapped by {pid}"
        time.sleep(0.05)


def take_free_rows(maps: unwindmaps.UnwindMaps) -> None:
    """Every free range of the row array taken, as other files' rows would (a new generation gives them back).
    Whether files fit is the row space's to say (bpf/rowspace.py), not ``_capacity``'s."""
    rows = maps._rows
    for _, count in list(rows._free):
        assert rows.allocate(count) is not None
    assert not rows.fits([1])


def test_a_new_generation_loads_the_live_process_again(workloads, tmp_path, monkeypatch):
    for name in ("unwind-tree", "libunwindtree.so"):  # a second copy: files the first generation lacks
        shutil.copy2(workloads / name, tmp_path / name)
    first = subprocess.Popen([str(workloads / "unwind-tree"), "60"])
    second = None
    session = ProfilingSession(SessionOptions(dataclasses.replace(TOP, raw_stacks=False), frequency_hz=499,
                                              pids=[first.pid]))
    try:
        session.start()
        maps = session.profiler.unwind
        wait_until(lambda: first.pid in session.unwinder._unwound, session, "the first table")
        assert drain_for(session, 1.5)[first.pid]["outermost"] > 0

        session.copies.close()  # the copy watcher stops: else the second's first copies have its table loaded at once
        second = subprocess.Popen([str(tmp_path / "unwind-tree"), "60"])
        session.add_pid(second.pid)
        wait_mapped(second.pid, tmp_path / "libunwindtree.so")  # no drain meanwhile, so the worker loads nothing
        take_free_rows(maps)  # full: the copies' rows do not fit
        monkeypatch.setattr(unwindmaps, "MIN_GENERATION_SECONDS", 0.0)
        # the first's files in use however long the second's tables take to read (5 s at load 34 here: its
        # files were stale then, evicted to make room, and no generation started)
        monkeypatch.setattr(unwindmaps, "ACTIVE_SECONDS", 3600.0)
        session.unwinder.unwind(second.pid)
        monkeypatch.undo()
        assert maps.generation == 1, maps.stats
        assert set(session.unwinder._unwound) == {second.pid} and not maps.has_process(first.pid)

        wait_until(lambda: maps.has_process(first.pid), session, "the first table loaded again")
        outcomes = drain_for(session, 2.0)
        for pid in (first.pid, second.pid):
            assert outcomes[pid]["outermost"] >= 0.95 * sum(outcomes[pid].values()), outcomes
        assert maps.generation == 1

        first.kill()
        first.wait()
        drain_for(session, 1.0)
        assert not maps.has_process(first.pid) and first.pid not in session.unwinder._unwound
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        session.close()
