"""The BPF unwinder (bpf/unwind.c) on real processes, against ground truth: a workload of ours built
without frame pointers with a known call tree, and the frame-pointer walk that fails on it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import run_optrace, verified_instructions

pytestmark = pytest.mark.usefixtures("bpf_ready")


def record(tmp_path: Path, *args: str, name: str = "rec.data") -> Path:
    out = tmp_path / name
    proc = run_optrace("record", "-o", str(out), *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def report(path: Path, *args: str) -> dict:
    return json.loads(run_optrace("report", "-i", str(path), "--format", "json", "--children", *args,
                                  check=True).stdout)


def shares(rows: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """(inclusive, self) percent by symbol."""
    inclusive: dict[str, float] = {}
    own: dict[str, float] = {}
    for row in rows:
        inclusive[row["symbol"]] = inclusive.get(row["symbol"], 0.0) + row["children_percent"]
        own[row["symbol"]] = own.get(row["symbol"], 0.0) + row["percent"]
    return inclusive, own


def test_call_tree_without_frame_pointers(tmp_path, workloads):
    """unwind-tree: main -> run_tree -> tree_a (leaf_x 40 %, leaf_y 20 %), tree_b (tree_c -> leaf_z 30 %,
    leaf_y 10 %). Each caller's inclusive share is within 3 points of its callees' self shares (leaf_y's
    split 2:1 by design); main holds >= 95 %; the record says >= 95 % of the stacks are complete."""
    data = record(tmp_path, "-F", "999", "--", str(workloads / "unwind-tree"), "3")
    result = report(data, "--comm", "unwind-tree")
    inclusive, own = shares(result["rows"])
    x, y, z = own["leaf_x"], own["leaf_y"], own["leaf_z"]
    assert x + y + z > 95
    assert inclusive["main"] >= 95
    assert inclusive["run_tree"] == pytest.approx(x + y + z, abs=3)
    assert inclusive["tree_a"] == pytest.approx(x + 2 * y / 3, abs=3)
    assert inclusive["tree_b"] == pytest.approx(z + y / 3, abs=3)
    assert inclusive["tree_c"] == pytest.approx(z, abs=3)
    meta = result["meta"]
    assert meta["call_graph"] == "dwarf"
    quality = meta["stack_quality"]
    assert quality["complete"] >= 0.95 * sum(quality.values()), quality
    header = run_optrace("report", "-i", str(data), check=True).stdout
    assert "# Stacks: " in header and "complete" in header and "(call graph: dwarf)" in header


def test_frame_pointers_alone_fail_on_it(tmp_path, workloads):
    """--call-graph fp on the same workload: the kernel's frame-pointer walk loses the callers (what the
    CFI unwinder is for), and the record says its stacks are incomplete."""
    data = record(tmp_path, "-F", "499", "--call-graph", "fp", "--", str(workloads / "unwind-tree"), "2")
    result = report(data, "--comm", "unwind-tree")
    inclusive, _ = shares(result["rows"])
    assert inclusive.get("main", 0) < 50
    meta = result["meta"]
    assert meta["call_graph"] == "fp"
    assert meta["stack_quality"].get("complete", 0) < 0.5 * sum(meta["stack_quality"].values())


def test_deep_stacks_reach_the_depth_limit(tmp_path, workloads):
    """unwind-deep recurses 200 levels without frame pointers: the tail-called walker takes 132 native frames
    (33 programs of 4: the kernel's tail-call limit, under the 256 frames a stack holds) and the record counts
    those stacks as stopped by the depth limit. (Samples taken before the process's table was loaded have
    their stack copied and walked in user space, bpf/stackcopy.c: all 200 levels.)"""
    data = record(tmp_path, "-F", "499", "--", str(workloads / "unwind-deep"), "200", "2")
    quality = report(data)["meta"]["stack_quality"]
    assert quality.get("depth_limit", 0) >= 0.9 * sum(quality.values()), quality
    folded = run_optrace("report", "-i", str(data), "--format", "folded", "--comm", "unwind-deep", check=True).stdout
    user_depths = [len([f for f in line.rpartition(" ")[0].split(";")[1:] if not f.endswith("_[k]")])
                   for line in folded.splitlines()]
    assert max(depth for depth in user_depths if depth < 200) == 132


def test_python_walker_verifies_in_few_instructions():
    """With Python frames (bpf/python.c) the walker's programs stay quick to verify: unwind_step with its inline
    Python frame 39k instructions here (63k with the walk of images, images.c: a mapping search per frame),
    python_step 25k (30.4k when each u64 read of the frame window was 27 byte loads), python_thread 40k (its
    256-state search), python_capture 10k (its frames looked at 32 per program: 455k when it looked at all 256
    at once)."""
    from bcc import BPF

    from optrace.bpf.profiler import Profiler

    profiler = Profiler(99, pids=None, cfi_unwind=True, python=True)
    profiler.load()
    try:
        limits = ((b"unwind_step", 70_000), (b"python_step", 30_000), (b"python_thread", 60_000),
                  (b"python_capture", 20_000))
        for program, limit in limits:
            name, count = verified_instructions(profiler._bpf.load_func(program, BPF.PERF_EVENT).fd)
            assert name == program.decode()
            assert 0 < count <= limit, f"{name}: {count} instructions verified"
    finally:
        profiler.close()


def test_walker_verifies_in_few_instructions():
    """unwind_step (4 frames) is verified in <= 40k instructions (36k on Linux 6.18 with the walk of images,
    images.c, 17k before; 160k, 0.11 s of CPU at every start, before its mapping search's midpoint went through
    memory, see forget() in unwind.c; 198k with an image's file found without forget())."""
    from optrace.bpf.abi import ProgType
    from optrace.bpf.profiler import Profiler

    profiler = Profiler(99, pids=None, cfi_unwind=True)
    profiler.load()
    try:
        for program, limit in ((b"unwind_step", 40_000), (b"on_sample", 70_000)):  # 61k with its stack copy
            name, count = verified_instructions(profiler._bpf.load_func(program, ProgType.PERF_EVENT).fd)
            assert name == program.decode()
            assert 0 < count <= limit, f"{name}: {count} instructions verified"
    finally:
        profiler.close()
