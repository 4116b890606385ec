"""Sampling events bound to processes rather than CPUs, as `perf record -p PID` and `perf record CMD` open
them: one event per thread, ``inherit=1`` so every thread and child process created later carries its own
copy, and the sampler program attached with PERF_EVENT_IOC_SET_BPF (the kernel hands the program on to the
inherited copies). A task-bound cpu-clock event runs its timer only while its task is on a CPU, so a
process that is not profiled pays nothing; a per-CPU event with a pid filter in BPF interrupts every CPU
at the sampling rate and runs the program in every task.

BCC's ``attach_perf_event`` opens one event per CPU and never sets ``inherit``; libbcc's raw variant
prints to stderr when a thread has just exited. So the syscall is made here.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Callable
from functools import partial

from optrace.errors import OptraceError

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine, 298)
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408
ANY_CPU = -1
GONE = (errno.ESRCH, errno.ENOENT)  # the thread exited between listing and opening
ROUNDS = 8  # threads listed again until no new one shows up (one created meanwhile inherited nothing)
FLAG_DISABLED, FLAG_INHERIT, FLAG_FREQ = 1 << 0, 1 << 1, 1 << 10  # perf_event_attr's bit fields


class PerfEventAttr(ctypes.Structure):
    """The head of ``struct perf_event_attr`` (PERF_ATTR_SIZE_VER5 = 112 bytes with the padding);
    ``sample_period`` is ``sample_freq`` with FLAG_FREQ, ``config1`` a uprobe's path, ``config2`` its offset."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("rest", ctypes.c_uint8 * 40),
    ]


class TaskEvents:
    """Events of type (``ev_type``, ``ev_config``) at ``frequency_hz`` on processes' threads, each running
    the BPF program ``prog_fd``; :meth:`close` releases them and every inherited copy."""

    def __init__(self, prog_fd: int, ev_type: int, ev_config: int, frequency_hz: int, inherit: bool = True,
                 period: bool = False) -> None:
        """``period``: ``frequency_hz`` is a sample period instead (every Nth event runs the program)."""
        self._prog_fd = prog_fd
        self._attr = _attr(ev_type, ev_config, frequency_hz, inherit, period)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fds: dict[int, int] = {}  # tid -> event fd

    def add_process(self, pid: int) -> int:
        """Open an event on each of the process's threads; returns how many it has now (0: it is gone).
        Threads are listed again until none is new: a thread created while the events were being opened,
        by a thread that had none yet, is caught by the next listing."""
        for _ in range(ROUNDS):
            new = [tid for tid in _threads(pid) if tid not in self._fds]
            if not new:
                break
            for tid in new:
                self._open(tid)
        return sum(1 for tid in _threads(pid) if tid in self._fds)

    def _open(self, tid: int) -> None:
        fd = self._libc.syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(self._attr), tid, ANY_CPU, -1, PERF_FLAG_FD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            if err in GONE:
                return
            raise OptraceError(f"cannot open a sampling event on thread {tid}: {os.strerror(err)} "
                               "(optrace doctor tells what is missing)")
        try:
            fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, self._prog_fd)
            fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
        except OSError as exc:
            os.close(fd)
            raise OptraceError(f"cannot attach the sampler to thread {tid}'s event: {exc.strerror}") from exc
        self._fds[tid] = fd

    def closers(self) -> list[Callable[[], None]]:
        """One call per event that closes it (the kernel removes the inherited copies with their parent);
        the caller may run them side by side. Afterwards nothing is left to close."""
        fds, self._fds = self._fds, {}
        return [partial(os.close, fd) for fd in fds.values()]


def probe(ev_type: int, ev_config: int, frequency_hz: int) -> bool:
    """Whether this event can be opened on this process (the test for a hardware PMU)."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _attr(ev_type, ev_config, frequency_hz, inherit=False)
    fd = libc.syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(attr), 0, ANY_CPU, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


def _attr(ev_type: int, ev_config: int, frequency_hz: int, inherit: bool, period: bool = False) -> PerfEventAttr:
    """Sampling at ``frequency_hz`` (with ``period``: every ``frequency_hz``-th event), disabled until the program
    is attached."""
    flags = (0 if period else FLAG_FREQ) | FLAG_DISABLED | (FLAG_INHERIT if inherit else 0)
    return PerfEventAttr(type=ev_type, size=ctypes.sizeof(PerfEventAttr), config=ev_config, sample_period=frequency_hz,
                         flags=flags)


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []
