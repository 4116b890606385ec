"""Freed heap memory goes back to the system when asked (a long-running exporter's RSS would
otherwise stay at the highest point any symbol-table load reached)."""
from __future__ import annotations

import re
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
