"""The BCC side of `optrace record` and `optrace serve`: load profile.c, attach it to the cpu-clock
(or cycles) event, on every CPU for the whole machine, else on the target processes' threads
(perfevents.py), and drain the kernel's aggregated counts as RawSamples.

This module and its siblings are the only ones that import BCC.
"""
from __future__ import annotations

import array
import ctypes
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
from typing import Callable, Iterable

from optrace.bpf import perfevents
from optrace.bpf.loader import counter_increments, import_bcc, load_bcc
from optrace.bpf.maptaker import MapTaker
from optrace.bpf.perfevents import TaskEvents
from optrace.errors import OptraceError
from optrace.model import RawSample, UserFrame
from optrace.kernel import syscall_events_available

PROGRAM = Path(__file__).with_name("profile.c")
UNWINDER = Path(__file__).with_name("unwind.c")  # appended with cfi_unwind (see unwindmaps.py)
MAX_CFI_STACKS = 16384  # distinct CFI-unwound stacks per drain period: 1 KiB each, preallocated, two sets
LOST_REASONS = (
    "user_stack_collision",
    "kernel_stack_collision",
    "user_stack_missing",
    "kernel_stack_missing",
    "counts_map_full",
    "idle",
)
USER_BUILD_ID, USER_SPARE, USER_RAW, USER_CFI = 0, 1, 2, 3  # enum user_map in profile.c
BUILD_ID_VALID = 1
BUILD_ID_IP = 2
BPF_NOEXIST = 1
GRACE_SECONDS = 0.005  # a sampler run takes microseconds; this is long past any run that saw the old set
PROC_EXEC, PROC_EXIT = 0, 1
BUILD_ID_ENTRY = struct.Struct("<i20sQ")  # struct bpf_stack_build_id
# struct key_t in profile.c: set, user_map, pid, user and kernel stack ids, tid, unused, epoch, cfi_stack, comm
COUNT_KEY = struct.Struct("=HHIiiIIQQ16s")
CLOSERS = 16
SWEEP_EVERY = 30  # drains between two sweeps of the stack maps for stacks no count names
# Stack maps: a new stack whose hash bucket holds another stack is a collision, so a map needs several
# buckets per distinct stack of a drain period (at most CPUs x Hz per second): at 4 per sample a stack
# finds its bucket taken about 1 time in 8, and then the next map in the chain (profile.c) takes it.
BUCKETS_PER_SAMPLE = 4
MIN_STACKS = 8192
MIN_COUNTS = 40960
MAX_STACKS = 1 << 17  # 128 MiB per raw-IP or kernel map (1 KiB a stack), two sets
MAX_BUILD_ID_STACKS = 1 << 14  # build-id stacks are 4 KiB each (127 x 32 bytes): 64 MiB per map


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
    # With ``fold_cfi``: (pid, comm, FoldedStack, kernel IPs, tid) -> samples, for CFI stacks all in files
    # with a build-id (bpf/unwindmaps.py): what a recording sums and decodes once, at its end.
    folded: dict[tuple, int] = field(default_factory=dict)


