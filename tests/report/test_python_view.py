"""The Python view (frontend/report/pythonview.py): the interpreter's own frames below a Python process's innermost
Python frame fold into that Python function in every output of `report` (self rows, folded stacks, JSON, flame
graph, pprof, OTLP), native code the function called stays, and --python-internals shows the stacks as recorded.

The record is built here: a Python process (CPython 3.11's frames marked ``interpreter`` as the symbolizer marks
them) whose leaves are the interpreter's allocator and an unnamed piece of a stripped python3.11, libc's memmove
under a page fault, a C extension, take_gil, and an interpreter still starting (no Python frame yet)."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest

from optrace.exporters.pprofproto import profile_pb2
from optrace.frontend.report.pythonview import leaf_depth, leaf_only, python_view, python_view_record
from optrace.model import KERNEL_DSO, RUNTIME_FRAME, Frame, RuntimeCounts, RawSample, Record, RecordMeta, Sample, UserFrame
from optrace.recordfile import write_record
from otlpdecode import decode
from support import run_optrace

PYTHON = "/usr/bin/python3.11"
FRAMES = [
    Frame("PyObject_Free", PYTHON, address=0x100, interpreter=True),  # 0
    Frame("python3.11+0x1fcc70", PYTHON, address=0x1FCC70, resolved=False, interpreter=True),  # 1
    Frame("rank", "/app/work.py", address=10, kind="cpython", line=12),  # 2
    Frame("sort_phase", "/app/work.py", address=20, kind="cpython", line=22),  # 3
    Frame("list_sort_impl", PYTHON, address=0x300, interpreter=True),  # 4: between two Python frames
    Frame("__memmove_avx_unaligned_erms", "/usr/lib/x86_64-linux-gnu/libc.so.6", address=0x400),  # 5
    Frame("asm_exc_page_fault", KERNEL_DSO, kind="kernel", address=0xFFFFFFFF81000000),  # 6
    Frame("take_gil", PYTHON, address=0x500, interpreter=True),  # 7
    Frame("Py_BytesMain", PYTHON, address=0x600, interpreter=True),  # 8: above the Python frames
    Frame("_start", PYTHON, address=0x700, interpreter=True),  # 9
    Frame("hot_c", "/app/_ext.cpython-311-x86_64-linux-gnu.so", address=0x800),  # 10
]
ROOT = (3, 8, 9)  # sort_phase called from the interpreter's main
SAMPLES = [
    Sample(10, "python3.11", (0, 2, 4) + ROOT, 30, 10),  # PyObject_Free under rank: rank's
    Sample(10, "python3.11", (1, 2, 4) + ROOT, 20, 10),  # a piece of stripped python3.11 under rank: rank's
    Sample(10, "python3.11", (2, 4) + ROOT, 10, 10),  # rank itself
    Sample(10, "python3.11", (6, 5, 0) + ROOT, 15, 10),  # a page fault in memmove the allocator called: stays
    Sample(10, "python3.11", (10, 1) + ROOT, 5, 10),  # a C extension the interpreter called for sort_phase
    Sample(10, "python3.11", (7,) + ROOT, 5, 10),  # waiting for the GIL
    Sample(10, "python3.11", (0, 8, 9), 5, 10),  # the interpreter starting: no Python frame, nothing to fold into
]
FOLDED_LEAVES = {"rank": 60, "asm_exc_page_fault": 15, "hot_c": 5, "take_gil": 5, "PyObject_Free": 5}
RECORDED_LEAVES = {"PyObject_Free": 35, "python3.11+0x1fcc70": 20, "rank": 10, "asm_exc_page_fault": 15, "hot_c": 5,
                   "take_gil": 5}


def python_record() -> Record:
    meta = RecordMeta("0.1.0", "host", "6.18", 0.0, 1.0, 99, "cpu-clock", command=[PYTHON, "/app/work.py"],
                      call_graph="dwarf", runtimes={"cpython": RuntimeCounts("Python", "CPython", {"named": 85, "native_only": 5},
                                                          {f"3.11.2 {PYTHON}": 1})})
    return Record(meta, list(FRAMES), list(SAMPLES), functions=[])


@pytest.fixture
def python_file(tmp_path: Path) -> Path:
    path = tmp_path / "py.data"
    write_record(python_record(), path)
    return path


def report(path: Path, *args: str) -> str:
    return run_optrace("report", "-i", str(path), *args, check=True).stdout


def json_leaves(path: Path, *args: str) -> dict[str, int]:
    rows = json.loads(report(path, "--format", "json", "--sort", "symbol", *args))["rows"]
    return {row["symbol"]: row["samples"] for row in rows if row["samples"]}


def test_the_interpreters_frames_fold_into_the_python_function_below_it() -> None:
    record, folded = python_view_record(python_record())
    leaves: Counter[str] = Counter()
    for sample in record.samples:
        leaves[record.frames[sample.frames[0]].symbol] += sample.count
    assert leaves == FOLDED_LEAVES and folded == 70
    stacks = {tuple(record.frames[i].symbol for i in sample.frames): sample.count for sample in record.samples}
    assert stacks[("rank", "list_sort_impl", "sort_phase", "Py_BytesMain", "_start")] == 60  # three stacks as one
    assert stacks[("asm_exc_page_fault", "__memmove_avx_unaligned_erms", "sort_phase", "Py_BytesMain", "_start")] == 15
    assert sum(s.count for s in record.samples) == sum(s.count for s in SAMPLES)


def test_a_record_without_interpreter_frames_is_the_same_object() -> None:
    """Older records (no frame marked) and processes that are not Python's are left as they are."""
    record = python_record()
    record.frames = [Frame(f.symbol, f.dso, f.kind, f.address, f.resolved, line=f.line)
                     for f in record.frames]
    assert python_view_record(record) == (record, 0)
    assert python_view(FRAMES, SAMPLES[-1:]) == SAMPLES[-1:]


