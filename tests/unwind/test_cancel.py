"""A session that ends does not wait out table builds: record -a over a machine with large or crafted
binaries once waited 40 s at exit for the worker's queue (tests/hostile/test_live.py caught it)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.processmaps import ProcessUnwinding
from optrace.frontend.unwind.table import build_table

CC1 = Path("/usr/lib/gcc/x86_64-linux-gnu/12/cc1")


@pytest.mark.skipif(not CC1.exists(), reason="gcc's cc1 is not installed")
def test_a_stopped_build_ends_at_its_next_check():
    data = CC1.read_bytes()
    started = time.thread_time()
    table = build_table(data, stop=lambda: True)
    spent = time.thread_time() - started
    assert "the session is ending" in table.problem
    assert table.count < build_table(data).count
    assert spent < 0.3, f"{spent:.2f} s of CPU after being told to stop"


def test_a_cancelled_unwinding_builds_nothing_more():
    unwinding = ProcessUnwinding(UnwindTableCache())
    assert unwinding.mappings(os.getpid())  # this python: libc, libpython's code
    unwinding.cancel()
    assert unwinding.mappings(os.getpid()) is None
    conversions = unwinding.tables.stats["conversions"]
    unwinding.warm("/usr/bin/python3.11")
    assert unwinding.tables.stats["conversions"] == conversions
