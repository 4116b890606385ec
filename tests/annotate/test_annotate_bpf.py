"""`optrace annotate` end to end: record real workloads whose hot loop is known, then annotate from the
record alone: after the binary is deleted, and for JIT code (perf map: bytes read from the live process;
jitdump: bytes from its CODE_LOAD records). Needs root (BPF) for the recording only."""
from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from support import REPO, run_as_nobody, run_optrace, OPTRACE

pytestmark = pytest.mark.usefixtures("bpf_ready")
JUMP = re.compile(r"^j\w+\s+0x([0-9a-f]+)$")


def record(tmp_path: Path, *command: str) -> Path:
    out = tmp_path / "rec.data"
    proc = run_optrace("record", "-F", "999", "-o", str(out), "--", *command, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def annotation(path: Path, symbol: str, *args: str) -> dict:
    proc = run_optrace("annotate", "-i", str(path), symbol, "-f", "json", *args, check=True)
    return json.loads(proc.stdout)


def innermost_loop_share(doc: dict) -> float:
    """The share of the smallest backward jump's range (target .. jump) that holds the hottest instruction."""
    instructions = doc["instructions"]
    hottest = max(instructions, key=lambda i: i["samples"])["address"]
    loops = []
    for ins in instructions:
        found = JUMP.match(ins["text"])
        if found and int(found.group(1), 16) <= hottest <= ins["address"]:
            loops.append((int(found.group(1), 16), ins["address"]))
    assert loops, f"no loop around the hottest instruction: {instructions}"
    low, high = min(loops, key=lambda span: span[1] - span[0])
    return sum(i["percent"] for i in instructions if low <= i["address"] <= high)


def test_native_hot_loop_after_the_binary_is_deleted(tmp_path, workloads):
    for name in ("demo", "libburn.so"):
        shutil.copy2(workloads / name, tmp_path / name)
    data = record(tmp_path, str(tmp_path / "demo"), "2")
    (tmp_path / "demo").unlink()
    (tmp_path / "libburn.so").unlink()
    for symbol in ("hot_a", "lib_burn"):
        doc = annotation(data, symbol)
        assert doc["function"]["samples"] > 300, doc["function"]
        assert sum(i["percent"] for i in doc["instructions"]) == pytest.approx(100, abs=0.5)
        assert innermost_loop_share(doc) >= 90, doc["instructions"]
    shared = Path(tempfile.mkdtemp(prefix="optrace-annotate-"))
    try:
        shared.chmod(0o755)
        copy = shutil.copy2(data, shared / "rec.data")
        Path(copy).chmod(0o644)
        text = run_as_nobody(str(OPTRACE), "annotate", "-i", str(copy), "hot_a")  # no root needed
    finally:
        shutil.rmtree(shared)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^\s+\d+\.\d\d :\s+[0-9a-f]+:\s+\w+", text.stdout, re.M) and "<hot_a>:" in text.stdout
    lines = annotation(data, "hot_a", "-l")["function"]["lines"]  # .debug_line of the deleted binary
    assert sum(line["percent"] for line in lines) == pytest.approx(100, abs=0.5)
    assert lines[0]["source"].endswith("/demo.c:10") and lines[0]["percent"] >= 90  # BURN_FUNCTION(hot_a)
    listing = run_optrace("annotate", "-i", str(data), check=True).stdout
    assert all(name in listing for name in ("hot_a", "hot_b", "lib_burn", "demo::Hasher::mix(double)"))


def test_jit_code_from_a_perf_map_process(jitcode_record):
    """jitcode writes only a perf map: the bytes were read from the live process's memory."""
    doc = annotation(jitcode_record, "jitcode::hot loop(long)")
    assert doc["function"]["dso"].startswith("[jit] /tmp/perf-")
    assert [i["text"] for i in doc["instructions"]] == ["movq   %rdi, %rax", "decq   %rax", "jne    0x%x" % (
        doc["function"]["start"] + 3), "retq"]
    assert sum(i["percent"] for i in doc["instructions"]) == pytest.approx(100, abs=0.5)
    assert innermost_loop_share(doc) >= 90


def test_jit_code_from_a_jitdump(tmp_path):
    """llvmlite-compiled code registered through the agent API with a jitdump only (no perf map)."""
    program = REPO / "tests" / "jit" / "programs" / "llvm_jit.py"
    data = record(tmp_path, sys.executable, str(program), "2", "--dump-dir", str(tmp_path), "--no-perf-map")
    doc = annotation(data, "optrace_jit_hot")
    assert doc["function"]["dso"].startswith("[jit] ") and doc["function"]["dso"].endswith(".dump")
    assert sum(i["percent"] for i in doc["instructions"]) == pytest.approx(100, abs=0.5)
    assert innermost_loop_share(doc) >= 90, doc["instructions"]
