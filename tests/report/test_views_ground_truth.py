"""The acceptance of the profile views on real records of the ground-truth workloads (real BPF, root):
the flame graph in headless Chromium shows demo's designed shares, the call tree's totals equal
--children, and `diff` of two runs of workloads/shares.c shows the change set by its argument.

With OPTRACE_SCREENSHOTS=DIR the flame graph and the differential one are also saved there as PNGs
(the docs' pictures are made this way: `OPTRACE_SCREENSHOTS=docs/images pytest -k screenshots`)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from browser import dump_dom, read_page, screenshot, share
from support import run_optrace, wait_perf_events

pytestmark = pytest.mark.usefixtures("bpf_ready")


def report_json(data: Path, *args: str) -> dict:
    return json.loads(run_optrace("report", "-i", str(data), "-f", "json", *args, check=True).stdout)


def test_flame_graph_shows_demo_shares(demo_record: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.html"
    run_optrace("report", "-i", str(demo_record), "--comm", "demo", "-f", "flamegraph", "-o", str(out), check=True)
    page = read_page(dump_dom(out))
    rows = {row["symbol"]: row for row in report_json(demo_record, "--comm", "demo", "--children")["rows"]}
    for symbol, designed in (("hot_a", 40), ("hot_b", 20), ("lib_burn", 20), ("demo::Hasher::mix(double)", 20)):
        shown = share(page, symbol)
        assert shown == pytest.approx(designed, abs=5), symbol
        assert shown == pytest.approx(rows[symbol]["children_percent"], abs=0.01), symbol


def test_svg_of_a_real_record(demo_record: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.svg"
    run_optrace("report", "-i", str(demo_record), "--comm", "demo", "-f", "svg", "-o", str(out), check=True)
    frames = list(ET.parse(out).getroot().iter("{http://www.w3.org/2000/svg}g"))
    total = int(frames[0].get("data-samples"))
    hot_a = sum(int(g.get("data-samples")) for g in frames
                if g.find("{http://www.w3.org/2000/svg}title").text.startswith("hot_a in "))
    assert 100 * hot_a / total == pytest.approx(40, abs=5)


def test_call_tree_totals_equal_children(demo_record: Path) -> None:
    children = {(row["dso"], row["symbol"]): row["children"]
                for row in report_json(demo_record, "--children", "-s", "dso,symbol")["rows"]}
    for order in ("caller", "callee"):
        tree = report_json(demo_record, "-G", order)["tree"]
        totals: dict[tuple[str, str], int] = {}
        pending = [(node, frozenset()) for node in tree]
        while pending:
            node, above = pending.pop()
            key = (node["dso"], node["symbol"])
            if key not in above:
                totals[key] = totals.get(key, 0) + node["total"]
            pending += [(child, above | {key}) for child in node["children"]]
        assert totals == children, order


def test_call_graph_text_names_the_hot_path(demo_record: Path) -> None:
    text = run_optrace("report", "-i", str(demo_record), "--comm", "demo", "-G", "callee", check=True).stdout
    entry = next(line for line in text.splitlines() if line.endswith("[.] hot_a"))
    assert float(entry.split()[0].rstrip("%")) == pytest.approx(40, abs=5)
    assert "---hot_a" in text and "main" in text


def test_wall_record_reports_wall_time_without_the_tracepoints_frames(tmp_path: Path, workloads: Path) -> None:
    """pingpong switches back and forth while perf traces sched_switch too: the tracepoint then calls its probes
    from __traceiter_sched_switch's loop, whose frame topped every off-CPU stack. `report` of the --wall
    record shows wall-clock time without being asked, and every wait ends in the scheduler's entry that called
    __schedule (schedule(), or a preemption point such as __cond_resched): where the context-switch event that
    opens a wait takes its stacks (bpf/offcpu.c), with no tracing frame above it."""
    perf = subprocess.Popen(["perf", "record", "-q", "-e", "sched:sched_switch", "-a", "-o", str(tmp_path / "perf.data"),
                             "--", "sleep", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_perf_events(perf.pid, os.cpu_count() or 1)
        data = tmp_path / "wall.data"
        run_optrace("record", "--wall", "-o", str(data), "--", str(workloads / "pingpong"), "50000", check=True,
                    timeout=300)
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
    assert "# Time: " in (text := run_optrace("report", "-i", str(data), check=True).stdout) and "of event 'wall'" in text
    waits = [line for line in run_optrace("report", "-i", str(data), "-e", "off-cpu", "-f", "folded",
                                          check=True).stdout.splitlines() if not line.startswith("#")]
    leaves = {line.rsplit(" ", 1)[0].rsplit(";", 1)[-1] for line in waits}
    scheduler = {"schedule_[k]", "__cond_resched_[k]", "preempt_schedule_common_[k]", "preempt_schedule_irq_[k]",
                 "preempt_schedule_[k]", "schedule_preempt_disabled_[k]", "io_schedule_[k]"}
    assert len(waits) >= 3 and "schedule_[k]" in leaves and leaves <= scheduler, leaves


def test_diff_shows_the_known_change(tmp_path: Path, shares_records: tuple[Path, Path]) -> None:
    """shares 30 then 70: share_a gains 40 points and share_b loses 40 (within 3)."""
    base, new = shares_records
    proc = run_optrace("diff", str(base), str(new), "--comm", "shares", "-f", "json", check=True)
    rows = {row["symbol"]: row for row in json.loads(proc.stdout)["rows"]}
    assert rows["share_a"]["delta_percent"] == pytest.approx(40, abs=3)
    assert rows["share_b"]["delta_percent"] == pytest.approx(-40, abs=3)
    assert list(rows)[:2] in (["share_a", "share_b"], ["share_b", "share_a"])  # the largest changes first
    out = tmp_path / "diff.html"
    run_optrace("diff", str(base), str(new), "--comm", "shares", "-f", "flamegraph", "-o", str(out), check=True)
    assert share(read_page(dump_dom(out)), "share_a", 2) == pytest.approx(40, abs=3)


def test_screenshots(tmp_path: Path, demo_record: Path, shares_records: tuple[Path, Path]) -> None:
    """The docs' pictures, from real records made by the docs' commands (`record -F 999 -- demo 3`, `record
    -F 999 -- shares 30 2` and `70 2`: the shared ones), reported in a scratch folder under the docs' file
    names, so the pages name the files as the docs do: the demo's flame graph searching for hot_, and the
    differential graph of shares 30 -> 70."""
    def optrace(*args: str) -> None:
        run_optrace(*args, check=True, timeout=300, cwd=tmp_path)

    for record, name in ((demo_record, "demo.data"), (shares_records[0], "base.data"), (shares_records[1], "new.data")):
        shutil.copyfile(record, tmp_path / name)
    optrace("report", "-i", "demo.data", "-f", "flamegraph", "-o", "flamegraph.html")
    optrace("diff", "base.data", "new.data", "-f", "flamegraph", "-o", "diff.html")
    shots = [(tmp_path / "flamegraph.html", tmp_path / "flamegraph.png", "#search=hot_"),
             (tmp_path / "diff.html", tmp_path / "diff-flamegraph.png", "")]
    for page, png, fragment in shots:
        screenshot(page, png, 1200, 560, fragment)
        assert png.stat().st_size > 20_000
    keep = os.environ.get("OPTRACE_SCREENSHOTS")
    if keep:
        for _, png, _ in shots:
            shutil.copy(png, Path(keep) / png.name)
