"""Fixtures for JIT tests: real child processes whose perf maps / jitdumps we plant or let them write."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import jithelpers`


@pytest.fixture
def spawn():
    """Start processes; kill and reap them (and remove their /tmp/perf-PID.map) at the end."""
    procs: list[subprocess.Popen] = []

    def start(argv, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        path = f"/tmp/perf-{proc.pid}.map"
        if os.path.lexists(path):
            os.unlink(path)
