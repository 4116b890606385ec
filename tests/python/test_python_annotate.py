"""`optrace annotate` of Python functions: the record keeps the hottest functions' source lines with the samples
of each (the innermost Python frame's line), so annotate needs neither the process nor the file."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from optrace.frontend.python.sourcecapture import function_end, read_source
from optrace.model import Frame, PythonSource, Record, RecordMeta, Sample
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
    bad = PythonSource("f", "/x.py", 10, ["def f():", "  pass"], {10: 1, 99: 5}, 1)
    record = Record(meta, [Frame("f", "/x.py", python=True, line=10, address=10)], [Sample(1, "p", (0,), 6)],
                    functions=[], python_sources=[bad])
    out = tmp_path / "bad.data"
    write_record(record, out)
    proc = run_optrace("annotate", "-i", str(out))
    assert proc.returncode == 0 and "skipped: sample lines outside its source" in proc.stderr
    assert_one_line_error(run_optrace("annotate", "-i", str(out), "f"), "cannot be annotated")
