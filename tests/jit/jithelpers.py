"""Helpers for the JIT tests (imported by name: tests/jit is put on sys.path by conftest.py)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from optrace.jitmaps import jitdump as jd

PROGRAMS = Path(__file__).parent / "programs"
NOBODY = 65534
PYTHON = sys.executable


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (chown, other users' processes)")


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def load(addr: int, size: int, name: str, ts: int, index: int = 0, code: bytes | None = None,
         pid: int = 42) -> jd.CodeLoad:
    return jd.CodeLoad(ts, pid, pid, addr, addr, size, index, name, code if code is not None else bytes(size))


def dump_bytes(records: list, pid: int = 42, order: str = "<", header_ts: int = 0) -> bytes:
    parts = [jd.encode_header(pid, 62, header_ts, order)]
    for record in records:
        if isinstance(record, jd.CodeLoad):
            parts.append(jd.encode_load(record, order))
        elif isinstance(record, jd.CodeMove):
            parts.append(jd.encode_move(record, order))
        elif isinstance(record, jd.DebugInfo):
            parts.append(jd.encode_debug_info(record, order))
        elif isinstance(record, jd.CodeClose):
            parts.append(jd.encode_close(record.timestamp, order))
        else:
            parts.append(record)  # raw bytes
    return b"".join(parts)
