"""A fleet on one machine: `optrace serve` agents on distinct loopback addresses (every 127.x.y.z answers on
loopback here), each pushing OTLP profiles to one receiver built on the generated gRPC servicer
(tests/otlpreceiver.py), and workloads under names no other process has.

Importable by name (pytest's pythonpath includes tests/): ``start_agent``, ``Agent``, ``demo_copy``,
``fake_container`` and the module-scoped ``otlp_fleet`` fixture (a receiver and three agents) are for
every fleet test (tests/fleet/): import the fixture into the test module to use it.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from otlpreceiver import GrpcReceiver
from support import bpf_prog_ids, first_in_line, still_loaded

OPTRACE = Path(sys.executable).parent / "optrace"
FLEET_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
AGENT_KEY = "optrace.agent"  # the resource attribute (OTEL_RESOURCE_ATTRIBUTES) that tells agents apart
CGROUP_PIDS = Path("/sys/fs/cgroup/pids")  # cgroup v1 here; the pids controller changes nothing for a workload


@dataclass
class Agent:
    """One serve agent: its process, its /metrics URL, its name in the resources it pushes."""

    name: str
    process: subprocess.Popen
    url: str
    stderr_path: Path
    prog_ids: set[int] = field(default_factory=set)

    def scrape(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url, timeout=10) as response:
            return response.read().decode()

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) * 1024

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def start_agent(address: str, args: list[str], tmp: Path, env: dict[str, str] | None = None,
                name: str | None = None, timeout: float = 180) -> Agent:
    """`optrace serve --listen ADDRESS:0 ARGS` with ``env`` added to this process's environment (OTEL_*
    variables), once it says where it serves; its resources carry optrace.agent=NAME (default: the address)."""
    name = name or address
    err_path = tmp / f"agent-{address}-{time.monotonic_ns()}.err"
    environ = {**os.environ, **(env or {})}
    environ["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(filter(None, (environ.get("OTEL_RESOURCE_ATTRIBUTES", ""),
                                                                   f"{AGENT_KEY}={name}")))
    with open(err_path, "w") as err:
        process = subprocess.Popen([str(OPTRACE), "serve", "--listen", f"{address}:0", *args], env=environ,
                                   stdout=subprocess.DEVNULL, stderr=err, preexec_fn=first_in_line)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving (\S+)", err_path.read_text())
        if found:
            return Agent(name, process, found.group(1), err_path, bpf_prog_ids(process.pid))
        if process.poll() is not None:
            raise AssertionError(f"optrace serve exited {process.returncode}: {err_path.read_text()}")
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"optrace serve did not start: {err_path.read_text()}")


def demo_copy(workloads: Path, folder: Path, name: str) -> Path:
    """workloads/build/demo (hot_a 40 %) as ``name`` (at most 15 bytes: its comm), with its libburn.so."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    shutil.copy2(workloads / "demo", folder / name)
    if not (folder / "libburn.so").exists():
        shutil.copy2(workloads / "libburn.so", folder / "libburn.so")
    return folder / name


@contextmanager
def fake_container() -> Iterator[tuple[str, Path]]:
    """A cgroup named as Docker names a container's (docker-<64 hex>.scope, in the pids hierarchy): a process
    moved into it reads as that container's in /proc/PID/cgroup. (id, the cgroup's folder); removed after."""
    container = secrets.token_hex(32)
    folder = CGROUP_PIDS / f"docker-{container}.scope"
    folder.mkdir()
    try:
        yield container, folder
    finally:
        for _ in range(50):  # its processes must have exited first
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def workload(argv: list[str], cgroup: Path | None = None) -> subprocess.Popen:
    """``argv`` ahead of the machine's other work (benchlib.first_in_line: other sessions' benchmarks run at
    nice -20 too), inside the cgroup ``cgroup`` if given (a shell moves itself there, then execs it)."""
    if cgroup is not None:
        argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, preexec_fn=first_in_line)


@contextmanager
def workloads_running(*runs: tuple[list[str], Path | None], timeout: float = 120) -> Iterator[list[subprocess.Popen]]:
    """Workloads started at once; the block waits for them; none is left running, whatever happens."""
    started = [workload(argv, cgroup) for argv, cgroup in runs]
    try:
        yield started
    finally:
        for process in started:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Fleet:
    receiver: GrpcReceiver
    agents: list[Agent]
    tmp: Path


FLEET_HZ = 499  # demo's 2 s of CPU are ~1,000 samples: its shares within a few points
# A whole-machine interval here is 0.1-0.3 MB: 1 MiB holds a few, so none is dropped while the receiver
# is up, and a receiver down for half a minute fills it.
QUEUE_BYTES = 1 << 20
FLEET_ARGS = ["-F", str(FLEET_HZ), "--otlp-interval", "2", "--otlp-queue-bytes", str(QUEUE_BYTES)]


@pytest.fixture(scope="module")
def otlp_fleet(bpf_ready, tmp_path_factory) -> Iterator[Fleet]:
    """One gRPC receiver on 127.0.0.1 and three whole-machine agents on 127.0.0.2-4 pushing to it
    (OTEL_EXPORTER_OTLP_ENDPOINT, 2 s intervals, a 1 MiB queue); probes gone after."""
    tmp = tmp_path_factory.mktemp("fleet")
    receiver = GrpcReceiver()
    agents: list[Agent] = []
    try:
        for address in FLEET_ADDRESSES:
            agents.append(start_agent(address, FLEET_ARGS, tmp, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}))
        yield Fleet(receiver, agents, tmp)
    finally:
        held = set().union(*(agent.prog_ids for agent in agents)) if agents else set()
        for agent in agents:
            agent.stop()
        receiver.stop()
        assert not still_loaded(held), "an agent left BPF programs behind"
