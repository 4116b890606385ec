"""Bounded reads of another process's memory with ``process_vm_readv`` (one system call for several ranges).

Everything read is the process's to choose (another user's, maybe hostile), so every range is capped
(:data:`MAX_RANGE` bytes, :data:`MAX_TOTAL` per call) and a read never raises for what the process did: an
unmapped address, a process that exited or one we may not read all give fewer bytes than asked (``b""``
when none). Only a caller's own mistake (more than :data:`MAX_RANGES` ranges) raises ValueError.

``process_vm_readv`` stops at the first remote range it cannot read (it may copy part of it); the ranges
after it are read again in another call, so one bad pointer costs only its own range.
"""
from __future__ import annotations

import ctypes
import errno
import struct
from collections.abc import Sequence

MAX_RANGE = 1 << 20  # bytes of one range (longer ones are cut)
MAX_TOTAL = 4 << 20  # bytes of one call's ranges together
MAX_RANGES = 256  # ranges of one call (the kernel's IOV_MAX is 1024)
MAX_ADDRESS = (1 << 64) - 1
_POINTER = struct.Struct("<Q")


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                                   ctypes.c_ulong, ctypes.c_ulong)
_libc.process_vm_readv.restype = ctypes.c_ssize_t


class ProcessMemory:
    """Reads of one process's memory (by pid: a process that exits and whose pid is reused is read as the
    new one; callers that care check the process's start time around their reads)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def read(self, address: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``address`` (capped at MAX_RANGE): fewer when part of it is unreadable."""
        return self.read_ranges([(address, size)])[0]

    def read_exact(self, address: int, size: int) -> bytes | None:
        """``size`` bytes at ``address``, or None when not all of them could be read."""
        data = self.read(address, size)
        return data if len(data) == size else None

    def pointer(self, address: int) -> int | None:
        """The 8-byte little-endian word at ``address`` (None when unreadable)."""
        data = self.read_exact(address, 8)
        return None if data is None else _POINTER.unpack(data)[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each (address, size), in order, each as much as could be read from its start."""
        if len(ranges) > MAX_RANGES:
            raise ValueError(f"{len(ranges)} ranges in one read (at most {MAX_RANGES})")
        sizes = [_capped(address, size) for address, size in ranges]
        if sum(sizes) > MAX_TOTAL:
            raise ValueError(f"{sum(sizes)} bytes in one read (at most {MAX_TOTAL})")
        results = [b""] * len(ranges)
        start = 0
        while start < len(ranges):
            start = self._read_from(ranges, sizes, start, results)
        return results

    def _read_from(self, ranges: Sequence[tuple[int, int]], sizes: list[int], start: int, results: list[bytes]) -> int:
        """Read ranges[start:] in one call, fill ``results``; the index to go on from (past the one that failed)."""
        wanted = [(index, ranges[index][0], sizes[index]) for index in range(start, len(ranges)) if sizes[index]]
        if not wanted:
            return len(ranges)
        buffer = ctypes.create_string_buffer(sum(size for _, _, size in wanted))
        local, remote = (_IoVec * len(wanted))(), (_IoVec * len(wanted))()
        at = 0
        for slot, (_, address, size) in enumerate(wanted):
            local[slot].base, local[slot].len = ctypes.addressof(buffer) + at, size
            remote[slot].base, remote[slot].len = address, size
            at += size
        copied = _libc.process_vm_readv(self.pid, local, len(wanted), remote, len(wanted), 0)
        if copied < 0 and ctypes.get_errno() in (errno.ESRCH, errno.EPERM):
            return len(ranges)  # the process is gone, or not ours to read: no range will read
        at = 0
        for index, _, size in wanted:
            got = min(size, copied - at)
            results[index] = buffer.raw[at:at + got] if got > 0 else b""
            if got < size:
                return index + 1
            at += size
        return len(ranges)


def _capped(address: int, size: int) -> int:
    """The bytes of a range that may be asked for: 0 for an impossible address, at most MAX_RANGE."""
    if address <= 0 or address > MAX_ADDRESS or size <= 0:
        return 0
    return min(size, MAX_RANGE, MAX_ADDRESS - address + 1)
