"""`report --format pprof`, read back by the reference client, `go tool pprof` (-top and -raw)."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from synthetic import records_whole_stack_formats_refuse, synthetic_record
from optrace.exporters.pprofproto import profile_pb2
from optrace.model import Frame, Record, RecordMeta, Sample
from optrace.recordfile import write_record
from pprofclient import go_pprof, top
from support import OPTRACE, assert_one_line_error


def pprof_of(optrace, record: Path, out: Path, *args: str) -> Path:
    proc = optrace("report", "-i", str(record), "--format", "pprof", "-o", str(out), *args)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
    return out


def report_percents(optrace, record: Path) -> dict[str, float]:
    """`report --sort symbol` as JSON: symbol -> percent (pprof -top aggregates by function name too)."""
    rows = json.loads(optrace("report", "-i", str(record), "--format", "json", "--sort", "symbol",
                              check=True).stdout)["rows"]
    return {row["symbol"]: row["percent"] for row in rows}


def test_top_agrees_with_report(optrace, record_file: Path, tmp_path: Path) -> None:
    rows = top(str(pprof_of(optrace, record_file, tmp_path / "p.pb.gz")), tmp_path)
    report = report_percents(optrace, record_file)
    assert {name: row.flat_percent for name, row in rows.items() if row.flat_percent} == report
    assert rows["main"].cum_percent == 95.0 and rows["write"].cum_percent == 10.0  # from the stacks


def test_raw_has_types_period_labels_and_mappings(optrace, tmp_path: Path) -> None:
    record = synthetic_record()
    record.frames[1] = Frame("hot_a", record.frames[1].dso, address=0x1200, build_id="ab" * 20)
    path = tmp_path / "r.data"
    write_record(record, path)
    proc = go_pprof("-raw", str(pprof_of(optrace, path, tmp_path / "p.pb.gz")), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    raw = proc.stdout
    assert "PeriodType: cpu nanoseconds" in raw and f"Period: {10**9 // 499}" in raw
    assert "Duration: 2.5s" in raw and "samples/count cpu/nanoseconds[dflt]" in raw
    assert re.search(r"^\s+400\s+%d: 1 2 $" % (400 * (10**9 // 499)), raw, re.M), raw
    assert "comm:[demo]" in raw and "pid:[100]" in raw and "comm:[bash]" in raw
    assert re.search(r"/work/main/workloads/build/demo " + "ab" * 20 + r" \[FN\]", raw), raw
    assert "0xffffffff81000000 M=" in raw  # a kernel address is a uint64, kept whole


def test_filters_apply_as_in_folded(optrace, record_file: Path, tmp_path: Path) -> None:
    rows = top(str(pprof_of(optrace, record_file, tmp_path / "p.pb.gz", "--comm", "bash")), tmp_path)
    assert {name: row.flat_percent for name, row in rows.items() if row.flat_percent} == {
        "hot_a": 50.0, "[unknown]": 50.0}


def test_hostile_names_stay_valid(optrace, tmp_path: Path) -> None:
    """Controls, lone surrogates and huge numbers from a hand-made record: a valid profile, names escaped."""
    meta = RecordMeta(optrace_version="0", hostname="h\x1b]0;x\a", kernel="k", started=1.8e19,
                      duration_s=1.8e19, frequency_hz=1, event="cpu-clock", command=["\udcff\n"])
    frames = [Frame("evil\x1b[2J\udc80;name\n", "/tmp/\u202edso", address=(1 << 64) - 1, build_id="\x00zz")]
    path = tmp_path / "evil.data"
    write_record(Record(meta, frames, [Sample((1 << 32) - 1, "c\x07", (0,), (1 << 64) - 1)]), path)
    out = pprof_of(optrace, path, tmp_path / "p.pb.gz")
    profile = profile_pb2.Profile.FromString(gzip.decompress(out.read_bytes()))
    assert all(text.isprintable() for text in profile.string_table)
    assert profile.sample[0].value[:] == [(1 << 63) - 1, (1 << 63) - 1]
    assert list(top(str(out), tmp_path)) == [r"evil\x1b[2J\udc80;name\x0a"]


def test_bad_input_is_one_line(optrace, tmp_path: Path) -> None:
    empty, no_stacks = records_whole_stack_formats_refuse(tmp_path)
    out = str(tmp_path / "p.pb.gz")
    assert_one_line_error(optrace("report", "-i", str(empty), "-f", "pprof", "-o", out), "no samples")
    assert_one_line_error(optrace("report", "-i", str(no_stacks), "-f", "pprof", "-o", out), "--no-stacks")
    assert_one_line_error(optrace("report", "-i", str(empty), "-f", "pprof", "--comm", "x", "-o", out), "no samples")
    record = tmp_path / "r.data"
    write_record(synthetic_record(), record)
    assert_one_line_error(optrace("report", "-i", str(record), "-f", "pprof", "-o", "/proc/nowhere/p.pb.gz"),
                          "cannot write")
    assert not os.path.exists(out)


@pytest.mark.usefixtures("bpf_ready")
def test_ground_truth_workload(optrace, demo_record: Path, tmp_path: Path) -> None:
    """demo spends 40% of its CPU in hot_a: report and `go tool pprof -top` say the same (±1 point)."""
    record = demo_record
    rows = top(str(pprof_of(optrace, record, tmp_path / "demo.pb.gz")), tmp_path)
    report = report_percents(optrace, record)
    assert abs(report["hot_a"] - 40) <= 5, report
    for name in ("hot_a", "hot_b", "lib_burn"):
        assert abs(rows[name].flat_percent - report[name]) <= 1, (name, rows[name], report[name])
    assert rows["main"].cum_percent >= 90


def test_a_30_mb_name_in_every_stack_is_written_once(optrace, tmp_path: Path) -> None:
    """The text formats stop at their output budget; pprof interns the name: one copy, little memory."""
    frame = Frame("s" * 30_000_000, "/lib/d.so")
    samples = [Sample(pid=1, comm=f"c{i}", frames=(0,), count=1) for i in range(200)]
    path = tmp_path / "amplified.data"
    write_record(Record(synthetic_record().meta, [frame], samples), path)
    measured = tmp_path / "time"
    out = tmp_path / "p.pb.gz"
    result = subprocess.run(["/usr/bin/time", "-o", str(measured), "-f", "%M", str(OPTRACE), "report", "-i",
                             str(path), "-f", "pprof", "-o", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size < 200_000
    assert int(measured.read_text().split()[-1]) < 400 << 10  # peak RSS in KB
    profile = profile_pb2.Profile.FromString(gzip.decompress(out.read_bytes()))
    assert len(profile.sample) == 200 and len(profile.function) == 1


def test_main_binary_is_the_program_not_libc(optrace, tmp_path: Path) -> None:
    """Without a command (serve, -p, -a), mapping[0] (pprof's "File:") is the program of the heaviest
    stacks, not the libc start-up code their roots are in."""
    record = synthetic_record()
    record.meta.command = None
    start = len(record.frames)
    record.frames.append(Frame("__libc_start_call_main", "/usr/lib/x86_64-linux-gnu/libc.so.6"))
    record.samples = [Sample(s.pid, s.comm, s.frames + (start,), s.count) for s in record.samples if s.frames]
    path = tmp_path / "r.data"
    write_record(record, path)
    profile = profile_pb2.Profile.FromString(gzip.decompress(pprof_of(optrace, path, tmp_path / "p.pb.gz").read_bytes()))
    assert profile.string_table[profile.mapping[0].filename] == "/work/main/workloads/build/demo"
