"""The per-second budget of looks at processes (frontend/unwind/budget.py): whatever the rate of requests, at
most its burst at once and its rate after, each refusal counted by kind."""
from __future__ import annotations

from optrace.frontend.unwind.budget import ProcessBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_looks_per_second_stay_bounded_whatever_the_requests():
    clock = Clock()
    budget = ProcessBudget(per_second=50, burst_seconds=2, clock=clock)
    assert sum(budget.take("tables") for _ in range(1000)) == 100  # the burst: 2 s of looks
    for _ in range(10):  # 10 s at 1,000 requests a second
        clock.now += 1.0
        assert sum(budget.take("symbols") for _ in range(1000)) == 50
    assert budget.taken == {"tables": 100, "symbols": 500}
    assert budget.deferred == {"tables": 900, "symbols": 9500}


def test_an_idle_budget_refills_to_its_burst_only():
    clock = Clock()
    budget = ProcessBudget(per_second=10, burst_seconds=1, clock=clock)
    clock.now += 3600
    assert sum(budget.take("python_maps") for _ in range(100)) == 10
