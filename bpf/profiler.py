"""The BCC side of `optrace record` and `optrace serve`: load profile.c, attach it to the cpu-clock
(or cycles) event, on every CPU for the whole machine, else on the target processes' threads
(perfevents.py), and drain the kernel's aggregated counts as RawSamples.

This module and its siblings are the only ones that load BPF programs (bpf/loader.py).
"""
from __future__ import annotations

import array
import ctypes
import dataclasses
import math
import os
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from operator import itemgetter
from typing import Callable, Iterable, Mapping, Sequence

from optrace.bpf import perfevents
from optrace.bpf.abi import PerfHWConfig, PerfSWConfig, PerfType, ProgType, online_cpus
from optrace.bpf.eventbuffers import EventBuffers
from optrace.bpf.loader import counter_increments, load_bcc, load_function
from optrace.bpf.maptaker import MapTaker
from optrace.bpf.offcpu import OffCpuWaits, WaitOptions
from optrace.bpf.perfevents import TaskEvents
from optrace.bpf.stackcopies import MAX_BYTES as COPY_MAX_BYTES, CopyRing, ring_pages
from optrace.bpf.images import ProcessImages
from optrace.bpf.stackstore import GRACE_SECONDS, STACK_BUILD_ID, STACK_CFI, STACK_RAW, StackStore, chunks_for, stored
from optrace.bpf.unwindmaps import FileIds, decode_cfi
from optrace.defaults import DEFAULT_FREQUENCY_HZ
from optrace.errors import OptraceError
from optrace.model import RawSample, StackCopy, UserFrame
from optrace.kernel import syscall_events_available

STACK_STORE = Path(__file__).with_name("stackstore.c")  # before profile.c: stacks by hash (stackstore.py)
PROGRAM = Path(__file__).with_name("profile.c")
FORKS = Path(__file__).with_name("forks.c")  # after profile.c: a target's children are targets
UNWINDER = Path(__file__).with_name("unwind.c")  # appended with cfi_unwind (see unwindmaps.py)
STACK_COPIES = Path(__file__).with_name("stackcopy.c")  # after it: stacks copied where it cannot walk (stackcopies.py)
IMAGES = Path(__file__).with_name("images.c")  # after them: processes' executable mappings (images.py)
PYTHON_WALK = Path(__file__).with_name("python_walk.h")  # before unwind.c: its Python state
PYTHON_WALKER = Path(__file__).with_name("python.c")  # after it, with python (see pythonmaps.py)
COPY_PYTHON = Path(__file__).with_name("copypython.c")  # after python.c: a copied sample's Python frames
OFF_CPU = Path(__file__).with_name("offcpu.c")  # after profile.c, with waits (see offcpu.py)
WAKERS = Path(__file__).with_name("wakers.c")  # last, with waits' wakers (see offcpu.py)
LOST_REASONS = (  # enum lost_reason in profile.c
    "user_stack_missing",
    "kernel_stack_missing",
    "counts_map_full",
    "idle",
    "ended_between_ticks",
    "carried",  # not lost: taken at the next tick of the process of a thread that ended between ticks
)
# With events bound to the targets' threads, they tick every TICK_NS of a thread's CPU time at most (a
# sample is taken each 1e9 / F ns of its process's, profile.c's sample_due): a thread's first millisecond
# can be sampled. Each tick is a timer interrupt of the thread's CPU (~20 us in this VM: 1 ms ticks cost a
# busy target ~2 %, 0.25 ms ticks ~8 %, bench/README.md).
TICK_NS = 1_000_000
SAMPLE_NS, ATTACHED_NS = 0, 1  # enum sampling_setting
NO_USER_STACK: tuple[tuple[UserFrame, ...], str, str] = ((), "", "")
BUILD_ID_VALID = 1
BUILD_ID_IP = 2
BPF_NOEXIST = 1
PROC_EXEC, PROC_EXIT = 0, 1
BUILD_ID_ENTRY = struct.Struct("<i20sQ")  # struct bpf_stack_build_id
USER_KINDS = {STACK_RAW: "raw", STACK_BUILD_ID: "build_id", STACK_CFI: "cfi"}
# struct key_t in profile.c: pid, tid, user and kernel stack hashes, epoch, user stack kind, copy id, comm
COUNT_KEY = struct.Struct("=IIQQQII16s")
# struct wakeup_key_t in offcpu.c: the wait's key, its waker's (zero: none seen), whether the thread slept
WAKEUP_KEY = struct.Struct("=" + "IIQQQII16s" * 2 + "II")
KEY_FIELDS = 8
NO_WAKER = (0, 0, 0, 0, 0, 0, 0, bytes(16))
UNSEEN_WAKER = RawSample(0, "", (), (), 0)  # RawSample.waker of a wait that slept, whose waker was not seen
KEY_WORDS = COUNT_KEY.size // 4  # a key's u32 words: pid is word 0, the user stack's kind word 8
COMM_OFFSET = COUNT_KEY.size - 16
_KEY_BYTES = struct.Struct(f"{COUNT_KEY.size}s")
_COMM = struct.Struct(f"{COMM_OFFSET}x16s")
CLOSERS = 16
# Stack storage: distinct stacks the stack store's index keeps (a stack met again while its entry lives is
# not copied again), and the store's arena holds twice as many before it turns over (stackstore.py). At
# most CPUs x Hz new stacks come a second: 4 per sample a second leaves 2 s between turnovers at worst.
BUCKETS_PER_SAMPLE = 4
MIN_STACKS = 8192
MIN_COUNTS = 40960
MAX_STACKS = 1 << 17


