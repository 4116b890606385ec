"""Fixtures for the uprobe tests."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def calls_links(workloads, tmp_path) -> tuple[Path, Path]:
    """(a symlink, a hard link) to workloads/build/calls. The hard link must be on the same file
    system, so it lives next to the binary and is removed afterwards."""
    link = tmp_path / "calls-symlink"
    link.symlink_to(workloads / "calls")
    hard = workloads / f"calls-hardlink-{os.getpid()}"
    if hard.exists():
        hard.unlink()
    os.link(workloads / "calls", hard)
    yield link, hard
    hard.unlink()
