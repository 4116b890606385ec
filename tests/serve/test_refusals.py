"""Issue 40, item 1 with basic auth on: refusals (4xx, a 401 without credentials above all) are paced per
client (frontend/serve/refusals.py), so that a flood of requests without a password costs serve's event
loop less than the scrapes beside it. tests/serve/test_slow_readers.py[basic-auth] is the attack itself
(on main before refusals.py, at load 13: p99 1.09 s, 204,818 401s in 45 s; 0.012 s after); here, what
the pacing promises, on real sockets and on its own."""
from __future__ import annotations

import asyncio
import base64
import re
import socket
import time
from pathlib import Path

from optrace.frontend.serve import httpserver
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve.refusals import RefusalPace
from optrace.frontend.serve.webconfig import load_web_config
from serve.servekit import TickSource, running_daemon
from serve.test_slow_readers import web_config

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def test_refusals_past_a_burst_wait_their_clients_turn():
    async def paced() -> None:
        pace = RefusalPace(rate=2.0, burst=3, clients=2)
        assert [pace.turn("a", 0.0) for _ in range(3)] == [None] * 3
        waiting = [pace.turn("a", 0.0) for _ in range(3)]
        assert all(waiter is not None and not waiter.done() for waiter in waiting)
        assert pace.turn("b", 0.0) is None  # a client of its own, a burst of its own
        waiting[0].cancel()  # its connection was cut while it waited: no turn is spent on it
        pace.release(0.5)  # one turn (2 a second)
        assert [waiter.done() and not waiter.cancelled() for waiter in waiting] == [False, True, False]
        pace.release(1.0)
        assert waiting[2].done()
        assert (pace.at_once, pace.waited) == (4, 2)
        late = pace.turn("a", 1.0)  # no turn left
        assert late is not None and pace.turn("b", 1.0) is None
        assert pace.turn("c", 1.0) is None  # a third client: "a", the least recently refused, is forgotten ...
        assert late.done()  # ... its waiters let go

    asyncio.run(paced())


def answers(sock: socket.socket, wait_s: float) -> list[bytes]:
    """The statuses of the answers that came within ``wait_s``."""
    got, deadline = b"", time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return re.findall(rb"HTTP/1\.1 \d{3}", got)


def test_a_client_without_password_gets_its_burst_and_a_scrape_beside_it_goes_on(tmp_path: Path, monkeypatch):
    """40 pipelined requests without a password: REFUSAL_BURST 401s at once, the rest at REFUSAL_RATE (0.01
    a second here: none within the test); a scrape with the password from the same address is answered
    meanwhile, and the server counts what it did."""
    monkeypatch.setattr(httpserver, "REFUSAL_RATE", 0.01)
    config, credentials = web_config(tmp_path)
    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.05, web=load_web_config(config))
    with running_daemon(options, [TickSource()]) as (daemon, _):
        port = daemon.address.port
        with socket.create_connection(("127.0.0.1", port)) as refused:
            refused.sendall(REQUEST * 40)
            burst = answers(refused, 2.0)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as scraper:
                auth = base64.b64encode(credentials.encode())
                scraper.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + auth
                                + b"\r\nConnection: close\r\n\r\n")
                scraped = answers(scraper, 10.0)
        pace = daemon._server.refusals
    assert burst == [b"HTTP/1.1 401"] * httpserver.REFUSAL_BURST
    assert scraped == [b"HTTP/1.1 200"]
    assert (pace.at_once, pace.waited) == (httpserver.REFUSAL_BURST, 0)
