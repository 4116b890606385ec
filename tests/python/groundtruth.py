"""workloads/pyground.py as ground truth: its functions' inclusive shares in folded stacks (optrace's or
py-spy's raw output, which name a Python frame alike: ``tokenize (/path/pyground.py:30)``) and the shares
it accounted for itself between two marks (SIGUSR1)."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from support import REPO

PYGROUND = REPO / "workloads" / "pyground.py"
DESIGNED = ("tokenize", "encode_all", "decode_all", "checksum")  # the workload accounts for these
NAMED = (*DESIGNED, "rank")
PYGROUND_FRAME = re.compile(r"^(\w+) \((?:.*/)?pyground\.py:\d+\)$")

Stacks = list[tuple[list[str], int]]


def parse_folded(text: str) -> Stacks:
    """(frames root first, samples) per line of folded text."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def inclusive(stacks: Stacks) -> tuple[dict[str, float], int]:
    """Percent of the samples whose stack holds each of NAMED (once per sample), and the samples."""
    total, holding = 0, Counter()
    for frames, count in stacks:
        total += count
        held = {match.group(1) for match in map(PYGROUND_FRAME.match, frames) if match}
        holding.update({name: count for name in held & set(NAMED)})
    return {name: 100.0 * holding[name] / total if total else 0.0 for name in NAMED}, total


def design_between(report: Path) -> dict[str, float]:
    """Percent of the CPU time the workload spent in each function between its last two marks."""
    marks = json.loads(report.read_text())["marks"]
    assert len(marks) >= 2, marks
    spent = {name: marks[-1][name] - marks[-2][name] for name in DESIGNED}
    return {name: 100.0 * seconds / sum(spent.values()) for name, seconds in spent.items()}


def has_pyground_frame(frames: list[str]) -> bool:
    return any(PYGROUND_FRAME.match(frame) for frame in frames)
