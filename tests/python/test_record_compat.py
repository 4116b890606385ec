"""Records with Python frames were format 3, and frame kinds made them format 4 (tests/record/test_frame_kinds.py):
records written before still read (their frames native unless marked), and the optrace before Python frames
refuses a new record in one clear line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from optrace.model import NATIVE, Frame, Record, RecordMeta, RuntimeCounts, Sample
from optrace.recordfile import FORMAT_VERSION, read_record, write_record
from support import REPO

BEFORE_PYTHON = "e1d711d"  # the last commit whose records were format 2


def python_record() -> Record:
    meta = RecordMeta("0.1.0", "host", "6.18", 0.0, 1.0, 99, "cpu-clock", runtimes={"cpython": RuntimeCounts("Python", "CPython", {"named": 5}, {"3.11.2 /usr/bin/python3.11": 1})})
    frames = [Frame("rank", "/app/work.py", "cpython", address=2, line=5), Frame("main", "/usr/bin/prog")]
    return Record(meta, frames, [Sample(1, "python3", (0, 1), 5)])


def test_the_optrace_before_python_frames_refuses_a_new_record(tmp_path: Path) -> None:
    assert FORMAT_VERSION == 4
    record = tmp_path / "new.data"
    write_record(python_record(), record)
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_PYTHON, "optrace"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    reader = "import sys; from optrace.recordfile import read_record; read_record(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", reader, str(record)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(old)}, cwd=old)
    assert proc.returncode != 0
    assert "recorded by a newer optrace (format 4): upgrade optrace" in proc.stderr.strip().splitlines()[-1]


def test_a_format_2_record_reads_with_python_fields_defaulted(tmp_path: Path) -> None:
    """A record the optrace before Python frames wrote (format 2, no Python columns)."""
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_PYTHON, "optrace"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    writer = ("import sys; from optrace.model import *; from optrace.recordfile import write_record; "
              "write_record(Record(RecordMeta('0.1.0', 'h', 'k', 0.0, 1.0, 99, 'cpu-clock'), [Frame('f', '/bin/x')], "
              "[Sample(1, 'x', (0,), 3)]), sys.argv[1])")
    path = tmp_path / "format2.data"
    subprocess.run([sys.executable, "-c", writer, str(path)], check=True, env={"PYTHONPATH": str(old)}, cwd=old)
    record = read_record(path)
    assert record.frames == [Frame("f", "/bin/x")] and record.frames[0].kind == NATIVE and record.frames[0].line == 0
    assert record.meta.runtimes == {} and record.sources == []


BEFORE_VIEWS = "4e1d5cd"  # the last commit before Frame.interpreter (issue 41's Python view)


def test_a_record_from_before_frame_interpreter_reads_with_no_frame_marked(tmp_path: Path) -> None:
    """Frame.interpreter is a column with a default: a record the optrace before it wrote reads here with no frame
    marked (shown as recorded)."""
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_VIEWS, "optrace"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    written = tmp_path / "before.data"
    writer = ("import sys; from optrace.model import *; from optrace.recordfile import write_record; "
              "write_record(Record(RecordMeta('0.1.0', 'h', 'k', 0.0, 1.0, 99, 'cpu-clock'), "
              "[Frame('PyObject_Free', '/usr/bin/python3.11')], [Sample(1, 'x', (0,), 3)]), sys.argv[1])")
    subprocess.run([sys.executable, "-c", writer, str(written)], check=True, env={"PYTHONPATH": str(old)}, cwd=old)
    assert [frame.interpreter for frame in read_record(written).frames] == [False]
