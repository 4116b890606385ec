"""Whether a run compiled its BPF programs or loaded them stored: record's meta and -v, count -v and
serve's log say so (bpf/loader.py's ProgramLoad). Real runs of the CLI with a program cache of their own."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from support import OPTRACE, run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")

SAMPLER = "stackstore.c+profile.c+forks.c+python_walk.h+unwind.c+stackcopy.c+images.c+python.c+copypython.c"
OFF_CPU_SAMPLER = ("stackstore.c+profile.c+forks.c+offcpu.c+python_walk.h+unwind.c+stackcopy.c+images.c+python.c"
                   "+copypython.c")


def test_record_says_whether_it_compiled(fresh_program_cache, tmp_path):
    out = tmp_path / "r.data"
    first = run_optrace("record", "-v", "-o", str(out), "--", "true", check=True)
    assert re.search(rf"BPF programs: {re.escape(SAMPLER)} compiled \(\d+\.\d\d s\)$", first.stderr, re.M), first.stderr
    second = run_optrace("record", "-v", "-o", str(out), "--", "true", check=True)
    assert re.search(rf"BPF programs: {re.escape(SAMPLER)} stored \(0\.\d\d s\)$", second.stderr, re.M), second.stderr
    meta = json.loads(run_optrace("report", "-i", str(out), "--format", "json", check=True).stdout)["meta"]
    assert meta["bpf_programs"] == {SAMPLER: "stored"}
    quiet = run_optrace("record", "-o", str(out), "--", "true", check=True)
    assert "BPF programs" not in quiet.stderr  # without -v only the record's meta says it
    waits = run_optrace("record", "-v", "--off-cpu", "-o", str(out), "--", "true", check=True)
    assert f"BPF programs: {OFF_CPU_SAMPLER} compiled" in waits.stderr  # off-CPU is another build of the sampler


def test_count_says_whether_it_compiled(fresh_program_cache):
    lines = [run_optrace("count", "-v", "-d", "0.1", "c:getpid", check=True).stderr for _ in range(2)]
    assert "BPF programs: uprobe_count.c compiled" in lines[0]
    assert "BPF programs: uprobe_count.c stored" in lines[1]


def test_serve_logs_whether_it_compiled(fresh_program_cache):
    logs = []
    for _ in range(2):
        serve = subprocess.Popen([str(OPTRACE), "serve", "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE,
                                 text=True)
        try:
            lines = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any("serving" in line for line in lines):
                lines.append(serve.stderr.readline())
        finally:
            serve.send_signal(signal.SIGINT)
            serve.wait(timeout=60)
        logs.append("".join(lines))
    assert f"BPF programs: {SAMPLER} compiled" in logs[0]
    assert f"BPF programs: {SAMPLER} stored" in logs[1]


def test_top_says_whether_it_compiled(fresh_program_cache):
    lines = [run_optrace("top", "--stdio", "-n", "1", "-d", "0.2", "-v", check=True).stderr for _ in range(2)]
    assert f"BPF programs: {SAMPLER} compiled" in lines[0]
    assert f"BPF programs: {SAMPLER} stored" in lines[1]
