"""Every marked example in the README is a real run (see readmecheck.py for how to mark one)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import readmecheck
from support import REPO

BLOCKS = readmecheck.checked_blocks((REPO / "README.md").read_text())
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _synthetic_record():
    """The report tests' record of known counts (tests/report/conftest.py)."""
    spec = importlib.util.spec_from_file_location("report_conftest", REPO / "tests" / "report" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_record(with_calls=True)


def _workdir(tmp_path: Path, real: Path | None) -> Path:
    from optrace.recordfile import write_record

    (tmp_path / "workloads").symlink_to(REPO / "workloads")
    write_record(_synthetic_record(), tmp_path / "optrace.data")
    if real is not None:
        (tmp_path / "real.data").write_bytes(real.read_bytes())
    return tmp_path


def test_blocks_are_found():
    assert len(BLOCKS) >= 5 and {block.mode for block in BLOCKS} == {"exact", "shape"}


@pytest.mark.parametrize("block", [
    pytest.param(block, id=f"README.md:{block.line}", marks=[pytest.mark.bpf] if block.needs_recording else [])
    for block in BLOCKS])
def test_readme_example(request, tmp_path, block):
    real = None
    if block.needs_recording:
        request.getfixturevalue("bpf_ready")
        real = request.getfixturevalue("demo_record")
    workdir = _workdir(tmp_path, real)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for example in block.examples:
        command, as_nobody = readmecheck.shell_command(example.command)
        argv = [*(NOBODY if as_nobody else []), "sh", "-c", command]
        proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
        stdout = readmecheck.normalize(proc.stdout, REPO, workdir)
        stderr = readmecheck.normalize(proc.stderr, REPO, workdir)
        problem = readmecheck.mismatch(block.mode, example.expected, stdout, stderr)
        assert problem is None, f"README.md:{block.line} `$ {example.command}`: {problem}"


def test_the_checker_fails_on_drift_and_passes_new_figures():
    """shape: numbers may change, names may not; exact: every line, nothing more."""
    expected = ("# Samples: 1010 of event 'cpu-clock', 499 Hz, 3.10 s", "    38.02%      384  demo  [.] hot_a")
    real = ["# Samples: 2012 of event 'cpu-clock', 999 Hz, 2.00 s", "  40.1%   807  demo  [.] hot_a", "extra"]
    assert readmecheck.mismatch("shape", expected, real, []) is None
    assert readmecheck.mismatch("shape", expected, [real[0].replace("event", "evnt"), real[1]], [])
    assert readmecheck.mismatch("shape", expected, [real[0]], [])  # a row gone
    assert readmecheck.mismatch("exact", ("a", "b"), ["a"], ["b"]) is None  # stdout and stderr interleave
    assert readmecheck.mismatch("exact", ("a",), ["a"], ["b"])  # a line more
    assert readmecheck.mismatch("exact", ('"lost": {"map full": 0}',), ['"lost": {}'], [])


def test_markers_and_commands_are_read_as_documented():
    text = "x\n<!-- checked: shape -->\n```\n$ sudo optrace doctor   # not root\nok\n\n$ optrace report\n```\n" \
           "```\n$ unmarked\n```\n"
    [block] = readmecheck.checked_blocks(text)
    assert block.mode == "shape" and [e.command for e in block.examples] == ["sudo optrace doctor   # not root",
                                                                             "optrace report"]
    assert block.examples[0].expected == ("ok", "")
    assert readmecheck.shell_command(block.examples[0].command) == ("optrace doctor", True)
    assert readmecheck.shell_command("optrace report -i x  # the demo") == ("optrace report -i x", False)
