"""bench/run.py, the `make bench` harness: every benchmark runs in its own process with its budget, a
failing or overrunning one is reported in the README and does not stop the others. No timings are
asserted: the benchmarks here are tiny scripts written by the test."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

SCRIPTS = {
    "bench_good.py": """
import json, pathlib
pathlib.Path("results/good.json").write_text(json.dumps({"targets": [
    {"name": "good: widgets", "target": ">= 2", "measured": "3", "met": True},
    {"name": "good: gadgets", "target": "<= 1", "measured": "5", "met": False}]}))
print("## Good bench\\n\\nall numbers here")
""",
    "bench_broken.py": """
import sys
print("partial table", flush=True)
print("broken: cannot find the reference tool", file=sys.stderr)
sys.exit(3)
""",
    "bench_slow.py": """
BENCH_BUDGET_S = 1
import time
time.sleep(120)
""",
    "bench_silent.py": "print('## Silent bench: forgot its results file')\n",
}


def load_run(monkeypatch, name: str):
    """bench/run.py as a module of its own (``name``)."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / "run.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def harness(tmp_path, monkeypatch):
    """bench/run.py pointed at a scratch tree holding the test's benchmark scripts."""
    module = load_run(monkeypatch, "bench_run_under_test")
    (tmp_path / "bench").mkdir()
    (tmp_path / "results").mkdir()
    for name, text in SCRIPTS.items():
        (tmp_path / "bench" / name).write_text(text)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "BENCH_DIR", tmp_path / "bench")
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(module, "OUTCOMES", tmp_path / "bench" / "outcomes")
    monkeypatch.setattr(module, "MACHINE", tmp_path / "bench" / "outcomes" / "machine.json")
    monkeypatch.setattr(module, "README", tmp_path / "bench" / "README.md")
    monkeypatch.setattr(module, "GRACE_S", 5)
    return module


def test_budget_is_read_from_the_script_or_defaults(harness, tmp_path):
    benches = harness.discover()
    assert sorted(benches) == ["broken", "good", "silent", "slow"]
    assert harness.budget_of(benches["slow"]) == 1
    assert harness.budget_of(benches["good"]) == harness.DEFAULT_BUDGET_S


def test_each_outcome_is_reported_and_none_stops_the_others(harness, tmp_path):
    benches = harness.discover()
    outcomes = {area: harness.run_bench(area, script) for area, script in benches.items()}

    assert outcomes["good"].status == "ok"
    assert outcomes["broken"].status == "failed (exit 3)"
    assert outcomes["slow"].status == "timed out after 1 s"
    assert outcomes["silent"].status == "no results file"
    assert "cannot find the reference tool" in outcomes["broken"].stderr_tail
    assert outcomes["good"].markdown.startswith("## Good bench")
    assert outcomes["broken"].markdown == ""  # a failed bench's partial table is not shown as a result

    text = harness.readme(outcomes, set(outcomes), {"cpu": "test cpu"}, 12.0)
    assert "| good | ok |" in text
    assert "| broken | failed (exit 3) |" in text
    assert "| slow | timed out after 1 s |" in text
    assert "| good | good: widgets | >= 2 | 3 | met |" in text
    assert "| good | good: gadgets | <= 1 | 5 | NOT met |" in text
    assert "all numbers here" in text
    assert "partial table" not in text


def test_rerunning_one_bench_keeps_the_others_last_sections(harness, tmp_path):
    benches = harness.discover()
    harness.run_bench("good", benches["good"])
    saved = json.loads((tmp_path / "bench" / "outcomes" / "good.json").read_text())
    assert saved["status"] == "ok"

    previous = harness.load_previous("good")
    outcomes = {"good": previous, "broken": harness.run_bench("broken", benches["broken"]), "silent": None}
    text = harness.readme(outcomes, {"broken"}, {"cpu": "test cpu"}, 1.0)
    assert f"earlier run, {previous.finished}" in text
    assert "all numbers here" in text
    assert "| silent | not run yet |" in text


def test_render_rebuilds_the_readme_from_stored_outcomes_alone(harness, tmp_path, monkeypatch):
    """A fresh clone has no bench/results/: the README must come back from the tracked outcomes."""
    benches = harness.discover()
    harness.run_bench("good", benches["good"])
    harness.MACHINE.write_text(json.dumps({"cpu": "the measuring machine"}))
    monkeypatch.setattr("sys.argv", ["run.py", "--render"])
    assert harness.main() == 0
    text = harness.README.read_text()
    assert "Rebuilt from bench/outcomes/" in text
    assert "## Good bench" in text and "| good | good: widgets | >= 2 | 3 | met |" in text
    assert "the measuring machine" in text
    assert "| broken | not run yet |" in text


def test_render_keeps_sections_written_by_hand(harness, tmp_path, monkeypatch):
    harness.README.write_text("# optrace benchmarks\n\n## Machine\n\nold\n\n## Hand-made (issue 99)\n\n| a |\n\n"
                              "## How these numbers are made\nold harness text\n")
    monkeypatch.setattr("sys.argv", ["run.py", "--render"])
    assert harness.main() == 0
    text = harness.README.read_text()
    assert "## Hand-made (issue 99)\n\n| a |" in text
    assert text.count("## Machine") == 1 and "old harness text" not in text


def test_refuses_unknown_benchmark_names(harness, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", "nosuch"])
    assert harness.main() == 2
    assert "no such benchmark: nosuch" in capsys.readouterr().err


def test_the_readme_holds_each_stored_outcome_as_stored(monkeypatch):
    """bench/README.md's sections made by benchmarks are their stored outcomes' (bench/outcomes/, tracked) word
    for word: a section edited in the README alone goes back to the outcome's text at the next --render (the
    OTLP section's peak RSS sentence did)."""
    run = load_run(monkeypatch, "bench_run_tracked")
    readme = run.sections(run.README.read_text())
    stored = [outcome for outcome in map(run.load_previous, run.discover()) if outcome is not None and outcome.ok]
    assert stored
    for outcome in stored:
        for heading, text in run.sections(outcome.markdown).items():
            assert readme.get(heading, "").rstrip() == text.rstrip(), (
                f"bench/README.md's '{heading}' is not bench/outcomes/{outcome.area}.json's: edit both")
