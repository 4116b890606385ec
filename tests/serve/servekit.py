"""A serve daemon without BPF for the HTTP tests: a source of known samples, run on a thread, or in a
process of its own with a scraper in another (``python servekit.py serve [SERIES [WEB_CONFIG]]`` /
``scrape URL COUNT EVERY TIMEOUT [USER:PASSWORD]``), each first in line for the CPU (nice -20 in an
autogroup of its own), so that other work on a shared machine does not count as the server's slowness.
The daemon's process is set up as `optrace serve`'s (one malloc arena, large blocks mapped): its memory is
serve's, less the BPF side."""
from __future__ import annotations

import base64
import json
import math
import subprocess
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
from optrace.frontend.serve.webconfig import WebConfig, load_web_config
from optrace.heap import large_blocks_mapped, one_arena


class TickSource:
    """A source without BPF: every drain counts 10 samples of demo's hot_a, and of ``series`` more symbols
    (a page of about 150 bytes a series: 600 make the ~90 KB page of issue 40)."""

    event = "cpu-clock"

    def __init__(self, series: int = 0) -> None:
        self.names = [("demo", "/w/demo", "hot_a")] + [
            ("worker", "/usr/lib/x86_64-linux-gnu/libworker.so.1", f"worker::Pool::run_task_{i}") for i in range(series)]

    def start(self) -> None:
        pass

    def collect(self, delta) -> None:
        for name in self.names:
            delta.cpu_samples[name] += 10

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


def scrape_times(url: str, count: int, every_s: float, timeout_s: float, credentials: str = "") -> dict[str, list]:
    """Seconds each of ``count`` scrapes took, one every ``every_s`` on a new connection (a failed one counts
    as ``timeout_s``, its error in "failures"); with ``credentials`` (USER:PASSWORD), basic auth. "peaks":
    the largest value each series of the HTTP server's own metrics (``optrace_http_*``) showed."""
    times, failures, peaks = [], [], {}
    headers = {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()} if credentials else {}
    for _ in range(count):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
                page = response.read()
                if response.status != 200 or b"optrace_drains_total" not in page:
                    raise OSError(f"HTTP {response.status} without the page")
            times.append(time.monotonic() - started)
            for line in page.decode().splitlines():
                if line.startswith("optrace_http_"):
                    series, _, value = line.rpartition(" ")
                    peaks[series] = max(peaks.get(series, 0.0), float(value))
        except OSError as error:
            times.append(timeout_s)
            failures.append(f"after {time.monotonic() - started:.1f} s: {error!r}")
        time.sleep(max(0.0, started + every_s - time.monotonic()))
    return {"times": times, "failures": failures, "peaks": peaks}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def script(name: str, *args: object, **kw) -> subprocess.Popen:
    """tests/serve/NAME run with ARGS in a process of its own (stdin and stdout piped, as text)."""
    return subprocess.Popen([sys.executable, str(Path(__file__).parent / name), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


@contextmanager
def stopped_by_a_line(process: subprocess.Popen, timeout: float) -> Iterator[subprocess.Popen]:
    """``process`` until the block ends, then a line on its stdin, which stops it; its output is in
    ``process.output`` then."""
    try:
        yield process
    finally:
        process.output, _ = process.communicate("stop\n", timeout=timeout)


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support import first_in_line

    first_in_line()
    if argv[0] == "scrape":
        print(json.dumps(scrape_times(argv[1], int(argv[2]), float(argv[3]), float(argv[4]), *argv[5:6])), flush=True)
        return
    one_arena()  # as `optrace serve` does before any thread (frontend/commands/serve.py)
    large_blocks_mapped()
    series = int(argv[1]) if len(argv) > 1 else 0
    web = load_web_config(argv[2]) if len(argv) > 2 else WebConfig()
    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.5, web=web)
    with running_daemon(options, [TickSource(series)]) as (_, url):
        print(url, flush=True)
        sys.stdin.readline()  # a line, or the end: stop


if __name__ == "__main__":
    main(sys.argv[1:])
