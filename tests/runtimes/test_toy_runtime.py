"""The runtime seam proved with a runtime that is not CPython (tests/runtimes/toy/): registered beside CPython,
it is detected by its file's name, attached (its function table read), its frame words are sent to it by the
id they carry and named as its frames (Frame.kind "toy") in the record and every output, its outcomes counted
under its name, and what it kept of a process forgotten. No product module names it (tests/test_architecture.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from optrace.exporters.otlp import frame_type
from optrace.exporters.table import runtime_line
from optrace.frontend.report.callgraph import frame_kind
from optrace.frontend.runtimes.cpython.runtime import CPYTHON
from optrace.frontend.runtimes.registry import RuntimeParts, SessionContext, check_registry
from optrace.frontend.symbols.symbolizer import Symbolizer
from optrace.model import RUNTIME_FRAME, UNKNOWN, RawSample, Record, RecordMeta, UserFrame
from optrace.procfs import read_maps
from optrace.recordfile import read_record, write_record
from toy.runtime import TOY, Toy, toy_word

FUNCTIONS = "main /app/prog.toy 1\nsort /app/prog.toy 10\ncompare /app/lib.toy 3\n"


class NoWalkers:
    """A loaded program that holds no runtime's BPF walker (CPython's part does not start)."""

    python = None


@pytest.fixture
def toyvm(tmp_path: Path):
    """A running process of an executable named toyvm (a copy of sleep) with its function table beside it."""
    executable = tmp_path / "toyvm"
    shutil.copy(shutil.which("sleep"), executable)
    (tmp_path / "toyvm.functions").write_text(FUNCTIONS)
    process = subprocess.Popen([str(executable), "30"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def started(symbolizer: Symbolizer) -> RuntimeParts:
    parts = RuntimeParts.start(SessionContext(NoWalkers(), symbolizer), runtimes=(CPYTHON, TOY))
    assert parts is not None and [runtime.name for runtime, _ in parts.parts] == ["toy"]
    symbolizer.runtime_lookup = parts.frame
    return parts


def stack_of(pid: int, *words: int) -> RawSample:
    return RawSample(pid, "toyvm", tuple(UserFrame(RUNTIME_FRAME, word) for word in words), (), 3)


def test_a_toy_process_is_detected_named_counted_and_forgotten(toyvm) -> None:
    symbolizer = Symbolizer()
    parts = started(symbolizer)
    assert parts.may_run(["libc.so.6", "toyvm"]) and not parts.may_run(["libc.so.6", "python3.11"])
    parts.look_at(toyvm.pid, read_maps(toyvm.pid).entries)
    parts.look_at(os.getpid(), read_maps(os.getpid()).entries)  # no toyvm mapped: not its process
    raw = [stack_of(toyvm.pid, toy_word(2, 4), toy_word(1, 12), toy_word(0, 2)), stack_of(toyvm.pid)]
    frames, rows = symbolizer.symbolize(raw)
    named = [frames[i] for i in rows[0].frames]
    assert [(f.kind, f.symbol, f.dso, f.address, f.line) for f in named] == [
        ("toy", "compare", "/app/lib.toy", 3, 4), ("toy", "sort", "/app/prog.toy", 10, 12),
        ("toy", "main", "/app/prog.toy", 1, 2)]
    assert all(f.runtime and not f.kernel for f in named)
    counts = parts.counts(raw, frames, rows)["toy"]
    executable = read_maps(toyvm.pid).entries
    path = next(e.file_path for e in executable if e.file_path.endswith("/toyvm"))
    assert counts.samples == {"named": 3, "native_only": 3} and counts.processes == {f"1.0 {path}": 1}
    assert runtime_line(counts) == f"Toy: 3 of 6 samples with Toy frames (50.0%); native_only 3; ToyVM 1.0 (1 process)"
    parts.exited(toyvm.pid)
    parts.forget(toyvm.pid)
    again = Symbolizer()
    again.runtime_lookup = parts.frame
    frames, _ = again.symbolize([stack_of(toyvm.pid, toy_word(2, 4))])
    assert frames[0].symbol == "[toy function 2]" and not frames[0].resolved


def test_a_toy_without_its_table_is_refused_and_counted(toyvm, tmp_path: Path) -> None:
    (tmp_path / "toyvm.functions").unlink()
    parts = started(Symbolizer())
    parts.look_at(toyvm.pid, read_maps(toyvm.pid).entries)
    raw = [stack_of(toyvm.pid)]
    frames, rows = Symbolizer().symbolize(raw)
    counts = parts.counts(raw, frames, rows)["toy"]
    assert counts.samples == {"refused: no function table": 3}
    assert counts.processes == {"refused: no function table": 1}


def test_a_word_no_started_runtime_stored_is_unknown() -> None:
    symbolizer = Symbolizer()
    started(symbolizer)
    frames, _ = symbolizer.symbolize([stack_of(7, CPYTHON_WORD := (1 << 62) | (1 << 56) | 0x1234)])
    assert (frames[0].symbol, frames[0].resolved, frames[0].address) == (UNKNOWN, False, CPYTHON_WORD)


def test_toy_frames_go_through_the_record_and_the_outputs(toyvm, tmp_path: Path) -> None:
    symbolizer = Symbolizer()
    parts = started(symbolizer)
    parts.look_at(toyvm.pid, read_maps(toyvm.pid).entries)
    raw = [stack_of(toyvm.pid, toy_word(1, 11), toy_word(0, 2))]
    frames, rows = symbolizer.symbolize(raw)
    meta = RecordMeta("0.9.0", "h", "k", 0.0, 1.0, 99, "cpu-clock", runtimes=parts.counts(raw, frames, rows))
    write_record(Record(meta, frames, rows, functions=[]), tmp_path / "toy.data")
    record = read_record(tmp_path / "toy.data")
    assert record.frames == frames and record.meta.runtimes == meta.runtimes
    assert {frame_kind(f) for f in record.frames} == {"runtime"}
    assert {frame_type(f) for f in record.frames} == {"toy"}  # a runtime's name is its OTLP frame type


def test_the_registry_refuses_runtimes_that_clash() -> None:
    check_registry((CPYTHON, TOY))
    with pytest.raises(ValueError, match="ids"):
        check_registry((CPYTHON, Toy(runtime_id=CPYTHON.runtime_id)))
    with pytest.raises(ValueError, match="names"):
        check_registry((CPYTHON, Toy(name="kernel")))
    with pytest.raises(ValueError, match="ids"):
        check_registry((Toy(runtime_id=16),))
