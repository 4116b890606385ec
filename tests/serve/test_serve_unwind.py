"""`optrace serve --call-graph dwarf|fp` on a workload built -O2 -fomit-frame-pointer with a known call tree
(workloads/unwind_tree.c, copied under a name of its own; the whole machine is sampled, --comm keeps
its samples): /debug/pprof/profile has its whole stacks with the CFI unwinder and not with frame pointers,
and optrace_stacks_total says so."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pprofclient import top
from serve.test_serve_bpf import start_serve, wait_for

STACKS = "optrace_stacks_total"
COMM = "srvunwindtree"
pytestmark = [pytest.mark.bpf, pytest.mark.slow, pytest.mark.usefixtures("bpf_ready")]


@pytest.fixture
def unwind_tree(workloads, tmp_path) -> Path:
    for name in ("unwind-tree", "libunwindtree.so"):
        shutil.copy2(workloads / name, tmp_path / (COMM if name == "unwind-tree" else name))
    return tmp_path / COMM


def quality(expo, url: str) -> dict[str, float]:
    return {dict(labels)["quality"]: value for labels, value in expo.samples(expo.scrape(url), STACKS).items()}


def profile_of_the_tree(call_graph: str, program: Path, tmp_path: Path, expo) -> tuple[dict, dict[str, float]]:
    """(go tool pprof -top rows of a 4 s profile, optrace_stacks_total's increase meanwhile), taken once the
    workload's samples have been counted a second time (its tables are loaded by then with dwarf)."""
    served = start_serve(["-F", "499", "--comm", COMM, "--call-graph", call_graph], tmp_path)
    workload = subprocess.Popen([str(program), "60"])
    try:
        first = wait_for(lambda: quality(expo, served.url), 30, "the workload's stacks")
        wait_for(lambda: sum(quality(expo, served.url).values()) > sum(first.values()) + 499, 30, "more stacks")
        before = quality(expo, served.url)
        rows = top(f"{served.url.removesuffix('/metrics')}/debug/pprof/profile?seconds=4", tmp_path)
        after = quality(expo, served.url)
        return rows, {outcome: after[outcome] - before.get(outcome, 0) for outcome in after}
    finally:
        workload.kill()
        workload.wait()
        assert served.stop() == 0


def test_dwarf_gives_whole_stacks_in_the_pprof_profile(unwind_tree, tmp_path, expo):
    rows, counted = profile_of_the_tree("dwarf", unwind_tree, tmp_path, expo)
    assert rows["main"].cum_percent >= 95, rows
    assert rows["run_tree"].cum_percent >= 95 and rows["tree_c"].cum_percent == pytest.approx(30, abs=5)
    assert counted["complete"] >= 0.95 * sum(counted.values()), counted


def test_frame_pointers_lose_the_callers(unwind_tree, tmp_path, expo):
    """The same with --call-graph fp: the test above can fail."""
    rows, counted = profile_of_the_tree("fp", unwind_tree, tmp_path, expo)
    assert rows.get("main") is None or rows["main"].cum_percent < 50, rows
    assert counted.get("complete", 0) < 0.5 * sum(counted.values()), counted
