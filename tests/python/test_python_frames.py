"""Python frames in recorded stacks (bpf/python.c), on every CPython of this machine (sid's in a container
root), started without a flag:
each interpreter frame replaced by the Python frames it ran, native frames in between kept, every thread
and child process, names with file and line read after the process is gone (a recording of a command names
its samples once the command has exited: only the walker's captures are left then)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pythons import PROGRAMS, REFUSED, SID, SUPPORTED, command, require
from support import run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")
MIXED = PROGRAMS / "mixed.py"
STRIPPED = ["3.11-debian", *SID]


def hot_line(marker: str) -> int:
    """The line of the program marked ``# hot: <marker>``."""
    lines = MIXED.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# hot: {marker}"))


def record(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "py.data"
    proc = run_optrace("record", "-F", "499", "-o", str(out), *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def folded(data: Path) -> list[tuple[list[str], int]]:
    text = run_optrace("report", "-i", str(data), "--format", "folded", check=True).stdout
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        stacks.append((stack.split(";"), int(count)))
    return stacks


def meta(data: Path) -> dict:
    return json.loads(run_optrace("report", "-i", str(data), "--format", "json", check=True).stdout)["meta"]


def position(frames: list[str], pattern: str) -> int:
    return next((i for i, frame in enumerate(frames) if re.match(pattern, frame)), -1)


@pytest.mark.parametrize("version", SUPPORTED)
def test_python_frames_replace_the_interpreters_with_native_frames_between(tmp_path, version) -> None:
    """sort_phase -> sorted (C) -> rank reads as that chain, root first, with the builtin's native frames
    between the two Python frames; the worker thread has its own stack; >= 90 % of the samples of the
    process have Python frames (those before its interpreter is found, at start, do not: test_python_shares
    holds a running process to 98 %); lines are the ones the program marks as hot."""
    data = record(tmp_path, "--", *command(version), str(MIXED), "2.5")
    stacks = folded(data)
    rank = re.escape(f"rank ({MIXED}:{hot_line('rank')})")
    chains = [frames for frames, _ in stacks if position(frames, rank) >= 0]
    assert chains, "no sample in rank"
    frames = max(chains, key=len)
    sort_at, rank_at = position(frames, r"sort_phase \("), position(frames, rank)
    between = frames[sort_at + 1:rank_at]
    assert 0 <= sort_at < rank_at and between and not any(" (" in frame for frame in between), frames
    if version not in STRIPPED:  # its static functions are python3.X+0x... (named by FDE)
        assert any(re.match(r"(builtin_sorted|list_sort\w*)$", frame) for frame in between), between
    assert not any(frame.startswith("_PyEval_EvalFrameDefault") for frame in between)
    assert position(frames, r"main \(") < sort_at and position(frames, r"(_start|__libc_start\w+)$") >= 0
    worker = [f for f, _ in stacks if position(f, r"worker \(") >= 0 and
              position(f, re.escape(f"tokenize ({MIXED}:{hot_line('tokenize')})")) > position(f, r"worker \(")]
    assert worker, "no sample of the worker thread in tokenize"
    outcomes = meta(data)["runtimes"]["cpython"]["samples"]
    assert outcomes.get("named", 0) >= 0.90 * sum(outcomes.values()), outcomes


@pytest.mark.parametrize("version", REFUSED)
def test_an_interpreter_without_a_known_layout_keeps_native_stacks_and_says_why(tmp_path, version) -> None:
    python = require(version)
    data = record(tmp_path, "--", str(python), str(MIXED), "1")
    outcomes = meta(data)["runtimes"]["cpython"]["samples"]
    assert list(outcomes) == [f"refused: python {version} not supported"], outcomes
    assert any(position(frames, r"_PyEval_EvalFrameDefault$") >= 0 for frames, _ in folded(data))
    header = run_optrace("report", "-i", str(data), check=True).stdout
    assert f"refused: python {version} not supported" in header


def test_child_processes_of_a_command_have_python_frames(tmp_path) -> None:
    python = require("3.12")
    data = record(tmp_path, "--", str(python), str(MIXED), "2", "--child")
    child = re.escape(f"child_loop ({MIXED}:{hot_line('child_loop')})")
    assert any(position(frames, child) >= 0 for frames, _ in folded(data))
    assert sum(meta(data)["runtimes"]["cpython"]["processes"].values()) == 2


def test_python_off_keeps_the_interpreters_frames(tmp_path) -> None:
    python = require("3.11-debian")
    data = record(tmp_path, "--python", "off", "--", str(python), str(MIXED), "1")
    stacks = folded(data)
    assert not any(position(frames, r"rank \(") >= 0 for frames, _ in stacks)
    assert any(position(frames, r"_PyEval_EvalFrameDefault$") >= 0 for frames, _ in stacks)
    assert meta(data)["runtimes"] == {}
