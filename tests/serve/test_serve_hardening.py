"""What a hostile or careless client, or a hostile file, can do to `optrace serve` (issue 8), without BPF:
bounded label values, idle series expiry, contained drain failures, HEAD, 1,000 concurrent scrapes,
trickling clients, and reload of the settings."""
from __future__ import annotations

import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from serve.servekit import TickSource
from optrace.frontend.serve import httpserver
from optrace.frontend.serve.connlimits import Connection, ConnectionLimits
from optrace.frontend.serve.cardinality import CUT_MARK, MAX_LABEL_CHARS, bound_label
from optrace.frontend.serve.daemon import ServeDaemon
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.frontend.serve.metricspage import ExporterInfo, MetricsPage
from optrace.bpf.profiler import DrainResult
from optrace.frontend.serve.sources import ProfileSource
from optrace.frontend.serve.totals import Delta, ExporterTotals
from optrace.model import Frame, RawSample, Sample, UserFrame
from serve.slowclients import source_address

CPU = "optrace_cpu_seconds_total"  # samples / 99 Hz here


# -- label values and series ----------------------------------------------------------------------------
def test_label_values_are_cut_and_control_characters_replaced():
    assert bound_label("x" * MAX_LABEL_CHARS) == "x" * MAX_LABEL_CHARS
    cut = bound_label("y" * (MAX_LABEL_CHARS + 1))
    assert len(cut) == MAX_LABEL_CHARS and cut.endswith(CUT_MARK) and cut.startswith("y" * 200)
    assert bound_label("\x1b]0;owned\x07\x1b[2Jname\r\n\x00") == "?]0;owned??[2Jname???"
    assert bound_label("caf\u00e9 \u2603") == "caf\u00e9 \u2603"  # printable non-ASCII stays


def test_a_million_long_names_cost_bounded_series_page_and_label_length(expo):
    """The issue's perf map of 1,000,000 distinct 200-byte names, as drains of 10,000 names each,
    plus names with terminal escapes: at most --max-series series, a page of a few MB, no escape."""
    totals = ExporterTotals(max_series=10000)
    for drain in range(100):
        delta = Delta()
        for i in range(10000):
            delta.cpu_samples[("java", "[jit]", f"L{drain}_{i}_" + "n" * 190 + "\x1b[2J")] = 1
        totals.apply(delta, drain_seconds=0)
    text = MetricsPage(totals, ExporterInfo(99, "cpu-clock")).render().decode()
    series = expo.samples(text, CPU)
    assert len(series) == 9501  # 9,500 regular series and java's symbol="[other]" (5% kept back for those)
    assert sum(series.values()) == pytest.approx(1_000_000 / 99)  # every sample still counted, most in [other]
    assert len(text) < 3_500_000
    assert "\x1b" not in text
    assert max(len(dict(key)["symbol"]) for key in series) <= MAX_LABEL_CHARS


def test_names_that_differ_only_past_the_cut_share_one_series():
    totals = ExporterTotals(max_series=100)
    stem = "s" * MAX_LABEL_CHARS
    totals.apply(Delta(cpu_samples=Counter({("c", "/d", stem + "a"): 1, ("c", "/d", stem + "b"): 2})), 0)
    assert totals.cpu_samples.values() == {("c", "/d", stem[: MAX_LABEL_CHARS - 1] + CUT_MARK): 3}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_series_expire_and_restart_from_zero(expo):
    clock = FakeClock()
    totals = ExporterTotals(max_series=100, series_idle_s=60, clock=clock)
    page = MetricsPage(totals, ExporterInfo(99, "cpu-clock"))
    busy, idle = ("busy", "/b", "f"), ("gone", "/g", "g")
    totals.apply(Delta(cpu_samples=Counter({busy: 5, idle: 7})), 0)
    for _ in range(20):  # 100 s of drains in which only `busy` moves
        clock.now += 5
        totals.apply(Delta(cpu_samples=Counter({busy: 1})), 0)
    text = page.render().decode()
    assert set(expo.samples(text, CPU)) == {tuple(zip(("comm", "dso", "symbol"), busy))}
    assert expo.value(text, "optrace_series_expired_total", metric=CPU) == 1
    assert expo.value(text, CPU, comm="busy") == pytest.approx(25 / 99)
    clock.now += 5
    totals.apply(Delta(cpu_samples=Counter({idle: 2})), 0)  # back: a new series, from 0
    assert expo.value(page.render().decode(), CPU, comm="gone") == pytest.approx(2 / 99)


