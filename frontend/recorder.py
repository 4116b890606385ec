"""`optrace record`'s engine: a profiling session drained on a fixed period, symbolized at the end.

Flow: ProfilingSession.drain() (raw samples; the session learns about processes while they are alive)
-> SampleStore sums them -> at the end everything is symbolized once and written as a Record. Names are
resolved while the recording still has root and the processes' files, so `optrace report` needs neither.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass, field

from optrace import __version__
from optrace.bpf.loader import ProgramLoad, program_loads
from optrace.bpf.profiler import FoldedCounts
from optrace.defaults import DEFAULT_CALL_GRAPH, DEFAULT_FREQUENCY_HZ
from optrace.frontend.loopwait import LoopWait
from optrace.frontend.session import (
    DEFAULT_JIT_MAX_FILE_SIZE, RECORD, OffCpuOptions, ProfilingSession, SessionOptions,
)
from optrace.frontend.stopsignals import StopSignals
from optrace.frontend.target import LAUNCHER_COMM, ExitWatch, GatedChild, add_subprocesses, with_subprocesses
from optrace.frontend.unwind.quality import stack_quality
from optrace.frontend.report.wakers import merged_samples, wakeup_rows
from optrace.heap import gc_paused, settle
from optrace.model import Frame, OffCpuMeta, RawSample, Record, RecordMeta, Sample, Wakeup
from optrace.procfs import is_alive

POLL_SECONDS = 0.05  # how often a loop that polls on a timer wakes (see Recorder._timer_polls)
# A process event is read this long after it woke the loop, as a poll every POLL_SECONDS read it 0-50 ms
# after: a program just exec'd has its libraries mapped by then (its maps are read at the exec event), and
# the events that come with it (its exit, a burst of execs) are read together. At 20 ms, most short-lived
# programs of the profile bench still ran when read: their maps were snapshot, 0.1 s more CPU in 30 s.
SETTLE_SECONDS = 0.05
# The first drain comes early: it finds the processes being sampled (with -a, the only way to know them),
# whose unwind tables are then loaded; until then their stacks are raw IPs, decoded at a drain one by one
# (at 10k samples a second, the 1 s before a drain at the full period cost 0.2 s of CPU).
FIRST_DRAIN_S = 0.25


@dataclass
class RecordOptions:
    frequency_hz: int = DEFAULT_FREQUENCY_HZ
    stacks: bool = True
    pids: list[int] = field(default_factory=list)
    system_wide: bool = False
    duration_s: float | None = None
    command: list[str] | None = None
    uprobes: list[str] = field(default_factory=list)
    jitdumps: list[str] = field(default_factory=list)
    drain_interval_s: float = 1.0
    stack_storage_size: int | None = None
    jit_max_file_size: int = DEFAULT_JIT_MAX_FILE_SIZE
    off_cpu: OffCpuOptions | None = None
    wall: bool = False  # off-CPU time and CPU samples, to be shown together as time
    call_graph: str = DEFAULT_CALL_GRAPH  # or "fp" (see SessionOptions.call_graph)
    python: bool = True  # Python frames (SessionOptions.python)
    subprocesses: bool = False  # with pids: their descendants too (target.with_subprocesses)


FOLD_BATCH_KEYS = 1 << 18  # folded keys kept as the drains gave them before they are summed (16 MiB of bytes)


class SampleStore:
    """Raw samples summed over drains. The drain time is kept only for stacks that may be in JIT code
    (a raw-IP frame in no file mapping), whose addresses get reused; other stacks merge across drains.
    Folded counts (Drain.folded) are kept as the kernel gave them, summed by key bytes once
    FOLD_BATCH_KEYS of them wait (and at the end), with the stack records their drains read, and decoded
    once, by :meth:`samples`: a drain adds two list items, however many stacks it read."""

    def __init__(self) -> None:
        self._counts: Counter[tuple] = Counter()
        self._folded: dict[bytes, int] = {}
        self._waiting: list[FoldedCounts] = []
        self._waiting_keys = 0
        self._records: list[tuple[object, dict[int, bytes]]] = []  # (file ids, stack records read with them)

    def add(self, sample: RawSample, timed: bool) -> None:
        key = (sample.pid, sample.comm, sample.user, sample.kernel, sample.time if timed else 0.0, sample.tid,
               sample.stop, sample.runtime, sample.waker)
        self._counts[key] += sample.count

    def add_folded(self, folded: FoldedCounts) -> None:
        self._waiting.append(folded)
        self._waiting_keys += len(folded.values) // 8
        if self._waiting_keys >= FOLD_BATCH_KEYS:
            self._sum_waiting()

    def _sum_waiting(self) -> None:
        """The waiting drains' counts summed into :attr:`_folded` (dict operations in C, a Python step only
        per key seen before), their records joined to those read with the same file ids."""
        mine = self._folded
        for folded in self._waiting:
            drained = folded.counts()
            for key in drained.keys() & mine.keys():
                drained[key] += mine[key]
            mine.update(drained)
            if not self._records or self._records[-1][0] is not folded.ids:
                self._records.append((folded.ids, {}))
            self._records[-1][1].update(folded.records)  # a stack read again is the same bytes
        self._waiting, self._waiting_keys = [], 0

    def samples(self, decode: Callable[[Mapping[bytes, int], Sequence[tuple[object, Mapping[int, bytes]]]],
                                       list[RawSample]] = lambda counts, records: []) -> list[RawSample]:
        """Every sample, the folded counts decoded by ``decode`` (Profiler.decode_folded)."""
        self._sum_waiting()
        for sample in decode(self._folded, self._records):
            self.add(sample, timed=False)
        self._folded, self._records = {}, []
        return [RawSample(pid, comm, user, kernel, n, t, tid=tid, stop=stop, runtime=runtime, waker=waker)
                for (pid, comm, user, kernel, t, tid, stop, runtime, waker), n in self._counts.items()]


class Recorder:
    def __init__(self, options: RecordOptions) -> None:
        self.options = options
        self.store = SampleStore()
        self.off_cpu_store = SampleStore()
        self.short_waits = 0
        self.lost: Counter[str] = Counter()
        self.launcher_samples = 0
        self.child: GatedChild | None = None
        self._exits = ExitWatch([])  # the targets whose end ends the recording, watched from the start
        self.exit_status: int | None = None
        self.stopped_command = False  # the recording ended first (-d, a signal) and stopped the command
        self.warnings: list[str] = []
        self._targets: set[int] = set()
        self._ended: float | None = None
        self._end_lock = threading.Lock()
        self._loads_before = len(program_loads())  # this process's loads before the recording's
        opts = options
        self.session = ProfilingSession(SessionOptions(
            RECORD, frequency_hz=opts.frequency_hz,
            pids=None if opts.system_wide else with_subprocesses(list(opts.pids), opts.subprocesses),
            stacks=opts.stacks, stack_storage_size=opts.stack_storage_size, jit_max_file_size=opts.jit_max_file_size,
            jitdumps=opts.jitdumps, off_cpu=opts.off_cpu,
            call_graph=opts.call_graph if opts.stacks else "fp",  # leaves only: nothing to unwind for
            python=opts.python))

    def run(self) -> Record:
        started = time.time()
        try:
            with ExitStack() as stack:
                stop = stack.enter_context(StopSignals())
                self.session.start()
                settle(None)  # what start made (modules, programs, tables) is left out of every collection
                stack.callback(self.session.detach_in_background)
                calls = self._start_call_counter(stack)
                t0 = time.monotonic()
                self._start_targets()
                self._exits = stack.enter_context(closing(ExitWatch(self._watched_pids())))
                if self.options.duration_s:
                    timer = threading.Timer(self.options.duration_s, self._time_up)
                    timer.start()
                    stack.callback(timer.cancel)
                self._loop(stop, t0)
                self._time_up()
                self._final_drain()
                call_counts = calls.calls() if calls else []
            with gc_paused():  # millions of acyclic objects: collections were a sixth of a storm's recording
                return settle(self._build_record(started, self._ended - t0, call_counts))
        finally:
            self.session.close()

    @property
    def program_loads(self) -> list[ProgramLoad]:
        """The BPF programs this recording loaded (stored or compiled)."""
        return program_loads()[self._loads_before:]

    def _time_up(self) -> None:
        """Sampling ends now, even while a drain is busy (a timer thread calls this at -d); the samples
        already taken are read by the drains still to come."""
        with self._end_lock:
            if self._ended is None:
                self._ended = time.monotonic()
                self.session.stop_sampling()

    def _start_call_counter(self, stack: ExitStack):
        if not self.options.uprobes:
            return None
        from optrace.frontend.uprobes.counter import CallCounter

        pid_filter = None if self.options.system_wide else self._is_target
        counter = CallCounter(self.options.uprobes, pid_filter=pid_filter, pids=self.options.pids)
        stack.enter_context(counter)
        return counter

    def _is_target(self, pid: int) -> bool:
        return pid in self._targets

    def _start_targets(self) -> None:
        if self.options.subprocesses:
            add_subprocesses(self.session.target_pids, self.session.add_pid)
        # The command waits for its program's unwind tables and the walker (issue 42: 0.3-0.5 s of its exec
        # time at load 15): released at once, a CPython command's first second had no Python frames (its
        # interpreter is found with its table), 15 % of a 2.5 s run's samples under load (bench/README.md (e)).
        if self.options.command:
            program = shutil.which(self.options.command[0])
            if program:
                self.session.prepare_unwind(program)
            self.child = GatedChild(self.options.command)
            self.session.add_pid(self.child.pid)
            self.child.release()

    def _loop(self, stop: StopSignals, t0: float) -> None:
        """Drain every period until the end; between drains, sleep until a stop, a target's end or a
        process event (handled SETTLE_SECONDS later), polling on a timer only while something is young."""
        opts = self.options
        deadline = t0 + opts.duration_s if opts.duration_s else None
        next_drain = t0 + min(FIRST_DRAIN_S, opts.drain_interval_s)
        waits = LoopWait(stop, self._exits, self.session.event_fds)
        settle: float | None = None  # when the event buffers found ready are read
        ready: tuple[int, ...] = ()
        while True:
            now = time.monotonic()
            if self._targets_gone() or (deadline and now >= deadline):
                break
            timer = self._timer_polls(now)
            if now >= next_drain:
                self._drain()  # reads every event buffer
                next_drain += opts.drain_interval_s
                settle, ready = None, ()
            elif settle is not None and now >= settle:
                self.session.poll(now, ready)
                settle, ready = None, ()
            elif timer:
                self.session.poll(now)
            timer = self._timer_polls(now)  # a drain or a poll may have queued a table to wait for
            wake = min(t for t in (next_drain, deadline, settle, now + POLL_SECONDS if timer else None) if t is not None)
            found = waits.wait(wake - now, events=settle is None)
            if stop.stopped.is_set():
                break
            if found:
                settle, ready = time.monotonic() + SETTLE_SECONDS, found

    def _timer_polls(self, now: float) -> bool:
        """Whether the loop also wakes every POLL_SECONDS: a young process (see ProfilingSession.wants_polls),
        or a target whose end no pidfd tells."""
        return self.session.wants_polls(now) or self._exits.blind

    def _watched_pids(self) -> list[int]:
        """The processes whose end ends the recording (see :meth:`_targets_gone`)."""
        if self.child:
            return [self.child.pid]
        return list(self.options.pids or []) if not self.options.system_wide else []

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
                self.stopped_command = True
                self.warnings.append("the recording ended first: the command was sent SIGTERM")
        result = self._drain(final=True)
        self.session.finish(result.time)
        self._targets = self.session.target_pids()

    def _drain(self, final: bool = False):
        with gc_paused():
            result = self.session.drain(final)
        self.lost.update(result.lost)
        for sample, timed in zip(result.samples, result.maybe_jit):
            if is_launcher(sample.comm):
                self.launcher_samples += sample.count
            else:
                self.store.add(sample, timed)
        folded = result.folded
        if LAUNCHER_COMM in folded.comms():
            folded, launched = folded.without_comm(LAUNCHER_COMM)
            self.launcher_samples += launched
        self.store.add_folded(folded)
        self.short_waits += result.off_cpu_short_waits
        for sample, timed in zip(result.off_cpu, result.off_cpu_maybe_jit):
            self.off_cpu_store.add(sample, timed)
        return result

    def _build_record(self, started: float, duration: float, calls) -> Record:
        raw = self.store.samples(self.session.profiler.decode_folded)
        frames, samples = self.session.symbolize(raw)
        quality = stack_quality(raw, frames, samples) if self.options.stacks else {}
        runtimes = self.session.runtimes
        off_cpu_raw = self.off_cpu_store.samples()
        frames, off_cpu = merged_frames(frames, *self.session.symbolize(off_cpu_raw))
        frames, wakeups = self._wakeups(frames, off_cpu_raw, off_cpu)
        session = self.session
        lost = dict(self.lost)
        idle = lost.pop("idle", 0)
        carried = lost.pop("carried", 0)
        total = sum(s.count for s in samples)
        warning = stackless_warning(lost, total, session.profiler.stack_storage_size)
        from optrace.frontend.codecapture import capture_session  # not imported on the way to the first sample

        functions = capture_session(session, frames, samples)  # before the warnings are taken: its own go in
        sources = runtimes.sources(frames, samples) if runtimes is not None else []
        meta = RecordMeta(
            optrace_version=__version__,
            hostname=os.uname().nodename,  # socket.gethostname(), without importing socket
            kernel=os.uname().release,
            started=started,
            duration_s=round(duration, 3),
            frequency_hz=self.options.frequency_hz,
            event=session.event,
            command=self.options.command,
            pids=list(self.options.pids),
            system_wide=self.options.system_wide,
            exit_status=self.exit_status,
            total_samples=total,
            lost=lost,
            idle_samples=idle if self.options.system_wide else 0,
            launcher_samples=self.launcher_samples,
            carried_samples=carried,
            stacks=self.options.stacks,
            call_graph=self.options.call_graph if self.options.stacks else "fp",
            stack_quality=quality,
            user_stacks={kind: n for kind, n in session.profiler.stats.items() if kind in ("raw", "build_id", "cfi", "copied")},
            warnings=self.warnings + warning + session.take_warnings(),
            file_problems=file_problems(session.symbolizer.stats, session.jit.stats, session.read_errors),
            off_cpu=self._off_cpu_meta(off_cpu, stack_quality(off_cpu_raw, frames, off_cpu) if self.options.stacks else {}),
            runtimes=runtimes.counts(raw, frames, samples) if runtimes is not None else {},
            bpf_programs={load.name: load.how for load in self.program_loads},
        )
        return Record(meta=meta, frames=frames, samples=samples, calls=calls, off_cpu=merged_samples(off_cpu),
                      wakeups=wakeups, functions=functions, sources=sources)

    def _wakeups(self, frames: list[Frame], raw: list[RawSample], off_cpu: list[Sample]
                 ) -> tuple[list[Frame], list[Wakeup]]:
        """The waits that slept (``raw[i]`` is ``off_cpu[i]`` before it was named), with their wakers named."""
        wakers = [s.waker for s in raw if s.waker is not None]
        if not wakers:
            return frames, []
        frames, named = merged_frames(frames, *self.session.symbolize(wakers))
        rows = iter(named)
        return frames, wakeup_rows(off_cpu, [next(rows) if s.waker is not None else None for s in raw])

    def _off_cpu_meta(self, off_cpu: list[Sample], quality: dict[str, int]) -> OffCpuMeta | None:
        opts = self.options.off_cpu
        if opts is None:
            return None
        from optrace.bpf.offcpu import ATTACHMENT

        return OffCpuMeta(source=ATTACHMENT, min_block_us=opts.min_block_us, states=sorted(opts.states),
                          total_ns=sum(s.count for s in off_cpu), short_waits=self.short_waits,
                          kernel_stacks=opts.kernel_stacks, wall=self.options.wall, every=opts.every,
                          wakers=opts.wakers, stack_quality=quality)


def merged_frames(frames: list[Frame], more_frames: list[Frame], more: list[Sample]) -> tuple[list[Frame], list[Sample]]:
    """One frame table for two symbolized sets: ``more``'s indices moved into ``frames`` (extended)."""
    merged = list(frames)
    index: dict[Frame, int] = {}
    for i, frame in enumerate(frames):
        index.setdefault(frame, i)
    moved = []
    for frame in more_frames:
        if frame not in index:
            index[frame] = len(merged)
            merged.append(frame)
        moved.append(index[frame])
    rows = [Sample(s.pid, s.comm, tuple(moved[i] for i in s.frames), s.count, s.tid) for s in more]
    return merged, rows


