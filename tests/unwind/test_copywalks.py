"""frontend/unwind/copywalks.py: the last drain asks for the tables of every process whose samples wait, whatever
the looks budget, and waits for them (issue 43: under load the budget was spent, and the last drains' samples of
compilers that had exited, never asked for, gave up: cc1 264 of 1,586 samples `no_table`)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from optrace.bpf.profiler import DrainResult
from optrace.frontend.unwind.copies import NO_TABLE
from optrace.frontend.unwind.copywalks import CopyWalks
from test_copies import MAPPING, PID, copied_sample, walked_frames


class FakeUnwinder:
    """The scheduler as CopyWalks uses it: its budget spent (a budgeted ask does nothing), an unbudgeted one
    builds the exited process's tables from its kept image at once (the capture worker's job, done)."""

    def __init__(self) -> None:
        self.on_tables = None
        self.unwinding = None
        self.asked: list[tuple[int, bool]] = []

    def unwind_soon(self, pid: int, budgeted: bool = True) -> None:
        self.asked.append((pid, budgeted))
        if not budgeted:
            self.on_tables(pid, 5, 3, [MAPPING])

    def pending(self) -> set[int]:
        return set()

    def wait_for(self, seconds: float, captures: bool = False) -> None:
        pass

    def unwind_later(self, pid: int) -> None:
        pass


@pytest.fixture
def walks():
    read_end, write_end = os.pipe()  # the copy ring's fd: never readable, the watcher only waits
    copies: dict = {}
    profiler = SimpleNamespace(
        unwind=SimpleNamespace(rows=lambda _key: None, want=lambda _keys: set()),
        copies=SimpleNamespace(fd=read_end), read_copies=lambda: copies.pop("next", {}),
        live_epoch=lambda _pid: 0)
    unwinder = FakeUnwinder()
    made = CopyWalks(profiler, unwinder, lambda _kind, call, *args: call(*args))
    yield made, unwinder, copies
    made.close()
    os.close(read_end)
    os.close(write_end)


def test_the_last_drain_asks_for_the_tables_of_an_exited_process_and_walks_its_samples(walks):
    made, unwinder, copies = walks
    sample, copy = copied_sample(1)
    copies["next"] = {1: copy}
    assert made.walk([sample], [], DrainResult(exits=[PID]), final=False) == ([], [])  # waits: budget spent
    assert set(unwinder.asked) == {(PID, True)}
    cpu, _ = made.walk([], [], DrainResult(), final=True)
    assert [(s.user, s.stop) for s in cpu] == [(walked_frames(), "outermost")]
    assert (PID, False) in unwinder.asked


def test_a_process_whose_tables_cannot_come_still_gives_up_at_the_last_drain(walks):
    made, unwinder, copies = walks
    unwinder.unwind_soon = lambda pid, budgeted=True: unwinder.asked.append((pid, budgeted))  # gone, no image
    sample, copy = copied_sample(1)
    copies["next"] = {1: copy}
    made.walk([sample], [], DrainResult(exits=[PID]), final=False)
    cpu, _ = made.walk([], [], DrainResult(), final=True)
    assert [(s.user, s.stop) for s in cpu] == [(sample.user, NO_TABLE)]
