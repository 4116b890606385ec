"""`report --format otlp`: an ExportProfilesServiceRequest read back with the published messages
(tests/otlpdecode.py): the dictionary's rules, sample types, resources, every kind of frame, the
ground truth of a real recording."""
from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest

from optrace.exporters.otlp import Resources, encode
from optrace.model import KERNEL_DSO, UNKNOWN, Frame, OffCpuMeta, Record, Sample
from optrace.recordfile import read_record, write_record
from otlpdecode import decode
from support import OPTRACE, assert_one_line_error
from synthetic import DEMO, records_whole_stack_formats_refuse, synthetic_record


def otlp_of(optrace, record: Path, out: Path, *args: str) -> ExportProfilesServiceRequest:
    proc = optrace("report", "-i", str(record), "--format", "otlp", "-o", str(out), *args)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
    return ExportProfilesServiceRequest.FromString(out.read_bytes())


def build_id_of(path: Path) -> str:
    notes = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", notes).group(1)


@pytest.mark.usefixtures("bpf_ready")
def test_a_real_recording(optrace, demo_record: Path, workloads: Path, tmp_path: Path) -> None:
    """demo (hot_a 40 %): one process, its CPU samples as samples/count with the period, each function's
    self samples those of `report --sort symbol`, its mappings' build-ids the files' own."""
    profiles = decode(otlp_of(optrace, demo_record, tmp_path / "demo.otlp"))
    record = read_record(demo_record)
    rows = json.loads(optrace("report", "-i", str(demo_record), "--format", "json", "--sort", "symbol",
                              check=True).stdout)["rows"]
    assert {p.sample_type for p in profiles} == {("samples", "count")}
    assert {(p.period_type, p.period) for p in profiles} == {(("cpu", "nanoseconds"), 10**9 // 999)}
    assert sum(p.total for p in profiles) == sum(s.count for s in record.samples)
    leaves = sum((p.leaves() for p in profiles), Counter())
    assert {name: n for name, n in leaves.items() if n} == {row["symbol"]: row["samples"] for row in rows}
    assert abs(100 * leaves["hot_a"] / sum(leaves.values()) - 40) <= 5
    demo = next(p for p in profiles if p.resource.get("process.executable.name") == "demo")
    assert demo.resource["process.executable.path"] == str(workloads / "demo")
    assert demo.resource["service.name"] == "unknown_service:demo" and demo.resource["host.name"] == record.meta.hostname
    assert demo.time_unix_nano == int(record.meta.started * 1e9) and demo.scope[0] == "optrace"
    frames = {frame for sample in demo.samples for frame in sample.stack}
    assert {f.build_id for f in frames if f.mapping == str(workloads / "demo")} == {build_id_of(workloads / "demo")}
    assert {f.build_id for f in frames if f.name == "lib_burn"} == {build_id_of(workloads / "libburn.so")}
    assert all(f.frame_type == "kernel" for f in frames if f.mapping == KERNEL_DSO)
    assert {f.frame_type for f in frames if f.name in ("hot_a", "main", "lib_burn")} == {"native"}
    assert demo.inclusive()["main"] >= 0.9 * demo.total


def frames_of_every_kind() -> Record:
    record = synthetic_record()
    record.frames += [
        Frame("rank", "/srv/app.py", address=50, kind="cpython", line=57),  # 8: Python: file, first line, line
        Frame("LHot;.f", "[jit] /tmp/perf-100.map", address=0x7F0000001000),  # 9: JIT
        Frame("libz.so+0x1f2", "/usr/lib/libz.so", address=0x1F2, resolved=False, build_id="cd" * 20),  # 10
        Frame(UNKNOWN, UNKNOWN, address=0x1234, resolved=False),  # 11
        Frame("evil\x1b[2J\udc80", "/tmp/\u202edso"),  # 12
    ]
    record.samples = [Sample(100, "demo", (8, 1, 0), 5), Sample(100, "demo", (9, 0), 3),
                      Sample(100, "demo", (10, 0), 2), Sample(100, "demo\x07", (11, 12), 1), Sample(300, "x", (), 4)]
    return record


def test_every_kind_of_frame() -> None:
    record = frames_of_every_kind()
    [demo, other] = decode(encode(record, Resources(), {"cpu": record.samples}))
    stacks = {sample.stack[0].name or sample.stack[0].mapping: sample for sample in demo.samples}
    python = stacks["rank"].stack[0]
    assert (python.filename, python.start_line, python.line, python.mapping, python.frame_type) == (
        "/srv/app.py", 50, 57, "", "cpython")
    assert stacks["rank"].stack[1].name == "hot_a" and stacks["rank"].stack[1].address == 0x1200
    jit = stacks["LHot;.f"].stack[0]
    assert (jit.mapping, jit.address, jit.frame_type) == ("[jit] /tmp/perf-100.map", 0x7F0000001000, None)
    unnamed = stacks["/usr/lib/libz.so"].stack[0]  # left for a backend that has the object's debug info
    assert (unnamed.name, unnamed.build_id, unnamed.address) == (None, "cd" * 20, 0x1F2)
    hostile = stacks[UNKNOWN]
    assert hostile.stack[0].mapping == "" and hostile.stack[1].name == r"evil\x1b[2J\udc80"
    assert hostile.stack[1].mapping == r"/tmp/\u202edso" and hostile.attributes == {"thread.name": r"demo\x07"}
    assert [s.stack[0].name for s in other.samples] == [UNKNOWN] and other.total == 4  # a lost stack counts


def test_resources_follow_the_precedence() -> None:
    resources = Resources(host=(("host.name", "h"), ("deployment.environment.name", "prod"), ("service.name", "env")),
                          processes={7: (("process.executable.name", "nginx"), ("host.name", "container"))})
    assert dict(resources.of(7)) == {"host.name": "container", "deployment.environment.name": "prod",
                                     "service.name": "env", "process.executable.name": "nginx", "process.pid": 7}
    assert dict(Resources(processes={7: (("process.executable.name", "nginx"),)}).of(7))["service.name"] == \
        "unknown_service:nginx"
    assert dict(Resources().of(8))["service.name"] == "unknown_service"
    assert dict(Resources(resources.host, service_name="checkout").of(8))["service.name"] == "checkout"


def test_off_cpu_is_its_own_sample_type(optrace, tmp_path: Path) -> None:
    record = synthetic_record()
    record.off_cpu = [Sample(100, "demo", (4, 0), 300_000_000), Sample(100, "demo", (2, 0), 100_000_000)]
    record.meta.off_cpu = OffCpuMeta(source="test", min_block_us=1, total_ns=400_000_000)
    path = tmp_path / "off.data"
    write_record(record, path)
    [profile] = decode(otlp_of(optrace, path, tmp_path / "off.otlp", "--event", "off-cpu"))
    assert profile.sample_type == ("off_cpu", "nanoseconds") and profile.period == 0
    assert profile.leaves() == Counter({"write": 300_000_000, "hot_b": 100_000_000})


def test_filters_select_stacks(optrace, tmp_path: Path) -> None:
    path = tmp_path / "r.data"
    write_record(synthetic_record(), path)
    profiles = decode(otlp_of(optrace, path, tmp_path / "r.otlp", "--comm", "bash"))
    assert [(p.resource["process.pid"], p.total) for p in profiles] == [(200, 100)]
    everything = decode(otlp_of(optrace, path, tmp_path / "all.otlp"))
    assert [p.resource["process.pid"] for p in everything] == [100, 200]
    assert everything[0].resource["process.executable.path"] == DEMO and "process.pid" in everything[1].resource


def test_bad_input_is_one_line(optrace, tmp_path: Path) -> None:
    empty, no_stacks = records_whole_stack_formats_refuse(tmp_path)
    out = str(tmp_path / "r.otlp")
    assert_one_line_error(optrace("report", "-i", str(empty), "-f", "otlp", "-o", out), "no samples")
    assert_one_line_error(optrace("report", "-i", str(no_stacks), "-f", "otlp", "-o", out), "--no-stacks")
    record = tmp_path / "r.data"
    write_record(synthetic_record(), record)
    tty = subprocess.run(["script", "-qec", f"{OPTRACE} report -i {record} -f otlp",
                          "/dev/null"], capture_output=True, text=True, timeout=60)
    assert "OTLP output is binary" in tty.stdout and "Traceback" not in tty.stdout
