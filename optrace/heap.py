"""Give freed heap memory back to the system (glibc's ``malloc_trim``).

glibc keeps freed heap memory in the process unless told otherwise, so a long-running exporter's
RSS would stay at the highest point it ever reached. Two callers free a lot at once: loading a
symbol table allocates several times its final size for a moment (section data, one object per
symbol), and BCC's compile (clang/LLVM, in process) frees about 60 MB once a BPF program is loaded
(about 50 MB of `optrace serve`'s RSS). Other C libraries: a no-op.

A daemon also keeps its heap in one arena (:func:`one_arena`): glibc gives each thread that allocates an
arena of its own (up to 8 per CPU), and `optrace serve`'s scrape threads and its drain loop each filled one
that trimming could not empty (a soak: two 64 MB thread arenas next to a 59 MB main heap, growing).

A daemon also keeps large blocks out of its heap (:func:`large_blocks_mapped`): each drain allocates and
frees buffers the size of its kernel maps (BCC's batch reads: ~11 MB at 99 Hz), and once glibc had raised its
mmap threshold past them (it does after freeing a mapped block) they came from the heap, whose free top it
keeps: `serve`'s RSS stepped up 11 MB at a time with Python's own memory flat (tracemalloc, in a soak).

Also the cycle collector's pause (:func:`gc_paused`) for code that allocates millions of acyclic objects.
"""
from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # the symbols already loaded: libc's own
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """True when the C library gave memory back."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


M_ARENA_MAX = -8  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 1 << 20


def one_arena() -> bool:
    """Every thread started from now on allocates from the main heap (glibc's ``M_ARENA_MAX`` = 1, as
    ``MALLOC_ARENA_MAX=1`` would); call it before starting threads. True when the C library took it."""
    return _mallopt(M_ARENA_MAX, 1)


def large_blocks_mapped() -> bool:
    """Blocks of LARGE_BLOCK bytes or more are mapped on their own and unmapped when freed, from now on (a
    fixed ``M_MMAP_THRESHOLD``, as ``MALLOC_MMAP_THRESHOLD_`` would set: glibc then never raises it). True
    when the C library took it."""
    return _mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)


def _mallopt(param: int, value: int) -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(param, value))


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cycle collector off while a record is decoded, a tree of a million nodes is built or walked, or
    an unwind table is built: none of it is cyclic garbage, and the collections that its allocations
    trigger took half the time of a 100,000-stack flame graph (8 s of CPU, 3.8 s without), a fifth of a
    flat report's and a sixth of python3.11's unwind table (0.080 s, 0.066 s without)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def settle(value: T) -> T:
    """Move every object alive now (``value``, a record just read, among them) out of the cycle collector's
    sight (``gc.freeze``): a short-lived command that holds one large acyclic record would otherwise have
    the collector walk all of it again and again while it builds its output. Frozen objects are still
    freed when their last reference goes; only cycles among them would stay."""
    gc.freeze()
    return value
