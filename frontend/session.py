"""One profiling session: the pipeline that `record` and `serve` share (and that live views will use).

    bpf.profiler (kernel maps) -> raw samples -> here: raw IPs translated to (build-id, offset) frames,
    new processes and objects looked at, JIT files read -> symbolizer -> Frame / Sample rows

The session owns everything about a process's life as the profiler reports it: an exec (the program and
its libraries are indexed, at once or once sampled), a sample that shows an object not seen before in
its process (its maps are read again), a sample in anonymous code (its perf map and jitdumps are read),
an exit (JIT files read a last time; with ``forget_exited``, everything about it dropped one drain
later). Each process's share of that work is contained: an exception there costs that process's names,
counted in :attr:`ProfilingSession.read_errors`, never the session.

What differs between `record`, `serve` and `top` is their :class:`SessionMode`, each setting with its
reason; what a user chooses within one is a field of :class:`SessionOptions`.
"""
from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TypeVar

from optrace.bpf.offcpu import WaitOptions
from optrace.bpf.profiler import DrainResult, FoldedCounts
from optrace.containment import contain, count_failure
from optrace.defaults import DEFAULT_CALL_GRAPH, DEFAULT_FREQUENCY_HZ
from optrace.errors import OptraceError
from optrace.frontend.report.pythonview import leaf_only
from optrace.frontend.startpriority import start_done
from optrace.frontend.symbols.kernelsymbols import KernelSymbolsLoader
from optrace.frontend.unwind.scheduler import UnwindScheduler
from optrace.heap import release_free_memory
from optrace.model import Frame, RawSample, Sample, UserFrame
from optrace.procfs import exec_path, process_cpu_ticks

T = TypeVar("T")
PRUNE_EVERY = 30  # drains between two looks in /proc for processes whose exit event was lost
TRIM_EVERY = 60  # drains between two returns of the free heap to the system (forget_exited: serve, top)
DEFAULT_JIT_MAX_FILE_SIZE = 256 << 20
SCAN_SLICE_S = 0.1  # SessionMode.scan_slice_s for daemons and live views
# record holds up to 256 MiB of unwind tables; serve drops a file's rows once the kernel holds them
# (keeping its build-id and load segments), so its cache holds only tables on their way to the kernel: at
# most 32 MiB (cc1's table is 7.7 MB). A file is converted again (libc: 35 ms of CPU) only after a new
# generation of the kernel's rows, or when it was evicted and a new process maps it. Keeping the rows in
# both places cost a whole-machine serve 44 MB of rows (RSS 168 -> 125 MB) after BCC compiles (libLLVM).
SERVE_UNWIND_CACHE_BYTES = 16 << 20  # SessionMode.unwind_cache_bytes of serve
BUILD_ID = attrgetter("build_id")  # of a UserFrame, in C: every drain looks at every frame of its samples


