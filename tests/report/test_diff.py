"""optrace diff BASE NEW on synthetic records whose shares differ by known amounts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from browser import dump_dom, read_page, share
from optrace.model import Record, RecordMeta
from optrace.recordfile import write_record
from support import assert_one_line_error


@pytest.fixture
def records(record: Record, tmp_path: Path) -> tuple[Path, Path]:
    """BASE: the synthetic record. NEW: hot_a 400 -> 100 and hot_b 200 -> 500 samples (of 1000), on
    another machine."""
    base, new = tmp_path / "base.data", tmp_path / "new.data"
    write_record(record, base)
    record.samples[0].count, record.samples[1].count = 100, 500
    record.meta.hostname, record.meta.kernel = "elsewhere", "6.1.0"
    write_record(record, new)
    return base, new


def test_table_sorted_by_change(optrace, records: tuple[Path, Path]) -> None:
    proc = optrace("diff", *map(str, records), check=True)
    lines = proc.stdout.splitlines()
    body = [line.split() for line in lines if line and not line.startswith("#")]
    assert body[0] == ["20.00%", "50.00%", "+30.00", "200", "500", "demo", "demo", "[.]", "hot_b"]
    assert body[1] == ["40.00%", "10.00%", "-30.00", "400", "100", "demo", "demo", "[.]", "hot_a"]
    assert all(row[2] == "+0.00" for row in body[2:])
    assert any(line.startswith("# Note: the records come from different machines (testhost, kernel 6.18.0;"
                               " elsewhere, kernel 6.1.0)") for line in lines)
    assert proc.stderr == ""


def test_json_rows(optrace, records: tuple[Path, Path]) -> None:
    doc = json.loads(optrace("diff", *map(str, records), "-f", "json", "-s", "symbol", check=True).stdout)
    assert doc["rows"][0] == {"comm": None, "pid": None, "dso": None, "symbol": "hot_b", "kernel": False,
                              "base_samples": 200, "new_samples": 500, "base_percent": 20.0,
                              "new_percent": 50.0, "delta_percent": 30.0}
    # -s symbol merges demo's and bash's hot_a: 450 -> 150
    assert doc["rows"][1]["symbol"] == "hot_a" and doc["rows"][1]["delta_percent"] == -30.0
    assert doc["notes"] and doc["base"]["hostname"] == "testhost" and doc["new"]["total_samples"] == 1000


def test_filters_and_percent_limit(optrace, records: tuple[Path, Path]) -> None:
    doc = json.loads(optrace("diff", *map(str, records), "-f", "json", "--comm", "bash", check=True).stdout)
    assert {row["symbol"] for row in doc["rows"]} == {"hot_a", "[unknown]"}
    assert all(row["delta_percent"] == 0 for row in doc["rows"])
    doc = json.loads(optrace("diff", *map(str, records), "-f", "json", "--percent-limit", "15", check=True).stdout)
    assert [row["symbol"] for row in doc["rows"]] == ["hot_b", "hot_a", "lib_burn"]


def test_differential_flame_graph(optrace, records: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "diff.html"
    optrace("diff", *map(str, records), "-f", "flamegraph", "-o", str(out), check=True)
    page = read_page(dump_dom(out))
    assert [share(page, "hot_b", column) for column in range(3)] == [20.0, 50.0, 30.0]
    assert share(page, "hot_a", 2) == -30.0
    assert "different machines" in out.read_text()


def test_bad_input(optrace, records: tuple[Path, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty.data"
    write_record(Record(meta=RecordMeta("0.1.0", "h", "6.18", 0.0, 1.0, 99, "cpu-clock")), empty)
    base, _ = records
    assert_one_line_error(optrace("diff", str(base), str(empty)), f"NEW {empty} has no samples")
    assert_one_line_error(optrace("diff", str(base), str(tmp_path / "missing")), "no such file")
    assert_one_line_error(optrace("diff", str(base), str(base), "-o", "/proc/nope/x"), "cannot write")
    assert_one_line_error(optrace("diff", str(base), str(base), "-f", "pdf"), "unknown format 'pdf'")
    assert_one_line_error(optrace("diff", str(base)), "Missing argument")
