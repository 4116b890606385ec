"""Issue 40, item 5: what else a network client can try on serve, each as the attack is made, on real
sockets: request smuggling forms, a client that pipelines without end, a flood of /debug/pprof/profile
windows, heads that fill the server's memory, and clients spread over an IPv6 /64.

Before the fix (main 4e1d5cd), these broke: a GET or POST whose chunked body held another request had
that request answered too (the body was read when whole, then the connection kept alive); both
Transfer-Encoding and Content-Length were served; a head over the limit was served when its last read
completed it (h11 bounds an incomplete head only: a 20 KB header got a 200 past the 16 KiB limit); an
absolute-form target (`GET http://host/metrics`) got 404; one connection that pipelined without end kept
the event loop to itself (a second such client got 3,840 bytes of answers against the first's 13 MB in
8 s); eight pprof windows each kept their own 100,000 stacks (291 MB); request bytes were bounded per
connection only (16 KiB x 4,096). These held: two Content-Lengths (400), chunked garbage (closed after the
answer), obs-fold (unfolded into one header), a pprof flood (429 past the eight windows, scrapes
unaffected)."""
from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from optrace.frontend.serve import connlimits, httpserver, profilewindows
from optrace.frontend.serve.httpserver import ListenAddress, client_of
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve.profilewindows import ProfileWindows
from optrace.model import Frame, Sample
from serve.servekit import TickSource, p99, running_daemon, script, stopped_by_a_line

HERE = Path(__file__).parent
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def served():
    """serve's daemon in a process of its own, first in line for the CPU (servekit.py): its port."""
    with stopped_by_a_line(script("servekit.py", "serve", 50), 60) as server:
        url = server.stdout.readline().strip()
        time.sleep(0.5)
        yield int(url.split(":")[2].split("/")[0])


