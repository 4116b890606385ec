"""Shared fixtures. BPF tests need root; under CI=true a missing capability fails instead of skipping."""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import IN_CI, REPO, WORKLOADS, run_optrace


def pytest_configure(config) -> None:
    """The suite's stored unwind tables are its own (a fresh directory per run), never those of root's
    real runs: a table converted by an older checkout is not one a test may meet."""
    if "OPTRACE_CACHE_DIR" not in os.environ:
        os.environ["OPTRACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="optrace-test-cache-")


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


@pytest.fixture
def fresh_program_cache(monkeypatch, tmp_path: Path) -> Path:
    """An empty cache directory of this test's: every BPF program it loads is compiled (bpf/programcache.py)."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("OPTRACE_CACHE_DIR", str(directory))
    return directory


@pytest.fixture(scope="session")
def workloads() -> Path:
    """The bundled C/C++ workloads, built once."""
    subprocess.run(["make", "-s", "-C", str(REPO / "workloads")], check=True)
    return WORKLOADS


@pytest.fixture
def optrace():
    return run_optrace


@pytest.fixture(scope="session")
def demo_record(bpf_ready: None, workloads: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real recording of the demo workload (`record -F 999 -- demo 3`: hot_a 40%, hot_b, lib_burn and
    the C++ method 20% each), shared by every test that only reads it: never write to it or next to it."""
    out = tmp_path_factory.mktemp("demo-record") / "demo.data"
    run_optrace("record", "-F", "999", "-o", str(out), "--", str(workloads / "demo"), "3", check=True, timeout=300)
    out.chmod(0o444)
    return out


@pytest.fixture(scope="session")
def jitcode_record(bpf_ready: None, workloads: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real recording of workloads/jitcode (`record -F 999 -- jitcode 2 0.7`: JIT code named only by the
    perf map it writes, and a native function), shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("jitcode-record") / "jit.data"
    run_optrace("record", "-F", "999", "-o", str(out), "--", str(workloads / "jitcode"), "2", "0.7", check=True,
                timeout=300)
    out.chmod(0o444)
    return out


@pytest.fixture(scope="session")
def shares_records(bpf_ready: None, workloads: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two real recordings of workloads/shares (`record -F 999 -- shares PCT 2`, PCT% of its CPU in share_a):
    30 then 70, shared by the tests that compare them."""
    folder = tmp_path_factory.mktemp("shares-records")
    records = []
    for pct in (30, 70):
        out = folder / f"shares{pct}.data"
        run_optrace("record", "-F", "999", "-o", str(out), "--", str(workloads / "shares"), str(pct), "2",
                    check=True, timeout=300)
        out.chmod(0o444)
        records.append(out)
    return records[0], records[1]


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


@pytest.fixture(autouse=True, scope="session")
def _jit_files_of_the_run() -> Iterator[set[Path]]:
    """The /tmp perf maps and jitdumps present before the run: kept (they are not the run's)."""
    yield set(Path("/tmp").glob("perf-*.map")) | set(Path("/tmp").glob("jit-*.dump"))


@pytest.fixture(autouse=True)
def _no_stale_jit_files(_jit_files_of_the_run: set[Path]) -> Iterator[None]:
    """After each test, the run's perf maps and jitdumps of processes that have exited go: workloads/jitcode
    leaves its map behind on purpose (a map read after its process exits), and a later test's new process
    that gets the same pid must not find it (CI: os.link onto /tmp/perf-PID.map failed with EEXIST)."""
    yield
    for path in list(Path("/tmp").glob("perf-*.map")) + list(Path("/tmp").glob("jit-*.dump")):
        pid = path.stem.split("-")[-1]
        if path not in _jit_files_of_the_run and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