@dataclass(frozen=True)
class SessionMode:
    """What a session is for: record (a recording named once it ends), serve (a daemon that runs for months
    and names leaves) or top (a live view). Its settings follow from that, each with its reason; a caller
    picks one of RECORD, SERVE, TOP (tests derive variants with dataclasses.replace)."""

    name: str
    # Raw user IPs for processes whose mappings were read (cheaper per sample than the kernel's build-id
    # stacks, see optrace.frontend.symbols.addrspace). serve keeps build-id stacks: with raw IPs, 2 of 6
    # full test-suite runs lost about half of one demo function's samples in serve (never in record, never
    # alone); kept out until understood.
    raw_stacks: bool
    # True: with pids (record of a command or of pids: a few targets), an exec'd program and its libraries
    # are indexed and its maps read at once (a short-lived program may be gone by the next drain). Never for
    # the whole machine, nor in serve: a busy machine execs hundreds of processes a second, most never
    # sampled; a sampled one is looked at once sampled (its image, bpf/images.c, outlives it).
    programs_at_exec: bool
    # True: with pids (record of a command or of pids: a few targets), an exec'd process's mappings are
    # read at once, so its samples are raw IPs from the first one. Never for the whole machine.
    learn_at_exec: bool
    # True: drop what is kept about an exited process one drain after its exit (serve runs for months).
    # False: keep it to name the process's samples when the recording ends (record).
    forget_exited: bool
    # Bytes of unwind tables held in user space (None: UnwindTableCache's default); serve holds fewer.
    unwind_cache_bytes: int | None
    # False: a file's unwind rows are dropped from the user-space cache once the kernel holds them (serve:
    # they are converted again only after a new generation of bpf/unwindmaps.py)
    keep_unwind_rows: bool
    # True: unwind tables are converted in a child process (frontend/unwind/builder.py), not on a thread
    # that shares the interpreter with the drain loop (serve: drains must not wait on a conversion)
    unwind_in_child: bool
    # True: JIT functions' code bytes are kept as they are loaded or sampled (record, for annotate)
    keep_jit_code: bool
    # True: perf maps are kept open and a name read back from its line when a sample needs it (serve, top:
    # a 20,000-name map's copied names held 6-7 MB while its process lived). False: names are copied (record
    # names its samples at the end, and a map rewritten in place by then would have lost them).
    jit_names_in_files: bool
    # True: counts whose stacks are named from files or kernel IPs alone come back undecoded, in
    # Drain.folded, to be summed as they are and decoded once when the recording ends (record: see
    # bpf/profiler.py's fold)
    fold: bool
    # Seconds one drain may spend scanning the library dirs for a build-id no mapping named (None: the
    # whole scan at once, record). serve, top: 2,500 files took a drain ~10 s on a slow machine.
    scan_slice_s: float | None
    # Looks at processes per second (frontend/unwind/budget.py): serve's stay within its share of a core under
    # an exec storm (a look is ~1 ms of CPU); a recording takes more, for its short-lived processes' stacks.
    looks_per_second: float
    # Bytes of symbol tables the symbolizer keeps (CacheLimits.table_bytes): serve reads a table back from the
    # symbol store (frontend/symbols/symbolstore.py) in a millisecond, and keeps fewer for its memory's sake.
    symbol_table_bytes: int
    # True: for the whole machine (record -a), the walker and the unwind tables of the processes that used
    # CPU while BCC compiled are in place before the sampler attaches, so the recording's first seconds
    # cost what later ones do (else the walker is verified and those tables converted while sampling, and
    # their stacks are raw IPs decoded at each drain until then). The attach comes that much later.
    unwind_busy_first: bool
    # True: the given pids' objects have their symbol tables read, and the kernel's begun, before the
    # sampler attaches (top's first rows come within a second of the attach)
    symbols_before_attach: bool


RECORD = SessionMode("record", raw_stacks=True, programs_at_exec=True, learn_at_exec=True, forget_exited=False,
                     unwind_cache_bytes=None, keep_unwind_rows=True, unwind_in_child=False, keep_jit_code=True,
                     jit_names_in_files=False, fold=True, scan_slice_s=None, unwind_busy_first=True,
                     symbols_before_attach=False, looks_per_second=200.0, symbol_table_bytes=64 << 20)
SERVE = SessionMode("serve", raw_stacks=False, programs_at_exec=False, learn_at_exec=False, forget_exited=True,
                    unwind_cache_bytes=SERVE_UNWIND_CACHE_BYTES, keep_unwind_rows=False, unwind_in_child=True,
                    keep_jit_code=False, jit_names_in_files=True, fold=False, scan_slice_s=SCAN_SLICE_S,
                    unwind_busy_first=False, symbols_before_attach=False, looks_per_second=25.0,
                    symbol_table_bytes=16 << 20)
TOP = SessionMode("top", raw_stacks=True, programs_at_exec=False, learn_at_exec=False, forget_exited=True,
                  unwind_cache_bytes=None, keep_unwind_rows=True, unwind_in_child=False, keep_jit_code=False,
                  jit_names_in_files=True, fold=False, scan_slice_s=SCAN_SLICE_S, unwind_busy_first=False,
                  symbols_before_attach=True, looks_per_second=50.0, symbol_table_bytes=32 << 20)