def exchange(port: int, data: bytes, wait_s: float = 3.0) -> tuple[list[bytes], bytes, bool]:
    """Sends ``data`` on a new connection and reads until the server closes it (or ``wait_s`` passes):
    (status lines, everything read, whether the server closed it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        got, closed = b"", False
        try:
            while chunk := sock.recv(65536):
                got += chunk
            closed = True
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass
    return [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")], got, closed


SMUGGLING = [
    # a body framed two ways: a proxy that goes by Content-Length sees one request, chunked sees two
    ("TE and CL", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
     + SMUGGLED, [b"400"]),
    # a whole chunked body, then a request: answered, closed, the rest never read
    ("GET with a chunked body", b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
     + SMUGGLED, [b"200"]),
    ("POST with a body", b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 36\r\n\r\n" + SMUGGLED, [b"405"]),
    ("two Content-Lengths", b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 36\r\n\r\n"
     + SMUGGLED, [b"400"]),
    ("chunked with garbage", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + SMUGGLED,
     [b"405"]),
    ("an unknown Transfer-Encoding", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"
     + SMUGGLED, [b"501"]),
    ("a space before the colon", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"
     + SMUGGLED, [b"400"]),
    ("a huge header", b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n", [b"431"]),
    ("a head just past the limit", b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * httpserver.MAX_HEAD_BYTES
     + b"\r\n\r\n", [b"431"]),
]


@pytest.mark.parametrize("name, data, statuses", SMUGGLING, ids=[case[0] for case in SMUGGLING])
def test_smuggling_forms_get_one_answer_and_a_close(served: int, name: str, data: bytes, statuses: list[bytes]):
    lines, got, closed = exchange(served, data)
    assert [line[9:12] for line in lines] == statuses, (name, got[-300:])
    assert b"not found" not in got and closed, (name, got[-300:])  # /smuggled was never answered


@pytest.mark.parametrize("target", [b"http://evil.example/metrics", b"HTTP://x:9/metrics?x=1"])
def test_an_absolute_target_is_served_by_its_path(served: int, target: bytes):
    lines, got, _ = exchange(served, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert lines == [b"HTTP/1.1 200 OK"] and b"optrace_drains_total" in got


def test_a_folded_header_is_one_header(served: int):
    lines, got, _ = exchange(served, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\nConnection: close\r\n\r\n")
    assert lines == [b"HTTP/1.1 200 OK"]


def test_pipelining_without_end_shares_the_loop(served: int):
    """Two connections that each pipeline requests without end and read every answer: each gets its share
    of the answers (a ratio within one run), and a scrape on a third gets through at once. They ask for
    the index page: 404s would be paced as refusals are (refusals.py)."""
    clients = [script("firehose.py", served, 8, "/") for _ in range(2)]
    for client in clients:
        assert client.stdout.readline() == "ready\n"
    time.sleep(1)
    started = time.monotonic()
    lines, _, _ = exchange(served, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    scrape_s = time.monotonic() - started
    got = [int(client.communicate(timeout=30)[0].split()[-1]) for client in clients]
    print(f"answer bytes each: {got}; a scrape beside them: {scrape_s:.3f} s")
    assert sum(got) > 200_000, "the clients did not get going: this run proves nothing"
    assert min(got) >= max(got) / 4
    assert lines == [b"HTTP/1.1 200 OK"] and scrape_s < 1.0


def test_request_bytes_stay_within_their_bound(monkeypatch):
    """Heads of 8 KiB less a byte, never finished, from 200 connections: past REQUEST_BYTES (64 KiB here)
    the connections holding them give way, oldest first; a scrape gets through."""
    monkeypatch.setattr(httpserver, "REQUEST_BYTES", 64 << 10)
    with running_daemon(ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.05), [TickSource()]) as (
            daemon, url):
        limits = daemon._server.limits
        socks, highest = [], 0
        try:
            for _ in range(200):
                sock = socket.create_connection(("127.0.0.1", daemon.address.port))
                sock.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (httpserver.MAX_HEAD_BYTES - 40))
                socks.append(sock)
                highest = max(highest, limits.request_held)
            time.sleep(0.5)
            lines, _, _ = exchange(daemon.address.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            held, cut = limits.request_held, limits.cut
        finally:
            for sock in socks:
                sock.close()
    assert lines == [b"HTTP/1.1 200 OK"]
    assert max(highest, held) <= 64 << 10 < 200 * (httpserver.MAX_HEAD_BYTES - 40)
    assert cut >= 150


def test_open_pprof_windows_share_one_bound(monkeypatch):
    """Eight windows (the most) on a machine where every sample is a new stack: together they keep at most
    MAX_WINDOW_STACKS stacks (1,000 here), each counting the rest as [stacks over the limit], every sample
    still counted; a window closed gives its share back."""
    monkeypatch.setattr(profilewindows, "MAX_WINDOW_STACKS", 1000)
    windows = ProfileWindows(99, lambda: "cpu-clock")
    functions = [Frame(f"f{i}", "/home/evil/bin/manystacks", address=0x1000 + 64 * i) for i in range(64)]
    bodies: list[bytes] = []
    collectors = [threading.Thread(target=lambda c=c: bodies.append(windows.collect(f"10.0.0.{c}", 60)))
                  for c in range(profilewindows.MAX_WINDOWS)]
    for collector in collectors:
        collector.start()
    while len(windows._open) < profilewindows.MAX_WINDOWS:
        time.sleep(0.01)
    rng = random.Random(40)
    for _ in range(10):
        samples = [Sample(7, "manystacks", tuple(rng.randrange(64) for _ in range(20)), 1) for _ in range(500)]
        windows.drained((functions, samples), time.monotonic())
    kept = [len(window.stacks) for window in windows._open]
    counted = [sum(window.stacks.values()) for window in windows._open]
    windows.drained(None, time.monotonic() + 100)  # their end
    for collector in collectors:
        collector.join(10)
    assert sum(kept) <= 1000 + profilewindows.MAX_WINDOWS, kept  # each: its stacks and its [over the limit]
    assert counted == [5000] * profilewindows.MAX_WINDOWS
    assert len(bodies) == profilewindows.MAX_WINDOWS and windows._budget.stacks == 1000


def test_a_pprof_flood_gets_429s_and_scrapes_go_on(served: int):
    """500 connections from 100 addresses each pipelining 20 profile requests (5 s windows): at most eight
    windows at a time, the rest 429 at once; scrapes beside them keep their p99 under 1 s."""
    flood = script("pprofflood.py", served, 500, 100, 12)
    assert flood.stdout.readline() == "ready\n"
    scraper = subprocess.run([sys.executable, str(HERE / "servekit.py"), "scrape",
                              f"http://127.0.0.1:{served}/metrics", "16", "0.5", "3"],
                             capture_output=True, text=True, timeout=60)
    statuses = json.loads(flood.communicate(timeout=60)[0].splitlines()[-1])
    times = json.loads(scraper.stdout)["times"]
    print(f"flood answers: {statuses}; scrapes p99 {p99(times):.3f} s")
    assert statuses.get("429", 0) > 100 and 0 < statuses.get("200", 0) <= profilewindows.MAX_WINDOWS * 3
    assert p99(times) <= 1.0


def test_clients_are_counted_by_address_and_ipv6_by_its_64():
    assert client_of("192.0.2.7") == "192.0.2.7"
    assert client_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_of("2001:db8:1:2:aaaa::1") == client_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_of("2001:db8:1:3::1") != client_of("2001:db8:1:2::1")
    assert client_of("fe80::1%eth0") == "fe80::/64"
    limits = connlimits.ConnectionLimits(per_address=2, total=100, request_bytes=1, answer_bytes=1)
    closed: list[int] = []
    for i in range(5):
        limits.admit(connlimits.Connection(client_of(f"2001:db8::{i + 1}"), lambda i=i: closed.append(i)))
    assert closed == [0, 1, 2] and limits.held() == 2
