"""What the fleet tests share besides fixtures (conftest.py): the fleet's constants and records, and
docs/fleet's Prometheus config as the tests run it."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from prometheusserver import Prometheus
from serve.test_serve_bpf import Served
from support import REPO

FLEET = REPO / "docs" / "fleet"
# The series docs/fleet/optrace-rules.yml records, in cores: the dashboard, the docs and these tests query it,
# and only the rule names serve's CPU counter (a renamed counter is a change of that one line).
CPU_RULE = "optrace:cpu_cores:rate1m"
HOT = "hot_a"  # demo's hottest function: 40% of its CPU, the others 20% each
# The agents' -F (serve.yaml's is 99): demo runs its functions in rounds of about 10.1 ms of CPU, which a
# 99 Hz sampler (10.1 ms) meets at nearly the same point round after round: three agents sampling it at
# 99 Hz over the same 5 s saw hot_a at 33%, 42% and 46%. At 499 Hz, five samples fall in each round.
FREQUENCY_HZ = 499
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SCRAPE_S = 1  # the tests' scrape and rule interval (the docs' is 15 s)
K8S_LABEL = "app.kubernetes.io/name"  # the pod label prometheus-kubernetes.yml selects optrace's pods by


@dataclass(frozen=True)
class Agent:
    host: str  # the loopback address it listens on: its instance label in Prometheus
    served: Served

    @property
    def base(self) -> str:
        """http://HOST:PORT"""
        return self.served.url.removesuffix("/metrics")

    @property
    def target(self) -> str:
        """HOST:PORT, as a Prometheus target"""
        return urlsplit(self.served.url).netloc


@dataclass(frozen=True)
class Fleet:
    agents: tuple[Agent, ...]
    comm: str  # the workload's command name: the only one the agents keep
    workload: subprocess.Popen


def copy_workload(workloads: Path, folder: Path, name: str) -> Path:
    """demo and its libburn.so under a name of our own (found beside it through demo's $ORIGIN runpath)."""
    os.chmod(folder, 0o755)
    shutil.copy2(workloads / "demo", folder / name)
    shutil.copy2(workloads / "libburn.so", folder / "libburn.so")
    return folder / name


def discovery_from_file(config: dict, targets: Path) -> dict:
    """``config`` with each job's discovery (file or Kubernetes) replaced by a file_sd of ``targets``. Debian
    builds Prometheus without Kubernetes discovery: a file's target groups can carry the
    __meta_kubernetes_* labels it would set, and the job's relabeling runs on them as shipped."""
    for job in config["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs", []):
            assert sd["role"] == "pod" and sd["selectors"] == [{"role": "pod", "label": f"{K8S_LABEL}=optrace"}]
        job.pop("file_sd_configs", None)
        job["file_sd_configs"] = [{"files": [str(targets)]}]
    return config


def prometheus_config(source: Path, folder: Path, target_groups: list[dict]) -> Path:
    """``source`` (a docs/fleet config) as the tests run it: its jobs' relabeling and its rules unchanged,
    scraped and evaluated every second, its targets ``target_groups`` (discovery_from_file)."""
    targets = folder / "targets.yml"
    targets.write_text(yaml.safe_dump(target_groups))
    config = discovery_from_file(yaml.safe_load(source.read_text()), targets)
    config.setdefault("global", {})["evaluation_interval"] = f"{SCRAPE_S}s"
    config["rule_files"] = [str(source.parent / rules) for rules in config.get("rule_files", [])]
    for job in config["scrape_configs"]:
        job.update(scrape_interval=f"{SCRAPE_S}s", scrape_timeout=f"{SCRAPE_S * 900}ms")
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_history(prometheus: Prometheus, seconds: float) -> float:
    """Until Prometheus has held ``seconds`` of scrapes; the time to evaluate queries at (now)."""
    time.sleep(max(0.0, prometheus.since + seconds - time.time()))
    return time.time()
