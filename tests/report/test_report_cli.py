"""`optrace report` as a user runs it: formats, bad input (one stderr line, no traceback), no root, no BCC."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from optrace.recordfile import HEADER, MAGIC

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
OPTRACE = str(Path(sys.executable).parent / "optrace")


def assert_one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("optrace: ") and message in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_default_table(optrace, record_file: Path) -> None:
    proc = optrace("report", "-i", str(record_file), check=True)
    assert "# Overhead  Samples  Command  Shared Object      Symbol" in proc.stdout
    assert "    40.00%      400  demo     demo               [.] hot_a" in proc.stdout
    assert "# Uprobe call counts" in proc.stdout and proc.stderr == ""


def test_default_input_is_optrace_data_in_cwd(optrace, record_file: Path) -> None:
    proc = optrace("report", "--format", "csv", cwd=record_file.parent, check=True)
    assert proc.stdout.splitlines()[1] == "demo,,,/work/main/workloads/build/demo,hot_a,false,400,40.0"


def test_json_with_filters_and_children(optrace, record_file: Path) -> None:
    proc = optrace("report", "-i", str(record_file), "--format", "json", "--children", "--dso", "demo",
                   "--sort", "symbol", "--percent-limit", "30", check=True)
    doc = json.loads(proc.stdout)
    assert [(r["symbol"], r["samples"], r["children"], r["percent"]) for r in doc["rows"]] == [
        ("main", 0, 900, 0.0), ("hot_a", 400, 400, 40.0)]
    assert doc["calls"][0]["calls"] == 1234


def test_pid_and_comm_filters(optrace, record_file: Path) -> None:
    by_pid = optrace("report", "-i", str(record_file), "--format", "folded", "--pid", "200,300", check=True)
    by_comm = optrace("report", "-i", str(record_file), "--format", "folded", "--comm", "bash", check=True)
    assert by_pid.stdout == by_comm.stdout == "bash;[unknown] 50\nbash;main;hot_a 50\n"


def test_output_file(optrace, record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.folded"
    proc = optrace("report", "-i", str(record_file), "--format", "folded", "-o", str(out), check=True)
    assert proc.stdout == "" and out.read_text().count("\n") == 6


def write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def test_bad_files(optrace, tmp_path: Path, record_file: Path) -> None:
    valid = record_file.read_bytes()
    newer = bytearray(valid)
    newer[8:12] = (9).to_bytes(4, "little")
    cases = {
        str(tmp_path / "missing.data"): "no such file: ",
        str(tmp_path): "is a directory",
        write(tmp_path / "perf.data", b"PERFILE2" + bytes(100)): "is a perf.data file: use perf report",
        write(tmp_path / "elf", Path(sys.executable).read_bytes()[:4096]): "is not an optrace record file",
        write(tmp_path / "cut", valid[: len(valid) // 2]): "is truncated",
        write(tmp_path / "head", valid[: HEADER.size - 3]): "is truncated",
        write(tmp_path / "flip", valid[:-5] + bytes([valid[-5] ^ 0x40]) + valid[-4:]): "is corrupt",
        write(tmp_path / "newer", bytes(newer)): "recorded by a newer optrace (format 9): upgrade",
        write(tmp_path / "empty", b""): "is empty",
        write(tmp_path / "magic", MAGIC): "is truncated",
    }
    for path, message in cases.items():
        assert_one_line_error(optrace("report", "-i", path), message)


@pytest.mark.skipif(shutil.which("perf") is None or os.geteuid() != 0, reason="needs perf and root")
def test_real_perf_data_is_recognised(optrace, tmp_path: Path) -> None:
    data = tmp_path / "perf.data"
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-o", str(data), "--", "true"],
                   check=True, capture_output=True)
    assert_one_line_error(optrace("report", "-i", str(data)), "is a perf.data file: use perf report")


@pytest.mark.parametrize("args,message", [
    (["--sort", "comm,bogus"], "unknown sort key 'bogus': valid keys are comm, pid, tid, dso, symbol"),
    (["--sort", "comm,cpu"], "perf's sort key 'cpu' is not in optrace's records: valid keys are comm, pid"),
    (["--sort", ""], "valid keys are comm, pid, tid, dso, symbol"),
    (["--format", "xml"], "unknown format 'xml': valid formats are table, json, csv, folded"),
    (["--pid", "abc"], "not a process id: 'abc'"),
    (["--pid", "-3"], "not a process id: '-3'"),
    (["--percent-limit", "lots"], "--percent-limit takes a number from 0 to 100"),
    (["--percent-limit", "101%"], "--percent-limit takes a number from 0 to 100 (or perf's 1%)"),
    (["--percent-limit", "150"], "--percent-limit takes a number from 0 to 100"),
    (["-o", "/nonexistent-dir/out.txt"], "cannot write /nonexistent-dir/out.txt: No such file or directory"),
])
def test_bad_options(optrace, record_file: Path, args: list[str], message: str) -> None:
    assert_one_line_error(optrace("report", "-i", str(record_file), *args), message)


@pytest.fixture
def shared_record_file(record_file: Path):
    """The root-written record copied to a world-readable directory, mode 644."""
    directory = Path(tempfile.mkdtemp(prefix="optrace-report-"))
    directory.chmod(0o755)
    path = directory / "optrace.data"
    shutil.copy(record_file, path)
    path.chmod(0o644)
    yield path
    shutil.rmtree(directory)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unprivileged_user_reports_a_root_file(shared_record_file: Path) -> None:
    assert os.stat(shared_record_file).st_uid == 0
    as_root = subprocess.run([OPTRACE, "report", "-i", str(shared_record_file), "--format", "json"],
                             capture_output=True, text=True, check=True)
    as_nobody = subprocess.run([*NOBODY, OPTRACE, "report", "-i", str(shared_record_file), "--format", "json"],
                               capture_output=True, text=True)
    assert as_nobody.returncode == 0, as_nobody.stderr
    assert json.loads(as_nobody.stdout) == json.loads(as_root.stdout)
    table = subprocess.run([*NOBODY, OPTRACE, "report", "-i", str(shared_record_file)], capture_output=True,
                           text=True, check=True)
    assert "[k] ksys_write" in table.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unprivileged_user_unreadable_file(shared_record_file: Path) -> None:
    shared_record_file.chmod(0o600)
    proc = subprocess.run([*NOBODY, OPTRACE, "report", "-i", str(shared_record_file)], capture_output=True,
                          text=True)
    assert_one_line_error(proc, "cannot read ")
    assert "Permission denied" in proc.stderr


def test_report_loads_neither_bcc_nor_the_bpf_package(record_file: Path) -> None:
    code = (
        "import sys\n"
        "from optrace.frontend.cli import cli\n"
        f"cli(['report', '-i', {str(record_file)!r}, '--format', 'json'], standalone_mode=False)\n"
        "loaded = sorted(m for m in sys.modules if m == 'bcc' or m.startswith(('bcc.', 'optrace.bpf')))\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOADED []" in proc.stderr
