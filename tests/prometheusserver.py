"""Debian's Prometheus (and promtool), started by a test on loopback: the reference scraper of serve's /metrics.

Prometheus does not print an ephemeral port, so its address is found from its listening socket in /proc."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from support import IN_CI, first_in_line


def need(tool: str) -> str:
    """The path of ``prometheus`` or ``promtool`` (skip locally, fail in CI: make setup installs them)."""
    path = shutil.which(tool)
    if path is None:
        if IN_CI:
            pytest.fail(f"{tool} is missing: make setup installs Debian's prometheus")
        pytest.skip(f"{tool} is missing: run make setup (Debian's prometheus)")
    return path


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([need("promtool"), *args], capture_output=True, text=True, timeout=60)


def socket_inodes(pid: int) -> set[str]:
    """Inodes of a process's sockets; its fds come and go while this reads them."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening_address(process: subprocess.Popen) -> str:
    """http://127.0.0.1:PORT of the process's listening TCP socket, or "" before it listens."""
    inodes = socket_inodes(process.pid)
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            return f"http://127.0.0.1:{int(fields[1].split(':')[1], 16)}"
    return ""


def ready(process: subprocess.Popen) -> str:
    """Prometheus listens before its storage is open and answers queries 503 until then: its base URL once
    /-/ready answers 200, else ""."""
    base = listening_address(process)
    if not base:
        return ""
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as response:
            return base if response.status == 200 else ""
    except OSError:  # HTTPError 503 is an OSError too
        return ""


def api(base: str, path: str, **params: str) -> dict | list:
    """The ``data`` of a successful /api/v1/PATH answer."""
    url = f"{base}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def query(base: str, promql: str, at: float | None = None) -> list[dict]:
    """The result vector of an instant query (at ``at``, a Unix time, or now)."""
    params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
    return api(base, "query", **params)["result"]


@dataclass(frozen=True)
class Prometheus:
    process: subprocess.Popen
    base: str
    since: float  # time.time() from which it holds data (scraped_all: when its first scrapes were in)


@contextmanager
def running_prometheus(config: Path, data: Path, timeout: float = 60) -> Iterator[Prometheus]:
    """Prometheus with ``config``, its storage in ``data``, on a free loopback port, ahead of the machine's
    other work (a scrape late on a busy machine is a missing point); stopped afterwards."""
    log = data.with_name(data.name + ".log")
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [need("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
             "--web.listen-address=127.0.0.1:0", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=sink, preexec_fn=first_in_line)
    try:
        deadline = time.monotonic() + timeout
        while not (base := ready(process)):
            assert process.poll() is None, f"prometheus exited {process.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "prometheus was not ready in time"
            time.sleep(0.2)
        yield Prometheus(process, base, time.time())
    finally:
        process.terminate()
        process.wait(20)


def scraped_all(server: Prometheus, targets: int, timeout: float = 60) -> Prometheus:
    """``server`` once each of its ``targets`` has been scraped (a new target list takes Prometheus up to 5 s
    to act on), its history counted from then."""
    deadline = time.monotonic() + timeout
    while len(query(server.base, "up == 1")) < targets:
        assert time.monotonic() < deadline, f"prometheus did not scrape {targets} targets: {query(server.base, 'up')}"
        time.sleep(0.2)
    return replace(server, since=time.time())
