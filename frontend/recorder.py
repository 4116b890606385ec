"""`optrace record`'s engine: run the profiler, drain it on a fixed period, symbolize at the end.

Flow: Profiler.drain() (raw samples) -> Symbolizer / JitSymbols learn about processes while they are
alive -> at the end everything is symbolized once and written as a Record. Names are resolved while
the recording still has root and the processes' files, so `optrace report` needs neither.
"""
from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field

from optrace import __version__
from optrace.model import RawSample, Record, RecordMeta
from optrace.procfs import exec_path, is_alive
from optrace.frontend.stopsignals import StopSignals
from optrace.frontend.target import GatedChild

POLL_SECONDS = 0.05  # how quickly the end of the profiled command is noticed


@dataclass
class RecordOptions:
    frequency_hz: int = 99
    stacks: bool = True
    pids: list[int] = field(default_factory=list)
    system_wide: bool = False
    duration_s: float | None = None
    command: list[str] | None = None
    uprobes: list[str] = field(default_factory=list)
    jitdumps: list[str] = field(default_factory=list)
    drain_interval_s: float = 1.0
    stack_storage_size: int = 8192
    jit_max_file_size: int = 256 << 20


class SampleStore:
    """Raw samples summed over drains. The drain time is kept only for stacks that may be in JIT code
    (a raw-IP frame in no file mapping), whose addresses get reused; other stacks merge across drains."""

    def __init__(self) -> None:
        self._counts: Counter[tuple] = Counter()
        self._build_ids: dict[int, set[bytes]] = {}

    def shows_new_objects(self, sample: RawSample) -> bool:
        """True when the sample has a build-id not seen before in its process (time to read its maps)."""
        known = self._build_ids.setdefault(sample.pid, set())
        new = {f.build_id for f in sample.user if f.build_id is not None} - known
        known |= new
        return bool(new)

    def add(self, sample: RawSample, timed: bool) -> None:
        key = (sample.pid, sample.comm, sample.user, sample.kernel, sample.time if timed else 0.0)
        self._counts[key] += sample.count

    def samples(self) -> list[RawSample]:
        return [RawSample(pid, comm, user, kernel, n, t) for (pid, comm, user, kernel, t), n in self._counts.items()]