@dataclass
class SessionOptions:
    """What varies within a mode: the user's choices."""

    mode: SessionMode
    frequency_hz: int = DEFAULT_FREQUENCY_HZ
    pids: list[int] | None = None  # None: the whole machine; else these processes and their children
    comms: frozenset[str] = frozenset()  # only samples of these commands (empty: all)
    # False: only each sample's leaf is named (serve's rows, record --no-stacks), so JIT files are read
    # only for processes whose leaf is in anonymous code.
    stacks: bool = True
    stack_storage_size: int | None = None  # None: sized from CPUs x Hz (bpf.profiler.default_stack_storage)
    # "dwarf": user stacks of processes whose files have CFI are unwound from it in BPF (frame pointers
    # where there is none, as in JIT code); "fp": the kernel's frame-pointer walk only (perf's names).
    # Independent of ``stacks``, which is about naming: serve names leaves, but whole stacks while a
    # pprof profile is collected. A caller that never names whole stacks passes "fp" (record --no-stacks).
    call_graph: str = DEFAULT_CALL_GRAPH
    jit_max_file_size: int = DEFAULT_JIT_MAX_FILE_SIZE
    jitdumps: Sequence[str] = ()
    off_cpu: OffCpuOptions | None = None  # also measure off-CPU time (optrace.bpf.offcpu)
    # True (with call_graph "dwarf"): the interpreter's eval frames of CPython processes are replaced by the
    # Python frames they ran (bpf/python.c, frontend/runtimes/)
    python: bool = True

    @property
    def programs_at_exec(self) -> bool:
        """SessionMode.programs_at_exec, with pids only."""
        return self.mode.programs_at_exec and self.pids is not None

    @property
    def learn_at_exec(self) -> bool:
        """SessionMode.learn_at_exec, with pids only."""
        return self.mode.learn_at_exec and self.pids is not None

    @property
    def unwind_busy_first(self) -> bool:
        """SessionMode.unwind_busy_first, for the whole machine only."""
        return self.mode.unwind_busy_first and self.pids is None


MAX_OFF_CPU_EVERY = 1_000_000  # OffCpuOptions.every


def wait_options(options: OffCpuOptions | None) -> WaitOptions | None:
    """The off-CPU part of the sampler's program (bpf/offcpu.py) for the session's options."""
    if options is None:
        return None
    return WaitOptions(min_block_us=options.min_block_us, states=options.states,
                       kernel_stacks=options.kernel_stacks, every=options.every, wakers=options.wakers)


def check_off_cpu_every(every: int) -> None:
    """record's and serve's --off-cpu-every, refused outside 1..MAX_OFF_CPU_EVERY."""
    if not 1 <= every <= MAX_OFF_CPU_EVERY:
        raise OptraceError(f"--off-cpu-every takes 1..{MAX_OFF_CPU_EVERY} (1: every wait), not {every}")


@dataclass(frozen=True)
class OffCpuOptions:
    min_block_us: int = 1  # shorter waits are left out, like BCC's offcputime
    states: frozenset[str] = frozenset()  # of optrace.bpf.offcpu.STATES; empty: every wait
    kernel_stacks: bool = True  # False: user stacks only (the kernel stack is most of the cost)
    every: int = 1  # N: one wait in N (at random) recorded, counted N times
    wakers: bool = False  # each wait with the stacks of the thread that woke it (RawSample.waker)


@dataclass
class Drain:
    """What one drain of the kernel's maps gave, user frames translated. ``maybe_jit[i]``: sample i has a
    frame in anonymous code, whose name depends on when it was sampled (JITs reuse addresses)."""

    samples: list[RawSample]
    maybe_jit: list[bool]
    lost: dict[str, int]
    execs: int
    exits: list[int]
    time: float
    off_cpu: list[RawSample] = field(default_factory=list)  # count: nanoseconds; user frames translated
    off_cpu_maybe_jit: list[bool] = field(default_factory=list)
    off_cpu_short_waits: int = 0  # waits under the minimum block time, left out
    # With ``fold``: the counts named from files and kernel IPs alone, undecoded (bpf.profiler.FoldedCounts)
    folded: FoldedCounts = field(default_factory=FoldedCounts)


class ProcessTracker:
    """Per live process: its exec'd path until it is first sampled, and the build-ids its samples showed.
    A process is looked at again (maps snapshot) only when a sample shows an object not seen before in it."""

    def __init__(self) -> None:
        self._seen: dict[int, set[bytes]] = {}
        self._execs: dict[int, str] = {}

    def exec(self, pid: int, path: str) -> None:
        self._execs[pid] = path

    def sampled(self, samples: Iterable[RawSample], build_ids: Mapping[int, Iterable[bytes]] = {},
                ) -> tuple[dict[int, str], set[int]]:
        """(pid -> exec'd path of processes sampled for the first time, processes to snapshot), from the
        samples' frames and, for processes whose samples are folded, the build-ids they may show."""
        executables: dict[int, str] = {}
        snapshot: set[int] = set()
        for sample in samples:
            self._note(sample.pid, map(BUILD_ID, sample.user), executables, snapshot)
        for pid, ids in build_ids.items():
            self._note(pid, ids, executables, snapshot)
        return executables, snapshot

    def _note(self, pid: int, build_ids: Iterable[bytes | None], executables: dict[int, str],
              snapshot: set[int]) -> None:
        if pid in self._execs:
            executables[pid] = self._execs.pop(pid)
        known = self._seen.setdefault(pid, set())
        new = set(build_ids) - known
        new.discard(None)
        if new:
            known |= new
            snapshot.add(pid)

    def forget(self, pid: int) -> None:
        self._seen.pop(pid, None)
        self._execs.pop(pid, None)

    def pids(self) -> set[int]:
        return set(self._seen) | set(self._execs)