def test_report_rows_folded_and_json_show_pythons_view(python_file: Path) -> None:
    assert json_leaves(python_file) == FOLDED_LEAVES
    table = report(python_file, "--sort", "symbol")
    assert "# Python view: the interpreter's own frames below a Python function count as its time in 70 samples" \
           " (77.78%); --python-internals shows them" in table, table
    folded = report(python_file, "--format", "folded")
    assert "python3.11;_start;Py_BytesMain;sort_phase (/app/work.py:22);list_sort_impl;rank (/app/work.py:12) 60" \
           in folded.splitlines(), folded
    assert "0x1fcc70" not in folded and sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()) == 90
    children = json.loads(report(python_file, "--format", "json", "--sort", "symbol", "--children"))["rows"]
    assert {row["symbol"]: row["children"] for row in children}["sort_phase"] == 85  # stacks keep their roots


def test_python_internals_shows_the_stacks_as_recorded(python_file: Path) -> None:
    assert json_leaves(python_file, "--python-internals") == RECORDED_LEAVES
    table = report(python_file, "--python-internals")
    assert "Python view" not in table and "python3.11+0x1fcc70" in table
    assert "0x1fcc70" in report(python_file, "--format", "folded", "--python-internals")


def pprof_leaves(path: Path, out: Path, *args: str) -> dict[str, int]:
    run_optrace("report", "-i", str(path), "--format", "pprof", "-o", str(out), *args, check=True)
    profile = profile_pb2.Profile.FromString(gzip.decompress(out.read_bytes()))
    functions = {f.id: profile.string_table[f.name] for f in profile.function}
    locations = {loc.id: functions[loc.line[0].function_id] for loc in profile.location}
    leaves: Counter[str] = Counter()
    for sample in profile.sample:
        leaves[locations[sample.location_id[0]]] += sample.value[0]
    return dict(leaves)