def test_expired_series_make_room_under_the_guard():
    clock = FakeClock()
    totals = ExporterTotals(max_series=20, series_idle_s=10, clock=clock)
    for wave in range(5):  # each wave: 15 new short-lived process names, then silence
        totals.apply(Delta(cpu_samples=Counter({(f"p{wave}_{i}", "/x", "f"): 1 for i in range(15)})), 0)
        clock.now += 11
        totals.apply(Delta(), 0)
    assert totals.cpu_samples.overflow == 0  # no wave overflowed: the earlier ones had expired
    assert totals.cpu_samples.expired == 75 and len(totals.cpu_samples) == 0


def test_zero_idle_time_keeps_series_forever():
    clock = FakeClock()
    totals = ExporterTotals(max_series=20, series_idle_s=0, clock=clock)
    totals.apply(Delta(cpu_samples=Counter({("a", "/x", "f"): 1})), 0)
    clock.now += 10**7
    totals.apply(Delta(), 0)
    assert len(totals.cpu_samples) == 1


# -- contained failures -----------------------------------------------------------------------------------
class Boom(RuntimeError):
    pass


class FlakySource:
    """Raises on every other drain, after adding a row (the daemon must keep the next drains)."""

    event = "cpu-clock"

    def __init__(self) -> None:
        self.drains = 0

    def start(self) -> None:
        pass

    def collect(self, delta: Delta) -> None:
        self.drains += 1
        if self.drains % 2:
            raise Boom("a symbol table with sh_link 0xffff")
        delta.cpu_samples[("ok", "/bin/ok", "f")] += 1

    def close(self) -> None:
        pass


def test_a_source_that_raises_costs_its_drain_only(expo):
    warnings: list[str] = []
    daemon = ServeDaemon(ServeOptions(max_series=10), [FlakySource()], on_warning=warnings.append)
    for _ in range(10):
        daemon.drain_once()
    text = MetricsPage(daemon.totals, ExporterInfo(99, "cpu-clock")).render().decode()
    assert expo.value(text, "optrace_read_errors_total", kind="drain") == 5
    assert expo.value(text, CPU, comm="ok") == pytest.approx(5 / 99)
    assert expo.value(text, "optrace_drains_total") == 10
    assert len(warnings) == 1 and "Boom" in warnings[0] and "\n" not in warnings[0]  # once, not every drain


