"""`go tool pprof` (Debian's golang-go), the reference client for optrace's pprof output: files and URLs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import IN_CI

# flat flat% sum% cum cum% name: "  1181.18ms 39.14% 39.14%  1189.19ms 39.40%  hot_a"
TOP_LINE = re.compile(r"^\s*(\S+)\s+([\d.]+)%\s+([\d.]+)%\s+(\S+)\s+([\d.]+)%\s+(.+?)\s*$")


@dataclass(frozen=True)
class TopRow:
    flat_percent: float
    cum_percent: float
    name: str


def go_pprof(*args: str, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``go tool pprof ARGS``, its fetched-profile cache in ``tmp`` (skip locally, fail in CI without go)."""
    go = shutil.which("go")
    if go is None:
        if IN_CI:
            pytest.fail("go (golang-go) is missing: make setup installs it")
        pytest.skip("go (golang-go) is missing: run make setup")
    env = {**os.environ, "PPROF_TMPDIR": str(tmp), "HOME": str(tmp), "GOCACHE": str(tmp / "gocache")}
    return subprocess.run([go, "tool", "pprof", *args], capture_output=True, text=True, timeout=timeout, env=env)


def top(source: str, tmp: Path, *args: str) -> dict[str, TopRow]:
    """``go tool pprof -top`` of a file or URL, by function name, every node (none trimmed)."""
    proc = go_pprof("-top", "-nodecount=100000", "-nodefraction=0", *args, source, tmp=tmp)
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        match = TOP_LINE.match(line)
        if match:
            rows[match.group(6)] = TopRow(float(match.group(2)), float(match.group(5)), match.group(6))
    assert rows, proc.stdout
    return rows
