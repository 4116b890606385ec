"""A Python process's copied samples keep their Python frames (real BPF, needs root): a sample taken before
the process's unwind table is loaded has its stack copied (bpf/stackcopy.c) and walked later in user space,
but its Python frames are its thread's frame chain in the heap, gone by then: bpf/copypython.c reads the
chain when the copy is taken and stores it as the sample's user stack, and the walk of the copy puts each
eval call's frames in place of its eval frame (frontend/unwind/stackcopy.py's with_python_frames)."""
from __future__ import annotations

import json
import subprocess

import pytest

from support import run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")
PYTHON = "/usr/bin/python3.11"  # Debian's: no frame pointers
LOOP = """
import time
def hot():
    total = 0
    for i in range(10000):
        total += i
def caller(seconds):
    end = time.time() + seconds
    while time.time() < end:
        hot()
caller(60)
"""


def test_a_python_process_whose_first_samples_are_copies_keeps_its_python_frames(tmp_path):
    """``record -p`` of a running Python loop: its first samples are copies (its table comes after the
    walker's programs are verified, 0.5-3 s on this loaded machine), and once its interpreter is found (on a
    thread of its own, at the start: not after its tables) and copy_python is in place (the walker's first
    program) they come with its Python frames, hot under caller: the copies taken before that are native
    only (one run: 0 of 63, another 96 of 187). Before, every copy was native only (111 of 111)."""
    target = subprocess.Popen([PYTHON, "-c", LOOP])
    try:
        out = tmp_path / "py.data"
        run_optrace("record", "-F", "999", "-d", "3", "-o", str(out), "-p", str(target.pid), check=True, timeout=180)
    finally:
        target.kill()
        target.wait()
    doc = json.loads(run_optrace("report", "-i", str(out), "--children", "--sort", "symbol", "--format", "json",
                                 check=True).stdout)
    meta = doc["meta"]
    copied, outcomes = meta["user_stacks"].get("copied", 0), meta["runtimes"]["cpython"]["samples"]
    assert copied >= 30, f"only {copied} copied samples: this run proves nothing ({meta['user_stacks']})"
    assert outcomes.get("native_only", 0) <= 0.6 * copied, (copied, outcomes)  # >= 40 % of the copies: Python
    total = sum(n for outcome, n in outcomes.items() if not outcome.startswith("cut: "))
    assert outcomes.get("named", 0) >= total - 0.6 * copied, outcomes
    rows = {row["symbol"]: row for row in doc["rows"]}
    assert rows["hot"]["children"] >= 0.8 * rows["caller"]["children"] > 0, sorted(rows)
