"""The off-CPU part of the sampler's program (offcpu.c, compiled into profile.c's object with -DOFF_CPU): its
build flags, its attachments (the sched_switch raw tracepoint and the software context-switch events), the
time sums a drain takes, and the stacks open waits still name.

Waits are walked by the CPU sampler's own programs (the CFI walker, Python frames) and named by the same
decoder: bpf/profiler.py drains them with the CPU counts, from the same flip of the active set. With wakers
(wakers.c), each wait's time comes joined to the stacks of the thread that woke it, walked by copies of the
same programs loaded as raw tracepoint programs (:meth:`OffCpuWaits.load_walker`). This module and its
siblings are the only ones that load BPF programs (bpf/loader.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from optrace.bpf.abi import PerfSWConfig, PerfType, ProgType
from optrace.bpf.loader import counter_increments, load_function
from optrace.bpf.maptaker import MapTaker
from optrace.bpf.perfevents import TaskEvents
from optrace.bpf.unwindmaps import PROG_UNWIND_STEP, PYTHON_PROGRAMS
from optrace.errors import OptraceError
from optrace.kernel import OFF_CPU_HOOK

TRACEPOINT = "sched_switch"
WAKING = "sched_waking"  # fired by try_to_wake_up in the waker's context (wakers.c)
ATTACHMENT = OFF_CPU_HOOK  # what doctor and the record's header say is used
LOST_REASONS = ("user_stack_missing", "kernel_stack_missing", "counts_map_full", "short_waits",
                "missed_switch_ins", "wakeup_counts_map_full")  # enum wait_lost_reason
# --state names -> the KEEP_* bits of offcpu.c
STATES = {"running": 0x1, "sleeping": 0x2, "disk": 0x4}
ALL_STATES = 0xF
SWITCH_OUTS_PERIOD = 1  # the context-switch event's program runs at every switch
# The walker's maps its copies for wakers use instead (wakers.c): a program array serves one program type
WAKER_MAPS = {b"unwind_progs": b"waker_progs", b"unwind_states": b"waker_states"}


@dataclass(frozen=True)
class WaitOptions:
    """How waits are measured: ``kernel_stacks=False``, user stacks only (the kernel stack is most of a
    switch's cost); ``every`` N, one wait in N (at random) recorded and counted N times (offcpu.c)."""

    min_block_us: int = 1
    states: frozenset[str] = frozenset()
    kernel_stacks: bool = True
    every: int = 1
    counts_size: int = 40960
    start_size: int = 32768
    wakers: bool = False

    def cflags(self) -> list[str]:
        mask = sum(STATES[state] for state in self.states) if self.states else ALL_STATES
        flags = ["-DOFF_CPU", f"-DWAIT_COUNTS_SIZE={self.counts_size}", f"-DWAIT_START_SIZE={self.start_size}",
                 f"-DMIN_BLOCK_NS={self.min_block_us * 1000}ULL", f"-DKEEP_STATES={mask}",
                 f"-DWAIT_EVERY={self.every}ULL"]
        if self.every > 1:
            flags.append(f"-DWAIT_THRESHOLD={(1 << 32) // self.every}U")
        if not self.kernel_stacks:
            flags.append("-DUSER_STACKS_ONLY")
        if self.wakers:
            flags.append("-DWAKERS")
        return flags


class OffCpuWaits:
    """offcpu.c's programs and maps in a loaded BCC object; attached by :meth:`attach` (per CPU for the whole
    machine, else on the targets' threads, as the CPU sampler's events are)."""

    def __init__(self, bpf) -> None:
        self._bpf = bpf
        self.wakers = b"wakers" in bpf
        counts = "wakeup_counts" if self.wakers else "wait_counts"
        self._counts = [MapTaker(bpf[f"{counts}{index}".encode()]) for index in (0, 1)]
        self._lost_seen = [0] * len(LOST_REASONS)
        self._tasks: TaskEvents | None = None

    def attach(self, whole_machine: bool, pids: Iterable[int]) -> None:
        try:
            self._bpf.attach_raw_tracepoint(tp=TRACEPOINT.encode(), fn_name=b"on_switch_in")
        except Exception as exc:
            raise OptraceError(f"cannot attach to the {ATTACHMENT}: {exc} (optrace doctor tells what is missing)"
                               ) from exc
        if self.wakers:
            self._bpf.attach_raw_tracepoint(tp=WAKING.encode(), fn_name=b"on_waking")
        switch_out = load_function(self._bpf, b"on_switch_out", ProgType.PERF_EVENT)
        software, switches = PerfType.SOFTWARE, PerfSWConfig.CONTEXT_SWITCHES
        if whole_machine:
            self._bpf.attach_perf_event(ev_type=software, ev_config=switches, fn_name=b"on_switch_out",
                                        sample_period=SWITCH_OUTS_PERIOD)
            return
        self._tasks = TaskEvents(switch_out.fd, software, switches, SWITCH_OUTS_PERIOD, period=True)
        for pid in pids:
            self.add_process(pid)

    def load_walker(self, python: bool) -> None:
        """With wakers and the CFI walker: the walker's programs (and python.c's with ``python``) loaded again
        as raw tracepoint programs for wakers.c, with their own program array and state; until then a
        waker's stack is its frame-pointer one. Off the start-up path, as UnwindMaps.load_step."""
        if not self.wakers or b"waker_progs" not in self._bpf:
            return
        programs = [(PROG_UNWIND_STEP, b"unwind_step")] + (list(PYTHON_PROGRAMS) if python else [])
        try:
            loaded = [(index, self._bpf.load_func_copy(b"waker_" + name, name, ProgType.RAW_TRACEPOINT, WAKER_MAPS).fd)
                      for index, name in programs]
        except Exception as exc:
            raise OptraceError(f"the kernel did not load the waker walker: {exc}") from exc
        progs = self._bpf[b"waker_progs"]
        for index, fd in loaded:
            progs[progs.Key(index)] = progs.Leaf(fd)

    def add_process(self, pid: int) -> None:
        if self._tasks is not None:
            self._tasks.add_process(pid)

    def open_stacks(self) -> tuple[set[int], set[int]]:
        """The stack hashes (user and kernel) and the stack copies (ids) that waits still open name: they
        must outlive the stack store's turnovers and the copies' own time limit until the waits end (a wait
        may last longer than a store epoch)."""
        hashes, copies = set(), set()
        for entry in self._bpf[b"wait_start"].values():
            hashes.update((entry.key.user, entry.key.kernel))
            copies.add(entry.key.copy)
        if self.wakers:  # each woken task's waker until it runs
            hashes.update(stack for waker in self._bpf[b"wakers"].values() for stack in (waker.key.user, waker.key.kernel))
        hashes.discard(0)
        copies.discard(0)
        return hashes, copies

    def take(self, set_index: int) -> tuple[bytes, bytes]:
        """The set's (keys, values) as bytes (profile.c's COUNT_KEY, or with wakers two of them: the wait's
        and its waker's; u64 nanoseconds), the map emptied."""
        keys, values, _ = self._counts[set_index].take()
        return keys, values

    def lost(self) -> dict[str, int]:
        return counter_increments(self._bpf[b"wait_lost"], LOST_REASONS, self._lost_seen)

    def closers(self) -> list[Callable[[], None]]:
        return self._tasks.closers() if self._tasks is not None else []