class PickySymbolizer:
    """Names every sample, except that anything involving pid 666 raises (a hostile file of its own)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def symbolize(self, samples):
        samples = list(samples)
        if any(s.pid == 666 for s in samples):
            raise Boom("malformed ELF of pid 666")
        frames = [Frame(f"fn{s.pid}", "/bin/x") for s in samples]
        return frames, [Sample(s.pid, s.comm, (i,), s.count) for i, s in enumerate(samples)]

    def snapshot_process(self, pid: int) -> None:
        if pid == 666:
            raise Boom("maps of pid 666")

    def add_executable(self, path: str, pid: int | None = None) -> None:
        pass

    def forget_process(self, pid: int) -> None:
        pass

    def cache_sizes(self) -> dict[str, int]:
        return {"dsos": 2, "table_bytes": 4096}


class FakeProfiler:
    def __init__(self, result: DrainResult) -> None:
        self.result = result

    def drain(self) -> DrainResult:
        return self.result


class NoJit:
    def __init__(self) -> None:
        from optrace.jitmaps.symtable import SymbolBudget

        self.warnings: list[str] = []
        self.stats: dict[str, int] = {}
        self.budget = SymbolBudget()

    def poll(self, pid: int, time: float) -> None:
        pass

    def forget_process(self, pid: int) -> None:
        pass


def test_one_process_that_breaks_symbolization_costs_its_own_names_only():
    source = ProfileSource(99, [], [])
    samples = [RawSample(pid, comm, (UserFrame(b"id%d" % pid, 0x10),), (), 3)
               for pid, comm in ((10, "good"), (666, "evil"), (11, "good2"))]
    session = source.session
    session.profiler = FakeProfiler(DrainResult(samples, {}, [], []))
    session.symbolizer, session.jit = PickySymbolizer(), NoJit()
    delta = Delta()
    source.collect(delta)
    assert delta.cpu_samples == Counter({("good", "/bin/x", "fn10"): 3, ("good2", "/bin/x", "fn11"): 3,
                                         ("evil", "[unknown]", "[unknown]"): 3})
    assert delta.read_errors == Counter({"process_maps": 1, "symbolize": 1})
    assert all("pid 666" in w for w in delta.warnings) and len(delta.warnings) == 2
    assert delta.caches == {"dsos": 2, "table_bytes": 4096, "jit_processes": 0, "jit_symbols": 0, "jit_names_bytes": 0,
                            "jit_files_kept": 0}


def test_cache_sizes_are_gauges_on_the_page(expo):
    totals = ExporterTotals(max_series=10)
    totals.apply(Delta(caches={"dsos": 5, "table_bytes": 1 << 20}), 0)
    totals.apply(Delta(caches={"dsos": 3, "table_bytes": 1 << 19}), 0)  # the latest value, not a sum
    text = MetricsPage(totals, ExporterInfo(99, "cpu-clock")).render().decode()
    assert expo.value(text, "optrace_symbol_cache_entries", cache="dsos") == 3
    assert expo.value(text, "optrace_symbol_cache_bytes", cache="table") == 1 << 19


# -- the HTTP side ----------------------------------------------------------------------------------------

@pytest.fixture
def daemon_url():
    """A daemon with a TickSource on a free loopback port, drained every 50 ms: (daemon, url)."""
    daemon = ServeDaemon(ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.05), [TickSource()])
    stop, urls = threading.Event(), []
    thread = threading.Thread(target=daemon.run, args=(stop,), kwargs={"on_ready": urls.append})
    thread.start()
    deadline = time.monotonic() + 10
    while not urls and time.monotonic() < deadline:
        time.sleep(0.01)
    yield daemon, urls[0]
    stop.set()
    thread.join(15)
    assert not thread.is_alive()


def test_head_answers_like_get_without_a_body(daemon_url):
    _, url = daemon_url
    time.sleep(0.1)
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as response:
        assert response.status == 200 and response.read() == b""
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        length = int(response.headers["Content-Length"])
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    assert length > 500 and abs(len(body) - length) < 100  # the page grows by a few digits between the two
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10)
    assert err.value.code == 405 and err.value.headers["Allow"] == "GET, HEAD"


def concurrent_requests(port: int, count: int, request: bytes, timeout: float, sources: int = 1) -> list[bytes]:
    """Opens ``count`` connections at once (non-blocking, one thread) from ``sources`` loopback addresses,
    sends ``request`` on each, and reads every response to its end; returns the responses (b"" for a
    connection never answered)."""
    selector = selectors.DefaultSelector()
    responses: dict[socket.socket, bytearray] = {}
    for index in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((source_address(index, sources), 0))
        sock.connect_ex(("127.0.0.1", port))
        responses[sock] = bytearray()
        selector.register(sock, selectors.EVENT_WRITE)
    open_count, deadline = count, time.monotonic() + timeout
    while open_count and time.monotonic() < deadline:
        for key, events in selector.select(timeout=1):
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:
                sock.sendall(request)
                selector.modify(sock, selectors.EVENT_READ)
                continue
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b""
            if chunk:
                responses[sock] += chunk
            else:
                selector.unregister(sock)
                sock.close()
                open_count -= 1
    for sock in list(responses):
        sock.close()
    return [bytes(body) for body in responses.values()]


def test_a_thousand_concurrent_scrapes_are_all_answered(daemon_url):
    """From 100 addresses: one address holds at most MAX_PER_ADDRESS connections (test_slow_clients.py)."""
    daemon, _ = daemon_url
    started = time.monotonic()
    answers = concurrent_requests(daemon.address.port, 1000, b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n", 60,
                                  sources=100)
    elapsed = time.monotonic() - started
    statuses = Counter(answer.split(b"\r\n", 1)[0] for answer in answers)
    assert statuses == Counter({b"HTTP/1.1 200 OK": 1000}), statuses
    assert all(b"optrace_drains_total" in answer for answer in answers)
    assert elapsed < 60
    print(f"1000 concurrent scrapes answered in {elapsed:.1f} s")


def test_trickling_clients_are_cut_at_the_head_deadline(daemon_url, monkeypatch):
    """Slowloris connections (a request line, then nothing) hold no worker: a scrape behind them is
    answered at once, and each of them is cut HEAD_S after it connected."""
    monkeypatch.setattr(httpserver, "HEAD_S", 2.0)
    daemon, url = daemon_url
    slow = []
    for index in range(200):
        sock = socket.socket()
        sock.bind((source_address(index, 20), 0))
        sock.connect(("127.0.0.1", daemon.address.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        slow.append(sock)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
        assert time.monotonic() - started < 1.5
        cut = 0
        for sock in slow:
            sock.settimeout(max(0.1, started + 6 - time.monotonic()))
            try:
                cut += sock.recv(1) == b""
            except OSError:
                cut += 1
        assert cut == len(slow)
    finally:
        for sock in slow:
            sock.close()


def test_a_new_connection_pushes_out_the_one_that_made_no_progress_longest():
    closed: list[str] = []
    limits = ConnectionLimits(per_address=2, total=3, request_bytes=1 << 20, answer_bytes=1 << 20)

    def conn(name: str) -> Connection:
        return Connection(name[0], lambda: closed.append(name))

    a1, a2, b1, a3, a4, c1, c2 = map(conn, ["a1", "a2", "b1", "a3", "a4", "c1", "c2"])
    for new in (a1, a2, b1):
        limits.admit(new)
    limits.admit(a3)
    assert closed == ["a1"]  # a's second limit: a's oldest goes
    limits.progressed(a2)  # it sent its request
    limits.admit(a4)
    assert closed == ["a1", "a3"]  # a3 has not moved since its accept, a2 since its request
    limits.admit(c1)
    assert closed == ["a1", "a3", "b1"]  # the total: the oldest of all
    limits.progressed(a4), limits.progressed(c1)
    limits.building(c1)  # its answer is being built: the server's time, not the client's
    limits.admit(c2)  # the others sent a request and sit still: the one that moved longest ago gives way
    assert closed[-1] == "a2" and limits.cut == 4
    limits.building(a4), limits.building(c2)
    c3 = conn("c3")
    limits.admit(c3)  # all out of the line: the one whose answer has been building longest goes
    assert closed[-1] == "c1" and limits.held("c") == 2
    limits.built(a4)
    limits.release(a1)  # a connection that gave way ends later: nothing changes
    assert limits.held() == 3 and limits.held("a") == 1 and limits.held("c") == 2


def test_answers_being_written_hold_each_body_once_and_within_the_bound():
    closed: list[str] = []
    limits = ConnectionLimits(per_address=10, total=10, request_bytes=1 << 20, answer_bytes=250)
    names = ["old", "page1", "page2", "profile"]
    old, page1, page2, profile = conns = [Connection("a", lambda name=name: closed.append(name)) for name in names]
    for each in conns:
        limits.admit(each)
    page, past_page = b"p" * 100, b"o" * 100
    limits.writing(old, past_page)
    limits.writing(page1, page), limits.writing(page2, page)
    assert limits.answer_held == 200 and not closed  # 4,000 writers of one page would hold it once too
    limits.writing(profile, b"x" * 100)  # 300 > 250: the writer of another body that moved longest ago goes
    assert closed == ["old"] and limits.answer_held == 200
    limits.written(page1), limits.written(page2)
    assert limits.answer_held == 100
    limits.release(profile)
    assert limits.answer_held == 0 and limits.held() == 2


def test_a_server_stopped_as_it_starts_stops_at_once():
    """A stop that came before the listener existed used to leave the loop running (close() hung)."""
    for _ in range(100):
        server = httpserver.MetricsServer(ListenAddress("127.0.0.1", 0))
        server.start(lambda: b"page")
        started = time.monotonic()
        server.close()
        assert time.monotonic() - started < 5 and not server._thread.is_alive()


def test_keep_alive_answers_requests_one_after_another(daemon_url):
    import http.client

    daemon, _ = daemon_url
    connection = http.client.HTTPConnection("127.0.0.1", daemon.address.port, timeout=10)
    for path in ("/metrics", "/", "/nothing", "/metrics"):
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.status == (404 if path == "/nothing" else 200) and response.read()
    connection.close()


@pytest.mark.parametrize("request_bytes", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64 + b"\r\n\r\n",  # a TLS hello to a plain port
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",  # an over-long request line
    b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",  # too many headers
    b"\xff\xfe garbage\r\n\r\n",
])
def test_hostile_requests_get_an_error_and_the_server_goes_on(daemon_url, request_bytes, capfd):
    daemon, url = daemon_url
    with socket.create_connection(("127.0.0.1", daemon.address.port), timeout=10) as sock:
        sock.sendall(request_bytes)
        try:
            answer = sock.recv(100)
        except ConnectionResetError:
            answer = b""
    assert b"200 OK" not in answer and b"optrace_" not in answer  # an error page (HTTP/0.9 style for some), or a hang-up
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
    assert "Traceback" not in capfd.readouterr().err


def test_reload_applies_the_idle_time_and_keeps_restart_only_settings(daemon_url):
    daemon, url = daemon_url
    infos, warnings = [], []
    daemon._on_info, daemon._on_warning = infos.append, warnings.append
    changed = ServeOptions(listen=ListenAddress("127.0.0.1", 1), series_idle_s=5, max_series=7, off_cpu=True,
                           off_cpu_every=3)
    daemon._reload_options = lambda: changed
    daemon.request_reload()
    deadline = time.monotonic() + 5
    while not infos and time.monotonic() < deadline:
        time.sleep(0.02)
    assert infos and infos[0].startswith("reloaded the settings: serving http://127.0.0.1:")
    assert daemon.totals.series_idle_s == 5
    assert daemon.options.max_series == 10000 and daemon.options.listen.port == 0
    assert sorted(w.split(":")[1].split()[0] for w in warnings) == ["listen", "max_series", "off_cpu", "off_cpu_every"]
    assert not daemon.options.off_cpu and daemon.options.off_cpu_every == 1
    with urllib.request.urlopen(url, timeout=10) as response:  # still on the first port
        assert response.status == 200
