"""`optrace top --call-graph dwarf|fp` (record's flag): the inclusive column of a workload built without
frame pointers holds its callers only when stacks are walked from CFI."""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

from support import run_optrace, running

pytestmark = pytest.mark.usefixtures("bpf_ready")
ROW = re.compile(r"^\s*(?P<children>\d+\.\d\d)%\s+(?P<self>\d+\.\d\d)%\s+\d+\s+.*\[[.k]\] (?P<symbol>\S+)")


@pytest.fixture
def tree(workloads) -> Iterator[subprocess.Popen]:
    """tree_a holds 60 % of the process's time through leaf_x and leaf_y, self ~0 (unwind_tree.c)."""
    with running([str(workloads / "unwind-tree"), "120"]) as proc:
        yield proc


def children_of(table: str, symbol: str) -> float:
    for line in table.splitlines():
        match = ROW.match(line)
        if match and match["symbol"] == symbol:
            return float(match["children"])
    return 0.0


def last_table(*args: str) -> str:
    proc = run_optrace("top", *args, "--children", "--stdio", "-n", "5", "-d", "1", timeout=180)
    assert proc.returncode == 0, proc.stderr
    return [part for part in proc.stdout.split("\n\n") if part.strip()][-1]


def test_dwarf_walks_callers_that_fp_cannot(tree):
    """Shares are not asserted to the point: a loaded machine gives a refresh few samples. The shape is:
    from CFI, main holds every sample and tree_a all of leaf_x's; by frame pointers the leaves are seen
    but their callers are not."""
    dwarf = last_table("-p", str(tree.pid))
    fp = last_table("-p", str(tree.pid), "--call-graph", "fp")
    assert children_of(dwarf, "main") >= 80, dwarf  # samples taken before the tables were loaded stop early
    assert children_of(dwarf, "tree_a") >= children_of(dwarf, "leaf_x") > 0, dwarf
    assert children_of(fp, "leaf_x") + children_of(fp, "leaf_y") > 0, fp
    assert children_of(fp, "tree_a") < 20 and children_of(fp, "main") < 20, fp


def test_call_graph_takes_only_dwarf_or_fp():
    proc = run_optrace("top", "--call-graph", "lbr", "--stdio", "-n", "1")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--call-graph" in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3
