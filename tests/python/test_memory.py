"""process_vm_readv reads (frontend/runtimes/cpython/memory.py) of this very process: several ranges in one call, an
unreadable range that costs only itself, a range cut at an inaccessible page, a process that is gone."""
from __future__ import annotations

import ctypes
import mmap
import os
import subprocess

import pytest

from optrace.frontend.runtimes.cpython.memory import MAX_RANGE, MAX_RANGES, ProcessMemory

PAGE = mmap.PAGESIZE
PROT_NONE = 0
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


@pytest.fixture
def guarded_page():
    """The address of a readable page filled with b"A"*PAGE, followed by an inaccessible one."""
    base = libc.mmap(None, 2 * PAGE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    ctypes.memset(base, ord("A"), PAGE)
    assert libc.mprotect(base + PAGE, PAGE, PROT_NONE) == 0
    yield base
    libc.munmap(base, 2 * PAGE)


def test_several_ranges_in_one_read():
    one, two = ctypes.create_string_buffer(b"first range", 11), ctypes.create_string_buffer(b"second", 6)
    memory = ProcessMemory(os.getpid())
    assert memory.read_ranges([(ctypes.addressof(one), 11), (ctypes.addressof(two), 6)]) == [b"first range",
                                                                                              b"second"]
    assert memory.pointer(ctypes.addressof(ctypes.c_uint64(0x1122334455667788))) == 0x1122334455667788


def test_an_unreadable_range_costs_only_itself(guarded_page):
    text = ctypes.create_string_buffer(b"after", 5)
    ranges = [(guarded_page, 4), (guarded_page + PAGE, 8), (0, 8), (ctypes.addressof(text), 5)]
    assert ProcessMemory(os.getpid()).read_ranges(ranges) == [b"AAAA", b"", b"", b"after"]


def test_a_range_is_cut_where_memory_ends(guarded_page):
    memory = ProcessMemory(os.getpid())
    assert memory.read(guarded_page + PAGE - 10, 100) == b"A" * 10
    assert memory.read_exact(guarded_page + PAGE - 10, 100) is None
    assert memory.pointer(guarded_page + PAGE - 4) is None


def test_sizes_are_capped():
    memory = ProcessMemory(os.getpid())
    buffer = ctypes.create_string_buffer(MAX_RANGE + 100)
    assert len(memory.read(ctypes.addressof(buffer), MAX_RANGE + 100)) == MAX_RANGE
    assert memory.read(ctypes.addressof(buffer), -5) == b""
    assert memory.read(-1, 8) == b"" and memory.read(1 << 64, 8) == b""
    with pytest.raises(ValueError):
        memory.read_ranges([(ctypes.addressof(buffer), 8)] * (MAX_RANGES + 1))


def test_a_process_that_is_gone_reads_nothing():
    proc = subprocess.Popen(["true"])
    proc.wait()
    memory = ProcessMemory(proc.pid)
    buffer = ctypes.create_string_buffer(8)
    assert memory.read_ranges([(ctypes.addressof(buffer), 8)] * 3) == [b"", b"", b""]
