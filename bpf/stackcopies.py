"""The user side of the stack copies (stackcopy.c): the ring buffer they come through, read into
:class:`~optrace.model.StackCopy` records by id (the id a count key names them by).

Reading is cheap when the ring is empty (one call into libbpf's consumer). Its fd is readable when copies
wait; a process's first copy of an epoch wakes a thread blocked on it (the copy watcher of
frontend/unwind/copywalks.py), the others do not.
"""
from __future__ import annotations

import ctypes
import struct
import threading

from optrace.model import StackCopy

HEAD = struct.Struct("<IIIIQQQQQII4Q")  # struct copy_head
COPY_CONTINUES = 1  # copy_head.flags (unwind.c)
COPY_RETURN_ADDRESS = 2
COPY_SHARED = 4
MAX_BYTES = 28672  # COPY_MAX_BYTES: the bytes of stack a copy holds at most (a per-CPU map value is at most
# 32 KiB with the head; cc1 used 3-22 KB between sp and the stack's top, perf --call-graph dwarf copies 8 KiB)
PAGE = 4096


def ring_pages(frequency_hz: int, cpus: int, seconds: float = 0.5, copy_bytes: int = 8192) -> int:
    """The ring's pages (a power of two, 1-32 MiB): room for every CPU's samples over ``seconds`` as copies
    of ``copy_bytes`` (cc1's stacks are 3-11 KB deep), should all of them be copied."""
    wanted = cpus * frequency_hz * seconds * copy_bytes / PAGE
    pages = 1 << max(0, int(wanted - 1).bit_length())
    return min(8192, max(256, pages))


class CopyRing:
    """The ring of a loaded program; :meth:`read` takes the copies that came since the last call."""

    def __init__(self, bpf) -> None:
        self._bpf = bpf
        table = bpf[b"stack_copies"]
        self.fd = table.map_fd
        self._copies: dict[int, StackCopy] = {}
        self._lock = threading.Lock()  # libbpf's consumer is not to be run by two threads at once
        self.malformed = 0
        table.open_ring_buffer(self._on_copy)

    def read(self) -> dict[int, StackCopy]:
        with self._lock:
            self._bpf.ring_buffer_consume()
            copies, self._copies = self._copies, {}
        return copies

    def _on_copy(self, _context, data, size: int) -> int:
        raw = ctypes.string_at(data, size)
        copy = parse_copy(raw)
        if copy is None:
            self.malformed += 1
        else:
            self._copies[copy[0]] = copy[1]
        return 0


def parse_copy(raw: bytes) -> tuple[int, StackCopy] | None:
    """(id, copy) of a ring record, None when it is not one stackcopy.c writes."""
    if len(raw) < HEAD.size:
        return None
    copy_id, pid, _tid, size, epoch, exec_epoch, ip, sp, bp, flags, _, *evals = HEAD.unpack_from(raw)
    if not copy_id or size > MAX_BYTES or HEAD.size + size > len(raw):
        return None
    stack = raw[HEAD.size:HEAD.size + size]
    ranges = tuple((start, end) for start, end in zip(evals[0::2], evals[1::2]) if start < end)
    return copy_id, StackCopy(ip, sp, bp, stack, bool(flags & COPY_RETURN_ADDRESS), bool(flags & COPY_CONTINUES),
                              pid, epoch, exec_epoch, bool(flags & COPY_SHARED), ranges)
