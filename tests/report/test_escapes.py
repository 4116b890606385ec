"""Names from someone else's record file reach the terminal escaped: no ESC, BEL, CR, C1 control or bidi
override from a comm, dso, symbol, warning or command line is printed raw by the table, CSV or folded
output, and every row stays one line. JSON keeps the names exactly as recorded."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from optrace.model import CallCount, Frame, Record, Sample
from optrace.recordfile import write_record
from optrace.escape import escape_controls

HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\n\x9b31m\u202eevil\x00;x"
ESCAPED = "\\x1b]0:owned\\x07\\x1b[2J\\x0d\\x0a\\x9b31m\\u202eevil\\x00:x"  # as folded shows it (';' -> ':')


def hostile_record(record: Record) -> Record:
    frames = list(record.frames) + [
        Frame(f"sym{HOSTILE}", f"/tmp/lib{HOSTILE}.so", address=0x10),
        Frame(f"ksym{HOSTILE}", f"[kernel{HOSTILE}]", kind="kernel", address=0x20),
    ]
    leaf, kernel_leaf = len(frames) - 2, len(frames) - 1
    samples = list(record.samples) + [Sample(300, f"comm{HOSTILE}", (leaf, 0), 70),
                                      Sample(300, f"comm{HOSTILE}", (kernel_leaf, leaf), 30)]
    meta = dataclasses.replace(record.meta, hostname=f"host{HOSTILE}", kernel=f"k{HOSTILE}",
                               command=[f"/bin/x{HOSTILE}", HOSTILE], warnings=[f"warning{HOSTILE}"],
                               lost={f"reason{HOSTILE}": 2})
    calls = [CallCount(f"probe{HOSTILE}", f"/bin{HOSTILE}", f"fn{HOSTILE}", 16, 5, {300: 5}, {300: HOSTILE})]
    return dataclasses.replace(record, meta=meta, frames=frames, samples=samples, calls=calls)


@pytest.fixture
def hostile_file(tmp_path: Path, record: Record) -> Path:
    path = tmp_path / f"r{HOSTILE.replace(chr(0), '').replace('/', '')}.data"  # the file name too
    write_record(hostile_record(record), path)
    return path


def assert_terminal_safe(text: str) -> None:
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if ch != "\n" and not ch.isprintable()})
    assert not bad, f"control characters printed raw: {bad}"


@pytest.mark.parametrize("sort", ["comm,dso,symbol", "pid,symbol"])
@pytest.mark.parametrize("children", [False, True])
def test_table(optrace, hostile_file: Path, sort: str, children: bool) -> None:
    proc = optrace("report", "-i", str(hostile_file), "--sort", sort, *(["--children"] if children else []),
                   check=True)
    assert_terminal_safe(proc.stdout)
    assert_terminal_safe(proc.stderr)
    assert "[.] sym\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0a\\x9b31m\\u202eevil\\x00;x" in proc.stdout
    assert "# Warning: warning\\x1b]0;owned" in proc.stdout and "reason\\x1b]0;owned" in proc.stdout
    rows = json.loads(optrace("report", "-i", str(hostile_file), "--sort", sort, "--format", "json",
                              *(["--children"] if children else []), check=True).stdout)["rows"]
    body = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert len(body) == len(rows) + 1  # one line per row, and the one call count


def test_table_columns_stay_aligned(optrace, hostile_file: Path) -> None:
    """Widths are measured on the escaped names: every row's [.]/[k] marker sits under "Symbol"."""
    lines = optrace("report", "-i", str(hostile_file), "--sort", "comm,symbol", check=True).stdout.splitlines()
    header = next(line for line in lines if line.startswith("# Overhead"))
    start = header.index("Symbol")
    rows = [line for line in lines if line.startswith("  ")][:-1]  # the last is the call count
    assert len(rows) == 8  # six (comm, symbol) rows of the synthetic record, two hostile ones
    assert all(line[start:start + 3] in ("[.]", "[k]") for line in rows), "\n".join(rows)


def test_csv_rows_are_lines(optrace, hostile_file: Path) -> None:
    proc = optrace("report", "-i", str(hostile_file), "--format", "csv", check=True)
    assert_terminal_safe(proc.stdout)
    lines = proc.stdout.splitlines()
    parsed = list(csv.reader(io.StringIO(proc.stdout)))
    assert len(parsed) == len(lines) and all(len(row) == 8 for row in parsed)
    assert f"comm{escape_controls(HOSTILE)}" in {row[0] for row in parsed}


def test_folded_lines_are_stacks(optrace, hostile_file: Path) -> None:
    proc = optrace("report", "-i", str(hostile_file), "--format", "folded", check=True)
    assert_terminal_safe(proc.stdout)
    lines = proc.stdout.splitlines()
    assert len(lines) == 8  # the six synthetic stacks and the two hostile ones
    assert f"comm{ESCAPED};main;sym{ESCAPED} 70" in lines
    assert f"comm{ESCAPED};sym{ESCAPED};ksym{ESCAPED}_[k] 30" in lines
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in lines)


def test_json_keeps_the_names(optrace, hostile_file: Path) -> None:
    proc = optrace("report", "-i", str(hostile_file), "--format", "json", check=True)
    assert_terminal_safe(proc.stdout)  # json.dumps escapes them itself
    doc = json.loads(proc.stdout)
    assert {row["symbol"] for row in doc["rows"]} >= {f"sym{HOSTILE}", f"ksym{HOSTILE}"}
    assert f"comm{HOSTILE}" in {row["comm"] for row in doc["rows"]}
    assert doc["meta"]["warnings"] == [f"warning{HOSTILE}"] and doc["calls"][0]["comms"] == {"300": HOSTILE}


def test_error_naming_a_hostile_path_is_one_safe_line(optrace, tmp_path: Path) -> None:
    proc = optrace("report", "-i", str(tmp_path / f"missing{HOSTILE}".replace("\0", "")))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert_terminal_safe(proc.stderr)


@pytest.mark.parametrize("text,shown", [
    ("plain name", "plain name"), ("tab\there", "tab\\x09here"), ("\x7f", "\\x7f"), ("\u200b", "\\u200b"),
    ("\U000e0001", "\\U000e0001"), ("\ud800", "\\ud800"), ("µs ünïcode 名前", "µs ünïcode 名前"),
])
def test_escape_controls(text: str, shown: str) -> None:
    assert escape_controls(text) == shown
