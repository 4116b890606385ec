"""Fixtures of the replay tests: the replay library, built once per session (replay.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent / "python")]  # replay, snapshots, pythons


@pytest.fixture(scope="session")
def replay():
    from replay import Replay, build

    return Replay(build())
