"""Shared fixtures. BPF tests need root; under CI=true a missing capability fails instead of skipping."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import IN_CI, REPO, WORKLOADS, run_optrace


def missing_capability(reason: str) -> None:
    """Skip locally, fail in CI: in CI a BPF test that cannot run is a broken machine, not a pass."""
    if IN_CI:
        pytest.fail(f"CI=true and BPF is unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def bpf_ready() -> None:
    """Requires root and a BCC that compiles here (checked once per session)."""
    if os.geteuid() != 0:
        missing_capability("needs root")
    try:
        import bcc  # noqa: F401
    except ImportError:
        missing_capability("BCC (python3-bpfcc) is not importable")
    if not os.path.exists(f"/lib/modules/{os.uname().release}/build"):
        missing_capability("kernel headers for BCC are missing: run make setup")


@pytest.fixture(scope="session")
def workloads() -> Path:
    """The bundled C/C++ workloads, built once."""
    subprocess.run(["make", "-s", "-C", str(REPO / "workloads")], check=True)
    return WORKLOADS


@pytest.fixture
def optrace():
    return run_optrace


def pytest_collection_modifyitems(config, items):
    """A test that needs BPF (the ``bpf_ready`` fixture) is a ``bpf`` test, whether or not its module says so:
    ``make test-unit`` (``-m "not bpf"``) must never load a BPF program."""
    for item in items:
        if "bpf_ready" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.bpf)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true nothing is skipped silently: a skipped test (a missing tool or capability) fails."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {report.longrepr}"
