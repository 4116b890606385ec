"""What `optrace serve` drains each period, as :class:`~optrace.frontend.serve.source.Source` objects:
the CPU profile (a :class:`~optrace.frontend.session.ProfilingSession` naming each sample's leaf) and the
uprobe call counts, each turned into a :class:`~optrace.frontend.serve.totals.Delta` of what it saw since the previous drain.

With ``--call-graph dwarf`` (the default, SERVE_CALL_GRAPH in options.py) user stacks are unwound
from CFI in BPF, as in record, though serve names whole stacks only while a /debug/pprof/profile
collection runs or OTLP push is on (whose off-CPU stacks are named whole too): the walk is in the kernel, and what user space keeps for it is bounded for a daemon
(bpf/unwindmaps.py's generations; the unwind tables held, at most
unwind_cache_bytes, and only until the kernel holds their rows: session.py's SERVE mode). Tables are
converted in a child process (unwind_in_child), so
the drain loop never shares its interpreter with a conversion.
Each drain also counts every sample's user stack by quality (``optrace_stacks_total{quality}``:
complete, or the reason the walk stopped, frontend/unwind/quality.py), naming at most its outermost
frame: none when the unwinder itself ended at a thread's first frame.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from optrace.frontend.report.pythonview import leaf_depth, python_view
from optrace.frontend.serve.options import SERVE_CALL_GRAPH, ServeOptions
from optrace.frontend.serve.source import Source
from optrace.frontend.serve.totals import Delta, add_leaf_rows, add_off_cpu_rows
from optrace.frontend.session import SERVE, OffCpuOptions, ProfilingSession, SessionOptions
from optrace.frontend.target import add_subprocesses, with_subprocesses
from optrace.frontend.unwind.quality import outermost_only, outermost_quality
from optrace.frontend.uprobes.reach import slowed_processes
from optrace.model import UNKNOWN, Frame, RawSample, Sample


def off_cpu_leaves(samples: list[RawSample]) -> list[RawSample]:
    """Each wait with only the frame it is named after: the innermost user frame (the call that blocked, as
    the program sees it; in a Python stack, up to the Python frame, see leaf_depth), or for a kernel thread
    the caller of schedule() (its kernel stack starts at schedule(), bpf/offcpu.c)."""
    return [dataclasses.replace(s, user=s.user[:leaf_depth(s.user)], kernel=()) if s.user else
            dataclasses.replace(s, kernel=s.kernel[1:2] or s.kernel[-1:]) for s in samples]


def build_sources(options: ServeOptions) -> list[Source]:
    off_cpu = OffCpuOptions(every=options.off_cpu_every) if options.off_cpu else None
    profile = ProfileSource(options.frequency_hz, options.pids, options.comms, off_cpu, options.call_graph,
                            options.python, options.python_internals, options.subprocesses)
    sources: list[Source] = [profile]
    if options.uprobes:
        targets = profile.target_pids if options.pids else None
        sources.append(CallSource(options.uprobes, options.comms, targets))
    return sources


class ProfileSource:
    """The continuous CPU profile: a profiling session that names leaf frames (whole stacks while the
    daemon asks for them: a /debug/pprof/profile collection) and forgets exited processes (serve runs
    for months), turned into per-drain rows."""

    def __init__(self, frequency_hz: int, pids: list[int], comms: list[str], off_cpu: OffCpuOptions | None = None,
                 call_graph: str = SERVE_CALL_GRAPH, python: bool = True, python_internals: bool = False,
                 subprocesses: bool = False) -> None:
        self.session = ProfilingSession(SessionOptions(
            SERVE, frequency_hz=frequency_hz, pids=with_subprocesses(pids, subprocesses) or None, comms=frozenset(comms),
            stacks=False, off_cpu=off_cpu, call_graph=call_graph, python=python))
        self.python_internals = python_internals  # else the Python view (frontend/report/pythonview.py)
        self._subprocesses = subprocesses
        self._refused_seen = 0
        self.event: str | None = None

    def start(self) -> None:
        self.session.start()
        if self._subprocesses:
            add_subprocesses(self.session.target_pids, self.session.add_pid)
        self.event = self.session.event

    def target_pids(self) -> set[int]:
        """With -p: the given processes and their children; empty for the whole machine."""
        return self.session.target_pids()

    def collect(self, delta: Delta) -> None:
        drain = self.session.drain()
        lost = dict(drain.lost)
        delta.idle_samples += lost.pop("idle", 0)
        delta.carried_samples += lost.pop("carried", 0)
        delta.lost.update(lost)
        delta.execs += drain.execs
        delta.exits += len(drain.exits)
        started = time.perf_counter()
        # The outermost frames stack_quality needs are named with the leaves (a process whose files break
        # naming fails once): leaf_only keeps a one-frame user stack as it is.
        outermost = outermost_only(drain.samples)
        frames, rows = self.session.symbolize(drain.samples + outermost, stacks=delta.want_stacks)
        named = self._viewed(frames, rows[:len(drain.samples)])
        add_leaf_rows(delta, *named)
        delta.stack_quality.update(outermost_quality(drain.samples, outermost, frames, rows[len(drain.samples):]))
        if drain.off_cpu:
            add_off_cpu_rows(delta, *self._viewed(*self.session.symbolize(off_cpu_leaves(drain.off_cpu))))
            if delta.want_off_cpu_stacks:
                delta.off_cpu_stacks = self._viewed(*self.session.symbolize(drain.off_cpu, stacks=True))
        if delta.want_stacks:
            delta.stacks = named
        delta.symbolize_seconds += time.perf_counter() - started
        delta.jit_refused_files += self._new_refusals()
        delta.read_errors.update(self.session.read_errors)
        self.session.read_errors.clear()
        delta.warnings.extend(self.session.take_warnings())
        delta.caches.update(self.session.cache_sizes())

    def _viewed(self, frames: list[Frame], samples: list[Sample]) -> tuple[list[Frame], list[Sample]]:
        """Named samples as every output of serve shows them: series, /debug/pprof/profile, OTLP."""
        return frames, samples if self.python_internals else python_view(frames, samples)

    def _new_refusals(self) -> int:
        total = sum(n for key, n in self.session.jit.stats.items() if key.startswith("refused_"))
        new, self._refused_seen = total - self._refused_seen, total
        return new

    def close(self) -> None:
        self.session.close()


class CallSource:

    """Exact uprobe call counts: the probe manager's cumulative counts since start, turned into
    per-drain increments by (binary, symbol, comm). Calls the kernel could not attribute to a process
    (its per-pid map was full) are counted with comm="[unknown]" from their own kernel counter, so the
    totals stay exact. An exited process is listed one last time with its final count, then dropped.
    What starting the probes has to say (how many processes they slow down, IFUNC resolvers, glob matches
    the kernel refused) comes with the first drain's warnings."""

    event = None

    def __init__(self, specs: list[str], comms: list[str], targets: Callable[[], set[int]] | None) -> None:
        self._specs = specs
        self._comms = set(comms)
        self._targets = targets
        self._seen: dict[tuple[str, int, int | None], int] = {}  # (binary, offset, pid or None) -> calls
        self._target_set: set[int] = set()  # read once per drain, not once per pid
        self._start_warnings: list[str] = []
        self.counter = None

    def start(self) -> None:
        from optrace.frontend.uprobes.counter import CallCounter

        pid_filter = self._target_set.__contains__ if self._targets else None
        self.counter = CallCounter(self._specs, pid_filter=pid_filter)
        self.counter.start()
        self._start_warnings = [*slowed_processes(self.counter.probes), *self.counter.warnings]

    def collect(self, delta: Delta) -> None:
        delta.warnings.extend(self._start_warnings)
        self._start_warnings = []
        if self._targets:
            self._target_set.clear()
            self._target_set.update(self._targets())
        seen: dict[tuple[str, int, int | None], int] = {}
        for count in self.counter.calls():
            cumulative: dict[int | None, int] = {**count.per_pid, None: count.unattributed}
            for pid, calls in cumulative.items():
                key = (count.binary, count.offset, pid)  # one glob SPEC gives many rows
                seen[key] = calls
                new = calls - self._seen.get(key, 0)
                comm = count.comms.get(pid) or UNKNOWN  # the attacher read the comm (kernel, else /proc)
                if new > 0 and (not self._comms or comm in self._comms):
                    delta.uprobe_calls[(count.binary, count.symbol, comm)] += new
        self._seen = seen  # pids the probe manager no longer reports are dropped here too

    def close(self) -> None:
        if self.counter is not None:
            self.counter.close()
