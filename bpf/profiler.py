"""The BCC side of `optrace record` and `optrace serve`: load profile.c, attach it to the cpu-clock
(or cycles) event on every CPU, and drain the kernel's aggregated counts as RawSamples.

This module and its siblings are the only ones that import BCC.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from optrace.bpf.loader import import_bcc, load_bcc
from optrace.frontend.errors import OptraceError
from optrace.frontend.model import RawSample, UserFrame

PROGRAM = Path(__file__).with_name("profile.c")
LOST_REASONS = (
    "user_stack_collision",
    "kernel_stack_collision",
    "user_stack_missing",
    "kernel_stack_missing",
    "counts_map_full",
    "idle",
)
BUILD_ID_VALID = 1
BUILD_ID_IP = 2
GRACE_SECONDS = 0.005  # a sampler run takes microseconds; this is long past any run that saw the old set
PROC_EXEC, PROC_EXIT = 0, 1


@dataclass
class DrainResult:
    samples: list[RawSample] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)
    execs: list[tuple[int, str]] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    time: float = 0.0


class Profiler:
    """Samples CPU stacks at `frequency_hz` on every CPU; `pids=None` means the whole machine."""

    def __init__(
        self,
        frequency_hz: int = 99,
        pids: Iterable[int] | None = None,
        follow_children: bool = True,
        stack_storage_size: int = 8192,
        counts_size: int = 40960,
        targets_size: int = 65536,
    ) -> None:
        self.frequency_hz = frequency_hz
        self._initial_pids = None if pids is None else list(pids)
        self._follow = follow_children
        self._cflags = [
            f"-DSTACK_SIZE={stack_storage_size}",
            f"-DSPARE_SIZE={max(stack_storage_size // 4, 1)}",
            f"-DCOUNTS_SIZE={counts_size}",
            f"-DTARGETS_SIZE={targets_size}",
        ]
        if pids is not None:
            self._cflags.append("-DFILTER_PIDS")
        self.event = ""
        self._bpf = None
        self._set = 0
        self._lost_seen = [0] * len(LOST_REASONS)
        self._events: list[tuple[int, int, str]] = []
        self.events_lost = 0

    def __enter__(self) -> "Profiler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._bpf = load_bcc(src_file=str(PROGRAM).encode(), cflags=self._cflags)
        for pid in self._initial_pids or ():
            self.add_pid(pid)
        if not self._follow:
            self._bpf.detach_tracepoint(b"sched:sched_process_fork")
        self._bpf[b"proc_events"].open_perf_buffer(self._on_event, page_cnt=256, lost_cb=self._on_events_lost)
        self._attach_sampler(import_bcc())

    def _attach_sampler(self, bcc) -> None:
        """cycles where a PMU exists, else the software cpu-clock (as BCC's profile does)."""
        attempts = [("cpu-clock", bcc.PerfType.SOFTWARE, bcc.PerfSWConfig.CPU_CLOCK)]
        if os.path.isdir("/sys/bus/event_source/devices/cpu"):
            attempts.insert(0, ("cycles", bcc.PerfType.HARDWARE, bcc.PerfHWConfig.CPU_CYCLES))
        for name, ev_type, ev_config in attempts:
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
        targets = self._bpf[b"targets"]
        targets[targets.Key(pid)] = targets.Leaf(1)

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
        result = DrainResult(samples=self._read_set(old, now), lost=self._read_lost(), time=now)
        result.execs, result.exits = self.poll_events()
        return result

    def poll_events(self) -> tuple[list[tuple[int, str]], list[int]]:
        """Exec'd files and exited processes since the last call (cheap: call it often, so a
        short-lived process can be looked at while it still runs)."""
        self._bpf.perf_buffer_poll(timeout=0)
        execs = [(pid, filename) for kind, pid, filename in self._events if kind == PROC_EXEC]
        exits = [pid for kind, pid, _ in self._events if kind == PROC_EXIT]
        self._events.clear()
        return execs, exits

    def _read_set(self, index: int, now: float) -> list[RawSample]:
        counts = self._bpf[b"counts"]
        ustacks = self._bpf[f"ustacks{index}".encode()]
        spare = self._bpf[f"ustacks{index}_alt".encode()]
        kstacks = self._bpf[f"kstacks{index}".encode()]
        items = [(k, v) for k, v in counts.items() if k.set == index]
        ucache: dict[tuple[int, int], tuple[UserFrame, ...]] = {}
        kcache: dict[int, tuple[int, ...]] = {}
        samples = []
        for key, value in items:
            user = self._user_stack(spare if key.user_alt else ustacks, key.user_stack_id, ucache)
            kernel = self._kernel_stack(kstacks, key.kernel_stack_id, kcache)
            comm = key.comm.decode("utf-8", "replace")
            samples.append(RawSample(key.pid, comm, user, kernel, value.value, now))
        for key, _ in items:
            del counts[key]
        _clear_stacks(ustacks)
        _clear_stacks(spare)
        _clear_stacks(kstacks)
        return samples

    @staticmethod
    def _user_stack(table, stack_id: int, cache: dict) -> tuple[UserFrame, ...]:
        if stack_id < 0:
            return ()
        slot = (id(table), stack_id)
        if slot not in cache:
            cache[slot] = _decode_build_id_stack(table, stack_id)
        return cache[slot]

    @staticmethod
    def _kernel_stack(table, stack_id: int, cache: dict) -> tuple[int, ...]:
        if stack_id < 0:
            return ()
        if stack_id not in cache:
            try:
                ips = table[table.Key(stack_id)].ip
            except KeyError:
                return ()
            cache[stack_id] = tuple(ip for ip in ips if ip)
        return cache[stack_id]

    def _read_lost(self) -> dict[str, int]:
        """Increments since the previous drain (the per-CPU counters themselves only grow)."""
        lost = self._bpf[b"lost"]
        delta = {}
        for i, reason in enumerate(LOST_REASONS):
            total = sum(lost[lost.Key(i)])
            if total > self._lost_seen[i]:
                delta[reason] = total - self._lost_seen[i]
            self._lost_seen[i] = total
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
        -9 releases them; this makes the normal paths prompt."""
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            bpf.cleanup()


def _decode_build_id_stack(table, stack_id: int) -> tuple[UserFrame, ...]:
    try:
        trace = table[table.Key(stack_id)].trace
    except KeyError:
        return ()
    frames = []
    for entry in trace:
        if entry.status == BUILD_ID_VALID:
            frames.append(UserFrame(bytes(entry.build_id), entry.offset))
        elif entry.status == BUILD_ID_IP and entry.offset:
            frames.append(UserFrame(None, entry.offset))
        else:
            break
    return tuple(frames)


def _clear_stacks(table) -> None:
    """BCC's StackTrace.clear() does nothing; delete every id so the map does not fill up."""
    for key in list(table.keys()):
        try:
            del table[key]
        except KeyError:
            pass
