"""perf's spellings on `optrace report` mean what they mean in perf, and a --percent-limit that hides
rows says what matched and what it hid (on the synthetic record of conftest.py: pid 200 has 10 % of the
samples in two rows of 5 %)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from optrace.errors import OptraceError
from optrace.frontend.cliopts import CallGraphSpec, parse_call_graph, parse_unwind
from support import assert_one_line_error


def report(optrace, record_file: Path, *args: str) -> str:
    return optrace("report", "-i", str(record_file), *args, check=True).stdout


@pytest.mark.parametrize("perf, ours", [
    (["--sort", "sym"], ["--sort", "symbol"]),
    (["--sort", "overhead,sym,dso"], ["--sort", "symbol,dso"]),
    (["--sort", "tgid,comm"], ["--sort", "pid,comm"]),
    (["--stdio", "-n", "--no-children"], []),
    (["--show-nr-samples", "--children"], ["--children"]),
    (["--percent-limit", "6%"], ["--percent-limit", "6"]),
    (["-g"], ["-G", "caller"]),
    (["-g", "--stdio"], ["-G", "caller"]),
    (["-g", "callee"], ["-G", "callee"]),
    (["--call-graph=fractal,0.5,callee,function,percent"], ["-G", "callee"]),
    (["-g", "graph,0.5,caller"], ["--call-graph", "caller"]),
    (["-g", "none"], []),
])
def test_perf_spelling_gives_the_same_report(optrace, record_file, perf, ours):
    assert report(optrace, record_file, *perf) == report(optrace, record_file, *ours)


def test_a_limit_that_hides_every_matching_row_says_so(optrace, record_file):
    text = report(optrace, record_file, "--pid", "200", "--percent-limit", "6")
    assert "no samples match" not in text
    assert "# Matched --pid 200: 100 samples (10.00% of all)" in text
    assert "# Hidden by --percent-limit 6: 2 rows with 100 samples (10.00% of all)" in text
    doc = json.loads(report(optrace, record_file, "--pid", "200", "--percent-limit", "6", "--format", "json"))
    assert (doc["rows"], doc["report"]["matched_samples"], doc["report"]["hidden_rows"],
            doc["report"]["hidden_samples"]) == ([], 100, 2, 100)


def test_no_filter_no_limit_adds_no_lines(optrace, record_file):
    text = report(optrace, record_file)
    assert "# Matched" not in text and "# Hidden" not in text


@pytest.mark.parametrize("text, spec", [
    ("caller", CallGraphSpec(order="caller")),
    ("callee", CallGraphSpec(order="callee")),
    ("none", CallGraphSpec(mode="none")),
    ("graph,0.5,caller", CallGraphSpec("graph", "caller", 0.5)),
    ("fractal,2,callee,function,percent", CallGraphSpec("fractal", "callee", 2.0)),
    ("flat,1%,10", CallGraphSpec("flat", "caller", 1.0, 10)),
    ("callee,folded", CallGraphSpec("folded", "callee")),
])
def test_perf_call_graph_forms(text, spec):
    assert parse_call_graph(text) == spec


@pytest.mark.parametrize("text", ["sideways", "graph,lots", "graph,0.5,10,20", "graph,500"])
def test_bad_call_graph_forms(text):
    with pytest.raises(OptraceError, match="--call-graph"):
        parse_call_graph(text)


@pytest.mark.parametrize("text, walk", [("dwarf", "dwarf"), ("fp", "fp"), ("dwarf,16384", "dwarf"), ("DWARF,1", "dwarf"),
                                        ("dwarf,65528", "dwarf"), ("dwarf,65521", "dwarf")])
def test_perf_record_call_graph_forms(text, walk):
    """record/top/serve --call-graph: perf's dwarf,SIZE is taken (optrace copies no stack: the size does not
    change the walk) and checked as perf checks it (1 to 65528 bytes once rounded up to 8)."""
    assert parse_unwind(text) == walk


@pytest.mark.parametrize("text", ["lbr", "dwarf,0", "dwarf,65529", "dwarf,16k", "dwarf,", "fp,8"])
def test_bad_record_call_graph_forms(text):
    with pytest.raises(ValueError):
        parse_unwind(text)


def test_bad_perf_record_options_are_one_line(optrace):
    """Before anything is loaded (no root needed): a size perf would refuse, an event optrace does not sample."""
    assert_one_line_error(optrace("record", "--call-graph", "dwarf,70000", "-a"), "--call-graph", "65528")
    assert_one_line_error(optrace("top", "--call-graph", "fp,8"), "--call-graph", "fp takes no size")
    assert_one_line_error(optrace("record", "-e", "cycles", "-a"), "-e 'cycles'", "cpu-clock only")


def test_threads_sort_key_filter_and_json_field(optrace, record_file):
    """Threads are kernel-visible and recorded: `--sort tid`, `--tid`, a Tid column and a JSON `tid`."""
    doc = json.loads(report(optrace, record_file, "--sort", "pid,tid", "--format", "json"))
    assert [(r["pid"], r["tid"], r["samples"]) for r in doc["rows"]] == [(100, 100, 500), (100, 101, 400),
                                                                         (200, 200, 100)]
    text = report(optrace, record_file, "--sort", "tid,sym", "--tid", "101")
    assert "# Overhead  Samples  Tid  Symbol" in text
    assert "    20.00%      200  101  [.] hot_b" in text and "hot_a" not in text
    assert "# Matched --tid 101: 400 samples (40.00% of all)" in text
    csv = report(optrace, record_file, "--sort", "tid", "--format", "csv").splitlines()
    assert csv[0] == "comm,pid,tid,dso,symbol,kernel,samples,percent" and csv[1] == ",,100,,,,500,50.0"
