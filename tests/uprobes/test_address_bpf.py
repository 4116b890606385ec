"""Real uprobes at mid-function instruction boundaries: exact counts, and the target runs to completion.

The instructions counted are the ones right after the calls in `calls`' two loops (the return addresses):
each runs exactly once per iteration, N and LIBC_N times.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import OPTRACE, assert_one_line_error

pytestmark = pytest.mark.bpf
NOBODY = 65534


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
    proc = optrace("count", "--format", "json", "--command-stdout", "stderr", f"{path}:{own_loop:#x}",
                   f"{path}:{libc_loop:#x}", "--", str(path), "4000", "3000", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "done 4000 3000\n" in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["exit_status"] == 0
    counts = {row["symbol"]: row["calls"] for row in doc["probes"]}
    assert counts == {f"main+{own_loop - main_start(path):#x}": 4000,
                      f"main+{libc_loop - main_start(path):#x}": 3000}


@pytest.fixture
def nobodys_calls(workloads):
    """A copy of `calls` owned by nobody in a folder nobody owns: a binary a hostile local user controls."""
    folder = Path(tempfile.mkdtemp(prefix="optrace-nobody-", dir="/tmp"))
    binary = folder / "calls"
    shutil.copy(workloads / "calls", binary)
    for path in (folder, binary):
        os.chmod(path, 0o755)
        os.chown(path, NOBODY, NOBODY)
    yield binary
    shutil.rmtree(folder)


def start_as_nobody(binary: Path, n: int) -> subprocess.Popen:
    """`binary N 0 -` as nobody, returned once it has exec'd (it then waits for a line on stdin)."""
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(binary),
                             str(n), "0", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while str(binary) not in Path(f"/proc/{proc.pid}/maps").read_text():
        assert time.monotonic() < deadline, "the target did not start"
        time.sleep(0.01)
    return proc


def test_another_users_process_survives_and_is_counted_exactly(bpf_ready, optrace, nobodys_calls):
    """Root counts in nobody's process of nobody's binary: the mid-instruction address that used to kill
    it is refused, the boundary after it counts exactly, and the process exits normally."""
    call = after_call(nobodys_calls, r"[0-9a-f]+ <target>") - 5  # `call target` is 5 bytes
    target = start_as_nobody(nobodys_calls, 2500)
    counting: subprocess.Popen | None = None
    try:
        refused = optrace("count", "-p", str(target.pid), f"{nobodys_calls}:{call + 1:#x}", "-d", "1")
        assert_one_line_error(refused, f"is inside the instruction at {call:#x} of main (5 bytes)",
                              f"use {call:#x} or {call + 5:#x}")
        counting = subprocess.Popen([str(OPTRACE), "count", "--format", "json", "-p", str(target.pid),
                                     f"{nobodys_calls}:{call + 5:#x}"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = counting.stderr.readline()
        assert line.startswith("Counting calls of 1 function"), line + counting.stderr.read()
        out, _ = target.communicate("go\n", timeout=60)
        assert target.returncode == 0 and out == "done 2500 0\n"
        counted, err = counting.communicate(timeout=60)  # ends by itself when its -p process is gone
        assert counting.returncode == 0, err
        assert json.loads(counted)["probes"][0]["calls"] == 2500
    finally:
        for proc in (target, counting):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
