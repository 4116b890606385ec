"""`optrace annotate` of Python functions: the record keeps the hottest functions' source lines with the samples
of each (the innermost Python frame's line), so annotate needs neither the process nor the file."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from optrace.frontend.runtimes.cpython.sourcecapture import capture_sources, function_end, read_source
from optrace.model import Frame, RuntimeSource, Record, RecordMeta, Sample
from optrace.recordfile import write_record
from pythons import PROGRAMS, require
from support import assert_one_line_error, run_optrace

MIXED = PROGRAMS / "mixed.py"


@pytest.mark.usefixtures("bpf_ready")
def test_annotate_shows_a_python_functions_lines_with_their_share(tmp_path) -> None:
    data = tmp_path / "py.data"
    run_optrace("record", "-F", "499", "-o", str(data), "--", str(require("3.12")), str(MIXED), "2", check=True,
                timeout=300)
    moved = tmp_path / "elsewhere.data"
    os.rename(data, moved)  # the record alone
    doc = json.loads(run_optrace("annotate", "-i", str(moved), "rank", "-f", "json", check=True).stdout)
    source = MIXED.read_text().splitlines()
    assert doc["function"]["file"] == str(MIXED) and doc["function"]["samples"] > 50
    for row in doc["lines"]:
        assert row["text"] == source[row["line"] - 1]
    hottest = max(doc["lines"], key=lambda row: row["samples"])
    assert hottest["text"].endswith("# hot: rank") and hottest["percent"] >= 50, hottest
    assert doc["lines"][-1]["text"].strip() == "return score"  # the function's lines, not the next one's
    listed = run_optrace("annotate", "-i", str(moved), check=True).stdout
    assert "mixed.py" in listed and " rank" in listed
    text = run_optrace("annotate", "-i", str(moved), "rank", check=True).stdout
    assert "Source of rank in" in text and "# hot: rank" in text


def test_a_functions_lines_end_where_its_body_does() -> None:
    text = ["@cache", "@other(", "  1)", "def f(a,", "      b", "):", "    x = 1", "", "    # note", "    return x",
            "", "def g():", "    pass", "class C:", "    def m(self):", "        return 1", "    def n(self):"]
    assert function_end(text, 1) == 10
    assert function_end(text, 12) == 13
    assert function_end(text, 15) == 16
    assert function_end(text, 17) == 17


def test_a_source_is_read_only_if_the_processes_user_could(tmp_path) -> None:
    path = tmp_path / "secret.py"
    path.write_text("x = 1\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o600)
    assert read_source(os.getpid(), str(path), uid=0) == ["x = 1"]
    assert read_source(os.getpid(), str(path), uid=65534) is None
    os.chmod(path, 0o644)
    assert read_source(os.getpid(), str(path), uid=65534) == ["x = 1"]
    link = tmp_path / "link.py"
    link.symlink_to(path)
    assert read_source(os.getpid(), str(link), uid=0) is None  # never followed
    assert read_source(os.getpid(), "relative.py", uid=0) is None


def test_a_hostile_records_python_source_is_skipped_with_a_warning(tmp_path) -> None:
    meta = RecordMeta("0", "h", "k", 0.0, 1.0, 99, "cpu-clock")
    bad = RuntimeSource("f", "/x.py", 10, ["def f():", "  pass"], {10: 1, 99: 5}, 1)
    record = Record(meta, [Frame("f", "/x.py", kind="cpython", line=10, address=10)], [Sample(1, "p", (0,), 6)],
                    functions=[], sources=[bad])
    out = tmp_path / "bad.data"
    write_record(record, out)
    proc = run_optrace("annotate", "-i", str(out))
    assert proc.returncode == 0 and "skipped: sample lines outside its source" in proc.stderr
    assert_one_line_error(run_optrace("annotate", "-i", str(out), "f"), "cannot be annotated")


def python_frame(symbol: str, first: int, line: int, file: str = "/app/views.py") -> Frame:
    return Frame(symbol, file, address=first, kind="cpython", line=line)


VIEWS = ["def render_page(rows):", "    return rows", "", "", "def html_view(request):", "    page = render_page(1)",
         "    page += render_page(2)", "    return page", "", "", "def html_view_impl():", "    pass"]


def views_record() -> Record:
    """pid 1's html_view has no time of its own: its two lines call render_page (3:1 by samples), once recursively
    (a sample holding html_view on both lines counts once for it, once for each line); pid 2 is another program
    with a function named like it."""
    frames = [python_frame("render_page", 1, 2), python_frame("html_view", 5, 6), python_frame("html_view", 5, 7),
              python_frame("html_views", 1, 2, "/other/app.py"), python_frame("html_view_impl", 11, 12)]
    samples = [Sample(1, "python3", (0, 1), 60), Sample(1, "python3", (0, 2), 20), Sample(1, "python3", (0, 2, 1), 10),
               Sample(1, "python3", (4,), 10), Sample(2, "other", (3,), 100)]
    sources = [RuntimeSource("render_page", "/app/views.py", 1, VIEWS[:2], {2: 90}, 1),
               RuntimeSource("html_view", "/app/views.py", 5, VIEWS[4:8], {}, 1),
               RuntimeSource("html_view_impl", "/app/views.py", 11, VIEWS[10:], {12: 10}, 1),
               RuntimeSource("html_views", "/other/app.py", 1, ["def html_views():", "    pass"], {2: 100}, 2)]
    return Record(RecordMeta("0", "h", "k", 0.0, 1.0, 99, "cpu-clock"), frames, samples, functions=[],
                  sources=sources)


def test_a_callers_lines_count_the_samples_under_them(tmp_path) -> None:
    out = tmp_path / "views.data"
    write_record(views_record(), out)
    doc = json.loads(run_optrace("annotate", "-i", str(out), "html_view", "-f", "json", check=True).stdout)
    assert doc["function"]["samples"] == 90 and doc["function"]["self_samples"] == 0
    shares = {row["line"]: (row["samples"], row["self_samples"]) for row in doc["lines"]}
    assert shares == {5: (0, 0), 6: (70, 0), 7: (30, 0), 8: (0, 0)}
    text = run_optrace("annotate", "-i", str(out), "html_view", check=True).stdout
    assert "   77.78          :        6      page = render_page(1)" in text, text
    leaf = json.loads(run_optrace("annotate", "-i", str(out), "render_page", "-f", "json", check=True).stdout)
    assert [(row["samples"], row["self_samples"]) for row in leaf["lines"]] == [(0, 0), (90, 90)]


def test_suggestions_come_from_the_process_that_holds_the_symbol(tmp_path) -> None:
    """In a record of the whole machine, `annotate render` names what render's own process kept."""
    record = views_record()
    record.sources = [s for s in record.sources if s.symbol != "html_view"]
    out = tmp_path / "views.data"
    write_record(record, out)
    proc = run_optrace("annotate", "-i", str(out), "html_view")
    assert_one_line_error(proc, "no annotatable function html_view in the record; it is in 90 samples' stacks "
                                "(pid 1), but record kept neither its code nor its source",
                          "did you mean html_view_impl (same process)?")
    assert "html_views" not in proc.stderr
    assert_one_line_error(run_optrace("annotate", "-i", str(out), "html_viewz"), "did you mean html_views")


def test_record_keeps_the_source_of_functions_whose_time_is_in_their_callees() -> None:
    record = views_record()
    kept = capture_sources(record.frames, record.samples, lambda pid, file: VIEWS if file == "/app/views.py" else None)
    assert [(s.symbol, s.first_line, s.hits) for s in kept] == [
        ("render_page", 1, {2: 90}), ("html_view_impl", 11, {12: 10}), ("html_view", 5, {})]
    assert kept[-1].text == VIEWS[4:8]
