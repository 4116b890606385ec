"""A whole BPF hash map read and emptied in a few system calls, as bytes.

Why not BCC's ``items_lookup_and_delete_batch``: it allocates key and value arrays for the whole map at every
call and yields two ctypes objects per entry, whose fields are then read one attribute at a time: at 10,000
samples a second with many distinct stacks (bench/bench_scale.py), a large part of each drain. Here the
buffers are allocated once per map and the caller decodes the bytes with :mod:`struct` and
:class:`memoryview` (C loops). They are anonymous mappings whose filled pages are given back after each
read, so a map's capacity (16 MiB for a set of CFI stacks) costs memory only while a drain reads it.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os

from optrace.bpf.bcclib import lib


class MapTaker:
    """Reads and deletes every entry of one BPF hash map (``BPF_MAP_LOOKUP_AND_DELETE_BATCH``)."""

    def __init__(self, table) -> None:
        self._batch = lib.bpf_lookup_and_delete_batch
        self._fd = table.map_fd
        self.key_size = ctypes.sizeof(table.Key)
        self.value_size = ctypes.sizeof(table.Leaf)
        self.capacity = table.max_entries
        self._buffers = [mmap.mmap(-1, size * self.capacity) for size in (self.key_size, self.value_size)]
        self._keys, self._values = (ctypes.addressof(ctypes.c_char.from_buffer(b)) for b in self._buffers)

    def take(self) -> tuple[bytes, bytes, int]:
        """(keys, values, count): the entries' bytes back to back. Entries added meanwhile may stay for
        the next call."""
        token, count = ctypes.c_uint32(0), ctypes.c_uint32(0)
        total = 0
        while total < self.capacity:
            count.value = self.capacity - total
            failed = self._batch(self._fd, ctypes.byref(token) if total else None, ctypes.byref(token),
                                 ctypes.c_void_p(self._keys + self.key_size * total),
                                 ctypes.c_void_p(self._values + self.value_size * total), ctypes.byref(count))
            error = ctypes.get_errno()
            total += count.value
            if failed:
                if error != errno.ENOENT:  # ENOENT: the last entries came with this call
                    raise OSError(error, f"BPF_MAP_LOOKUP_AND_DELETE_BATCH: {os.strerror(error)}")
                break
            if not count.value:  # no progress (a bucket larger than the room left): the rest waits
                break
        taken = (ctypes.string_at(self._keys, self.key_size * total),
                 ctypes.string_at(self._values, self.value_size * total), total)
        for buffer, size in zip(self._buffers, (self.key_size, self.value_size)):
            if total:  # the filled pages go back: a daemon keeps no high-water mark of its busiest drain
                buffer.madvise(mmap.MADV_DONTNEED, 0, size * total)
        return taken
