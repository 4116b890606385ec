"""Fixtures of the runtime tests: the JDKs of this machine and the Java ground-truth workload compiled once."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "replay")]  # jvms, javasnapshots, snapshots

from jvms import JDKS, WORKLOAD  # noqa: E402


@pytest.fixture(scope="session")
def phases_classes(tmp_path_factory) -> Path:
    """workloads/java/Phases.java compiled (by JDK 17's javac: its classes run on both JDKs)."""
    javac = shutil.which("javac") or str(Path(JDKS["17"]) / "javac")
    if not Path(javac).exists():
        pytest.skip("no javac (JDK 17)")
    out = tmp_path_factory.mktemp("phases")
    subprocess.run([javac, "-d", str(out), str(WORKLOAD)], check=True)
    return out
