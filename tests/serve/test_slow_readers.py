"""Issue 40, item 1, as the issue writes it: sockets that each shrink their receive buffer to the least, send
20 pipelined `GET /metrics` (no gzip, a ~90 KB page) and never read, 256 from each of 17 loopback addresses
and 300 more from the scraper's own address (127.0.0.1), kept up for the whole scrape run (a socket the
server closes is opened again 2-4 s later); without and with basic auth (the attackers send no password:
401s). A scraper takes `/metrics` on a new connection every 0.5 s from 127.0.0.1, 100 times. Targets: at
least 99 % of the scrapes succeed, their p99 at most 1 s, the server's RSS at most 100 MB during the attack
and at most 80 MB a minute after it; with basic auth, the server answers each attacking address no more 401s
than its burst and pace allow (refusals.py). Unpaced, the loop answered up to ~4,500 401s a second and the
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
import sys
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from optrace.frontend.serve.httpserver import REFUSAL_BURST, REFUSAL_RATE
from serve.servekit import p99, script, stopped_by_a_line

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
PAGE_SERIES = 600  # a page of about 90 KB
SCRAPES = 100
SCRAPE_EVERY_S = 0.5
SCRAPE_TIMEOUT_S = 3.0
P99_TARGET_S = 1.0
SUCCESS_TARGET = 0.99
RSS_DURING_MB = 100
RSS_AFTER_MB = 80
AFTER_S = 60
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


def web_config(folder: Path) -> tuple[Path, str]:
    config = folder / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    config.chmod(0o600)
    return config, f"prometheus:{PASSWORD}"


@pytest.mark.parametrize("auth", [False, True], ids=["open", "basic-auth"])
def test_scrapes_and_memory_beside_pipelined_slow_readers(auth: bool, tmp_path: Path) -> None:
    config, credentials = web_config(tmp_path) if auth else (None, "")
    seconds = 60 + SCRAPES * (SCRAPE_EVERY_S + SCRAPE_TIMEOUT_S)
    with stopped_by_a_line(script("servekit.py", "serve", PAGE_SERIES, *([config] if config else [])), 60) as server:
        url = server.stdout.readline().strip()
        port = url.split(":")[2].split("/")[0]
        time.sleep(1.5)  # a few drains: the page has its series
        before = rss_mb(server.pid)
        attack_began = time.monotonic()
        attackers = [script("slowclients.py", port, count, "pipeline", sources, seconds, *([origin] if origin else []))
                     for count, sources, origin in ATTACKERS]
        try:
            with RssWatch(server.pid) as watch:
                for attacker in attackers:
                    assert attacker.stdout.readline() == "ready\n", "the attackers did not get connected"
                scraper = subprocess.run([sys.executable, str(HERE / "servekit.py"), "scrape", url, str(SCRAPES),
                                          str(SCRAPE_EVERY_S), str(SCRAPE_TIMEOUT_S), credentials],
                                         capture_output=True, text=True, timeout=seconds)
                attack_s = time.monotonic() - attack_began
        finally:
            reports = [json.loads(attacker.communicate("stop\n", timeout=60)[0].strip().splitlines()[-1])
                       for attacker in attackers]
        time.sleep(AFTER_S)
        after = rss_mb(server.pid)
    scrapes = json.loads(scraper.stdout)
    times, failures = scrapes["times"], scrapes["failures"]
    ordered = sorted(times)
    print(f"\n{'auth' if auth else 'open'}: {SCRAPES - len(failures)} of {SCRAPES} scrapes, median "
          f"{ordered[len(ordered) // 2]:.3f} s, p99 {p99(times):.3f} s, max {ordered[-1]:.3f} s; server RSS "
          f"{before:.0f} MB before, {watch.peak_mb:.0f} MB peak, {after:.0f} MB {AFTER_S} s after; attackers: {reports}; "
          f"failures: {failures[:5]}; the server's own account at its peak: {scrapes['peaks']}")
    assert sum(report["opened"] for report in reports) >= 2 * sum(count for count, _, _ in ATTACKERS)  # cut, back again
    assert SCRAPES - len(failures) >= SUCCESS_TARGET * SCRAPES, failures[:5]
    assert p99(times) <= P99_TARGET_S, ordered[-5:]
    assert watch.peak_mb <= RSS_DURING_MB
    assert after <= RSS_AFTER_MB
    if auth:  # what the 401s cost: each client's burst, then its pace, whatever it asks (refusals.py)
        peaks = scrapes["peaks"]
        refused = sum(peaks[f'optrace_http_refusals_total{{pace="{pace}"}}'] for pace in ("at_once", "waited"))
        clients = sum(sources for _, sources, _ in ATTACKERS)
        assert refused <= clients * (REFUSAL_BURST + REFUSAL_RATE * attack_s)