class Profiler:
    """Samples CPU stacks at `frequency_hz`: `pids=None` means the whole machine (an event per CPU), else
    those processes and their children (events bound to their threads, inherited)."""

    def __init__(
        self,
        frequency_hz: int = 99,
        pids: Iterable[int] | None = None,
        follow_children: bool = True,
        stack_storage_size: int | None = None,
        counts_size: int | None = None,
        targets_size: int = 65536,
        raw_stacks: bool = True,
        cfi_unwind: bool = False,
        unwind_rows: int = 1 << 20,
        fold_cfi: bool = False,
    ) -> None:
        """``raw_stacks=False`` keeps every user stack as build-ids (what the sampler does anyway
        where the kernel has no syscall tracepoints to tell new executable mappings). ``cfi_unwind``:
        processes given to :attr:`unwind` are unwound from their files' CFI (unwind.c), up to
        ``unwind_rows`` rows of all files together. ``fold_cfi``: such stacks all in files with a build-id
        come back undecoded, in :attr:`DrainResult.folded` (record: at 10k samples a second of distinct
        stacks, decoding them at each drain was most of the drain's CPU)."""
        self.frequency_hz = frequency_hz
        self._initial_pids = None if pids is None else list(pids)
        self._follow = follow_children
        self.stack_storage_size = stack_storage_size or default_stack_storage(frequency_hz, len(online_cpus()))
        size = self.stack_storage_size
        # a count per distinct (process, stacks) of a drain period: at most one per sample
        self._counts_size = counts_size or max(MIN_COUNTS, size // BUCKETS_PER_SAMPLE * 2)
        self._cflags = [
            f"-DSTACK_SIZE={size}",
            f"-DBUILD_ID_SIZE={min(size, MAX_BUILD_ID_STACKS)}",
            f"-DSPARE_SIZE={max(min(size, MAX_BUILD_ID_STACKS) // 4, 1)}",
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
            self._cflags += ["-DCFI_UNWIND", f"-DUNWIND_ROWS={unwind_rows}", f"-DCFI_STACKS={min(size, MAX_CFI_STACKS)}"]
        self._unwind_rows = unwind_rows
        self._fold_cfi = fold_cfi
        self.unwind = None  # UnwindMaps once loaded, with cfi_unwind
        self.stats: Counter[str] = Counter()  # samples by user-stack kind: "raw", "build_id", "cfi"
        self.event = ""
        self._bpf = None
        self._set = 0
        self._lost_seen = [0] * len(LOST_REASONS)
        self._sweeps = 0
        self._events: list[tuple[int, int, str]] = []
        self.events_lost = 0
        self._pids: list[int] = []
        self._tasks: TaskEvents | None = None
        self._counts: list[MapTaker] = []  # the two sets' count maps, once loaded
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
        self._bpf = load_bcc([PROGRAM, UNWINDER] if self.cfi_unwind else [PROGRAM], self._cflags)
        self._counts = [MapTaker(self._bpf[f"counts{index}".encode()]) for index in (0, 1)]
        if (self._counts[0].key_size, self._counts[0].value_size) != (COUNT_KEY.size, 8):
            raise OptraceError("internal error: profile.c's count key is not the layout profiler.py reads")
        if self.cfi_unwind:
            from optrace.bpf.unwindmaps import UnwindMaps

            self.unwind = UnwindMaps(self._bpf, self._unwind_rows)
        for pid in self._initial_pids or ():
            self.add_pid(pid)
        if not self._follow:
            self._bpf.detach_raw_tracepoint(b"sched_process_fork")
        self._bpf[b"proc_events"].open_perf_buffer(self._on_event, page_cnt=256, lost_cb=self._on_events_lost)

    def attach(self) -> None:
        """Start sampling: on every CPU for the whole machine, else on the targets' threads (and what they
        start later, see perfevents.py), the pids added so far now and those added later at once."""
        bcc = import_bcc()
        if self._initial_pids is None:
            self._attach_sampler(bcc)
            return
        name, ev_type, ev_config = self._task_event(bcc)
        prog_fd = self._bpf.load_func(b"on_sample", bcc.BPF.PERF_EVENT).fd
        self._tasks = TaskEvents(prog_fd, ev_type, ev_config, self.frequency_hz, inherit=self._follow)
        self.event = name
        for pid in self._pids:
            self._tasks.add_process(pid)

    def _task_event(self, bcc) -> tuple[str, int, int]:
        for name, ev_type, ev_config in self._event_choices(bcc):
            if perfevents.probe(ev_type, ev_config, self.frequency_hz):
                return name, ev_type, ev_config
        raise OptraceError("cannot open a cpu-clock perf event: check perf_event_paranoid and run optrace doctor")

    @staticmethod
    def _event_choices(bcc) -> list[tuple[str, int, int]]:
        """cycles where a PMU exists, else the software cpu-clock (as BCC's profile does)."""
        attempts = [("cpu-clock", bcc.PerfType.SOFTWARE, bcc.PerfSWConfig.CPU_CLOCK)]
        if os.path.isdir("/sys/bus/event_source/devices/cpu"):
            attempts.insert(0, ("cycles", bcc.PerfType.HARDWARE, bcc.PerfHWConfig.CPU_CYCLES))
        return attempts

    def _attach_sampler(self, bcc) -> None:
        for name, ev_type, ev_config in self._event_choices(bcc):
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
            self._tasks.add_process(pid)

    def target_pids(self) -> set[int]:
        """Every process that was a target, children included (entries are never removed)."""
        if self._initial_pids is None:
            return set()
        return {k.value for k in self._bpf[b"targets"].keys()}

    def drain(self) -> DrainResult:
        """Flip the active map set, then read and clear the one the sampler no longer writes."""
        self._bpf.perf_buffer_poll(timeout=0)
        old = self._set
        self._set = 1 - old
        active = self._bpf[b"active"]
        active[active.Key(0)] = active.Leaf(self._set)
        time.sleep(GRACE_SECONDS)
        now = time.monotonic()
        samples, build_id_pids, folded = self._read_set(old, now)
        result = DrainResult(samples=samples, lost=self._read_lost(), time=now, build_id_pids=build_id_pids,
                             folded=folded)
        result.execs, result.exits = self.poll_events()
        return result

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

    def mark_known(self, pid: int, epoch: int) -> None:
        """The caller holds the process's mappings of ``epoch``: raw IPs from now on."""
        known = self._bpf[b"known"]
        known[known.Key(pid)] = known.Leaf(epoch)

    def poll_events(self) -> tuple[list[tuple[int, str]], list[int]]:
        """Exec'd files and exited processes since the last call (cheap: call it often, so a
        short-lived process can be looked at while it still runs)."""
        self._bpf.perf_buffer_poll(timeout=0)
        execs = [(pid, filename) for kind, pid, filename in self._events if kind == PROC_EXEC]
        exits = [pid for kind, pid, _ in self._events if kind == PROC_EXIT]
        self._events.clear()
        return execs, exits

    def _read_set(self, index: int, now: float) -> tuple[list[RawSample], set[int], dict[tuple, int]]:
        """The set's counts in one batched read-and-delete, then each stack they name read and deleted once
        (one syscall each; stack maps have no batch operations)."""
        frames = FrameDecoder()  # distinct stacks of a drain share most of their frames: each is made once
        stacks = {kind: StackReader(self._bpf[f"{name}{index}{suffix}".encode()], decode)
                  for kind, name, suffix, decode in (
                      (USER_BUILD_ID, "ustacks", "", frames.build_id_frames),
                      (USER_SPARE, "ustacks", "_alt", frames.build_id_frames),
                      (USER_RAW, "rawstacks", "", frames.raw_frames))}
        kstacks = StackReader(self._bpf[f"kstacks{index}".encode()], _decode_ips)
        keys, values, taken = self._counts[index].take()
        on_build_ids = set()  # processes whose maps the sampler still waits for
        cfi = self.unwind.read_stacks(index, fold=self._fold_cfi) if self.unwind else {}
        folded_type = _folded_stack_type() if self._fold_cfi else None
        samples = []
        folded: dict[tuple, int] = {}
        comms: dict[bytes, str] = {}
        kinds: Counter[str] = Counter()
        for (_, user_map, pid, user_id, kernel_id, tid, _, epoch, cfi_stack, raw_comm), count in zip(
                COUNT_KEY.iter_unpack(keys), array.array("Q", values)):
            kernel = kstacks.take(kernel_id) if kernel_id >= 0 else ()  # most samples are in user space
            comm = comms.get(raw_comm)
            if comm is None:
                comm = comms[raw_comm] = raw_comm.split(b"\0", 1)[0].decode("utf-8", "replace")
            if user_map == USER_CFI:
                unwound = cfi.get(cfi_stack)
                kinds["cfi"] += count
                if type(unwound) is folded_type:
                    key = (pid, comm, unwound, kernel, tid)
                    folded[key] = folded.get(key, 0) + count
                    continue
                user, stop = (unwound.frames, unwound.status) if unwound else ((), "")
                samples.append(RawSample(pid, comm, user, kernel, count, now, tid=tid, stop=stop))
                continue
            user = stacks[user_map].take(user_id) if user_map in stacks else ()
            raw = bool(user) and user_map == USER_RAW
            samples.append(RawSample(pid, comm, user, kernel, count, now, epoch if raw else 0, tid))
            if raw:
                kinds["raw"] += count
            elif user:
                kinds["build_id"] += count
                on_build_ids.add(pid)
        self.stats.update(kinds)
        self._sweeps += 1
        if self._sweeps % SWEEP_EVERY == 0 or taken >= self._counts_size:
            for reader in (*stacks.values(), kstacks):  # stacks whose count was lost (a full counts map)
                _clear_stacks(reader.table)
        return samples, on_build_ids, folded

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
        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            closers += [partial(bpf.detach_tracepoint, tp) for tp in list(bpf.tracepoint_fds)]
        with ThreadPoolExecutor(max_workers=CLOSERS) as pool:  # each close waits for an RCU grace period
            list(pool.map(lambda close: close(), closers))
        if bpf is not None:
            bpf.cleanup()


def _folded_stack_type() -> type:
    from optrace.bpf.unwindmaps import FoldedStack  # unwindmaps imports this module

    return FoldedStack


def default_stack_storage(frequency_hz: int, cpus: int, drain_seconds: float = 1.0) -> int:
    """Stacks per map: BUCKETS_PER_SAMPLE x the most samples of one drain period, a power of two (the
    kernel rounds the buckets up to one), within [MIN_STACKS, MAX_STACKS]."""
    wanted = BUCKETS_PER_SAMPLE * cpus * frequency_hz * drain_seconds
    return min(MAX_STACKS, max(MIN_STACKS, 1 << max(0, math.ceil(math.log2(max(wanted, 1))))))


def online_cpus() -> list[int]:
    return list(import_bcc().utils.get_online_cpus())


class StackReader:
    """Reads and deletes stack ids of one stack map, each once per drain (a drain's samples share stacks)."""

    def __init__(self, table, decode: Callable[[bytes], tuple]) -> None:
        from bcc.libbcc import lib

        self.table = table
        self._lookup_and_delete = lib.bpf_lookup_and_delete
        self._decode = decode
        self._key = ctypes.c_uint32()
        self._leaf = table.Leaf()
        self._size = ctypes.sizeof(self._leaf)
        self._taken: dict[int, tuple] = {}

    def take(self, stack_id: int) -> tuple:
        if stack_id < 0:
            return ()
        stack = self._taken.get(stack_id)
        if stack is None:
            self._key.value = stack_id
            found = self._lookup_and_delete(self.table.map_fd, ctypes.byref(self._key), ctypes.byref(self._leaf)) == 0
            stack = self._decode(ctypes.string_at(ctypes.addressof(self._leaf), self._size)) if found else ()
            self._taken[stack_id] = stack
        return stack


def _raw_ips(table, stack_id: int) -> tuple[int, ...]:
    """One stack of a stack map, left in it (bpf/offcpu.py: a stack may still be named later)."""
    try:
        ips = table[table.Key(stack_id)].ip
    except KeyError:
        return ()
    return tuple(ip for ip in ips if ip)


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
    from bcc.libbcc import lib

    key, leaf = table.Key(pid), table.Leaf(value)
    lib.bpf_update_elem(table.map_fd, ctypes.byref(key), ctypes.byref(leaf), BPF_NOEXIST)


def _clear_stacks(table) -> None:
    """BCC's StackTrace.clear() does nothing; delete every id so the map does not fill up."""
    for key in list(table.keys()):
        try:
            del table[key]
        except KeyError:
            pass
