"""top's live totals (frontend/report/toprows.py): decay, the window, projections, children percentages."""
from __future__ import annotations

import pytest

from optrace.frontend.report.toprows import DECAY, LiveTotals, ViewState, deep_stack_share
from optrace.model import Frame, RawSample, Sample, UserFrame

FRAMES = [Frame("hot", "/bin/a"), Frame("main", "/bin/a"), Frame("other", "/bin/b"), Frame("tick", "[k]", kind="kernel")]


def interval(hot: int, other: int, kernel: int = 0) -> list[Sample]:
    return [Sample(1, "a", (0, 1), hot), Sample(2, "b", (2,), other), Sample(1, "a", (3, 0, 1), kernel)]


def by_symbol(totals: LiveTotals, view: ViewState) -> dict[str, tuple[float, float]]:
    return {row.key.symbol: (round(row.percent, 2), round(row.children_percent, 2)) for row in totals.rows(view)}


def test_decay_and_window():
    decayed, window = LiveTotals(), LiveTotals(zero=True)
    for totals in (decayed, window):
        totals.add(FRAMES, interval(80, 20))
        totals.add(FRAMES, interval(0, 100))
    assert by_symbol(window, ViewState())["other"][0] == 100.0
    hot = 80 * DECAY
    assert by_symbol(decayed, ViewState())["hot"][0] == pytest.approx(100 * hot / (hot + 20 * DECAY + 100), abs=0.01)


def test_children_are_of_the_stacked_samples_only():
    totals = LiveTotals()
    for _ in range(5):
        totals.add(FRAMES, interval(60, 40), stacks=False)
    totals.add(FRAMES, interval(60, 40), stacks=True)
    shown = by_symbol(totals, ViewState(children=True))
    assert shown["main"][1] == 60.0 and shown["hot"][1] == 60.0 and shown["other"][1] == 40.0


def test_keys_kernel_filter():
    totals = LiveTotals()
    totals.add(FRAMES, interval(50, 40, 10))
    assert set(by_symbol(totals, ViewState(show_kernel=False))) == {"hot", "other"}
    assert set(by_symbol(totals, ViewState(filter="OTH"))) == {"other"}
    rows = totals.rows(ViewState(sort=("comm", "symbol")))
    assert {(row.key.comm, row.key.symbol) for row in rows} == {("a", "hot"), ("b", "other"), ("a", "tick")}
    assert all(row.key.dso is None for row in rows)


def test_stack_quality():
    frame = UserFrame(None, 1)
    samples = [RawSample(1, "a", (frame, frame), (), 3), RawSample(1, "a", (frame,), (), 1), RawSample(1, "a", (), (5,), 9)]
    assert deep_stack_share(samples) == 75.0
    assert deep_stack_share([]) is None
