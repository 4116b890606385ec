"""perf's habits on `record` (real recordings, root): `-e cpu-clock`, `--call-graph dwarf,SIZE` and
`-o /dev/null` are taken and record what optrace records without them."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from support import run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")
PERF_HABITS = ("-e", "cpu-clock", "--call-graph", "dwarf,16384", "-F", "499")


def test_perf_options_record_as_without_them(tmp_path: Path, workloads: Path) -> None:
    proc = run_optrace("record", *PERF_HABITS, "-o", "/dev/null", "--", str(workloads / "demo"), "1", timeout=300)
    assert proc.returncode == 0 and "wrote /dev/null" in proc.stderr, proc.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    data = tmp_path / "demo.data"
    run_optrace("record", *PERF_HABITS, "-o", str(data), "--", str(workloads / "demo"), "1", check=True, timeout=300)
    doc = json.loads(run_optrace("report", "-i", str(data), "-f", "json", "--comm", "demo", check=True).stdout)
    assert (doc["meta"]["event"], doc["meta"]["call_graph"]) == ("cpu-clock", "dwarf")
    quality = doc["meta"]["stack_quality"]
    assert quality.get("complete", 0) >= 0.9 * sum(quality.values()), quality
    shares = {row["symbol"]: row["percent"] for row in doc["rows"]}
    assert shares.get("hot_a", 0) == pytest.approx(40, abs=8), shares