class ProfilingSession:
    """Start it, then call :meth:`poll` often and :meth:`drain` once per period; :meth:`symbolize` turns
    drained samples into rows, now (serve) or at the end (record); :meth:`close` detaches everything."""

    def __init__(self, options: SessionOptions) -> None:
        from optrace.frontend.symbols.addrspace import AddressSpaces
        from optrace.frontend.symbols.buildid import BuildIdCache
        from optrace.jitmaps.jitsymbols import JitSymbols

        self.options = options
        from optrace.jitmaps.jitcode import JitCodeStore

        self.jit = JitSymbols(max_file_size=options.jit_max_file_size, jitdumps=options.jitdumps,
                              code=JitCodeStore() if options.mode.keep_jit_code else None,
                              names_in_files=options.mode.jit_names_in_files)
        self.build_ids = BuildIdCache()  # one read of each mapped file's build-id, for spaces and symbolizer
        self.spaces = AddressSpaces(self.build_ids)
        self.tracker = ProcessTracker()
        self.read_errors: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.profiler = None
        self.symbolizer = None
        self._jit_pids: set[int] = set()  # processes whose JIT files are read
        self._exited: list[int] = []  # exits since the last drain: their address spaces go at its end
        self._forgettable: list[int] = []  # exited before the last drain: forgotten at the next one
        self._drains = 0
        self.runtimes = None  # RuntimeParts (frontend/runtimes/registry.py) when a runtime's walker is loaded
        # When processes get their unwind tables: one that does nothing until start (and with call graph "fp")
        self.unwinder = UnwindScheduler(None, None, None, self._contain)
        self.copies = None  # CopyWalks with call_graph "dwarf": samples whose stacks were copied
        self._kallsyms: KernelSymbolsLoader | None = None
        self._detaching: Future | None = None

    # -- life ------------------------------------------------------------------------------------------
    def start(self) -> None:
        from optrace.bpf.profiler import Profiler
        from optrace.frontend.symbols.symbolizer import CacheLimits, Symbolizer
        from optrace.frontend.symbols.symbolstore import SymbolStore

        opts = self.options
        cfi = opts.call_graph == "dwarf"
        self.symbolizer = Symbolizer(jit_lookup=self.jit.lookup, build_ids=self.build_ids,
                                     limits=CacheLimits(table_bytes=opts.mode.symbol_table_bytes),
                                     scan_slice_s=opts.mode.scan_slice_s, store=SymbolStore.default())
        for pid in opts.pids or ():  # before the programs load: a target that exits soon after is still named
            self._contain("process_maps", self.symbolizer.snapshot_process, pid)
        if opts.mode.symbols_before_attach:  # while the programs load: after, 0.8 s at load 14 beside the tables
            self._kallsyms = KernelSymbolsLoader()
        cpu_before = process_cpu_ticks() if opts.unwind_busy_first and cfi else None
        measured_from = time.monotonic()
        self.profiler = Profiler(opts.frequency_hz, pids=None if opts.pids is None else [],
                                 stack_storage_size=opts.stack_storage_size, raw_stacks=opts.mode.raw_stacks,
                                 cfi_unwind=cfi, fold=opts.mode.fold, python=opts.python, waits=wait_options(opts.off_cpu))
        self.profiler.load()
        from optrace.frontend.runtimes.registry import RuntimeParts, SessionContext

        self.runtimes = RuntimeParts.start(SessionContext(self.profiler, self.symbolizer))
        if self.runtimes is not None:
            self.symbolizer.runtime_lookup = self.runtimes.frame

        unwinding = None  # ProcessUnwinding with call_graph "dwarf"
        if cfi:
            from optrace.frontend.unwind.builder import ChildProcessBuilder
            from optrace.frontend.unwind.cache import DEFAULT_MAX_BYTES, UnwindTableCache
            from optrace.frontend.unwind.processmaps import ProcessUnwinding
            from optrace.frontend.unwind.tablestore import TableStore

            builder = ChildProcessBuilder() if opts.mode.unwind_in_child else None
            store = TableStore.default()
            if store.problem:
                self.warnings.append(f"stored unwind tables: {store.problem}; every file is converted again")
            unwinding = ProcessUnwinding(UnwindTableCache(opts.mode.unwind_cache_bytes or DEFAULT_MAX_BYTES,
                                                          builder=builder, store=store))
        self.unwinder = UnwindScheduler(self.profiler, unwinding, self.runtimes, self._contain,
                                        keep_rows=opts.mode.keep_unwind_rows, fold=opts.mode.fold,
                                        looks_per_second=opts.mode.looks_per_second)
        if cfi:
            from optrace.frontend.unwind.copywalks import CopyWalks

            self.copies = CopyWalks(self.profiler, self.unwinder, self._contain)
            if opts.mode.programs_at_exec:  # a program gone before its exec event is read is named from these
                self.unwinder.on_capture = self.symbolizer.captured
        self.unwinder.start()
        for pid in opts.pids or ():
            self.add_pid(pid)
            self.learn(pid)  # before the first sample: raw IPs from the start
            self.unwinder.python_soon(pid)  # its samples copied until its tables come keep their Python frames
            if opts.mode.symbols_before_attach:
                self._contain("symbols", self.symbolizer.load_symbols, pid)
        if cpu_before is not None:
            self.unwinder.unwind_busy(cpu_before, measured_from, self.learn)
        self.profiler.attach()
        start_done()  # the priority the command started at is given back (frontend/startpriority.py)
        # After the attach, off the way to the first sample (they only compete with it for the interpreter and
        # the CPUs: a stored program leaves no compile to hide them behind): the targets' unwind tables (the
        # walker follows frame pointers until they are in place) and the kernel symbols (named at the end).
        for pid in opts.pids or ():
            self.unwinder.unwind_later(pid)
        self._kallsyms = self._kallsyms or KernelSymbolsLoader()

    def detach(self) -> None:
        """Stop sampling: every BPF program and event is released (safe to call twice). Symbolizing still
        works until :meth:`close` (a recording names its samples after the profiler is gone)."""
        if self.copies is not None:
            self.copies.close()
        self.unwinder.close()
        if self.profiler is not None:
            self.profiler.close()

    def detach_in_background(self) -> None:
        """Start :meth:`detach` on a thread of its own: closing tracepoint events waits for RCU grace
        periods in the kernel, which a recording spends naming its samples instead. :meth:`close` waits
        for it (and raises what it raised)."""
        if self._detaching is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="optrace-detach")
            self._detaching = pool.submit(self.detach)
            pool.shutdown(wait=False)  # the detach goes on; the thread ends with it

    def close(self) -> None:
        """Detach and release the symbolizer's files; safe to call twice."""
        if self._detaching is not None:
            self._detaching.result()
        self.detach()
        if self.symbolizer is not None:
            self.symbolizer.close()
        self.jit.close()

    def __enter__(self) -> ProfilingSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def event(self) -> str:
        return self.profiler.event if self.profiler else ""

    def stop_sampling(self) -> None:
        """The recording's time is up: samples from now on are not kept (safe from another thread), and no
        more unwind tables are built (they would only compete with the final drain for the interpreter)."""
        self.profiler.stop_sampling()
        self.unwinder.cancel()

    def add_pid(self, pid: int) -> None:
        """Profile one more process (and its children), e.g. a command started after the session."""
        self.profiler.add_pid(pid)

    def target_pids(self) -> set[int]:
        """With pids: the given processes and their children; empty for the whole machine."""
        return self.profiler.target_pids() if self.profiler and self.options.pids is not None else set()

    # -- the profiler's reports ------------------------------------------------------------------------
    def poll(self, now: float, ready: Iterable[int] | None = None) -> None:
        """Exec and exit events since the last call: cheap, call it often (a short-lived program can then be
        looked at while it still runs), or when :attr:`event_fds` are readable (the ``ready`` ones)."""
        execs, exits = self.profiler.poll_events(ready)
        self._note_execs(execs)
        self._note_exits(exits, now)
        self.unwinder.poll(now)
        for pid in self.unwinder.take_reloaded():  # a library mapped since: named from it while it runs
            self._contain("process_maps", self.symbolizer.snapshot_process, pid)

    @property
    def event_fds(self) -> tuple[int, ...]:
        """Readable when exec or exit events wait for :meth:`poll`."""
        return self.profiler.event_fds

    def wants_polls(self, now: float) -> bool:
        """Whether :meth:`poll` is wanted on a timer, events or not (see UnwindScheduler.wants_polls)."""
        return self.unwinder.wants_polls(now)

    def drain(self, final: bool = False, leaves: bool = False) -> Drain:
        """The samples since the last drain; ``final``: the last one, every sample waiting for its
        process's tables comes now; ``leaves``: a caller that names leaves only, for whom no sample waits
        (see frontend/unwind/copywalks.py)."""
        result = self.profiler.drain()
        if self.runtimes is not None:
            self.runtimes.drained()
        samples = self._translated_all(result.samples)
        off_cpu = self._translated_all(result.off_cpu)
        folded = result.folded
        self._note_execs(result.execs)
        if self.copies is not None:
            samples, off_cpu = self.copies.walk(samples, off_cpu, result, final, leaves)
        self.unwinder.unwind_processes(samples)  # before the symbolizer's learning: at record -a's start on a
        # busy machine that took 30 s or more, and the processes' Python looks waited for it (scheduler.py)
        maybe_jit = self._learn_processes(samples, result.time, folded.pids())
        if self.copies is not None:  # samples waiting for tables (maybe past their process's exit): learned now
            self._learn_processes(self.copies.arrived(), result.time)
        for pid in result.build_id_pids:  # still on build-id stacks: their mappings are read now
            if self.unwinder.budget.take("raw_stacks"):
                self.learn(pid)
        drain = Drain(samples, maybe_jit, result.lost, len(result.execs), result.exits, result.time,
                      folded=folded)
        if self.options.off_cpu is not None:
            self._drain_off_cpu(drain, result, off_cpu)

        self.unwinder.touch({s.pid for s in samples} | folded.pids())
        self._end_processes(result.exits, result.time)
        return drain

    def _translated_all(self, samples: list[RawSample]) -> list[RawSample]:
        """The samples of the commands asked for, their raw IPs translated (see :meth:`_translated`)."""
        translated: dict[tuple, tuple[UserFrame, ...]] = {}
        addresses: dict[tuple[int, int], dict[int, UserFrame]] = {}
        return [self._translated(s, translated, addresses) for s in samples
                if not self.options.comms or s.comm in self.options.comms]

    # -- off-CPU time ----------------------------------------------------------------------------------
    def _drain_off_cpu(self, drain: Drain, result: DrainResult, off_cpu: list[RawSample]) -> None:
        """The off-CPU sums since the last drain (walked as CPU samples are: raw IPs translated from the
        mappings of their epoch, stack copies walked); processes that waited, and their wakers (whose stacks
        are CFI or build-id frames: nothing to translate), get their unwind tables as sampled ones do."""
        lost = dict(result.off_cpu_lost)
        drain.off_cpu_short_waits = lost.pop("short_waits", 0)
        drain.lost.update({f"off_cpu_{reason}": n for reason, n in lost.items()})
        drain.off_cpu, seen = off_cpu, off_cpu + [s.waker for s in off_cpu if s.waker is not None]
        drain.off_cpu_maybe_jit = self._learn_processes(seen, result.time)[:len(off_cpu)]
        self.unwinder.unwind_processes(seen)

    def finish(self, time: float) -> None:
        """The recording is over: JIT files are read a last time."""
        self._contain("jit_symbols", self.jit.finish, time)

    def learn(self, pid: int) -> None:
        """Read a process's mappings, so the sampler can take raw IPs of it (see addrspace). The symbolizer
        looks at them too: the frames these raw IPs become are named from the files mapped now, even when
        the process is gone by the drain (a library mapped since its last look would be [unknown])."""
        if not self.profiler.raw_stacks:
            return
        epoch = self.profiler.epoch(pid)
        if epoch and not self.spaces.has(pid, epoch) and self.spaces.learn(pid, epoch):
            self.profiler.mark_known(pid, epoch)
            self._contain("process_maps", self.symbolizer.snapshot_process, pid)

    def prepare_unwind(self, executable: str) -> None:
        """Build the unwind tables of a program about to be started now (see UnwindScheduler.prepare_unwind)."""
        self.unwinder.prepare_unwind(executable)

    def maybe_jit(self, sample: RawSample) -> bool:
        """A raw address outside every file mapping (and [vdso]) may be JIT code (its name depends on when
        it was sampled: the JIT reuses addresses)."""
        frames = sample.user if self.options.stacks else sample.user[:1]
        if all(map(BUILD_ID, frames)):  # the common case, checked in C: every frame is in a file
            return False
        for frame in frames:
            if frame.build_id is None:
                entry = self.symbolizer.machine.mapping_at(sample.pid, frame.offset)
                if entry is None or not (entry.is_file or entry.path == "[vdso]"):
                    return True
        return False

    # -- naming ----------------------------------------------------------------------------------------
    def symbolize(self, samples: list[RawSample], stacks: bool | None = None) -> tuple[list[Frame], list[Sample]]:
        """Rows for ``samples``, in their order (leaf frames only without ``stacks``, which defaults to the
        session's; serve names whole stacks only while a profile is being collected). If naming raises, it
        is done again one process at a time, so only the process whose files broke it loses its names (its
        samples still count, as frameless rows)."""
        if not (self.options.stacks if stacks is None else stacks):
            samples = [leaf_only(s) for s in samples]
        if self._kallsyms is not None:
            self._kallsyms.hand_to(self.symbolizer)
        try:
            return self.symbolizer.symbolize(samples)
        except Exception:  # found again, counted and warned below, per process
            pass
        by_pid: dict[int, list[int]] = defaultdict(list)  # pid -> indices of its samples
        for i, sample in enumerate(samples):
            by_pid[sample.pid].append(i)
        frames: list[Frame] = []
        rows: list[Sample | None] = [None] * len(samples)  # in the order of ``samples``
        for indices in by_pid.values():
            group = [samples[i] for i in indices]
            named = self._contain("symbolize", self.symbolizer.symbolize, group)
            group_frames, group_rows = named or ([], [Sample(s.pid, s.comm, (), s.count, s.tid) for s in group])
            for i, r in zip(indices, group_rows):
                rows[i] = Sample(r.pid, r.comm, tuple(f + len(frames) for f in r.frames), r.count, r.tid)
            frames += group_frames
        return frames, rows

    def take_warnings(self) -> list[str]:
        """New warnings of the session, the symbolizer and the JIT files, handed over once."""
        taken = self.warnings + self.symbolizer.warnings + self.jit.warnings
        for owner in (self.warnings, self.symbolizer.warnings, self.jit.warnings):
            owner.clear()
        return taken

    def cache_sizes(self) -> dict[str, int]:
        sizes = {**self.symbolizer.cache_sizes(), "jit_processes": len(self._jit_pids),
                 "jit_symbols": self.jit.budget.entries, "jit_names_bytes": self.jit.budget.name_bytes,
                 "jit_files_kept": self.jit.budget.files}
        return {**sizes, **self.unwinder.sizes()}

    # -- processes -------------------------------------------------------------------------------------
    def _translated(self, sample: RawSample, done: dict[tuple, tuple[UserFrame, ...]],
                    addresses: dict[tuple[int, int], dict[int, UserFrame]]) -> RawSample:
        """Raw IPs as the kernel's build-id map would have given them, from the mappings of their epoch
        (``done``: the stacks translated in this drain, by process, epoch and IPs; ``addresses``: each
        address's frame, by process and epoch)."""
        if not sample.epoch:
            return sample
        key = (sample.pid, sample.epoch, sample.user)
        if key not in done:
            space = self.spaces.get(sample.pid, sample.epoch)
            if space is None:  # cannot happen while snapshots are kept long enough; never guess
                self.stats["raw_without_mappings"] += sample.count
                done[key] = sample.user
            else:
                frames = addresses.setdefault((sample.pid, sample.epoch), {})  # one lookup per address
                done[key] = tuple(frames.get(f.offset) or frames.setdefault(f.offset, space.frame(f.offset))
                                  for f in sample.user)
        return dataclasses.replace(sample, user=done[key], epoch=0)

    def _note_execs(self, execs: list[tuple[int, str]]) -> None:
        for pid, filename in execs:
            path = exec_path(pid, filename)
            self.unwinder.execd(pid, path)
            if not self.options.programs_at_exec:
                if path:
                    self.tracker.exec(pid, path)
                continue
            if self.options.learn_at_exec:  # first: what the sampler needs (symbols can wait)
                self.unwinder.unwind_later(pid, path, budgeted=False)
                self.learn(pid)
            self._contain("process_maps", self.symbolizer.snapshot_process, pid)  # first: it says where pid is
            if path:
                self._contain("executable", self.symbolizer.add_executable, path, pid)

    def _learn_processes(self, samples: list[RawSample], time: float, folded_pids: Iterable[int] = (),
                         ) -> list[bool]:
        """What the symbolizer and JIT symbols must know before this drain's samples are named; returns
        which samples may be in JIT code. A folded stack's frames are in files of its process's CFI table:
        those build-ids stand for its frames (UnwindScheduler.table_build_ids)."""
        tables = {pid: self.unwinder.table_build_ids(pid) for pid in folded_pids}
        executables, snapshot = self.tracker.sampled(samples, tables)
        for pid in snapshot.union(self.unwinder.take_reloaded()):  # (those poll() did not take yet)
            if self.unwinder.budget.take("symbols"):
                self._contain("process_maps", self.symbolizer.snapshot_process, pid)
        for pid, path in executables.items():  # for processes gone before their maps could be read
            self._contain("executable", self.symbolizer.add_executable, path, pid)
        maybe_jit = [self.maybe_jit(s) for s in samples]
        for pid in {s.pid for s, jit in zip(samples, maybe_jit) if jit}:
            self._jit_pids.add(pid)
            self._contain("jit_symbols", self.jit.poll, pid, time)
        if self.options.mode.keep_jit_code:
            for sample in (s for s, jit in zip(samples, maybe_jit) if jit and s.user and not s.kernel
                           and s.user[0].build_id is None):
                self._contain("jit_code", self.jit.keep_code, sample.pid, sample.user[0].offset, time)
        return maybe_jit

    def _note_exits(self, exits: list[int], now: float) -> None:
        """JIT files are read once more at exit (a map written at exit, DumpPerfMapAtExit, counts)."""
        self._exited += exits
        for pid in self._jit_pids.intersection(exits):
            self._contain("jit_symbols", self.jit.process_exited, pid, now)

    def _end_processes(self, exits: list[int], now: float) -> None:
        """Exits seen by this drain; with ``forget_exited``, processes that exited before the previous
        drain are forgotten (samples taken just before an exit may reach the next drain; those whose stack
        copies wait for tables, later), and every
        PRUNE_EVERY drains, those whose exit event was lost (the kernel's event buffer overflowed)."""
        self._note_exits(exits, now)
        for pid in self._exited:  # with those poll() saw: the unwinder's table goes at once
            self.unwinder.exited(pid)
            if self.runtimes is not None:
                self.runtimes.exited(pid)
        retired, self._exited = self._exited, []
        self.spaces.end_drain(retired)
        if not self.options.mode.forget_exited:
            return
        self._drains += 1
        if self._drains % PRUNE_EVERY == 0:  # gone without an exit event seen, or loaded after it was handled
            self.unwinder.drop_unwound_exited()
        waiting = self.copies.waiting() if self.copies is not None else set()  # their samples come later
        jit_tables = bool(self._jit_pids.intersection(self._forgettable))
        for pid in set(self._forgettable) - waiting:
            self._contain("forget_process", self._forget, pid)
        # A JIT table can be tens of MB: give the freed heap back, or RSS keeps its peak. And now and then
        # anyway: each drain's transient objects (stacks, frames, the exporter's pages) leave free holes
        # that glibc keeps, and a daemon's RSS crept up with them.
        if self._drains % TRIM_EVERY == 0:
            gc.collect()  # its own thresholds count objects, not bytes: a few big cycles could wait for hours
        if jit_tables or self._drains % TRIM_EVERY == 0:
            release_free_memory()
        self._forgettable = retired + [pid for pid in self._forgettable if pid in waiting]
        if self._drains % PRUNE_EVERY == 0:
            self._forgettable += [pid for pid in self.tracker.pids() if not os.path.exists(f"/proc/{pid}")]

    def _forget(self, pid: int) -> None:
        """Drop what is kept about a process, so memory does not grow with every process that ever ran."""
        self.tracker.forget(pid)
        self._jit_pids.discard(pid)
        self.unwinder.forget(pid)
        self.symbolizer.forget_process(pid)
        self.jit.forget_process(pid)
        if self.runtimes is not None:
            self.runtimes.forget(pid)

    def _contain(self, kind: str, call: Callable[..., T], *args: object) -> T | None:
        """``call(*args)``, or None when it raised: counted in ``read_errors[kind]`` and warned, so one
        hostile or malformed file costs only what depended on it."""
        return contain(lambda: call(*args), lambda exc: count_failure(self.read_errors, self.warnings, kind, exc,
                                                                      "only what depended on it is lost"))
