"""Issue 40, item 1, as the issue writes it: sockets that each shrink their receive buffer to the least, send
20 pipelined `GET /metrics` (no gzip, a ~90 KB page) and never read, 256 from each of 17 loopback addresses
and 300 more from the scraper's own address (127.0.0.1), kept up for the whole scrape run (a socket the
server closes is opened again 2-4 s later); without and with basic auth (the attackers send no password:
401s): both at once, an open server and one with basic auth, each with attackers and a scraper of its
own (one after the other, the two took 230 s of the suite's time; together, one scrape run, then the
RSS held to its bound for SETTLED_S once under it, AFTER_S after the attack at the latest). A scraper
takes `/metrics` on a new connection every 0.5 s from 127.0.0.1, 100 times. Targets: at least 99 % of
the scrapes succeed, their p99 at most 1 s, the server's RSS at most 100 MB during the attack and at most
80 MB a minute after it; with basic auth, the server answers each attacking address no more 401s than its
burst and pace allow (refusals.py). Unpaced, the loop answered up to ~4,500 401s a second and the
scrapes' p99 went from 0.02 to 1.25 s from run to run (the attacker, not first in line for the CPU, sends
less on a busier machine), so the p99 alone does not show it; paced, 0.007-0.012 s. The server is serve's
daemon and HTTP server in a process of their own, set up as `optrace serve` is, with a source that makes a
90 KB page instead of BPF (tests/serve/servekit.py; tests/hostile/test_serve_flood.py runs the same attack
against root's real `optrace serve`).

On main before the fix (4e1d5cd): an answer blocked by a client that does not read was never cut before 60
s, held its copy of the page, and never gave way to a new connection: 1 of 91 scrapes succeeded and the
server reached 575 MB (the issue's figures)."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import pytest

from optrace.frontend.serve.httpserver import REFUSAL_BURST, REFUSAL_RATE
from serve.servekit import p99, script, stopped_by_a_line

pytestmark = pytest.mark.slow
PAGE_SERIES = 600  # a page of about 90 KB
SCRAPES = 100
SCRAPE_EVERY_S = 0.5
SCRAPE_TIMEOUT_S = 3.0
P99_TARGET_S = 1.0
SUCCESS_TARGET = 0.99
RSS_DURING_MB = 100
RSS_AFTER_MB = 80
AFTER_S = 60  # the RSS must be under RSS_AFTER_MB this long after the attack at the latest ...
SETTLED_S = 10  # ... and stay under it this long (then the minute need not be waited out)
ATTACKERS = [(4352, 17, None), (300, 1, "127.0.0.1")]  # (sockets, source addresses, the one address)
PASSWORD = "correct horse battery staple"


class RssWatch:
    """The largest RSS a process reached while the block ran (sampled every 0.2 s)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mb, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_mb = max(self.peak_mb, rss_mb(self.pid))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def settle(pids: list[int]) -> float:
    """Seconds from now until the RSS of each of ``pids`` had been at most RSS_AFTER_MB for SETTLED_S (sampled
    every 0.5 s), or AFTER_S when it was not by then: the issue's bound a minute after the attack, without
    waiting the minute out when the memory came back sooner."""
    began, under_since = time.monotonic(), None
    while True:
        now = time.monotonic()
        if any(rss_mb(pid) > RSS_AFTER_MB for pid in pids):
            under_since = None
        elif under_since is None:
            under_since = now
        if now - began >= AFTER_S or under_since is not None and now - under_since >= SETTLED_S:
            return now - began
        time.sleep(0.5)


def web_config(folder: Path) -> tuple[Path, str]:
    config = folder / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    config.chmod(0o600)
    return config, f"prometheus:{PASSWORD}"


