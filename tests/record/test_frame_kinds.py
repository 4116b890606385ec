"""Frame kinds (format 4, issue 44): a frame says what named it (native, kernel, jit-map or a runtime's name) in
place of the ``kernel`` and ``python`` booleans, and a runtime's counts and source lines are the runtime's. Records
of formats 1-3 still read (optrace/recordupgrade.py): ``data/format3.data`` was written by the optrace before
this change (commit 7e0ac3a) with a Python frame, an interpreter frame, a native, a kernel and a perf-map frame."""
from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import pytest

from optrace.exporters.table import runtime_line
from optrace.model import JIT_MAP, KERNEL, NATIVE, Frame, Record, RecordMeta, RuntimeCounts, RuntimeSource, Sample
from optrace.recordfile import FORMAT_VERSION, HEADER, RecordFileError, read_record, write_record

STORED_FORMAT_3 = Path(__file__).parent / "data" / "format3.data"


def test_a_stored_format_3_record_reads_with_kinds() -> None:
    record = read_record(STORED_FORMAT_3)
    assert [frame.kind for frame in record.frames] == ["cpython", NATIVE, NATIVE, KERNEL, JIT_MAP]
    python, interpreter, native, kernel, jit = record.frames
    assert python.runtime and (python.symbol, python.dso, python.address, python.line) == ("rank", "/app/work.py", 2, 5)
    assert interpreter.interpreter and not interpreter.runtime and interpreter.build_id == "ab" * 20
    assert kernel.kernel and not native.kernel and not jit.runtime and jit.dso == "[jit] /tmp/perf-42.map"
    counts = record.meta.runtimes["cpython"]
    assert counts == RuntimeCounts("Python", "CPython", {"named": 5, "native_only": 2, "cut: natives_cut": 1},
                                   {"3.11.2 /usr/bin/python3.11": 1})
    assert runtime_line(counts) == ("Python: 5 of 7 samples with Python frames (71.4%); native_only 2, "
                                    "cut: natives_cut 1; CPython 3.11.2 (1 process)")
    assert record.sources == [RuntimeSource("rank", "/app/work.py", 2, ["def rank():", "    return 1"], {3: 5}, 1)]
    assert [s.count for s in record.samples] == [5, 2, 1]


def test_the_stored_record_is_format_3() -> None:
    """So the test above reads what an older optrace wrote, not what this one writes."""
    header = STORED_FORMAT_3.read_bytes()[:HEADER.size]
    assert HEADER.unpack(header)[1] == 3 and FORMAT_VERSION == 4


def test_a_format_4_record_keeps_kinds_and_runtimes(tmp_path: Path) -> None:
    counts = RuntimeCounts("Toy", "Toy VM", {"named": 3}, {"1.0 /opt/toy": 1}, {"frames_named": 9})
    meta = RecordMeta("0.9.0", "h", "k", 0.0, 1.0, 99, "cpu-clock", runtimes={"toy": counts})
    frames = [Frame("f", "prog.toy", "toy", address=1, line=3), Frame("g", "[kernel.kallsyms]", KERNEL),
              Frame("h", "[jit] /tmp/perf-1.map", JIT_MAP), Frame("main", "/bin/x")]
    record = Record(meta, frames, [Sample(1, "toy", (0, 1, 2, 3), 3)], functions=[])
    write_record(record, tmp_path / "r.data")
    back = read_record(tmp_path / "r.data")
    assert back.frames == frames and back.meta.runtimes == {"toy": counts}
    assert [f.runtime for f in back.frames] == [True, False, False, False]


def _format_3_document(frames: dict) -> bytes:
    """A format 3 file holding ``frames`` as its frames table (the rest taken from the stored record)."""
    data = STORED_FORMAT_3.read_bytes()
    magic, version, compressed_len, raw_len, _ = HEADER.unpack(data[:HEADER.size])
    document = json.loads(zlib.decompress(data[HEADER.size:HEADER.size + compressed_len]))
    document["frames"] = frames
    raw = json.dumps(document).encode()
    compressed = zlib.compress(raw)
    return HEADER.pack(magic, version, len(compressed), len(raw), zlib.crc32(compressed)) + compressed


@pytest.mark.parametrize("column", ["kernel", "python"])
def test_a_format_3_column_of_another_length_is_refused(tmp_path: Path, column: str) -> None:
    frames = {"symbol": ["a", "b"], "dso": ["/x", "/y"], "kernel": [False, False], "python": [False, False]}
    frames[column] = [True]
    path = tmp_path / "bad.data"
    path.write_bytes(_format_3_document(frames))
    with pytest.raises(RecordFileError, match="is corrupt"):
        read_record(path)


def test_frame_kind_replaces_the_booleans() -> None:
    """No frame field says python or kernel any more: a kind does (the properties read it)."""
    names = {f.name for f in dataclasses.fields(Frame)}
    assert "kind" in names and not names & {"python", "kernel"}