class Recorder:
    def __init__(self, options: RecordOptions) -> None:
        self.options = options
        self.store = SampleStore()
        self.lost: Counter[str] = Counter()
        self.child: GatedChild | None = None
        self.exit_status: int | None = None
        self.warnings: list[str] = []
        self._targets: set[int] = set()
        self._jit_pids: set[int] = set()  # processes with samples in anonymous code: their JIT files are read

    def run(self) -> Record:
        from optrace.bpf.profiler import Profiler
        from optrace.frontend.symbols.kallsyms import Kallsyms
        from optrace.frontend.symbols.symbolizer import Symbolizer
        from optrace.jitmaps.jitsymbols import JitSymbols

        opts = self.options
        self.jit = JitSymbols(max_file_size=opts.jit_max_file_size, jitdumps=opts.jitdumps)
        targets = None if opts.system_wide else list(opts.pids)
        self.profiler = Profiler(opts.frequency_hz, pids=targets, stack_storage_size=opts.stack_storage_size)
        started = time.time()
        with ExitStack() as stack:
            stop = stack.enter_context(StopSignals())
            stack.enter_context(self.profiler)  # first: the compile's peak memory does not stack on kallsyms'
            self.symbolizer = Symbolizer(kallsyms=Kallsyms.load(), jit_lookup=self.jit.lookup)
            calls = self._start_call_counter(stack)
            t0 = time.monotonic()
            self._start_targets()
            self._loop(stop, t0)
            self._final_drain()
            call_counts = calls.calls() if calls else []
        duration = time.monotonic() - t0
        return self._build_record(started, duration, call_counts)

    def _start_call_counter(self, stack: ExitStack):
        if not self.options.uprobes:
            return None
        from optrace.frontend.uprobes.counter import CallCounter

        pid_filter = None if self.options.system_wide else self._is_target
        counter = CallCounter(self.options.uprobes, pid_filter=pid_filter)
        stack.enter_context(counter)
        return counter

    def _is_target(self, pid: int) -> bool:
        return pid in self._targets

    def _start_targets(self) -> None:
        for pid in self.options.pids:
            self.symbolizer.snapshot_process(pid)
        if self.options.command:
            self.child = GatedChild(self.options.command)
            self.profiler.add_pid(self.child.pid)
            self.child.release()

    def _loop(self, stop: StopSignals, t0: float) -> None:
        opts = self.options
        deadline = t0 + opts.duration_s if opts.duration_s else None
        next_drain = t0 + opts.drain_interval_s
        while True:
            now = time.monotonic()
            if self._targets_gone():
                break
            if deadline and now >= deadline:
                break
            if now >= next_drain:
                self._drain()
                next_drain += opts.drain_interval_s
            else:
                execs, exits = self.profiler.poll_events()
                self._note_execs(execs)
                self._note_exits(exits, now)
            wake = min(next_drain, deadline or next_drain)
            if stop.wait(min(POLL_SECONDS, wake - now)):
                break

    def _targets_gone(self) -> bool:
        """Like perf: a command's recording ends with it; a -p recording ends when its processes have."""
        if self.child:
            return self.child.poll() is not None
        if self.options.pids and not self.options.system_wide:
            return not any(is_alive(pid) for pid in self.options.pids)
        return False

    def _final_drain(self) -> None:
        if self.child:
            self.exit_status = self.child.poll()
            if self.exit_status is None:
                self.exit_status = self.child.stop()
                self.warnings.append("the recording ended first: the command was sent SIGTERM")
        result = self._drain()
        self.jit.finish(result.time)
        self._targets = self.profiler.target_pids()

    def _drain(self):
        result = self.profiler.drain()
        self.lost.update(result.lost)
        self._note_execs(result.execs)
        for pid in {s.pid for s in result.samples if self.store.shows_new_objects(s)}:
            self.symbolizer.snapshot_process(pid)
        polled = set()
        for sample in result.samples:
            maybe_jit = self._maybe_jit(sample)
            self.store.add(sample, timed=maybe_jit)
            if maybe_jit:
                polled.add(sample.pid)
        self._jit_pids |= polled
        for pid in polled:
            self.jit.poll(pid, result.time)
        self._note_exits(result.exits, result.time)  # after the poll: this drain may be a pid's first JIT sample
        return result

    def _maybe_jit(self, sample: RawSample) -> bool:
        """A raw address outside every file mapping (and [vdso]) may be JIT code: keep its drain time."""
        for frame in sample.user:
            if frame.build_id is None:
                entry = self.symbolizer.machine.mapping_at(sample.pid, frame.offset)
                if entry is None or not (entry.is_file or entry.path == "[vdso]"):
                    return True
        return False

    def _note_execs(self, execs: list[tuple[int, str]]) -> None:
        """A new program is looked at right away: a short-lived one may be gone by the next drain."""
        for pid, filename in execs:
            path = exec_path(pid, filename)
            if path:
                self.symbolizer.add_executable(path)
            self.symbolizer.snapshot_process(pid)
            if not self.options.system_wide:  # a few targets; a whole machine may exec hundreds a second
                self.profiler.learn(pid)

    def _note_exits(self, exits: list[int], now: float) -> None:
        """JIT files are read once more at exit (a map written at exit, DumpPerfMapAtExit, counts)."""
        for pid in self._jit_pids.intersection(exits):
            self.jit.process_exited(pid, now)

    def _build_record(self, started: float, duration: float, calls) -> Record:
        raw = self.store.samples()
        if not self.options.stacks:
            raw = [leaf_only(s) for s in raw]
        frames, samples = self.symbolizer.symbolize(raw)
        self.symbolizer.close()
        lost = dict(self.lost)
        idle = lost.pop("idle", 0)
        meta = RecordMeta(
            optrace_version=__version__,
            hostname=socket.gethostname(),
            kernel=os.uname().release,
            started=started,
            duration_s=round(duration, 3),
            frequency_hz=self.options.frequency_hz,
            event=self.profiler.event,
            command=self.options.command,
            pids=list(self.options.pids),
            system_wide=self.options.system_wide,
            exit_status=self.exit_status,
            total_samples=sum(s.count for s in samples),
            lost=lost,
            idle_samples=idle if self.options.system_wide else 0,
            stacks=self.options.stacks,
            user_stacks={kind: n for kind, n in self.profiler.stats.items() if kind in ("raw", "build_id")},
            warnings=self.warnings + self.symbolizer.warnings + self.jit.warnings,
            file_problems=file_problems(self.symbolizer.stats, self.jit.stats),
        )
        return Record(meta=meta, frames=frames, samples=samples, calls=calls)


def file_problems(symbol_stats: Mapping[str, int], jit_stats: Mapping[str, int]) -> dict[str, int]:
    """The counts behind the per-file warnings, for the record's header (see RecordMeta.file_problems)."""
    problems = {f"elf_{key[len('bad_files_'):]}": n for key, n in symbol_stats.items()
                if key.startswith("bad_files_") and n}
    problems.update({f"jit_{key[len('refused_'):]}": n for key, n in jit_stats.items()
                     if key.startswith("refused_") and n})
    if jit_stats.get("symbols_dropped"):
        problems["jit_symbols_dropped"] = jit_stats["symbols_dropped"]
    return problems


def leaf_only(sample: RawSample) -> RawSample:
    if sample.kernel:
        return RawSample(sample.pid, sample.comm, (), sample.kernel[:1], sample.count, sample.time)
    return RawSample(sample.pid, sample.comm, sample.user[:1], (), sample.count, sample.time)