@dataclass
class FoldedCounts:
    """A drain's counts whose stacks are named from files or kernel IPs alone, as the kernel gave them:
    ``keys`` (COUNT_KEY after COUNT_KEY, each a distinct key of the drain) and ``values`` (u64 counts);
    ``records``: the stack records new in this drain (stackstore.parse_records), whose CFI frames decode
    with ``ids``. A recording sums the keys as bytes over drains and decodes each distinct one once, with
    the records its drains kept (:meth:`Profiler.decode_folded`)."""

    keys: bytes = b""
    values: bytes = b""
    records: dict[int, bytes] = field(default_factory=dict)
    ids: FileIds | None = None

    def counts(self) -> dict[bytes, int]:
        """Key bytes -> samples (built in C: no Python step per key)."""
        return dict(zip(map(itemgetter(0), _KEY_BYTES.iter_unpack(self.keys)), array.array("Q", self.values)))

    def pids(self) -> set[int]:
        return set(memoryview(self.keys).cast("I")[0::KEY_WORDS])

    def comms(self) -> set[str]:
        return {raw.split(b"\0", 1)[0].decode("utf-8", "replace") for raw in set(map(itemgetter(0), _COMM.iter_unpack(self.keys)))}

    def without_comm(self, comm: str) -> tuple["FoldedCounts", int]:
        """These counts but ``comm``'s, and how many samples ``comm`` had."""
        name = comm.encode()
        kept_keys, kept_values, dropped = bytearray(), array.array("Q"), 0
        for key, count in zip(map(itemgetter(0), _KEY_BYTES.iter_unpack(self.keys)), array.array("Q", self.values)):
            if key[COMM_OFFSET:].split(b"\0", 1)[0] == name:
                dropped += count
            else:
                kept_keys += key
                kept_values.append(count)
        return FoldedCounts(bytes(kept_keys), kept_values.tobytes(), self.records, self.ids), dropped

    def build_id_pids(self) -> set[int]:
        """Processes with build-id stacks here: their mappings are not known to the sampler yet."""
        words = memoryview(self.keys).cast("I")
        return {pid for pid, kind in set(zip(words[0::KEY_WORDS], words[8::KEY_WORDS])) if kind == STACK_BUILD_ID}


@dataclass
class DrainResult:
    """Raw facts: samples whose user frames are build-id frames, or raw IPs with the epoch of the mappings
    they ran in (RawSample.epoch, for the caller to translate); the processes still on build-id stacks."""

    samples: list[RawSample] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)
    execs: list[tuple[int, str]] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    time: float = 0.0
    build_id_pids: set[int] = field(default_factory=set)
    # With ``fold``: the counts named from files and kernel IPs alone, undecoded (see FoldedCounts).
    folded: FoldedCounts = field(default_factory=FoldedCounts)
    # With ``waits``: off-CPU time (RawSample.count in nanoseconds) and the waits' lost counters (offcpu.py)
    off_cpu: list[RawSample] = field(default_factory=list)
    off_cpu_lost: dict[str, int] = field(default_factory=dict)
    open_copies: set[int] = field(default_factory=set)  # the copies that off-CPU waits still open name