STACKLESS_WARN_SHARE = 0.01


def stackless_warning(lost: Mapping[str, int], total: int, stack_storage_size: int) -> list[str]:
    """A warning when more than 1 % of the samples lost their stack (a full stack store, which a larger
    one fixes), with the flag that fixes it."""
    stackless = sum(n for reason, n in lost.items() if "stack" in reason)
    if not total or stackless <= STACKLESS_WARN_SHARE * total:
        return []
    return [f"{100 * stackless / total:.1f}% of samples lost their stack (a stack store of {stack_storage_size} "
            f"stacks): record with --stack-storage-size {min(max(4 * stack_storage_size, 1 << 13), 1 << 20)}"]


def is_launcher(comm: str) -> bool:
    """A sample of a command forked by optrace before its exec: optrace's launcher, not the command. Any
    pid: under -a, other optrace runs' launchers are optrace's overhead too (a process that names itself
    optrace-exec is left out the same way, and counted)."""
    return comm == LAUNCHER_COMM


def file_problems(symbol_stats: Mapping[str, int], jit_stats: Mapping[str, int],
                  read_errors: Mapping[str, int] = {}) -> dict[str, int]:
    """The counts behind the per-file warnings, for the record's header (see RecordMeta.file_problems)."""
    problems = {f"elf_{key[len('bad_files_'):]}": n for key, n in symbol_stats.items()
                if key.startswith("bad_files_") and n}
    problems.update({f"jit_{key[len('refused_'):]}": n for key, n in jit_stats.items()
                     if key.startswith("refused_") and n})
    if jit_stats.get("symbols_dropped"):
        problems["jit_symbols_dropped"] = jit_stats["symbols_dropped"]
    if jit_stats.get("files_not_read_to_the_end"):
        problems["jit_unread"] = jit_stats["files_not_read_to_the_end"]
    problems.update({f"failed_{kind}": n for kind, n in read_errors.items() if n})
    return problems