@dataclass
class Attacked:
    """One server under the attack: its URL, RSS before, its watch, its attackers and scraper, and what they said."""

    auth: bool
    server: subprocess.Popen
    url: str
    before: float = 0.0
    watch: RssWatch | None = None
    attackers: list[subprocess.Popen] = field(default_factory=list)
    scraper: subprocess.Popen | None = None
    reports: list[dict] = field(default_factory=list)
    scrapes: dict = field(default_factory=dict)
    after: float = 0.0

    @property
    def name(self) -> str:
        return "auth" if self.auth else "open"

    def attack(self, seconds: float) -> None:
        port = self.url.split(":")[2].split("/")[0]
        self.attackers = [script("slowclients.py", port, count, "pipeline", sources, seconds, *([origin] if origin else []))
                          for count, sources, origin in ATTACKERS]


def test_scrapes_and_memory_beside_pipelined_slow_readers(tmp_path: Path) -> None:
    """One attack at once against an open server and one with basic auth (each its own process, attackers and
    scraper): one run of the scrapes and one minute after, for both (the two took 230 s one after the other)."""
    config, credentials = web_config(tmp_path)
    seconds = 60 + SCRAPES * (SCRAPE_EVERY_S + SCRAPE_TIMEOUT_S)
    with ExitStack() as stack:
        servers = []
        for auth in (False, True):
            server = stack.enter_context(stopped_by_a_line(script("servekit.py", "serve", PAGE_SERIES,
                                                                  *([config] if auth else [])), 60))
            servers.append(Attacked(auth, server, ""))
        for each in servers:
            each.url = each.server.stdout.readline().strip()
        time.sleep(1.5)  # a few drains: the page has its series
        for each in servers:
            each.before = rss_mb(each.server.pid)
        attack_began = time.monotonic()
        for each in servers:
            each.attack(seconds)
        try:
            for each in servers:
                each.watch = stack.enter_context(RssWatch(each.server.pid))
                for attacker in each.attackers:
                    assert attacker.stdout.readline() == "ready\n", "the attackers did not get connected"
            for each in servers:
                each.scraper = script("servekit.py", "scrape", each.url, SCRAPES, SCRAPE_EVERY_S, SCRAPE_TIMEOUT_S,
                                      credentials if each.auth else "")
            for each in servers:
                each.scrapes = json.loads(each.scraper.communicate(timeout=seconds)[0])
            attack_s = time.monotonic() - attack_began
        finally:
            for each in servers:
                each.reports = [json.loads(attacker.communicate("stop\n", timeout=60)[0].strip().splitlines()[-1])
                                for attacker in each.attackers]
        for each in servers:
            each.watch.stop()
        settled_s = settle([each.server.pid for each in servers])
        for each in servers:
            each.after = rss_mb(each.server.pid)
    for each in servers:
        times, failures = each.scrapes["times"], each.scrapes["failures"]
        ordered = sorted(times)
        print(f"\n{each.name}: {SCRAPES - len(failures)} of {SCRAPES} scrapes, median {ordered[len(ordered) // 2]:.3f} s, "
              f"p99 {p99(times):.3f} s, max {ordered[-1]:.3f} s; server RSS {each.before:.0f} MB before, "
              f"{each.watch.peak_mb:.0f} MB peak, {each.after:.0f} MB {settled_s:.0f} s after; attackers: {each.reports}; "
              f"failures: {failures[:5]}; the server's own account at its peak: {each.scrapes['peaks']}")
    for each in servers:
        times, failures = each.scrapes["times"], each.scrapes["failures"]
        assert sum(report["opened"] for report in each.reports) >= 2 * sum(count for count, _, _ in ATTACKERS), each.name
        assert SCRAPES - len(failures) >= SUCCESS_TARGET * SCRAPES, (each.name, failures[:5])
        assert p99(times) <= P99_TARGET_S, (each.name, sorted(times)[-5:])
        assert each.watch.peak_mb <= RSS_DURING_MB, each.name
        assert each.after <= RSS_AFTER_MB, each.name
    # with basic auth, what the 401s cost: each client's burst, then its pace, whatever it asks (refusals.py)
    peaks = servers[1].scrapes["peaks"]
    refused = sum(peaks[f'optrace_http_refusals_total{{pace="{pace}"}}'] for pace in ("at_once", "waited"))
    clients = sum(sources for _, sources, _ in ATTACKERS)
    assert refused <= clients * (REFUSAL_BURST + REFUSAL_RATE * attack_s)
