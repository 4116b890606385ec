"""Fixtures for the unwind-table tests: real binaries of the system, and workloads built without frame
pointers (with .eh_frame, and with only .debug_frame)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import framesinterp`

from support import REPO  # noqa: E402

SOURCES = REPO / "workloads"


def _gcc(out: Path, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", *flags, "-o", str(out), str(SOURCES / "calls.c")],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def omit_fp_binary(tmp_path_factory) -> Path:
    """workloads/calls.c built with -O2 -fomit-frame-pointer: CFI in .eh_frame only."""
    return _gcc(tmp_path_factory.mktemp("unwind") / "calls-nofp")


@pytest.fixture(scope="session")
def debug_frame_binary(tmp_path_factory) -> Path:
    """The same without .eh_frame: -g -fno-asynchronous-unwind-tables puts the CFI in .debug_frame."""
    return _gcc(tmp_path_factory.mktemp("unwind") / "calls-debugframe", "-g", "-fno-asynchronous-unwind-tables",
                "-fno-exceptions", "-fno-unwind-tables")
