"""`optrace top`'s refresh loop and header, on a clock and a session of the test's own (no BPF): a plain
table comes every interval from the first (only a screen refreshes faster until it has rows), and the
samples-per-second figure is over the time between two drains, whatever the refreshes between them cost."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from optrace.frontend.session import Drain
from optrace.frontend.top import screen
from optrace.frontend.top.engine import TopEngine, TopOptions
from optrace.frontend.unwind.copies import NO_TABLE
from optrace.model import Frame, RawSample, Sample, UserFrame


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    """Rows from the ``rows_at``-th refresh on; each refresh's time is noted."""

    def __init__(self, clock: Clock, rows_at: int, iterations: int) -> None:
        self.options = TopOptions(interval_s=0.5, iterations=iterations)
        self.clock, self.rows_at = clock, rows_at
        self.refreshes = 0
        self.times: list[float] = []
        self.totals = SimpleNamespace(self_totals={})

    def start(self) -> None:
        self.started = self.clock.now

    def poll(self) -> None:
        pass

    def refresh(self) -> None:
        self.refreshes += 1
        self.times.append(round(self.clock.now - self.started, 3))
        if self.refreshes >= self.rows_at:
            self.totals.self_totals = {"hot_a": 1.0}


class FakeUi:
    def __init__(self, clock: Clock, quick_first: bool) -> None:
        self.clock, self.quick_first = clock, quick_first

    def show(self, engine) -> None:
        pass

    def wait(self, seconds: float) -> bool:
        self.clock.now += seconds
        return False


@pytest.mark.parametrize("quick_first, times", [(False, [0.5, 1.0, 1.5, 2.0]), (True, [0.25, 0.5, 0.75, 1.25])],
                         ids=["plain", "screen"])
def test_plain_tables_come_every_interval_from_the_first(monkeypatch, quick_first, times):
    """Rows from the third refresh on: a log's -n 4 covers four intervals; a screen looks every 0.25 s until
    it has rows (before, piped `top -n 3 -d 0.5` took its three tables within 0.75 s of the attach, empty
    ones when the first samples came later, as on a busy machine)."""
    clock = Clock()
    monkeypatch.setattr(screen.time, "monotonic", clock)
    engine = FakeEngine(clock, rows_at=3, iterations=4)
    screen.run(engine, FakeUi(clock, quick_first), SimpleNamespace(stopped=threading.Event()))
    assert engine.times == times


class FakeSession:
    """Drains at given times, each with a count of samples of one function; the first symbolize takes 0.8 s
    (it waits for the kernel's symbols), the others 10 ms."""

    event = "cpu-clock"

    def __init__(self, drains: list[tuple[float, int]], clock: Clock) -> None:
        self.drains, self.clock = list(drains), clock
        self.symbolized = 0
        self.leaves: list[bool] = []  # each drain's ``leaves``

    def start(self) -> None:
        pass

    def drain(self, leaves: bool = False) -> Drain:
        self.leaves.append(leaves)
        at, count = self.drains.pop(0)
        assert at >= self.clock.now
        self.clock.now = at
        samples = [RawSample(7, "demo", (), (), count, at)]
        return Drain(samples, [False], {}, 0, [], at)

    def symbolize(self, samples: list[RawSample]) -> tuple[list[Frame], list[Sample]]:
        self.clock.now += 0.8 if not self.symbolized else 0.01
        self.symbolized += 1
        return [Frame("hot_a", "demo")], [Sample(s.pid, s.comm, (0,), s.count) for s in samples]

    def take_warnings(self) -> list[str]:
        return []


def test_samples_per_second_is_over_the_time_between_drains(monkeypatch):
    """The refresh after a slow one drains at once: its samples came over that slow one's time (before,
    the header said 6,000 samples/s of a process sampled at 999 Hz)."""
    clock = Clock()
    monkeypatch.setattr("optrace.frontend.top.engine.time.monotonic", clock)
    engine = TopEngine(TopOptions(python_internals=True))
    engine.session = FakeSession([(100.5, 50), (101.31, 120), (101.82, 9)], clock)
    engine.start()
    rates = []
    for _ in range(3):
        engine.refresh()
        rates.append(engine.header.samples_per_s)
    assert rates == pytest.approx([50 / 0.5, 120 / 0.81, 9 / 0.51])


def test_samples_wait_for_unwind_tables_only_while_the_children_column_is_on(monkeypatch):
    """The self column needs leaves, known at once: rows within a second of the attach, whatever the time
    the target's unwind tables take (7.5 s at load 30 on 2 CPUs)."""
    clock = Clock()
    monkeypatch.setattr("optrace.frontend.top.engine.time.monotonic", clock)
    engine = TopEngine(TopOptions(python_internals=True))
    engine.session = FakeSession([(100.5, 50), (101.5, 50), (102.5, 50)], clock)
    engine.start()
    engine.refresh()
    engine.options.view.children = True
    engine.refresh()
    engine.options.view.children = False
    engine.refresh()
    assert engine.session.leaves == [True, False, True]


class StackSession(FakeSession):
    """Each drain: ``count`` samples walked whole (hot_a called by main) and as many more whose stack copy was
    never walked (their process's tables came too late: only their leaf is known)."""

    def drain(self, leaves: bool = False) -> Drain:
        self.leaves.append(leaves)
        at, count = self.drains.pop(0)
        self.clock.now = at
        samples = [RawSample(7, "demo", (UserFrame(None, 1), UserFrame(None, 2)), (), count, at, stop="outermost"),
                   RawSample(7, "demo", (UserFrame(None, 1),), (), count, at, stop=NO_TABLE)]
        return Drain(samples, [False, False], {}, 0, [], at)

    def symbolize(self, samples: list[RawSample]) -> tuple[list[Frame], list[Sample]]:
        frames = [Frame("hot_a", "demo"), Frame("main", "demo")]
        return frames, [Sample(s.pid, s.comm, tuple(range(len(s.user))), s.count) for s in samples]


def test_children_are_of_whole_stacks_only(monkeypatch):
    """A sample whose stack copy was never walked has its leaf, not its callers: it counts in the self column
    only (before, main, on every stack of a one-threaded process, showed 87.6 % in CI: its tables came late)."""
    clock = Clock()
    monkeypatch.setattr("optrace.frontend.top.engine.time.monotonic", clock)
    engine = TopEngine(TopOptions(python_internals=True, children=True))
    engine.session = StackSession([(100.5, 50), (101.5, 50)], clock)
    engine.start()
    for _ in range(2):
        engine.refresh()
    rows = {row.key.symbol: row for row in engine.snapshot().rows}
    assert rows["main"].children_percent == 100.0 and rows["hot_a"].children_percent == 100.0
    assert rows["hot_a"].percent == 100.0 and engine.header.samples_per_s == 100.0
