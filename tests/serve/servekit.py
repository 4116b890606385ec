"""A serve daemon without BPF for the HTTP tests: a source of known samples, run on a thread, or in a
process of its own with a scraper in another (``python servekit.py serve`` / ``scrape URL COUNT EVERY
TIMEOUT``), each first in line for the CPU (nice -20 in an autogroup of its own), so that other work on a
shared machine does not count as the server's slowness."""
from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optrace.frontend.serve.daemon import ServeDaemon
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.frontend.serve.options import ServeOptions


class TickSource:
    """A source without BPF: every drain counts 10 samples of demo's hot_a."""

    event = "cpu-clock"

    def start(self) -> None:
        pass

    def collect(self, delta) -> None:
        delta.cpu_samples[("demo", "/w/demo", "hot_a")] += 10

    def close(self) -> None:
        pass


@contextmanager
def running_daemon(options: ServeOptions, sources: list | None = None) -> Iterator[tuple[ServeDaemon, str]]:
    """A ServeDaemon run on a thread until the block ends: yields (daemon, url)."""
    daemon = ServeDaemon(options, sources if sources is not None else [TickSource()])
    stop, urls = threading.Event(), []
    thread = threading.Thread(target=daemon.run, args=(stop,), kwargs={"on_ready": urls.append})
    thread.start()
    deadline = time.monotonic() + 10
    while not urls and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    try:
        yield daemon, urls[0]
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive()


def scrape_times(url: str, count: int, every_s: float, timeout_s: float) -> dict[str, list]:
    """Seconds each of ``count`` scrapes took, one every ``every_s`` on a new connection (a failed one counts
    as ``timeout_s``, its error in "failures")."""
    times, failures = [], []
    for _ in range(count):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                if response.status != 200 or b"optrace_drains_total" not in response.read():
                    raise OSError(f"HTTP {response.status} without the page")
            times.append(time.monotonic() - started)
        except OSError as error:
            times.append(timeout_s)
            failures.append(f"after {time.monotonic() - started:.1f} s: {error!r}")
        time.sleep(max(0.0, started + every_s - time.monotonic()))
    return {"times": times, "failures": failures}


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support import first_in_line

    first_in_line()
    if argv[0] == "scrape":
        print(json.dumps(scrape_times(argv[1], int(argv[2]), float(argv[3]), float(argv[4]))), flush=True)
        return
    with running_daemon(ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.5)) as (_, url):
        print(url, flush=True)
        sys.stdin.readline()  # a line, or the end: stop


if __name__ == "__main__":
    main(sys.argv[1:])
