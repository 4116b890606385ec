"""Freed heap memory goes back to the system when asked (a long-running exporter's RSS would
otherwise stay at the highest point any symbol-table load reached)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from optrace.heap import release_free_memory


def rss_kb() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def test_freed_heap_is_given_back() -> None:
    blocks = [bytearray(4096) for _ in range(20000)]  # ~80 MB of glibc heap (not mmap'd: under the threshold)
    keep = blocks[-1]  # the top of the heap stays in use: freeing alone returns nothing
    del blocks
    before = rss_kb()
    assert release_free_memory()
    assert before - rss_kb() > 40_000
    assert len(keep) == 4096


ARENA_COUNT = """
import ctypes, re, sys, tempfile, threading
from optrace.heap import one_arena
if sys.argv[1] == "one":
    assert one_arena()
kept = []
def allocate():
    kept.append([bytearray(2048) for _ in range(2000)])  # a thread's own allocations: its own arena by default
threads = [threading.Thread(target=allocate) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
with tempfile.TemporaryFile() as out:
    stream = libc.fdopen(out.fileno(), b"w")
    libc.malloc_info(0, stream)
    libc.fflush(stream)
    out.seek(0)
    print(len(re.findall(rb'<heap nr="', out.read())))
"""


def test_one_arena_keeps_every_thread_in_the_main_heap() -> None:
    """serve's threads each filled an arena of their own that trimming could not empty (optrace/heap.py):
    with one_arena, threads started afterwards allocate from the main heap, as glibc's malloc_info shows."""
    def heaps(mode: str) -> int:
        return int(subprocess.run([sys.executable, "-c", ARENA_COUNT, mode], capture_output=True, text=True,
                                  check=True).stdout)

    assert heaps("default") > 1
    assert heaps("one") == 1


LARGE_BLOCKS = """
import ctypes, re, sys
from pathlib import Path
from optrace.heap import large_blocks_mapped
if sys.argv[1] == "fixed":
    assert large_blocks_mapped()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def anon_kb():
    return int(re.search(r"RssAnon:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))
first = libc.malloc(16 << 20)  # mapped (over the default threshold); freeing it raises the threshold past 8 MB
ctypes.memset(first, 1, 16 << 20)
libc.free(first)
before = anon_kb()
block = libc.malloc(8 << 20)  # a drain's batch buffer
ctypes.memset(block, 1, 8 << 20)
libc.free(block)
print(anon_kb() - before)
"""


def test_large_blocks_go_back_when_freed() -> None:
    """serve's drains allocate and free buffers the size of the kernel maps (~11 MB at 99 Hz): once glibc
    raised its mmap threshold they came from the heap and stayed in RSS after free; with large_blocks_mapped
    they are unmapped when freed."""
    def kept_kb(mode: str) -> int:
        return int(subprocess.run([sys.executable, "-c", LARGE_BLOCKS, mode], capture_output=True, text=True,
                                  check=True).stdout)

    assert kept_kb("default") > 6000
    assert kept_kb("fixed") < 1000
