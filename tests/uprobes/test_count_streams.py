"""`count`'s outputs never mix: the counts on stdout or in -o FILE, the command's output where the user says.

workloads/calls N prints "done N 0" on its stdout after exactly N calls of target(): the ground truth."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import assert_one_line_error


def test_json_and_the_commands_stdout_need_a_choice(optrace, workloads: Path) -> None:
    """Refused before anything is attached: one line naming both ways out."""
    proc = optrace("count", "--format", "json", f"{workloads}/calls:target", "--", str(workloads / "calls"), "5")
    assert_one_line_error(proc, "--format json on stdout would mix", "-o FILE", "--command-stdout stderr")
    assert proc.stdout == "" and "Counting calls" not in proc.stderr


def test_unwritable_output_is_one_line(optrace, workloads: Path, tmp_path: Path) -> None:
    for target in (tmp_path / "missing" / "c.json", Path("/proc/self/c.json")):
        proc = optrace("count", "-o", str(target), f"{workloads}/calls:target", "--", str(workloads / "calls"), "5")
        assert_one_line_error(proc, "cannot write")
        assert "Counting calls" not in proc.stderr and "done" not in proc.stdout


@pytest.mark.usefixtures("bpf_ready")
@pytest.mark.parametrize("where", ["stderr", "null"])
def test_json_on_stdout_stays_whole(optrace, workloads: Path, where: str) -> None:
    proc = optrace("count", "--format", "json", "--command-stdout", where, f"{workloads}/calls:target", "--",
                   str(workloads / "calls"), "1234", check=True)
    doc = json.loads(proc.stdout)  # the whole of stdout: nothing of the command in it
    assert doc["probes"][0]["calls"] == 1234 and doc["exit_status"] == 0
    assert ("done 1234 0\n" in proc.stderr) == (where == "stderr")


@pytest.mark.usefixtures("bpf_ready")
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_output_file_keeps_the_commands_stdout(optrace, workloads: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "counts"
    proc = optrace("count", "--format", fmt, "-o", str(out), f"{workloads}/calls:target", "--",
                   str(workloads / "calls"), "777", check=True)
    assert proc.stdout == "done 777 0\n"
    text = out.read_text()
    if fmt == "json":
        assert json.loads(text)["probes"][0]["calls"] == 777
    else:
        assert "777" in text and "target" in text
