"""Real uprobes at mid-function instruction boundaries: exact counts, and the target runs to completion.

The instructions counted are the ones right after the calls in `calls`' two loops (the return addresses):
each runs exactly once per iteration, N and LIBC_N times.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

pytestmark = pytest.mark.bpf


def after_call(path, pattern: str) -> int:
    """The address of the instruction after the call in main whose operand matches `pattern`."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "--disassemble=main", str(path)],
                         capture_output=True, text=True, check=True).stdout
    starts = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"^\s+([0-9a-f]+):\s+(.*)$", out, re.MULTILINE)]
    index = next(i for i, (_at, text) in enumerate(starts) if re.fullmatch(rf"call\s+{pattern}", text.strip()))
    return starts[index + 1][0]


def main_start(path) -> int:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[0], 16) for line in out.splitlines() if line.split()[-1] == "main")


@pytest.mark.parametrize("binary", ["calls", "calls-nopie"])
def test_loop_body_instructions_count_exactly(bpf_ready, workloads, optrace, binary):
    path = workloads / binary
    own_loop = after_call(path, r"[0-9a-f]+ <target>")
    libc_loop = after_call(path, r"\*%rax")
    proc = optrace("count", "--format", "json", f"{path}:{own_loop:#x}", f"{path}:{libc_loop:#x}", "--",
                   str(path), "4000", "3000", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("done 4000 3000\n")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["exit_status"] == 0
    counts = {row["symbol"]: row["calls"] for row in doc["probes"]}
    assert counts == {f"main+{own_loop - main_start(path):#x}": 4000,
                      f"main+{libc_loop - main_start(path):#x}": 3000}
