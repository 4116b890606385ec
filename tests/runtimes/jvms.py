"""The JDKs the HotSpot tests run (Debian's OpenJDK 17, Temurin 25) and the ground-truth workload's design."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "workloads" / "java" / "Phases.java"
JDKS = {"17": "/usr/lib/jvm/java-17-openjdk-amd64/bin", "25": "/usr/lib/jvm/temurin-25-jdk-amd64/bin"}
# workloads/java/Phases.java: phase method -> its share of the time (the rest is main's loop, negligible)
PHASES = {"Phases.hashPhase": 0.5, "Phases.sortPhase": 0.3, "Phases.scanPhase": 0.2}


def main_lines() -> range:
    """The lines of Phases.main's body (its frame's line is one of them)."""
    lines = WORKLOAD.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "public static void main" in line)
    last = next(i for i, line in enumerate(lines, 1) if i > first and line.strip() == "}")
    return range(first + 1, last)


def java(jdk: str) -> Path:
    found = Path(JDKS[jdk]) / "java"
    if not found.exists():
        pytest.skip(f"JDK {jdk} is not installed ({found})")
    return found


@contextmanager
def running(jdk: str, classes: Path, seconds: float, *flags: str) -> Iterator[subprocess.Popen]:
    """Phases running on JDK ``jdk`` (started, "ready" printed) for the block, killed after."""
    proc = subprocess.Popen([str(java(jdk)), *flags, "-cp", str(classes), "Phases", str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise AssertionError(f"JDK {jdk}: Phases did not start")
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def phase_of(names: list[str]) -> str | None:
    """The design's phase a stack (innermost first) is in."""
    return next((name for name in reversed(names) if name in PHASES), None)
