"""What `optrace serve` drains each period: the CPU profile and the uprobe call counts, as a Delta.

Each source owns its kernel side (start/close) and, per drain, adds to a :class:`Delta` the rows it
saw since the previous drain. Per-process state is dropped when the process exits, so memory stays
bounded however many processes come and go. Each process's share of the work (reading its maps, its
JIT files, naming its samples) is contained: an exception there costs that process's names (counted
in ``Delta.read_errors``), never the drain or the daemon.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import partial
from typing import Protocol, TypeVar

from optrace.exporters.totals import Delta
from optrace.fileaccess import printable
from optrace.model import UNKNOWN, Frame, RawSample, Sample
from optrace.frontend.recorder import leaf_only
from optrace.procfs import exec_path

JIT_DSO = "[jit]"
PRUNE_EVERY = 30  # drains between two looks for processes whose exit event was lost
T = TypeVar("T")


class Source(Protocol):
    event: str | None  # the sampling event once started ("cpu-clock"...), None for non-sampling sources

    def start(self) -> None: ...

    def collect(self, delta: Delta) -> None: ...

    def close(self) -> None: ...


def dso_label(dso: str) -> str:
    """JIT dsos name a per-process file (`[jit] /tmp/perf-PID.map`): one label for all of them, or
    every process would add series."""
    return JIT_DSO if dso.startswith(JIT_DSO) else dso


def leaf_labels(comm: str, frame: Frame | None) -> tuple[str, str, str]:
    """(comm, dso, symbol) of a sample's leaf frame. An unnamed address becomes symbol="[unknown]"
    (keeping its dso): `dso+0xOFFSET` labels would add a series per address."""
    if frame is None:
        return (comm, UNKNOWN, UNKNOWN)
    return (comm, dso_label(frame.dso), frame.symbol if frame.resolved else UNKNOWN)


def contain(delta: Delta, kind: str, call: Callable[[], T]) -> T | None:
    """``call()``, or None when it raised: the failure is counted in ``delta.read_errors[kind]`` and
    warned about once per kind and exception type (the daemon dedupes), so one hostile or malformed
    file costs only what depended on it."""
    try:
        return call()
    except Exception as exc:  # containment is the point: any bug or bad input in one process's work
        delta.read_errors[kind] += 1
        delta.warnings.append(f"{kind} failed and was skipped ({type(exc).__name__}: {printable(exc)[:200]}); "
                              f"counted in optrace_read_errors_total{{kind=\"{kind}\"}}")
        return None


def add_leaf_rows(delta: Delta, frames: list[Frame], samples: Iterable[Sample]) -> None:
    for sample in samples:
        leaf = frames[sample.frames[0]] if sample.frames else None
        if leaf is None or not leaf.resolved:
            delta.unresolved_frames += sample.count
        delta.cpu_samples[leaf_labels(sample.comm, leaf)] += sample.count


class ProcessTracker:
    """Per live process: its exec'd path until it is first sampled, and the build-ids its samples
    showed. Only sampled processes cost anything (a busy machine execs hundreds of processes a
    second); a process is re-read (maps snapshot) only when a sample shows an object not seen
    before in it, as the recorder does. Everything about a process goes when it exits."""

    def __init__(self) -> None:
        self._seen: dict[int, set[bytes]] = {}
        self._execs: dict[int, str] = {}

    def exec(self, pid: int, path: str) -> None:
        self._execs[pid] = path

    def sampled(self, samples: Iterable[RawSample]) -> tuple[dict[int, str], set[int]]:
        """(pid -> exec'd path of processes sampled for the first time, processes to snapshot)."""
        executables, snapshot = {}, set()
        for sample in samples:
            if sample.pid in self._execs:
                executables[sample.pid] = self._execs.pop(sample.pid)
            known = self._seen.setdefault(sample.pid, set())
            new = {f.build_id for f in sample.user if f.build_id is not None} - known
            if new:
                known |= new
                snapshot.add(sample.pid)
        return executables, snapshot

    def forget(self, pid: int) -> None:
        self._seen.pop(pid, None)
        self._execs.pop(pid, None)

    def pids(self) -> set[int]:
        return set(self._seen) | set(self._execs)


def _leaf_is_raw_address(sample: RawSample) -> bool:
    """A user leaf without build-id is anonymous memory, JIT code maybe: only then are the
    process's perf map and jitdumps worth reading (only the leaf is named here)."""
    return not sample.kernel and bool(sample.user) and sample.user[0].build_id is None


class ProfileSource:
    """The continuous CPU profile: Profiler -> leaf frames -> Symbolizer (JIT included) -> rows."""

    def __init__(self, frequency_hz: int, pids: list[int], comms: list[str]) -> None:
        self._frequency_hz = frequency_hz
        self._pids = pids
        self._comms = set(comms)
        self._tracker = ProcessTracker()
        self._exited: list[int] = []  # forgotten one drain late: their last samples may still come
        self._refused_seen = 0
        self._jit_pids: set[int] = set()  # processes whose JIT symbol files are being read
        self._drains = 0
        self.event: str | None = None
        self.profiler = None
        self.symbolizer = None

    def start(self) -> None:
        from optrace.bpf.profiler import Profiler
        from optrace.frontend.symbols.kallsyms import Kallsyms
        from optrace.frontend.symbols.symbolizer import Symbolizer
        from optrace.jitmaps.jitsymbols import JitSymbols

        # Build-id user stacks only: with raw IPs, 2 of 6 full test-suite runs lost about half of one
        # demo function's samples in serve (never in record, never alone); kept out until understood.
        self.profiler = Profiler(self._frequency_hz, pids=self._pids or None, raw_stacks=False)
        self.profiler.start()  # first: the compile's peak memory does not stack on kallsyms' tables
        self.event = self.profiler.event
        self.jit = JitSymbols()
        self.symbolizer = Symbolizer(kallsyms=Kallsyms.load(), jit_lookup=self.jit.lookup)
        for pid in self._pids:
            self.symbolizer.snapshot_process(pid)

    def target_pids(self) -> set[int]:
        """With -p: the given processes and their children; empty for the whole machine."""
        return self.profiler.target_pids() if self.profiler and self._pids else set()

    def collect(self, delta: Delta) -> None:
        result = self.profiler.drain()
        lost = dict(result.lost)
        delta.idle_samples += lost.pop("idle", 0)
        delta.lost.update(lost)
        delta.execs += len(result.execs)
        delta.exits += len(result.exits)
        samples = [s for s in result.samples if not self._comms or s.comm in self._comms]
        self._learn_processes(result, samples, delta)
        started = time.perf_counter()
        for frames, symbolized in self._symbolize([leaf_only(s) for s in samples], delta):
            add_leaf_rows(delta, frames, symbolized)
        delta.symbolize_seconds += time.perf_counter() - started
        self._end_processes(result, delta)
        delta.jit_refused_files += self._new_refusals()
        self._take_warnings(delta)
        delta.caches.update(self.symbolizer.cache_sizes(), jit_processes=len(self._jit_pids),
                            jit_symbols=self.jit.budget.entries, jit_names_bytes=self.jit.budget.name_bytes)

    def _symbolize(self, leaves: list[RawSample], delta: Delta) -> list[tuple[list[Frame], list[Sample]]]:
        """All leaves in one call; if that raises, again one process at a time, so only the process
        whose files broke it loses its names (its samples still count, as "[unknown]")."""
        try:
            return [self.symbolizer.symbolize(leaves)]
        except Exception:  # found again, counted and warned below, per process
            pass
        by_pid: dict[int, list[RawSample]] = defaultdict(list)
        for leaf in leaves:
            by_pid[leaf.pid].append(leaf)
        results = []
        for group in by_pid.values():
            named = contain(delta, "symbolize", partial(self.symbolizer.symbolize, group))
            results.append(named or ([], [Sample(s.pid, s.comm, (), s.count) for s in group]))
        return results

    def _learn_processes(self, result, samples: list[RawSample], delta: Delta) -> None:
        """What the symbolizer and JIT symbols must know before this drain's samples are named."""
        for pid, filename in result.execs:
            path = exec_path(pid, filename)
            if path:
                self._tracker.exec(pid, path)
        executables, snapshot = self._tracker.sampled(samples)
        for pid in snapshot:
            contain(delta, "process_maps", partial(self.symbolizer.snapshot_process, pid))
        for path in executables.values():  # for processes gone before their maps could be read
            contain(delta, "executable", partial(self.symbolizer.add_executable, path))
        for pid in {s.pid for s in samples if _leaf_is_raw_address(s)}:
            self._jit_pids.add(pid)
            contain(delta, "jit_symbols", partial(self.jit.poll, pid, result.time))

    def _end_processes(self, result, delta: Delta) -> None:
        """Exited processes are forgotten one drain late: samples taken just before an exit may
        reach the next drain. Every PRUNE_EVERY drains, processes whose exit event was lost (the
        kernel's event buffer overflowed) are found in /proc and forgotten too."""
        for pid in self._exited:
            contain(delta, "forget_process", partial(self._forget, pid))
        self._exited = list(result.exits)
        self._drains += 1
        if self._drains % PRUNE_EVERY == 0:
            self._exited += [pid for pid in self._tracker.pids() if not os.path.exists(f"/proc/{pid}")]
        for pid in result.exits:
            if pid in self._jit_pids:
                contain(delta, "jit_symbols", partial(self.jit.process_exited, pid, result.time))

    def _forget(self, pid: int) -> None:
        """Drop what is kept about a process, so memory does not grow with every process that ever ran."""
        self._tracker.forget(pid)
        self._jit_pids.discard(pid)
        self.symbolizer.forget_process(pid)
        self.jit.forget_process(pid)

    def _take_warnings(self, delta: Delta) -> None:
        """Hand new warnings to the daemon (it logs them) instead of keeping them forever."""
        for owner in (self.symbolizer, self.jit):
            delta.warnings.extend(owner.warnings)
            owner.warnings.clear()

    def _new_refusals(self) -> int:
        total = sum(n for key, n in self.jit.stats.items() if key.startswith("refused_"))
        new, self._refused_seen = total - self._refused_seen, total
        return new

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()
        if self.symbolizer is not None:
            self.symbolizer.close()


class CallSource:
    """Exact uprobe call counts: the probe manager's cumulative counts since start, turned into
    per-drain increments by (binary, symbol, comm). Calls the kernel could not attribute to a process
    (its per-pid map was full) are counted with comm="[unknown]" from their own kernel counter, so the
    totals stay exact. An exited process is listed one last time with its final count, then dropped."""

    event = None

    def __init__(self, specs: list[str], comms: list[str], targets: Callable[[], set[int]] | None) -> None:
        self._specs = specs
        self._comms = set(comms)
        self._targets = targets
        self._seen: dict[tuple[str, int, int | None], int] = {}  # (binary, offset, pid or None) -> calls
        self._target_set: set[int] = set()  # read once per drain, not once per pid
        self.counter = None

    def start(self) -> None:
        from optrace.frontend.uprobes.counter import CallCounter

        pid_filter = self._target_set.__contains__ if self._targets else None
        self.counter = CallCounter(self._specs, pid_filter=pid_filter)
        self.counter.start()

    def collect(self, delta: Delta) -> None:
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
