"""`optrace top`'s engine: the profiling session `record` and `serve` use, drained once per refresh, its
samples named at once and added to :class:`~optrace.frontend.report.toprows.LiveTotals`.

Settings are serve's (a live view of a busy machine): a program is indexed once it is sampled, not at
exec, and what is kept about an exited process goes one drain after its exit. Stacks are named only while
the children column is on (like perf top without -g): naming every frame of every stack each second is
most of top's CPU time, and the self column needs only the leaves.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from optrace.defaults import DEFAULT_CALL_GRAPH, DEFAULT_FREQUENCY_HZ
from optrace.frontend.report.toprows import Header, LiveTotals, TopSnapshot, ViewState, deep_stack_share
from optrace.frontend.report.pythonview import leaf_only, python_view
from optrace.frontend.session import TOP, ProfilingSession, SessionOptions
from optrace.frontend.target import add_subprocesses, with_subprocesses
from optrace.frontend.unwind.copies import NO_TABLE
from optrace.model import RawSample, Sample


@dataclass
class TopOptions:
    frequency_hz: int = DEFAULT_FREQUENCY_HZ
    pids: list[int] | None = None  # None: the whole machine
    interval_s: float = 1.0
    sort: tuple[str, ...] = ("dso", "symbol")
    call_graph: str = DEFAULT_CALL_GRAPH  # how user stacks are walked (record's --call-graph)
    python: bool = True  # Python frames (SessionOptions.python)
    python_internals: bool = False  # the interpreter's frames as they are, not folded (report/pythonview.py)
    subprocesses: bool = False  # with pids: their descendants too (target.with_subprocesses)
    zero: bool = False
    children: bool = False
    iterations: int | None = None  # stop after this many refreshes (None: until q, Ctrl-C or SIGTERM)
    first_refresh_s: float = 0.25  # refresh this often until the first rows
    view: ViewState = field(init=False)

    def __post_init__(self) -> None:
        self.view = ViewState(sort=self.sort, children=self.children)


class TopEngine:
    def __init__(self, options: TopOptions) -> None:
        self.options = options
        self.totals = LiveTotals(zero=options.zero)
        self.header = Header(cpus=os.cpu_count() or 0, frequency_hz=options.frequency_hz,
                             interval_s=options.interval_s, zero=options.zero)
        self.session = ProfilingSession(SessionOptions(
            TOP, frequency_hz=options.frequency_hz, stacks=True, call_graph=options.call_graph, python=options.python,
            pids=None if options.pids is None else with_subprocesses(options.pids, options.subprocesses)))
        self.refreshes = 0
        self._last = 0.0  # when the last drain was (monotonic), or the attach

    def start(self) -> None:
        self.session.start()
        if self.options.subprocesses:
            add_subprocesses(self.session.target_pids, self.session.add_pid)
        self.header.event = self.session.event
        self._last = time.monotonic()

    def close(self) -> None:
        self.session.close()

    def poll(self) -> None:
        self.session.poll(time.monotonic())

    def refresh(self) -> None:
        """Drain the kernel's maps and add what they held (kept aside while paused: the totals freeze)."""
        view = self.options.view
        # without the children column, a sample whose stack was copied is not held until its process's
        # unwind table is read (seconds after the attach on a loaded machine): its leaf is known now
        drained = self.session.drain(leaves=not view.children)
        raw = drained.samples if view.children else [leaf_only(sample) for sample in drained.samples]
        frames, named = self.session.symbolize(raw)
        samples, partial = whole_stacks(raw, named) if view.children else (named, [])
        if not self.options.python_internals:
            samples, partial = python_view(frames, samples), python_view(frames, partial)
        # between drains: a slow refresh before (the first waits for the kernel's symbols) is not this one's
        elapsed, self._last = max(drained.time - self._last, 1e-3), drained.time
        count = sum(sample.count for sample in samples + partial)
        self.refreshes += 1
        self.header.lost += sum(n for reason, n in drained.lost.items() if reason not in ("idle", "carried"))
        self.header.warnings += len(self.session.take_warnings())
        if view.paused:
            return
        self.header.samples_per_s = count / elapsed
        self.header.deep_stacks = deep_stack_share(drained.samples)
        self.totals.add(frames, samples, stacks=view.children, partial=partial)

    def snapshot(self, limit: int | None = None) -> TopSnapshot:
        view = self.options.view
        return TopSnapshot(self.header, view, self.totals.rows(view, limit), time.strftime("%H:%M:%S"))


def whole_stacks(raw: list[RawSample], named: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """The named samples (in the order of ``raw``) whose stacks are whole, and those whose stack copy was never
    walked (their process's tables came too late: NO_TABLE), their callers unknown: self only (toprows.py)."""
    whole: list[Sample] = []
    partial: list[Sample] = []
    for sample, row in zip(raw, named):
        (partial if sample.stop == NO_TABLE else whole).append(row)
    return whole, partial
