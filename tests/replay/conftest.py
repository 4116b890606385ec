"""Fixtures of the replay tests: the replay library, built once per session (replay.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "python"), str(HERE.parents[1] / "bench")]  # replay, snapshots, pythons, sidroot


@pytest.fixture(scope="session")
def replay():
    from replay import Replay, build

    return Replay(build())