class Profiler:
    """Samples CPU stacks at `frequency_hz`: `pids=None` means the whole machine (an event per CPU), else
    those processes and their children (events bound to their threads, inherited)."""

    def __init__(
        self,
        frequency_hz: int = DEFAULT_FREQUENCY_HZ,
        pids: Iterable[int] | None = None,
        follow_children: bool = True,
        stack_storage_size: int | None = None,
        counts_size: int | None = None,
        targets_size: int = 65536,
        raw_stacks: bool = True,
        cfi_unwind: bool = False,
        unwind_rows: int = 1 << 20,
        fold: bool = False,
        python: bool = False,
        waits: WaitOptions | None = None,
    ) -> None:
        """``raw_stacks=False`` keeps every user stack as build-ids (what the sampler does anyway
        where the kernel has no syscall tracepoints to tell new executable mappings). ``cfi_unwind``:
        processes given to :attr:`unwind` are unwound from their files' CFI (unwind.c), up to
        ``unwind_rows`` rows of all files together. ``fold``: counts whose stacks are named from files or
        kernel IPs alone come back undecoded, in :attr:`DrainResult.folded` (record: at 10k samples a
        second of distinct stacks, decoding them at each drain was most of the drain's CPU). ``python`` (with
        ``cfi_unwind``): the eval frames of processes given to :attr:`python` become their Python frames.
        ``waits``: also measure off-CPU time (offcpu.c), stacks walked as the CPU samples' are."""
        self.frequency_hz = frequency_hz
        self._initial_pids = None if pids is None else list(pids)
        self._follow = follow_children
        self.stack_storage_size = stack_storage_size or default_stack_storage(frequency_hz, len(online_cpus()))
        size = self.stack_storage_size
        # a count per distinct (process, stacks) of a drain period: at most one per sample
        self._counts_size = counts_size or max(MIN_COUNTS, size // BUCKETS_PER_SAMPLE * 2)
        self._store_chunks = chunks_for(size)
        self._cflags = [
            f"-DSTORE_CHUNKS={self._store_chunks}",
            f"-DSTORE_INDEX_SIZE={size}",
            f"-DCOUNTS_SIZE={self._counts_size}",
            f"-DTARGETS_SIZE={targets_size}",
            f"-DPROCS_SIZE={targets_size}",
        ]
        if pids is not None:
            self._cflags.append("-DFILTER_PIDS")
        syscall_events = syscall_events_available()
        self.raw_stacks = raw_stacks and syscall_events
        if self.raw_stacks:
            self._cflags.append("-DRAW_STACKS")
        if syscall_events and (raw_stacks or cfi_unwind):
            self._cflags.append("-DTRACK_MAPPINGS")
        self.cfi_unwind = cfi_unwind
        if cfi_unwind:
            self._cflags += ["-DCFI_UNWIND", f"-DUNWIND_ROWS={unwind_rows}", f"-DCOPY_MAX_BYTES={COPY_MAX_BYTES}",
                             f"-DCOPY_RING_PAGES={ring_pages(frequency_hz, len(online_cpus()))}"]
        self.python_frames = python and cfi_unwind
        if self.python_frames:
            self._cflags.append("-DPYTHON_UNWIND")
        self._wait_options = waits
        if waits is not None:
            self._cflags += waits.cflags()
        self.waits: OffCpuWaits | None = None  # once loaded, with waits
        self._waiting_waits: list[tuple[tuple, int]] = []  # wait sums whose stacks were not readable yet
        self._unwind_rows = unwind_rows
        self._fold = fold
        self.unwind = None  # UnwindMaps once loaded, with cfi_unwind
        self.copies: CopyRing | None = None  # once loaded, with cfi_unwind
        self.images: ProcessImages | None = None  # once loaded, with cfi_unwind
        self.python = None  # PythonMaps once loaded, with python
        self.store: StackStore | None = None
        self.stats: Counter[str] = Counter()  # samples by user-stack kind: "raw", "build_id", "cfi"
        self.event = ""
        self.tick_ns = 0  # once attached to the targets' threads: the events' period (ns; 0: per CPU or cycles)
        self._bpf = None
        self._set = 0
        self._lost_seen = [0] * len(LOST_REASONS)
        self._events: list[tuple[int, int, str]] = []
        self._event_buffers: EventBuffers | None = None  # once loaded
        self.events_lost = 0
        self._pids: list[int] = []
        self._tasks: TaskEvents | None = None
        self._counts: list[MapTaker] = []  # the two sets' count maps, once loaded
        self._rawcounts: list[MapTaker] = []
        self._waiting: list[tuple[tuple, int]] = []  # counts whose stacks were not readable yet (see drain)
        self._closing_lock = threading.Lock()
        self._tracepoints_closing: threading.Thread | None = None  # see stop_sampling

    def __enter__(self) -> "Profiler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.load()
        self.attach()

    def load(self) -> None:
        """Compile and load the programs and add the initial pids; nothing is sampled until :meth:`attach`
        (the caller may read the targets' mappings in between, so their samples are raw IPs from the first)."""
        self._bpf = load_bcc(self._sources(), self._cflags)
        self._bpf.preload(b"on_sample", ProgType.PERF_EVENT)  # verified while the rest is set up (attach waits)
        self._counts = [MapTaker(self._bpf[f"counts{index}".encode()]) for index in (0, 1)]
        self._rawcounts = [MapTaker(self._bpf[f"rawcounts{index}".encode()]) for index in (0, 1)]
        if (self._counts[0].key_size, self._counts[0].value_size) != (COUNT_KEY.size, 8):
            raise OptraceError("internal error: profile.c's count key is not the layout profiler.py reads")
        self.store = StackStore(self._bpf, self._store_chunks, GRACE_SECONDS)
        if self.cfi_unwind:
            from optrace.bpf.unwindmaps import UnwindMaps

            self.unwind = UnwindMaps(self._bpf, self._unwind_rows)
            self.copies = CopyRing(self._bpf)
            self.images = ProcessImages(self._bpf)
        if self.python_frames:
            from optrace.bpf.pythonmaps import PythonMaps

            self.python = PythonMaps(self._bpf)
        if self._wait_options is not None:
            self.waits = OffCpuWaits(self._bpf)
        for pid in self._initial_pids or ():
            self.add_pid(pid)
        if not self._follow:
            self._bpf.detach_raw_tracepoint(b"sched_process_fork")
        self._bpf[b"proc_events"].open_perf_buffer(self._on_event, page_cnt=256, lost_cb=self._on_events_lost)
        self._event_buffers = EventBuffers(self._bpf)

    def _sources(self) -> list[Path]:
        sources = [STACK_STORE, PROGRAM, FORKS] + ([OFF_CPU] if self._wait_options is not None else [])
        if self.cfi_unwind:
            sources += [PYTHON_WALK, UNWINDER, STACK_COPIES, IMAGES] + ([PYTHON_WALKER, COPY_PYTHON]
                                                                        if self.python_frames else [])
        return sources + ([WAKERS] if self._wait_options is not None and self._wait_options.wakers else [])

    def load_walker(self) -> None:
        """The CFI walker's programs (and python.c's with ``python``), off the start-up path (unwindmaps.py),
        and their copies for wakers' stacks (offcpu.py)."""
        self.unwind.load_step(python=self.python_frames)
        self.images.start()
        if self.waits is not None:
            self.waits.load_walker(python=self.python_frames)

    def attach(self) -> None:
        """Start sampling: on every CPU for the whole machine, else on the targets' threads (and what they
        start later, see perfevents.py), the pids added so far now and those added later at once."""
        if self._initial_pids is None:
            self._attach_sampler()
        else:
            name, ev_type, ev_config = self._task_event()
            prog_fd = load_function(self._bpf, b"on_sample", ProgType.PERF_EVENT).fd
            self._tasks = self._task_events(prog_fd, ev_type, ev_config)
            self.event = name
            self._mark_attached()
            for pid in self._pids:
                self._tasks.add_process(pid)
        if self.waits is not None:
            self.waits.attach(self._initial_pids is None, self._pids)

    def _task_events(self, prog_fd: int, ev_type: int, ev_config: int) -> TaskEvents:
        """cpu-clock events ticking every TICK_NS of a thread's CPU time at most, a sample each 1e9 / F ns of
        its process's (profile.c's sample_due); cycles (counted in cycles, not time) at F, every tick a sample."""
        if ev_type != PerfType.SOFTWARE:
            return TaskEvents(prog_fd, ev_type, ev_config, self.frequency_hz, inherit=self._follow)
        sample_ns = 1_000_000_000 // self.frequency_hz
        self.tick_ns = min(sample_ns, TICK_NS)
        settings = self._bpf[b"sampling"]
        settings[settings.Key(SAMPLE_NS)] = settings.Leaf(sample_ns)
        return TaskEvents(prog_fd, ev_type, ev_config, self.tick_ns, inherit=self._follow, period=True)

    def _mark_attached(self) -> None:
        """Threads born from now on have events from their start: their whole CPU time is the recording's."""
        settings = self._bpf[b"sampling"]
        settings[settings.Key(ATTACHED_NS)] = settings.Leaf(time.monotonic_ns())  # bpf_ktime_get_ns()'s clock

    def _task_event(self) -> tuple[str, int, int]:
        for name, ev_type, ev_config in self._event_choices():
            if perfevents.probe(ev_type, ev_config, self.frequency_hz):
                return name, ev_type, ev_config
        raise OptraceError("cannot open a cpu-clock perf event: check perf_event_paranoid and run optrace doctor")

    @staticmethod
    def _event_choices() -> list[tuple[str, int, int]]:
        """cycles where a PMU exists, else the software cpu-clock (as BCC's profile does)."""
        attempts = [("cpu-clock", PerfType.SOFTWARE, PerfSWConfig.CPU_CLOCK)]
        if os.path.isdir("/sys/bus/event_source/devices/cpu"):
            attempts.insert(0, ("cycles", PerfType.HARDWARE, PerfHWConfig.CPU_CYCLES))
        return attempts

    def _attach_sampler(self) -> None:
        # Loaded here, not inside attach_perf_event: a refused program is not a perf event that failed to open.
        load_function(self._bpf, b"on_sample", ProgType.PERF_EVENT)
        for name, ev_type, ev_config in self._event_choices():
            try:
                self._bpf.attach_perf_event(
                    ev_type=ev_type, ev_config=ev_config, fn_name=b"on_sample", sample_freq=self.frequency_hz
                )
            except Exception:
                continue
            self.event = name
            return
        raise OptraceError("cannot open a cpu-clock perf event: check perf_event_paranoid and run optrace doctor")

    def add_pid(self, pid: int) -> None:
        """Profile a process (its children too); sampled at once when the sampler is attached already."""
        targets = self._bpf[b"targets"]
        targets[targets.Key(pid)] = targets.Leaf(1)
        self._pids.append(pid)
        if self._tasks is not None:
            self._mark_attached()
            self._tasks.add_process(pid)
            if self.waits is not None:
                self.waits.add_process(pid)

    def target_pids(self) -> set[int]:
        """Every process that was a target, children included (entries are never removed)."""
        if self._initial_pids is None:
            return set()
        return {k.value for k in self._bpf[b"targets"].keys()}

    def drain(self) -> DrainResult:
        """Flip the active count set, then read and clear the one the sampler no longer writes, with the
        stack records stored since the last drain."""
        self._event_buffers.read_all()
        old = self._set
        self._set = 1 - old
        active = self._bpf[b"active"]
        active[active.Key(0)] = active.Leaf(self._set)
        time.sleep(GRACE_SECONDS)
        now = time.monotonic()
        open_copies: set[int] = set()
        if self.waits is not None:
            open_hashes, open_copies = self.waits.open_stacks()
            self.store.keep(open_hashes)
        new = self.store.read()
        ids = self.unwind.drain_ids() if self.unwind else None  # after the read (see drain_ids)
        result = DrainResult(lost=self._read_lost(), time=now, open_copies=open_copies)
        decoder = _Decoder(partial(_with_ids, self.store.get, ids))
        retried, self._waiting = self._waiting, []
        samples = [decoder.sample(key, count, now, missing_ok=True) for key, count in retried]
        keys, values, _ = self._counts[old].take()
        if self._fold:
            result.folded = FoldedCounts(keys, values, new, ids)
        else:
            samples += self._decoded(decoder, keys, values, now)
        raw_keys, raw_values, _ = self._rawcounts[old].take()
        samples += self._decoded(decoder, raw_keys, raw_values, now)
        result.samples = samples
        if self.waits is not None:
            result.off_cpu, result.off_cpu_lost = self._drained_waits(decoder, old, now)
        result.build_id_pids = decoder.build_id_pids | result.folded.build_id_pids()
        self.stats.update(decoder.kinds)
        result.execs, result.exits = self.poll_events()
        return result

    def _decoded(self, decoder: "_Decoder", keys: bytes, values: bytes, now: float,
                 waiting: list[tuple[tuple, int]] | None = None, tally: bool = True) -> list[RawSample]:
        """Samples of count entries whose stacks are read; an entry naming a stack not read yet (its record
        was still being written when the store was read: rare) waits for the next drain, once, in
        ``waiting`` (the CPU counts' list by default)."""
        waiting = self._waiting if waiting is None else waiting
        samples = []
        for key, count in zip(COUNT_KEY.iter_unpack(keys), array.array("Q", values)):
            sample = decoder.sample(key, count, now, tally=tally)
            if sample is None:
                waiting.append((key, count))
            else:
                samples.append(sample)
        return samples

    def _drained_waits(self, decoder: "_Decoder", old: int, now: float) -> tuple[list[RawSample], dict[str, int]]:
        """The off-CPU sums of the set no longer written (count: nanoseconds), each with its waker
        (RawSample.waker) with wakers, and the waits' lost counters."""
        retried, self._waiting_waits = self._waiting_waits, []
        samples = [wait_sample(decoder, key, ns, now, missing_ok=True) for key, ns in retried]
        keys, values = self.waits.take(old)
        if not self.waits.wakers:
            samples += self._decoded(decoder, keys, values, now, self._waiting_waits, tally=False)
            return samples, self.waits.lost()
        for key, ns in zip(WAKEUP_KEY.iter_unpack(keys), array.array("Q", values)):
            sample = wait_sample(decoder, key, ns, now)
            if sample is None:
                self._waiting_waits.append((key, ns))
            else:
                samples.append(sample)
        return samples, self.waits.lost()

    def decode_folded(self, counts: Mapping[bytes, int],
                      records: Sequence[tuple[FileIds | None, Mapping[int, bytes]]]) -> list[RawSample]:
        """A recording's folded counts (key bytes -> samples, over all its drains), each distinct key
        decoded once, with the stack records its drains kept: (file ids, the records read with them),
        usually one pair (file ids change with the unwinder's generations)."""
        def lookup(stack_hash: int) -> tuple[bytes, FileIds | None] | None:
            for ids, kept in records:
                record = kept.get(stack_hash)
                if record is not None:
                    return record, ids
            return None

        decoder = _Decoder(lookup)
        samples = [decoder.sample(COUNT_KEY.unpack(key), count, 0.0, missing_ok=True) for key, count in counts.items()]
        self.stats.update(decoder.kinds)
        return samples

    def stop_sampling(self) -> None:
        """Samples from now on are ignored (the events stay until :meth:`close`): a recording's end is kept
        to the moment, even while a drain is still busy. Safe from another thread. The syscall tracepoints,
        which only keep the targets' mapping epochs for samples to come, start closing now, on a thread:
        each close waits for RCU grace periods, which the final drain need not wait for."""
        active = self._bpf[b"active"]
        active[active.Key(1)] = active.Leaf(1)
        with self._closing_lock:
            if self._tracepoints_closing is None:
                self._tracepoints_closing = threading.Thread(target=self._detach_tracepoints, args=(self._bpf,),
                                                             name="optrace-tracepoints", daemon=True)
                self._tracepoints_closing.start()

    @staticmethod
    def _detach_tracepoints(bpf) -> None:
        with ThreadPoolExecutor(max_workers=CLOSERS) as pool:  # each close waits for an RCU grace period
            list(pool.map(bpf.detach_tracepoint, list(bpf.tracepoint_fds)))

    def epoch(self, pid: int) -> int:
        """The process's mappings epoch (set now if it has none). To let the sampler take raw IPs of a
        process, the caller reads this epoch first, then /proc/PID/maps, then calls :meth:`mark_known`:
        a mapping made in between changes the epoch and the sampler keeps to build-ids (see profile.c)."""
        epochs = self._bpf[b"epochs"]
        _insert_if_absent(epochs, pid, time.monotonic_ns())  # the clock of bpf_ktime_get_ns()
        return _lookup(epochs, pid)

    def live_epoch(self, pid: int) -> int:
        """The process's epoch, 0 when it has none (never sampled, or gone: its exit drops it); nothing is set."""
        return _lookup(self._bpf[b"epochs"], pid)

    def exec_epoch(self, pid: int) -> int:
        """The process's epoch at its last exec the sampler saw (0: none), with cfi_unwind: a stack copy
        (StackCopy.exec_epoch) is walked only with mappings read since the same exec."""
        return _lookup(self._bpf[b"exec_epochs"], pid) if self.cfi_unwind else 0

    def mark_known(self, pid: int, epoch: int) -> None:
        """The caller holds the process's mappings of ``epoch``: raw IPs from now on."""
        known = self._bpf[b"known"]
        known[known.Key(pid)] = known.Leaf(epoch)

    def poll_events(self, ready: Iterable[int] | None = None) -> tuple[list[tuple[int, str]], list[int]]:
        """Exec'd files and exited processes since the last call (cheap: call it often, so a
        short-lived process can be looked at while it still runs). ``ready``: the :attr:`event_fds` a
        poll by the caller found readable (see EventBuffers.read_ready)."""
        self._event_buffers.read_ready(ready)
        execs = [(pid, filename) for kind, pid, filename in self._events if kind == PROC_EXEC]
        exits = [pid for kind, pid, _ in self._events if kind == PROC_EXIT]
        self._events.clear()
        return execs, exits

    @property
    def event_fds(self) -> tuple[int, ...]:
        """The fds of the process-event buffers: readable when they hold events (once loaded)."""
        return self._event_buffers.fds if self._event_buffers is not None else ()

    def read_copies(self) -> dict[int, StackCopy]:
        """The stack copies that came since the last read, by id (RawSample.copy names them): after a
        drain's flip, every copy its counts name is there. Thread-safe."""
        return self.copies.read() if self.copies is not None else {}

    def _read_lost(self) -> dict[str, int]:
        """Increments since the previous drain (the per-CPU counters themselves only grow)."""
        delta = counter_increments(self._bpf[b"lost"], LOST_REASONS, self._lost_seen)
        if self.events_lost:
            delta["proc_events_lost"] = self.events_lost
            self.events_lost = 0
        return delta

    def _on_event(self, cpu: int, data, size: int) -> None:
        ev = self._bpf[b"proc_events"].event(data)
        filename = ev.filename.decode("utf-8", "replace") if ev.kind == PROC_EXEC else ""
        self._events.append((ev.kind, ev.pid, filename))

    def _on_events_lost(self, count: int) -> None:
        self.events_lost += count

    def close(self) -> None:
        """Detach everything; safe to call twice. Perf events and programs are fds, so even a kill
        -9 releases them; this makes the normal paths prompt. Closing a perf tracepoint event with a BPF
        program waits for RCU grace periods (32-70 ms each on this VM, from one boot to the next) under a
        kernel-wide lock, so the syscall tracepoints are only the two exits (profile.c reads the arguments
        there): 4 took 0.13-0.19 s even closed side by side. The sched ones are raw tracepoints, which do
        not wait; the syscall ones have no raw form but sys_enter and sys_exit, which run on every system
        call of the machine (measured: getppid 76 -> 121 ns, against 86 ns with 4 syscall tracepoints).
        The per-task sampling events, closed with them, do not wait."""
        if self._tracepoints_closing is not None:
            self._tracepoints_closing.join()
        closers: list[Callable[[], object]] = []
        if self._tasks is not None:
            closers += self._tasks.closers()
        if self.waits is not None:
            closers += self.waits.closers()
        bpf, self._bpf = self._bpf, None
        self._event_buffers = None  # its readers are freed with the BPF object: reading them then would crash
        if bpf is not None:
            closers += [partial(bpf.detach_tracepoint, tp) for tp in list(bpf.tracepoint_fds)]
        with ThreadPoolExecutor(max_workers=CLOSERS) as pool:  # each close waits for an RCU grace period
            list(pool.map(lambda close: close(), closers))
        if bpf is not None:
            bpf.cleanup()


def default_stack_storage(frequency_hz: int, cpus: int, drain_seconds: float = 1.0) -> int:
    """Distinct stacks the stack store keeps: BUCKETS_PER_SAMPLE x the most samples of one drain period, a
    power of two (the kernel rounds a hash map's buckets up to one), within [MIN_STACKS, MAX_STACKS]."""
    wanted = BUCKETS_PER_SAMPLE * cpus * frequency_hz * drain_seconds
    return min(MAX_STACKS, max(MIN_STACKS, 1 << max(0, math.ceil(math.log2(max(wanted, 1))))))




def _decode_ips(value: bytes) -> tuple[int, ...]:
    """A stack map value: u64 addresses, zero after the last frame."""
    ips = array.array("Q", value)
    end = ips.index(0) if 0 in ips else len(ips)
    return tuple(ips[:end])


class FrameDecoder:
    """Stack map values as UserFrames, one object per distinct frame (a raw IP, a build-id entry)."""

    def __init__(self) -> None:
        self._raw: dict[int, UserFrame] = {}
        self._entries: dict[bytes, UserFrame | None] = {}

    def raw_frames(self, value: bytes) -> tuple[UserFrame, ...]:
        frames = self._raw
        return tuple(frames.get(ip) or frames.setdefault(ip, UserFrame(None, ip)) for ip in _decode_ips(value))

    def build_id_frames(self, value: bytes) -> tuple[UserFrame, ...]:
        """struct bpf_stack_build_id entries (status, 20-byte build-id, offset or ip) up to the first one
        that is neither a valid build-id frame nor a non-zero IP."""
        out = []
        size = BUILD_ID_ENTRY.size
        for start in range(0, len(value) - size + 1, size):
            entry = value[start:start + size]
            if entry not in self._entries:
                self._entries[entry] = _build_id_frame(entry)
            frame = self._entries[entry]
            if frame is None:
                break
            out.append(frame)
        return tuple(out)


def wait_sample(decoder: "_Decoder", key: tuple, ns: int, now: float, missing_ok: bool = False) -> RawSample | None:
    """A wait's sample: of a COUNT_KEY, or of a WAKEUP_KEY with its waker (RawSample.waker: None for a wait
    that was preempted, UNSEEN_WAKER for one that slept and whose waker was not seen). None when a stack it
    names is not read yet (unless ``missing_ok``)."""
    blocked = decoder.sample(key[:KEY_FIELDS], ns, now, missing_ok, tally=False)
    if blocked is None or len(key) == KEY_FIELDS or not key[-2]:
        return blocked
    waker_key = key[KEY_FIELDS:2 * KEY_FIELDS]
    if waker_key == NO_WAKER:
        return dataclasses.replace(blocked, waker=UNSEEN_WAKER)
    waker = decoder.sample(waker_key, 0, 0.0, missing_ok, tally=False)
    return None if waker is None else dataclasses.replace(blocked, waker=waker)


def _build_id_frame(entry: bytes) -> UserFrame | None:
    status, build_id, offset = BUILD_ID_ENTRY.unpack(entry)
    if status == BUILD_ID_VALID:
        return UserFrame(build_id, offset)
    if status == BUILD_ID_IP and offset:
        return UserFrame(None, offset)
    return None


def _lookup(table, pid: int) -> int:
    try:
        return table[table.Key(pid)].value
    except KeyError:
        return 0


def _insert_if_absent(table, pid: int, value: int) -> None:
    """BPF_NOEXIST: an epoch the sampler or a tracepoint set meanwhile is kept."""
    from optrace.bpf.bcclib import lib

    key, leaf = table.Key(pid), table.Leaf(value)
    lib.bpf_update_elem(table.map_fd, ctypes.byref(key), ctypes.byref(leaf), BPF_NOEXIST)


def _with_ids(get: Callable[[int], bytes | None], ids: FileIds | None, stack_hash: int) -> tuple[bytes, FileIds | None] | None:
    record = get(stack_hash)
    return None if record is None else (record, ids)


class _Decoder:
    """Count keys (COUNT_KEY tuples) as RawSamples, each stack decoded once; ``lookup`` gives a stack
    record by hash, with the CFI file ids it decodes with. ``kinds``: samples by user-stack kind."""

    def __init__(self, lookup: Callable[[int], tuple[bytes, FileIds | None] | None]) -> None:
        self._lookup = lookup
        self._frames = FrameDecoder()
        self._user: dict[int, tuple[tuple[UserFrame, ...], str, str] | None] = {}
        self._kernel: dict[int, tuple[int, ...] | None] = {}
        self._comms: dict[bytes, str] = {}
        self.kinds: Counter[str] = Counter()
        self.build_id_pids: set[int] = set()  # processes whose samples came with build-id stacks

    def sample(self, key: tuple, count: int, now: float, missing_ok: bool = False, tally: bool = True
               ) -> RawSample | None:
        """None when a stack the key names is not known (unless ``missing_ok``: then it is left out).
        ``tally``: the count is of samples (not off-CPU time): it goes to :attr:`kinds`."""
        pid, tid, user_hash, kernel_hash, epoch, kind, copy, raw_comm = key
        kernel = self._kernel_stack(kernel_hash) if kernel_hash else ()
        unwound = self._user_stack(user_hash) if user_hash else NO_USER_STACK
        if kernel is None or unwound is None:
            if not missing_ok:
                return None
            kernel, unwound = kernel or (), unwound or NO_USER_STACK
        comm = self._comms.get(raw_comm)
        if comm is None:
            comm = self._comms[raw_comm] = raw_comm.split(b"\0", 1)[0].decode("utf-8", "replace")
        user, stop, python = unwound
        if user and tally:
            self.kinds[USER_KINDS.get(kind, "raw")] += count
            if copy:
                self.kinds["copied"] += count
        if user and kind == STACK_BUILD_ID:
            self.build_id_pids.add(pid)
        return RawSample(pid, comm, user, kernel, count, now, epoch if kind == STACK_RAW and user else 0, tid, stop,
                         python, copy)

    def _kernel_stack(self, stack_hash: int) -> tuple[int, ...] | None:
        if stack_hash not in self._kernel:
            found = self._lookup(stack_hash)
            self._kernel[stack_hash] = tuple(array.array("Q", stored(found[0]).words)) if found else None
        return self._kernel[stack_hash]

    def _user_stack(self, stack_hash: int) -> tuple[tuple[UserFrame, ...], str, str] | None:
        if stack_hash not in self._user:
            found = self._lookup(stack_hash)
            self._user[stack_hash] = self._decoded_user(*found) if found else None
        return self._user[stack_hash]

    def _decoded_user(self, raw_record: bytes, ids: FileIds | None) -> tuple[tuple[UserFrame, ...], str, str]:
        """(frames, how a CFI walk ended, why its Python frames stopped short)."""
        record = stored(raw_record)
        if record.kind == STACK_RAW:
            return self._frames.raw_frames(record.words), "", ""
        if record.kind == STACK_BUILD_ID:
            return self._frames.build_id_frames(record.words), "", ""
        unwound = decode_cfi(record.words, record.status, ids, record.python)
        return unwound.frames, unwound.status, unwound.python
