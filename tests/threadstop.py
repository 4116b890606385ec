"""Stopping one thread of another process and reading its registers (ptrace), for tests that read a stack
from outside while it holds still: the replay's snapshot maker, the HotSpot naming tests.

``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT`` stop the thread without a signal the process would see; detaching
lets it run on. Needs root (or the same user with ptrace allowed by Yama).
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PTRACE_GETREGS = 12
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
# struct user_regs_struct (x86_64), in order
REGISTER_NAMES = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax", "cx", "dx", "si", "di",
                  "orig_ax", "ip", "cs", "flags", "sp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_libc.ptrace.restype = ctypes.c_long


@dataclass(frozen=True)
class Registers:
    values: dict[str, int]

    def __getattr__(self, name: str) -> int:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def _ptrace(request: int, tid: int, address: int = 0, data: int | ctypes.Array | None = 0) -> None:
    pointer = ctypes.addressof(data) if isinstance(data, ctypes.Array) else data
    if _libc.ptrace(request, tid, address, pointer) < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"ptrace({request:#x}, {tid}): {os.strerror(error)}")


@contextmanager
def stopped(tid: int) -> Iterator[Registers]:
    """The thread ``tid`` stopped for the block (its registers given), running again after."""
    _ptrace(PTRACE_SEIZE, tid)
    try:
        _ptrace(PTRACE_INTERRUPT, tid)
        os.waitpid(tid, os.__dict__.get("__WALL", 0x40000000))
        raw = (ctypes.c_uint64 * len(REGISTER_NAMES))()
        _ptrace(PTRACE_GETREGS, tid, 0, raw)
        yield Registers(dict(zip(REGISTER_NAMES, raw)))
    finally:
        _ptrace(PTRACE_DETACH, tid)


def busiest_thread(pid: int, comm: str | None = None) -> int:
    """The thread of ``pid`` (named ``comm``, if given) that has used the most CPU time so far. A Java
    program's main thread is not the process's first (the launcher starts the VM on a thread of its own) and
    is the busiest "java" thread: the JIT's threads are named "C2 CompilerThre..." and such."""
    best = (-1, pid)
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{name}/stat") as stat:
                head, tail = stat.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        if comm is None or head.split("(", 1)[1] == comm:
            best = max(best, (int(fields[11]) + int(fields[12]), int(name)))
    return best[1]
