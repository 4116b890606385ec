"""The BCC side of `record --off-cpu`: load offcpu.c on the sched_switch raw tracepoint and drain the
kernel's per-stack sums of off-CPU nanoseconds as RawSamples (user frames as raw IPs, for the session to
name with the process's mappings).

This module and its siblings are the only ones that load BPF programs (bpf/loader.py).
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from optrace.bpf.loader import counter_increments, load_bcc
from optrace.bpf.profiler import GRACE_SECONDS, _raw_ips
from optrace.errors import OptraceError
from optrace.kernel import OFF_CPU_HOOK
from optrace.model import RawSample, UserFrame

PROGRAM = Path(__file__).with_name("offcpu.c")
TRACEPOINT = "sched_switch"
ATTACHMENT = OFF_CPU_HOOK  # what doctor and the record's header say is used
LOST_REASONS = ("user_stack_collision", "kernel_stack_collision", "counts_map_full", "short_waits",
                "missed_switch_ins")
# --state names -> the KEEP_* bits of offcpu.c
STATES = {"running": 0x1, "sleeping": 0x2, "disk": 0x4}
ALL_STATES = 0xF
TARGETS_HASH_SIZE = 65536  # target processes, when pid_max is too large for a byte per pid
MAX_PID_ARRAY = 1 << 18  # the most pids a byte-per-pid target array covers (8 bytes each in the kernel)
PID_MAX = Path("/proc/sys/kernel/pid_max")


def pid_array_size() -> int | None:
    """pid_max when a byte per pid fits (TARGETS_BY_PID in offcpu.c), else None."""
    try:
        pid_max = int(PID_MAX.read_text())
    except (OSError, ValueError):
        return None
    return pid_max if 0 < pid_max <= MAX_PID_ARRAY else None


@dataclass
class OffCpuDrain:
    samples: list[RawSample] = field(default_factory=list)  # count: nanoseconds off CPU
    lost: dict[str, int] = field(default_factory=dict)
    time: float = 0.0


class OffCpuTracer:
    """Sums off-CPU time per thread and stack; ``pids=None`` means every thread on the machine."""

    def __init__(
        self,
        pids: Iterable[int] | None = None,
        min_block_us: int = 1,
        states: Iterable[str] = (),
        stack_storage_size: int = 8192,
        counts_size: int = 40960,
        start_size: int = 32768,
        targets_by_pid: bool = True,
        kernel_stacks: bool = True,
        wait_every: int = 1,
    ) -> None:
        """``kernel_stacks=False``: user stacks only, about 60% cheaper per context switch. ``wait_every`` N:
        one wait in N, chosen at random, is recorded and counted N times (see offcpu.c). ``targets_by_pid``:
        the target processes in a byte-per-pid array when pid_max allows, else (and when False) a hash."""
        mask = sum(STATES[state] for state in set(states)) if states else ALL_STATES
        self._cflags = [
            f"-DSTACK_SIZE={stack_storage_size}",
            f"-DCOUNTS_SIZE={counts_size}",
            f"-DSTART_SIZE={start_size}",
            f"-DMIN_BLOCK_NS={min_block_us * 1000}ULL",
            f"-DKEEP_STATES={mask}",
            f"-DWAIT_EVERY={wait_every}ULL",
        ]
        if wait_every > 1:
            self._cflags.append(f"-DWAIT_THRESHOLD={(1 << 32) // wait_every}U")
        if pids is not None:
            self._cflags.append("-DFILTER_PIDS")
        pid_slots = pid_array_size() if targets_by_pid else None
        if pid_slots:
            self._cflags += ["-DTARGETS_BY_PID", f"-DTARGETS_SIZE={pid_slots}"]
        else:
            self._cflags.append(f"-DTARGETS_SIZE={TARGETS_HASH_SIZE}")
        if not kernel_stacks:
            self._cflags.append("-DUSER_STACKS_ONLY")
        self._initial_pids = list(pids or ())
        self._bpf = None
        self._set = 0
        self._lost_seen = [0] * len(LOST_REASONS)

    def load(self) -> None:
        """Compile and load; nothing is measured until :meth:`attach`."""
        self._bpf = load_bcc([PROGRAM], self._cflags)
        for pid in self._initial_pids:
            self.add_pid(pid)

    def attach(self) -> None:
        try:
            self._bpf.attach_raw_tracepoint(tp=TRACEPOINT.encode(), fn_name=b"on_switch")
        except Exception as exc:
            raise OptraceError(f"cannot attach to the {ATTACHMENT}: {exc} (optrace doctor tells what is missing)"
                               ) from exc

    def add_pid(self, pid: int) -> None:
        targets = self._bpf[b"targets"]
        targets[targets.Key(pid)] = targets.Leaf(1)

    def drain(self) -> OffCpuDrain:
        """Flip the stack set switch-outs write, then take every finished wait's sum (both sets: a wait
        that began before the previous flip may end now) and clear the old set's stacks that no thread
        still waiting names.

        The waiting threads are looked at before the sums are read: a wait that ends in between adds its
        sum before it removes its entry, so its stacks are either kept (the entry was seen) or its sum
        is read now. Looked at after, a wait ending in between lost its stacks to the clearing, and its
        sum went to whatever stack took the freed id (a CI run: the mutex wait under another stack)."""
        old = self._set
        self._set = 1 - old
        active = self._bpf[b"active"]
        active[active.Key(0)] = active.Leaf(self._set)
        time.sleep(GRACE_SECONDS)
        pending = self._pending_stacks(old)
        now = time.monotonic()
        items = list(self._bpf[b"counts"].items_lookup_and_delete_batch())
        samples = self._samples(items, now)
        self._clear_stacks(old, pending)
        return OffCpuDrain(samples=samples, lost=self._read_lost(), time=now)

    def _samples(self, items: list, now: float) -> list[RawSample]:
        stacks: dict[tuple[str, int, int], tuple[int, ...]] = {}

        def stack(kind: str, index: int, stack_id: int) -> tuple[int, ...]:
            if stack_id < 0:
                return ()
            slot = (kind, index, stack_id)
            if slot not in stacks:
                stacks[slot] = _raw_ips(self._bpf[f"{kind}{index}".encode()], stack_id)
            return stacks[slot]

        samples = []
        for key, value in items:
            user = tuple(UserFrame(None, ip) for ip in stack("ustacks", key.set, key.user_stack_id))
            kernel = stack("kstacks", key.set, key.kernel_stack_id)
            comm = key.comm.decode("utf-8", "replace")
            nanoseconds = value if isinstance(value, int) else value.value  # the batch call gives ints
            samples.append(RawSample(key.pid, comm, user, kernel, nanoseconds, now, tid=key.tid))
        return samples

    def _pending_stacks(self, index: int) -> tuple[set[int], set[int]]:
        """The set's user and kernel stack ids named by threads still off CPU (their waits end later)."""
        pending_user, pending_kernel = set(), set()
        for entry in self._bpf[b"start"].values():
            if entry.key.set == index:
                pending_user.add(entry.key.user_stack_id)
                pending_kernel.add(entry.key.kernel_stack_id)
        return pending_user, pending_kernel

    def _clear_stacks(self, index: int, pending: tuple[set[int], set[int]]) -> None:
        """Delete the set's stacks but the ``pending`` ones."""
        pending_user, pending_kernel = pending
        for name, keep in ((f"ustacks{index}", pending_user), (f"kstacks{index}", pending_kernel)):
            table = self._bpf[name.encode()]
            for key in list(table.keys()):
                if key.value not in keep:
                    try:
                        del table[key]
                    except KeyError:
                        pass

    def _read_lost(self) -> dict[str, int]:
        return counter_increments(self._bpf[b"lost"], LOST_REASONS, self._lost_seen)

    def close(self) -> None:
        """Detach everything; safe to call twice (the tracepoint link is an fd: even kill -9 releases it)."""
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            bpf.cleanup()
