"""Issue 35: network clients that hold connections without finishing a request, in a process of their own
(slowclients.py), from many loopback addresses or from one, while `/metrics` is scraped from another
(127.0.0.1) on a new connection every 0.5 s: p99 of the scrapes' times at most 1 s over 40 scrapes. The
server and the scraper run first in line for the CPU (servekit.py): on a shared machine, other people's
work is not the server's slowness.

The threading server serve had before (128 handler threads, each held up to 60 s) failed 11 of 12 scrapes
beside 600 slowloris clients; on it these tests fail with every scrape timing out."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optrace.frontend.serve.httpserver import MAX_PER_ADDRESS
from serve.servekit import p99, script, stopped_by_a_line

pytestmark = pytest.mark.slow
SCRAPES = 40
SCRAPE_EVERY_S = 0.5  # 20 s in all: past HEAD_S, when the slowloris clients are cut and come back
SCRAPE_TIMEOUT_S = 3.0
P99_TARGET_S = 1.0
HERE = Path(__file__).parent


@pytest.mark.parametrize("count, mode, sources", [
    (1000, "slowloris", 100),  # a header line every 2-4 s each, from 100 addresses
    (3000, "connect", 100),  # connected, nothing sent
    (500, "connect", 1),  # from one address: it holds MAX_PER_ADDRESS, a new one pushes out its oldest
])
def test_scrapes_beside_clients_that_never_finish_a_request(count: int, mode: str, sources: int) -> None:
    seconds = 30 + SCRAPES * (SCRAPE_EVERY_S + SCRAPE_TIMEOUT_S)
    with stopped_by_a_line(script("servekit.py", "serve"), 60) as server:
        url = server.stdout.readline().strip()
        port = url.split(":")[2].split("/")[0]
        with stopped_by_a_line(script("slowclients.py", port, count, mode, sources, seconds), seconds) as clients:
            assert clients.stdout.readline() == "ready\n", "the clients did not get connected"
            scraper = subprocess.run([sys.executable, str(HERE / "servekit.py"), "scrape", url, str(SCRAPES),
                                      str(SCRAPE_EVERY_S), str(SCRAPE_TIMEOUT_S)], capture_output=True, text=True, timeout=seconds)
    report = json.loads(clients.output.strip().splitlines()[-1])
    scrapes = json.loads(scraper.stdout)
    times = scrapes["times"]
    ordered = sorted(times)
    print(f"{count} {mode} clients from {sources} address(es): scrapes median {ordered[len(ordered) // 2]:.3f} s, "
          f"p99 {p99(times):.3f} s, max {ordered[-1]:.3f} s; clients: {report}")
    assert len(times) == SCRAPES and p99(times) <= P99_TARGET_S, (ordered[-3:], scrapes["failures"][:3])
    if count <= sources * MAX_PER_ADDRESS:
        assert report["most_open"] >= count  # they were all held at once
    else:  # the per-address limit: the rest were pushed out as they came
        assert report["closed_by_server"] >= count - sources * MAX_PER_ADDRESS