def test_pprof_otlp_and_flame_graph_leaves(python_file: Path, tmp_path: Path) -> None:
    assert pprof_leaves(python_file, tmp_path / "p.pb.gz") == FOLDED_LEAVES
    assert pprof_leaves(python_file, tmp_path / "r.pb.gz", "--python-internals") == RECORDED_LEAVES
    out = tmp_path / "p.otlp"
    run_optrace("report", "-i", str(python_file), "--format", "otlp", "-o", str(out), check=True)
    profiles = decode(ExportProfilesServiceRequest.FromString(out.read_bytes()))
    assert dict(+sum((p.leaves() for p in profiles), Counter())) == FOLDED_LEAVES
    page = report(python_file, "--format", "flamegraph")
    assert "python3.11+0x1fcc70" not in page and "rank" in page
    assert "python3.11+0x1fcc70" in report(python_file, "--format", "flamegraph", "--python-internals")


def test_gil_waits_keep_take_gil(python_file: Path) -> None:
    assert json_leaves(python_file, "--gil") == {"take_gil": 5}


def test_a_leaf_named_alone_keeps_the_frames_up_to_its_python_frame() -> None:
    """top and serve name each sample's leaf only: the frames the Python view picks it from come with it."""
    native = UserFrame(b"\x01" * 20, 0x100)
    python = UserFrame(RUNTIME_FRAME, 0x7000)
    assert leaf_depth((native, native, python, native, python)) == 3
    assert leaf_depth((native, native)) == 1 and leaf_depth(()) == 1
    sample = RawSample(1, "p", (native, python, native), (), 1)
    assert leaf_only(sample).user == (native, python)
    assert leaf_only(RawSample(1, "p", (native, python), (0xFFFF,), 1)) == RawSample(1, "p", (), (0xFFFF,), 1)


def test_diff_compares_pythons_view(python_file: Path) -> None:
    def symbols(*args: str) -> dict[str, int]:
        doc = json.loads(run_optrace("diff", str(python_file), str(python_file), "--format", "json", "--sort",
                                     "symbol", *args, check=True).stdout)
        return {row["symbol"]: row["new_samples"] for row in doc["rows"] if row["new_samples"]}

    assert symbols() == FOLDED_LEAVES
    assert symbols("--python-internals") == RECORDED_LEAVES



def test_the_fold_counts_and_rebuilds_only_the_stacks_it_changes() -> None:
    """A decoded record gives every sample its own tuple: equal stacks are not the same object. The fold
    judges each distinct stack once; samples whose stack it leaves alone are kept as they are, not rebuilt
    one by one, and are not counted as folded (main counted every unchanged stack met a second time: 17.5 %
    "folded" on a whole-machine record where 8.2 % were)."""
    rank_self = [Sample(10, "python3.11", tuple([2, 4, *ROOT]), 1, 100 + n) for n in range(200)]
    under_rank = [Sample(10, "python3.11", tuple([0, 2, 4, *ROOT]), 1, 100 + n) for n in range(50)]  # folds
    native = [Sample(20, "demo", tuple([5, 6]), 1, 20) for _ in range(100)]  # no Python frame
    record = Record(python_record().meta, list(FRAMES), rank_self + under_rank + native, functions=[])
    viewed, folded = python_view_record(record)
    assert folded == 50
    assert Counter((s.tid, s.frames) for s in viewed.samples for _ in range(s.count)) == Counter(
        (s.tid, (2, 4, *ROOT) if s in under_rank else s.frames) for s in record.samples)
    kept = {id(sample) for sample in viewed.samples}
    assert sum(id(sample) in kept for sample in rank_self[50:] + native) == 250  # not rebuilt
    assert len(viewed.samples) == 300  # each allocator sample merged into its thread's rank sample, in its place
    assert [s.tid for s in viewed.samples[:200]] == [100 + n for n in range(200)]
