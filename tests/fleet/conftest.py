"""The fleet of docs/fleet.md on one machine, shared by the fleet tests (Prometheus, pprof, OTLP).

Three `optrace serve` agents, each started from docs/fleet/serve.yaml on its own loopback address
(127.0.0.2-4: three hosts to Prometheus), all keeping only one workload's samples (`--comm`): a copy of
workloads/build/demo under a name of this session, running while the session lasts (hot_a: 40% of its
CPU). One real Prometheus scrapes them with docs/fleet/prometheus.yml's job and recording rule, every
second instead of every 15 s. Everything is started once for the tests of this folder, only on loopback,
and stopped when they are done.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import fleetkit`, `import alloysyntax`

from fleetkit import FLEET, FREQUENCY_HZ, HOSTS, Agent, Fleet, copy_workload, prometheus_config  # noqa: E402
from prometheusserver import Prometheus, running_prometheus, scraped_all  # noqa: E402
from serve.test_serve_bpf import await_serving, launch_serve  # noqa: E402
from support import first_in_line  # noqa: E402


@pytest.fixture(scope="session")
def agent_args() -> list[str]:
    """Arguments every agent gets besides docs/fleet/serve.yaml, its address and the workload's --comm."""
    return []


@pytest.fixture(scope="session")
def agent_env() -> dict[str, str]:
    """Environment variables every agent gets besides the tests' own (an OTLP receiver's address, say)."""
    return {}


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _stop(agent: Agent) -> int:
    if agent.served.process.poll() is None:
        return agent.served.stop()
    return agent.served.process.returncode


@pytest.fixture(scope="package")
def fleet(bpf_ready, workloads: Path, agent_args: list[str], agent_env: dict[str, str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three agents serving from docs/fleet/serve.yaml, and the workload they profile, running."""
    tmp = tmp_path_factory.mktemp("fleet")
    comm = f"flt{os.getpid()}"  # ours alone, even beside another session's fleet
    binary = copy_workload(workloads, tmp_path_factory.mktemp("fleet-workload"), comm)
    args = ["--config", str(FLEET / "serve.yaml"), "-F", str(FREQUENCY_HZ), "--comm", comm, *agent_args]
    env = {**os.environ, **agent_env}
    # three BCC compiles at once, ahead of the machine's other work
    launched = [launch_serve(args, _folder(tmp / host), f"{host}:0", env, first_in_line) for host in HOSTS]
    agents = tuple(Agent(host, await_serving(*started, 180)) for host, started in zip(HOSTS, launched))
    # CPU seconds: until killed; ahead of the machine's other work too, so that a busy shared machine leaves
    # it enough CPU for its shares to show in a few seconds
    workload = subprocess.Popen([str(binary), "3600"], stdout=subprocess.DEVNULL, preexec_fn=first_in_line)
    try:
        yield Fleet(agents, comm, workload)
    finally:
        workload.kill()
        workload.wait()
        codes = [_stop(agent) for agent in agents]
    assert codes == [0] * len(agents), [agent.served.stderr_path.read_text()[-2000:] for agent in agents]


@pytest.fixture(scope="package")
def prometheus(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Debian's Prometheus with docs/fleet/prometheus.yml (its file_sd listing the three agents) and
    optrace-rules.yml, scraping every second."""
    folder = tmp_path_factory.mktemp("prometheus")
    groups = [{"targets": [agent.target for agent in fleet.agents], "labels": {"role": "test"}}]
    config = prometheus_config(FLEET / "prometheus.yml", folder, groups)
    with running_prometheus(config, folder / "data") as server:
        yield scraped_all(server, len(fleet.agents))
