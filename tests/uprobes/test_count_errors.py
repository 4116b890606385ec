"""Every bad input to `optrace count`: one line on stderr, a non-zero exit, no traceback, nothing attached."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import WORKLOADS

OPTRACE = Path(sys.executable).parent / "optrace"


def assert_one_line_error(proc, pattern: str) -> None:
    import re

    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("optrace: ") and re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("args, pattern", [
    (["/no/such/binary:main"], r"no such file: /no/such/binary"),
    (["/etc/passwd:main"], r"/etc/passwd is not an ELF executable or library"),
    (["c:mallok"], r"no function 'mallok' in \S+libc\.so\.6: did you mean malloc"),
    (["c:zzzz*"], r"no function in \S+libc\.so\.6 matches 'zzzz\*'"),
    ([f"{WORKLOADS}/demo:demo::Hasher::mixx"], r"no function 'demo::Hasher::mixx' in \S+/demo: "
                                               r"did you mean demo::Hasher::mix\(double\)\?$"),
    ([f"{WORKLOADS}/demo:_ZN4demo6Hasher3mixEx"], r"did you mean demo::Hasher::mix\(double\)\?$"),
    ([f"{WORKLOADS}/demo:demo::Nothing::*"], r"no function in \S+/demo matches 'demo::Nothing::\*'"),
    (["c:*"], r"'c:\*' matches \d+ functions, more than the limit of 1000: .*--max-probes"),
    (["c:str*", "--max-probes", "3"], r"more than the limit of 3"),
    (["c:labs", "-p", "999999999"], r"no such process: 999999999"),
    (["c:labs", "--cumulative"], r"--cumulative goes with -i INTERVAL"),
    (["c"], r"bad probe 'c': expected BINARY:SYMBOL"),
    ([], r"no probe given"),
    (["nosuchlibrary42:f"], r"'nosuchlibrary42' is neither a library"),
    (["c:labs", "--", "no-such-command-42"], r"command not found: no-such-command-42"),
    (["c:labs", "-p", "1", "--", "true"], r"either -p PID or -- CMD"),
])
def test_bad_input(optrace, args, pattern):
    assert_one_line_error(optrace("count", *args), pattern)


def test_not_root():
    """Run as nobody (setpriv drops root): refused before anything is loaded."""
    command = [str(OPTRACE), "count", "c:labs", "-d", "1"]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop root"
        command = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert_one_line_error(proc, r"root|CAP_BPF")
